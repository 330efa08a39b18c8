"""Run by the ENGINE's python, never imported by metaltune: the engine's own bench client
(`vllm.benchmarks.serve`: `add_cli_args`, then `main(args)`, which returns its result dict) once
per concurrency level and repeat, in one process (its imports cost seconds), the dicts' scalars
written as JSON to OUT. Usage: python bench_driver.py OUT.json LADDER REPEATS BENCH-ARGS...
(LADDER: comma-separated concurrencies; each run adds --max-concurrency C)."""
import argparse
import json
import sys


def main() -> int:
    from vllm.benchmarks.serve import add_cli_args, main as bench

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
    except ImportError:  # older layouts: plain argparse takes the same arguments
        Parser = argparse.ArgumentParser
    out_path, ladder, repeats, rest = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    runs = []
    for r in range(repeats):
        for c in (int(x) for x in ladder.split(",")):
            parser = Parser()
            add_cli_args(parser)
            res = bench(parser.parse_args([*rest, "--max-concurrency", str(c)]))
            # the scalars only: per-request lists (ttfts, itls, generated texts) are not needed
            row = {k: v for k, v in res.items() if isinstance(v, (int, float, str, bool)) or v is None}
            runs.append({**row, "concurrency": c, "repeat": r})
    with open(out_path, "w") as f:
        json.dump({"runs": runs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
