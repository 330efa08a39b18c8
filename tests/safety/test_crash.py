"""Crash consistency: SIGKILL the applying process at every crash point of three transactions
(intent, apply, read back, probation, confirm, rollback), after random delays, and in the middle
of recovery itself; then `metaltune recover` (a subprocess) must leave the simulated host at the
baseline or at the last confirmed state, and the journal must say which."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from safety.journal import Journal
from safety.restore import same
from tests.safety import simhost

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
ENV.pop("METALTUNE_CRASH_AT", None)


class Zygote:
    """One pre-imported parent (tests/safety/_zygote.py) per worker thread."""

    def __init__(self) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "tests.safety._zygote"], cwd=REPO, env=ENV,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, root: Path, state: Path, variant: str, crash_at: int | None = None,
            log: Path | None = None, kill_after: float | None = None) -> int:
        """Run the scenario in a fresh forked process; returns its wait status."""
        self.p.stdin.write(json.dumps({"kind": simhost.KIND, "root": str(root), "state": str(state),
                                       "variant": variant, "crash_at": crash_at,
                                       "log": str(log) if log else None}) + "\n")
        self.p.stdin.flush()
        pid = json.loads(self.p.stdout.readline())["pid"]
        if kill_after is not None:
            time.sleep(kill_after)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return json.loads(self.p.stdout.readline())["status"]

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=30)


def _recover(root: Path, state: Path, crash_at: int | None = None) -> subprocess.CompletedProcess:
    env = dict(ENV)
    if crash_at:
        env["METALTUNE_CRASH_AT"] = str(crash_at)
    return subprocess.run(simhost.recover_argv(root, state), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def clone(template: Path, root: Path) -> None:
    """A copy of the sim host: hard links for the read-only tree, real copies of what changes
    (the device state folder and the kernel log are written by knobs, monitors and injections)."""
    shutil.copytree(template, root, copy_function=os.link)
    for sub in ("nvml", "dev"):
        if (root / sub).exists():
            shutil.rmtree(root / sub)
            shutil.copytree(template / sub, root / sub)


def _expected(j: Journal, initial: dict) -> tuple[dict, str]:
    """What the host must look like, from the journal: baseline, then each confirmed change in
    order. Returns (values, which) where which is "baseline" or "confirmed txn N"."""
    exp, which = dict(initial), "baseline"
    for t in sorted(j.txns(1000), key=lambda t: t["id"]):
        assert t["state"] in ("confirmed", "rolled_back"), f"transaction left {t['state']}: {t}"
        if t["state"] == "confirmed":
            for c in j.changes(t["id"]):
                exp[c["knob"]] = c["after"]
            which = f"confirmed txn {t['id']}"
    return exp, which


def _check(root: Path, state: Path, initial: dict) -> str:
    j = Journal(state / "journal.db")
    exp, which = _expected(j, initial)
    now = simhost.read_all(root)
    bad = {k: (now.get(k), v) for k, v in exp.items() if not same(now.get(k), v)}
    assert not bad, f"host differs from the {which} state: {bad}"
    for k, b in j.baseline().items():
        assert same(b["value"], initial[k]), f"baseline of {k} is {b['value']}, host had {initial[k]}"
    j.close()
    return which


def test_sigkill_anywhere_then_recover_gives_baseline_or_confirmed(tmp_path):
    t_start = time.monotonic()
    template = tmp_path / "template"
    simhost.init(template)
    initial = simhost.read_all(template)

    zygotes = [Zygote() for _ in range(3)]
    # dry runs: count the crash points of each variant and time a whole run
    points: dict[str, int] = {}
    names: dict[tuple[str, int], str] = {}
    run_s = 0.0
    for variant in ("confirm", "expire", "nowatchdog"):
        root, state, log = tmp_path / f"dry-{variant}", tmp_path / f"dry-{variant}-s", tmp_path / f"{variant}.log"
        shutil.copytree(template, root)
        t0 = time.monotonic()
        assert zygotes[0].run(root, state, variant, crash_at=10**9, log=log) == 0
        run_s = max(run_s, time.monotonic() - t0)
        lines = log.read_text().split("\n")[:-1]
        points[variant] = len(lines)
        for ln in lines:
            n, name = ln.split(" ", 1)
            names[(variant, int(n))] = name
        assert _check(root, state, initial) == "confirmed txn " + ("1" if variant == "expire" else "3")

    cases: list[dict] = [{"variant": v, "crash_at": k} for v in ("confirm", "expire")
                         for k in range(1, points[v] + 1)]
    rng = random.Random(1234)
    cases += [{"variant": rng.choice(["confirm", "expire"]), "delay": rng.uniform(0.01, run_s * 0.8)}
              for _ in range(8)]
    # a power cut, then another one during recovery (at its 1st/2nd/3rd crash point)
    cases += [{"variant": "nowatchdog", "crash_at": k, "recover_crash_at": r}
              for k, r in ((9, 1), (20, 2), (22, 3), (33, 1), (35, 2))]
    assert len(cases) >= 100

    def run(i: int, case: dict) -> dict:
        root, state = tmp_path / f"h{i}", tmp_path / f"s{i}"
        clone(template, root)
        status = zygotes[i % 3].run(root, state, case["variant"], crash_at=case.get("crash_at"),
                                    kill_after=case.get("delay"))
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if "recover_crash_at" in case:
            r = _recover(root, state, crash_at=case["recover_crash_at"])
            case["recover_killed"] = r.returncode == -signal.SIGKILL
        r = _recover(root, state)
        assert r.returncode == 0, f"case {case}: recover failed: {r.stderr}"
        which = _check(root, state, initial)
        shutil.rmtree(root)
        return {**case, "killed": killed, "which": which,
                "point": names.get((case["variant"], case.get("crash_at", 0)))}

    # worker w runs cases w, w+3, ...: one zygote each
    def worker(w: int) -> list[dict]:
        return [run(i, c) for i, c in enumerate(cases) if i % 3 == w]

    try:
        with ThreadPoolExecutor(max_workers=3) as ex:
            results = [r for rs in ex.map(worker, range(3)) for r in rs]
    finally:
        for z in zygotes:
            z.close()

    killed = [r for r in results if r["killed"]]
    assert len(killed) >= 100, f"only {len(killed)} runs were killed"
    hit = {r["point"].split(":")[0].split(".")[0] for r in killed if r["point"]}
    assert {"intent", "apply", "applied", "probation", "confirm", "rollback"} <= hit, hit
    assert {"apply.after"} <= {r["point"].split(":")[0] for r in killed if r["point"]}  # read back done
    assert sum(r.get("recover_killed", False) for r in results) >= 3
    outcomes = {w: sum(r["which"] == w for r in results) for w in {r["which"] for r in results}}
    assert "baseline" in outcomes and "confirmed txn 1" in outcomes and "confirmed txn 3" in outcomes
    print(f"\n{len(results)} runs, {len(killed)} killed, outcomes {outcomes},"
          f" {time.monotonic() - t_start:.1f}s")
