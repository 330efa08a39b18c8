"""How close each proposer gets to the simulated host's true optimum within the demo's budget.

The true optimum is a brute force over the simulated GPU's noise-free model (every pinned clock x
memory clock x power limit on a 10 W grid). Each row runs the whole demo loop (noise, policy,
transactions, rollbacks) and reports the noise-free throughput of the settings it kept.

    .venv/bin/python benchmarks/bench_proposers.py [--trials 60] [--seeds 1 2 3] [--sku h200]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.search.demo import run_demo  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--sku", default="h200")
    ap.add_argument("--proposers", nargs="+", default=["random", "grid", "coordinate", "optuna"])
    a = ap.parse_args()
    rows = []
    for prop in a.proposers:
        fr, secs, kept, rb = [], [], [], []
        for seed in a.seeds:
            with tempfile.TemporaryDirectory() as d:
                t0 = time.time()
                r = run_demo(a.trials, seed, prop, a.sku, Path(d))
                secs.append(time.time() - t0)
            fr.append(r["true_best"] / r["true_optimum"])
            kept.append(r["kept"])
            rb.append(r["rolled_back"])
            base = r["true_baseline"] / r["true_optimum"]
        rows.append((prop, fr, statistics.mean(secs), kept, rb, base))
    print(f"\nsimulated {a.sku}, {a.trials} trials per run, seeds {a.seeds}")
    print("fraction of the true optimum reached (noise-free value of the kept settings)\n")
    hdr = f"{'proposer':<11} {'per seed':<26} {'mean':>7} {'worst':>7} {'≥97%':>5} {'kept':>10} {'rolled back':>12} {'s/run':>6}"
    print(hdr)
    print("-" * len(hdr))
    for prop, fr, s, kept, rb, base in rows:
        per = " ".join(f"{x:.1%}" for x in fr)
        ok = sum(x >= 0.97 for x in fr)
        print(f"{prop:<11} {per:<26} {statistics.mean(fr):>7.1%} {min(fr):>7.1%} {ok:>2}/{len(fr):<2} "
              f"{'/'.join(map(str, kept)):>10} {'/'.join(map(str, rb)):>12} {s:>6.1f}")
    print(f"\nbaseline (driver defaults) reaches {base:.1%} of the optimum")


if __name__ == "__main__":
    main()
