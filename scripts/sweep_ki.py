"""Sweep scripts/inject_ki.py over N = start, start+step, ... for `apply h200 --probation 300`
on a fresh simulated host each time (N=0 first: counts the points); report hangs (no exit
within --hang-s) with py-spy stacks (`pip install py-spy` in the venv), and each outcome's last
stderr line. Exploration tool, not a test:

    .venv/bin/python scripts/sweep_ki.py --from begin --only acquire
    .venv/bin/python scripts/sweep_ki.py --from wait --start 1 --stop 240 --step 3"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stress_ctrlc import PY, REPO, env_for, stacks  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="frm", default="begin")
    ap.add_argument("--only", default="")
    ap.add_argument("--start", type=int, default=1)
    ap.add_argument("--stop", type=int, default=10**9)
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--hang-s", type=float, default=20.0)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="sweep-ki-"))
    work.mkdir(parents=True, exist_ok=True)
    template = work / "template"
    if not (template / "sim").exists():
        subprocess.run([PY, "-m", "tuner", "sim", "init", str(template / "sim"), "--sku", "h200"],
                       cwd=REPO, env=env_for(template), check=True, capture_output=True)
    counts: collections.Counter = collections.Counter()
    n = 0
    total = None
    while n <= a.stop and (total is None or n <= total):
        d = Path(tempfile.mkdtemp(dir=work))
        shutil.copytree(template / "sim", d / "sim", symlinks=True)
        env = {**env_for(d), "METALTUNE_KI_AT": str(n), "METALTUNE_KI_FROM": a.frm,
               "METALTUNE_KI_ONLY": a.only}
        errf = open(d / "err", "w+")
        p = subprocess.Popen([PY, str(REPO / "scripts" / "inject_ki.py"), "apply", "h200",
                              "--probation", "300"],
                             cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=errf)
        t0 = time.monotonic()
        hang = False
        try:
            if n == 0:  # the count is printed when the trigger returns; then stop it
                end = time.monotonic() + 120
                while "ki-events" not in (d / "err").read_text() and time.monotonic() < end:
                    time.sleep(0.1)
                p.kill()
            p.wait(timeout=a.hang_s)
        except subprocess.TimeoutExpired:
            hang = True
            st = stacks(p.pid)
            p.kill()
            p.wait()
        err = (d / "err").read_text()
        lines = err.strip().splitlines()
        inj = next((ln for ln in lines if ln.startswith("ki-injected")), "ki-injected: (never)")
        ev = next((ln for ln in lines if ln.startswith("ki-events")), None)
        if ev and "(never)" in inj:
            total = int(ev.split()[1])  # N=0: a run without a fault counts the points
            print(f"{total} points to inject at", flush=True)
        last = next((ln for ln in reversed(lines) if not ln.startswith("ki-")), "")
        s = subprocess.run([PY, "-m", "tuner", "status", "--json"], cwd=REPO, env=env_for(d),
                           capture_output=True, text=True, timeout=120)
        pend = '"pending": null' not in s.stdout and s.returncode == 0
        key = "HANG" if hang else f"rc={p.returncode} " + (last[:110])
        counts[key.split(";")[0][:80]] += 1
        print(f"N={n} {inj[13:]} -> {key} ({time.monotonic() - t0:.1f}s)"
              + (" PENDING LEFT" if pend else ""), flush=True)
        if hang or "Traceback" in err:
            print(err[-3000:], flush=True)
            if hang:
                print(st, flush=True)
        else:
            shutil.rmtree(d, ignore_errors=True)
        n = a.start if n == 0 else n + a.step
    for k, v in counts.most_common():
        print(v, k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
