"""Default engine settings against the ones a search keeps, on a real vLLM server: a `search mixed`
over engine settings (at most 20 trials), then the two settings measured again outside the search
in paired rounds (default, kept, default, kept, ...; both servers kept running), and a table of
goodput (requests/s meeting the SLOs) and output tok/s per ladder size with the ratio kept/default
and its 95% interval over the paired rounds (a bootstrap of the rounds' mean ratio).

  METALTUNE_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/bench_serving.py --budget 12

No model is downloaded: without --model a config-built Llama (tests/vllmhelpers.tiny_llama) is
made in the work dir. The search runs on a simulated host with no host knob (`--knob none`):
only the engine's settings move. Pass --objective goodput where that objective exists."""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEARCHED = "max-num-seqs+max-num-batched-tokens+enforce-eager+optimization-level+block-size"


def cli(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"metaltune {' '.join(args[:6])} ...: exit {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout


def paired_ci(a: list[float], b: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the rounds' ratios b/a and its 95% bootstrap interval (rounds resampled as pairs)."""
    r = [y / x for x, y in zip(a, b) if x > 0]
    if not r:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(r, k=len(r))) for _ in range(resamples))
    return statistics.fmean(r), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def search(a: argparse.Namespace, sim: Path, state: Path, base: str) -> dict:
    """The search's kept engine settings."""
    res = json.loads(cli("--backend", "sim", "--sim-root", str(sim), "--state-dir", str(state), "search",
                         "mixed", "--knob", "none", "--workload", f"vllm:{base},search={a.search}",
                         "--budget", str(a.budget), "--rounds", str(a.search_rounds), "--repeats", "1",
                         "--objective", a.objective, "--json"))
    kept = res["kept"]["runtime"]
    print(f"search: {res['trials']} trials, {res['by_verdict']}; kept {kept or 'nothing'}", flush=True)
    return kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a model dir (default: a config-built tiny Llama)")
    ap.add_argument("--budget", type=int, default=12, help="search trials (at most 20)")
    ap.add_argument("--rounds", type=int, default=5, help="paired rounds measured after the search")
    ap.add_argument("--search-rounds", type=int, default=2, help="A/B pairs per search trial")
    ap.add_argument("--search", default=SEARCHED, help="engine settings searched, joined by '+'")
    ap.add_argument("--objective", default="throughput")
    ap.add_argument("--serving", default="concurrency=4+16,num_prompts=64,input_len=128,output_len=64,"
                    "ttft_ms=250,tpot_ms=20,flags=--max-model-len 1024 --dtype bfloat16,"
                    "setting.kv-cache-memory-bytes=1073741824",
                    help="the serving config's other key=value pairs")
    ap.add_argument("--work", default=None, help="work dir (default: a temp dir)")
    ap.add_argument("--kept", default=None, help="JSON of kept settings: skip the search, measure these")
    a = ap.parse_args()
    if not 1 <= a.budget <= 20:
        ap.error("--budget: expected 1..20")
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-serving-"))
    model = a.model
    if model is None:
        from tests.vllmhelpers import tiny_llama

        model = str(tiny_llama(work / "model"))
    base = f"model={model},{a.serving}"
    sim, state = work / "sim", work / "state"
    if not sim.exists():
        cli("sim", "init", str(sim))
    if a.kept is not None:
        kept = json.loads(a.kept)
    else:
        kept = search(a, sim, state, base)
    from tuner.workloads.serving.config import load
    from tuner.workloads.serving.workload import ServingWorkload

    wl = ServingWorkload(load(base))
    default = wl.runtime_settings()
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        for _ in range(a.rounds):
            for side, rt in (("default", default), ("kept", {**default, **kept})):
                wl.configure(rt)
                m = wl.measure(repeats=1)
                for size in m.per_size:
                    rows.setdefault(f"goodput {size}", {}).setdefault(side, []).append(m.per_size_goodput[size])
                    rows.setdefault(f"tok/s {size}", {}).setdefault(side, []).append(m.per_size[size])
    finally:
        wl.close()
    print(f"\nkept settings: {json.dumps(kept)}; {a.rounds} paired rounds, SLOs in: {a.serving}\n")
    print(f"| metric | default (median) | kept (median) | kept/default, mean [95% CI] |")
    print("|---|---|---|---|")
    for name, sides in rows.items():
        d, k = sides["default"], sides.get("kept", sides["default"])
        mean, lo, hi = paired_ci(d, k)
        print(f"| {name} | {statistics.median(d):.2f} | {statistics.median(k):.2f} | "
              f"{mean:.3f} [{lo:.3f}, {hi:.3f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
