"""Stress `metaltune apply h200 --probation 300` on a simulated host with Ctrl-C (SIGINT) at
random moments; report every run that does not exit within --hang-s, with py-spy stacks.

Not a test: a tool to find the rare hang after Ctrl-C (tests/profiles/test_apply_outcome_output.py
::test_ctrl_c_in_apply_says_it_rolled_back). Usage:

    .venv/bin/python scripts/stress_ctrlc.py --runs 50 --mode probation   # SIGINT 0-300 ms after
    .venv/bin/python scripts/stress_ctrlc.py --runs 50 --mode launch      # "in probation", or
                                                                          # 0-3 s after launch
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def env_for(d: Path) -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(REPO), "METALTUNE_BACKEND": "sim",
         "METALTUNE_SIM_ROOT": str(d / "sim"), "METALTUNE_STATE_DIR": str(d / "state"),
         "METALTUNE_RUN_DIR": str(d / "run"), "COLUMNS": "80"}
    e.pop("METALTUNE_NO_DAEMON", None)
    return e


def stacks(pid: int) -> str:
    spy = Path(PY).with_name("py-spy")
    if not spy.exists():
        return "(no py-spy)"
    r = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True,
                       timeout=60)
    return r.stdout + r.stderr


def one(template: Path, work: Path, mode: str, hang_s: float) -> dict:
    d = Path(tempfile.mkdtemp(dir=work))
    shutil.copytree(template / "sim", d / "sim", symlinks=True)
    env = env_for(d)
    errf = open(d / "err", "w+")
    t0 = time.monotonic()
    p = subprocess.Popen([PY, "-m", "tuner", "apply", "h200", "--probation", "300"], cwd=REPO,
                         env=env, stdout=subprocess.DEVNULL, stderr=errf,
                         # a shell's background job ignores SIGINT; a test's child does not
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if mode == "launch":
        delay = random.uniform(0.0, 3.0)
        time.sleep(delay)
    else:
        end = time.monotonic() + 60
        while "in probation" not in (d / "err").read_text() and time.monotonic() < end:
            time.sleep(0.005)
        delay = random.uniform(0.0, 0.3)
        time.sleep(delay)
    at = time.monotonic() - t0
    p.send_signal(signal.SIGINT)
    out = {"dir": str(d), "sigint_at_s": round(at, 3), "delay": round(delay, 3)}
    try:
        p.wait(timeout=hang_s)
    except subprocess.TimeoutExpired:
        out["hang"] = True
        out["stacks"] = stacks(p.pid)
        out["err"] = (d / "err").read_text()[-2000:]
        p.kill()
        p.wait()
    out["rc"] = p.returncode
    out["exit_s"] = round(time.monotonic() - t0 - at, 2)
    err = (d / "err").read_text()
    out["last"] = err.strip().splitlines()[-1][:200] if err.strip() else ""
    out["traceback"] = "Traceback" in err
    # what the journal says now (the watchdog may still be rolling back after the caller died)
    time.sleep(0.2)
    s = subprocess.run([PY, "-m", "tuner", "status", "--json"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    try:
        st = json.loads(s.stdout)
        out["pending"] = (st.get("pending") or {}).get("state")
        out["recent"] = (st.get("recent") or [{}])[0].get("state") if st.get("recent") else None
    except ValueError:
        out["status_err"] = s.stderr.strip()[-300:]
    if not out.get("hang"):
        shutil.rmtree(d, ignore_errors=True)
    return out


def kind(r: dict) -> str:
    if r.get("hang"):
        return "HANG"
    last = r["last"]
    for key in ("rolled back", "before anything was written", "failed here", "rollback failed"):
        if key in last:
            return f"rc={r['rc']} {key}"
    return f"rc={r['rc']} {last[:90]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--mode", choices=["probation", "launch"], default="probation")
    ap.add_argument("--hang-s", type=float, default=20.0)
    ap.add_argument("--work", default=None)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    random.seed(a.seed)
    work = Path(a.work or tempfile.mkdtemp(prefix="stress-ctrlc-"))
    work.mkdir(parents=True, exist_ok=True)
    template = work / "template"
    if not (template / "sim").exists():
        subprocess.run([PY, "-m", "tuner", "sim", "init", str(template / "sim"), "--sku", "h200"],
                       cwd=REPO, env=env_for(template), check=True, capture_output=True)
    counts: collections.Counter = collections.Counter()
    for i in range(a.runs):
        r = one(template, work, a.mode, a.hang_s)
        counts[kind(r)] += 1
        brief = {k: r.get(k) for k in ("sigint_at_s", "rc", "exit_s", "pending", "recent")}
        print(f"run {i}: {kind(r)} {brief}", flush=True)
        if r.get("hang") or r.get("traceback") or r.get("pending") or \
                r.get("recent") not in ("rolled_back", None):
            print(json.dumps(r, indent=1), flush=True)
    print(dict(counts))
    return 1 if counts.get("HANG") else 0


if __name__ == "__main__":
    sys.exit(main())
