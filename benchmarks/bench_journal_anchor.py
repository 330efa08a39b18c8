"""What the journal's anchor costs: the same 1-knob transaction (begin + confirm, no watchdog) on
a simulated H200, with the anchor rewrite and with it switched off, interleaved so both see the
same load; plus the anchor rewrite alone (temp file, fsync, rename, folder fsync).

    .venv/bin/python benchmarks/bench_journal_anchor.py [--reps N]

Prints one table. Numbers depend on the disk's fsync latency and the load (printed)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from safety import Journal, Policy, Transaction, anchor  # noqa: E402
from tuner.host import open_host  # noqa: E402
from tuner.knobs.registry import discover  # noqa: E402
from tuner.sim.hostinit import init_host  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-anchor-"))
    host = open_host("sim", init_host(tmp / "host"))
    knobs = discover(host, providers=["gpu"])
    policy = Policy.from_dict({"rules": [{"knob": "gpu*"}]}, "bench")
    j = Journal(tmp / "state" / "journal.db")
    real = Journal._sync_anchor
    times: dict[str, list[float]] = {"with the anchor": [], "anchor switched off": []}
    for i in range(a.reps):
        for mode in times:
            Journal._sync_anchor = real if mode == "with the anchor" else (lambda self: None)  # type: ignore[method-assign]
            t0 = time.perf_counter()
            t = Transaction(j, knobs, {"gpu0.power_limit_w": 600 if i % 2 else 700}, policy=policy,
                            probation_s=60, poll_interval_s=None, watchdog="none")
            t.begin()
            t.confirm()
            times[mode].append(time.perf_counter() - t0)
    Journal._sync_anchor = real  # type: ignore[method-assign]
    rec, alone = anchor.read(j.anchor_path), []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        anchor.write(j.anchor_path, rec)
        alone.append(time.perf_counter() - t0)
    times["anchor rewrite alone"] = alone
    print(f"\njournal anchor: simulated H200, {a.reps} reps, load avg {os.getloadavg()[0]:.1f}")
    print(f"{'transaction 1 knob, no watchdog (begin + confirm)':<52}{'median ms':>10}{'p90 ms':>9}")
    for k, xs in times.items():
        xs = sorted(xs)
        print(f"{k:<52}{statistics.median(xs) * 1e3:>10.1f}{xs[int(0.9 * (len(xs) - 1))] * 1e3:>9.1f}")


if __name__ == "__main__":
    main()
