"""Stress the forked probation watchdog: N times, a caller applies two file-backed knobs, is
SIGKILLed during probation, and the watchdog must restore them AND journal the transaction as
rolled_back. Prints how each run ended; run it beside CPU load (e.g. two `yes > /dev/null`) to
provoke timing races. With the WAL journal about 1 run in 5 ended `rolling_back` (the watchdog
died of SIGBUS, safety/journal.py); with the rollback journal, none.

    .venv/bin/python benchmarks/stress_watchdog.py [--runs 30]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from safety import Journal  # noqa: E402
from tests.safety import _knobs  # noqa: E402
from tests.safety.conftest import BASE  # noqa: E402

CALLER = """
import time
from safety import Journal, Transaction, Policy
from tests.safety import _knobs
knobs = _knobs.make({root!r})
j = Journal({db!r})
pol = Policy.from_dict({{"rules": [{{"knob": "gpu0.*"}}]}})
Transaction(j, knobs, {{"gpu0.power_limit_w": 400, "gpu0.locked_clocks_mhz": 900}},
            policy=pol, probation_s=60, state_dir={state!r}).begin()
print("applied", flush=True)
time.sleep(120)
"""


def one(base: Path, wait_s: float) -> tuple[str, float]:
    root, state = base / "host", base / "state"
    state.mkdir(parents=True)
    _knobs.init(root, BASE)
    knobs = _knobs.make(str(root))
    code = textwrap.dedent(CALLER.format(root=str(root), db=str(state / "journal.db"),
                                         state=str(state)))
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    if p.stdout.readline().strip() != b"applied":
        p.kill()
        return "caller_failed", 0.0
    p.send_signal(signal.SIGKILL)
    p.wait()
    t0 = time.monotonic()
    while knobs["gpu0.power_limit_w"].read() != 700 or knobs["gpu0.locked_clocks_mhz"].read() != 0:
        if time.monotonic() - t0 > wait_s:
            return "not_restored", time.monotonic() - t0
        time.sleep(0.005)
    j = Journal(state / "journal.db")
    tid = j.txns(1)[0]["id"]
    while (st := j.txn_state(tid)) not in ("rolled_back", "rollback_failed"):
        if time.monotonic() - t0 > wait_s:
            break
        time.sleep(0.005)
    return st or "missing", time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--wait-s", type=float, default=8.0)
    a = ap.parse_args()
    ends: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as td:
        for i in range(a.runs):
            st, dt = one(Path(td) / f"run{i}", a.wait_s)
            ends[st] += 1
            print(f"run {i:3d}: {st:14s} {dt * 1e3:8.1f} ms", flush=True)
    print("\n" + ", ".join(f"{k}: {v}" for k, v in ends.most_common()) + f"  (load avg {os.getloadavg()[0]:.1f})")
    return 0 if set(ends) == {"rolled_back"} else 1


if __name__ == "__main__":
    raise SystemExit(main())
