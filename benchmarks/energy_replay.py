"""Replay kept dispatch tables outside the search and compare them on throughput and energy.

Each table (e.g. the one `search mixed --objective throughput` kept and the one `--objective
energy` kept) is installed in turn into one fresh workload process, rounds in ABBA order; per size
the workload's own timing (tokens/s, outputs checked against plain torch first) and, on a GPU, the
board's mean watts over the same window (kernelsearch.energy: NVML's total-energy counter, read
only) and tokens per joule. Prints per side and size tokens/s, tokens/J and mean W, and the ratios
of the second table to the first (issue 34's target: tokens/J >= 1.3x with tokens/s within 5%).

    python3 benchmarks/energy_replay.py --workload deepseek-v3.2:batch=8:ctx=131072 \
        --table throughput=T1.json --table energy=T2.json [--pairs 2] [--repeats 3] [--out DIR]

Needs torch; no pydantic: runs on the bare GPU machine. On the CPU no energy is measured (the
columns read "-")."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOK_PER_J_TARGET, THROUGHPUT_FLOOR = 1.3, 0.95


def _side(spec: str) -> tuple[str, str]:
    name, eq, path = spec.partition("=")
    if not eq or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {spec!r}")
    return name, path


def one_round(wl: Any, repeats: int) -> dict[str, dict[str, float]]:
    """Per size: tok/s (median of the repeats), tok/J and W where measured."""
    res = wl.bench.run(wl.runtime, repeats=repeats)
    rec = res.get("energy_record") or {}
    return {k: {"tok_s": statistics.median(v),
                "tok_j": (rec.get("per_size_tok_per_j") or {}).get(k),
                "watts": (rec.get("per_size_watts") or {}).get(k),
                "source": rec.get("energy_source", "")}
            for k, v in res["per_size_samples"].items()}


def _median(xs: list[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def replay(wl: Any, tables: dict[str, Any], pairs: int, repeats: int) -> dict[str, Any]:
    from kernelsearch import dispatch

    rounds: dict[str, list[dict]] = {s: [] for s in tables}
    checks: dict[str, Any] = {}
    for i in range(pairs):
        for side in (list(tables) if i % 2 == 0 else list(tables)[::-1]):
            dispatch.install(tables[side])
            wl.dispatch_changed()
            if wl.check_outputs and side not in checks:
                checks[side] = wl.check()
            rounds[side].append(one_round(wl, repeats))
    dispatch.install(None)
    sizes = list(next(iter(rounds.values()))[0])
    med = {s: {k: {m: _median([r[k][m] for r in rounds[s]]) for m in ("tok_s", "tok_j", "watts")}
               for k in sizes} for s in tables}
    sources = sorted({r[k]["source"] for rs in rounds.values() for r in rs for k in r})
    return {"sizes": sizes, "medians": med, "rounds": rounds, "checks": checks,
            "energy_source": ",".join(x for x in sources if x) or ""}


def ratios(med: dict[str, Any], a: str, b: str, sizes: list[str]) -> dict[str, dict[str, Any]]:
    """b / a per size and metric (None where either side has no reading)."""
    out = {}
    for k in sizes:
        out[k] = {m: (med[b][k][m] / med[a][k][m] if med[a][k][m] and med[b][k][m] else None)
                  for m in ("tok_s", "tok_j", "watts")}
        tj, ts = out[k]["tok_j"], out[k]["tok_s"]
        out[k]["target_met"] = None if tj is None else bool(tj >= TOK_PER_J_TARGET
                                                            and ts >= THROUGHPUT_FLOOR)
    return out


def _fmt(x: Optional[float], f: str) -> str:
    return "-" if x is None else format(x, f)


def _x(r: Optional[float]) -> str:
    return "-" if r is None else f"{r:.3f}x"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--table", type=_side, action="append", required=True,
                    help="NAME=PATH of a kept table; two or more (ratios: the last / the first)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write energy-replay.json here")
    a = ap.parse_args(argv)

    from kernelsearch.table import DispatchTable, TableError

    tables = {}
    for name, path in a.table:
        try:
            tables[name] = DispatchTable.load(path)
        except (TableError, OSError) as e:
            print(f"--table {name}: {e}", file=sys.stderr)
            return 2
    if len(tables) < 2:
        print("--table: expected two or more NAME=PATH, with distinct names", file=sys.stderr)
        return 2
    from tuner.errors import BadInput
    from tuner.workloads.factory import make_workload

    try:
        wl = make_workload(None, a.workload, None, 600.0)
    except BadInput as e:
        print(e, file=sys.stderr)
        return 2
    t0 = time.time()
    r = replay(wl, tables, a.pairs, a.repeats)
    first, last = list(tables)[0], list(tables)[-1]
    r["ratios"] = ratios(r["medians"], first, last, r["sizes"])
    print(f"{a.workload}: {a.pairs} ABBA pairs x {a.repeats} repeats, {time.time() - t0:.0f} s; "
          f"energy: {r['energy_source'] or 'not measured'}")
    print("| table | size | tokens/s | tokens/J | mean W |")
    print("|---|---|---|---|---|")
    for s in tables:
        for k in r["sizes"]:
            m = r["medians"][s][k]
            print(f"| {s} | {k} | {m['tok_s']:.0f} | {_fmt(m['tok_j'], '.2f')} | "
                  f"{_fmt(m['watts'], '.0f')} |")
    for k, x in r["ratios"].items():
        verdict = {None: "no energy reading", True: "met", False: "not met"}[x["target_met"]]
        print(f"| {last} / {first} | {k} | {_x(x['tok_s'])} | {_x(x['tok_j'])}"
              f" | {_x(x['watts'])} | target (tok/J >= {TOK_PER_J_TARGET}x, tok/s >= "
              f"{THROUGHPUT_FLOOR}x): {verdict}")
    print("output check:", json.dumps(r["checks"], default=str))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "energy-replay.json").write_text(json.dumps(
            {"workload": a.workload, "tables": dict(a.table), **r}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
