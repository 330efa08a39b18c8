"""On the simulated host: refused changes never reach the device; the CLI (status --json, confirm,
rollback, recover) as subprocesses against a real applying process."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("tuner.sim.inject")

from safety import Journal, PolicyDenied, Transaction  # noqa: E402
from safety import policy as pol  # noqa: E402
from tuner.host import open_host  # noqa: E402
from tuner.knobs.registry import discover  # noqa: E402
from tuner.sim.hostinit import init_host  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def digest(root: Path) -> str:
    """Every file of the simulated host (device state, sysfs, procfs, BMC)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "lock":
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def sim(tmp_path):
    root = init_host(tmp_path / "host")
    host = open_host("sim", root)
    yield root, discover(host)
    host.close()


@pytest.mark.parametrize("changes,rule,failed", [
    ({"gpu0.power_limit_w": 400}, "rule #0 (knob 'gpu*.power_limit_w')", "below the floor 0.75 x default 700"),
    ({"gpu0.power_limit_w": 690, "gpu0.persistence_mode": 0}, "forbidden 'gpu*.persistence_mode'",
     "never changed"),
    ({"gpu0.gpc_clock_offset_mhz": 100}, "rule #2 (knob 'gpu*.*_clock_offset_mhz')", ""),
    ({"bios.WorkloadProfile": "HighPerformanceCompute"}, "forbidden 'bios.*'", "never changed"),
    ({"driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode": 1}, "forbidden 'driver.*'", "never changed"),
    ({"sysctl.vm.dirty_ratio": 30}, "no rule", "deny by default"),
    ({"gpu0.locked_clocks_mhz": [1500, 2100]}, "rule #1 (knob 'gpu*.locked_clocks_mhz')",
     "outside the device's domain"),
])
def test_default_policy_refusals_never_reach_the_sim(sim, tmp_path, changes, rule, failed):
    root, knobs = sim
    before = digest(root)
    j = Journal(tmp_path / "state" / "journal.db")
    with pytest.raises(PolicyDenied) as e:
        Transaction(j, knobs, changes, policy=pol.load_default()).begin()
    msg = str(e.value)
    assert "safety/policies/default.yaml" in msg and rule in msg and failed in msg, msg
    assert digest(root) == before
    assert j.txns() == [] and j.baseline() == {}


def _metaltune(root: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", "--backend", "sim", "--sim-root", str(root),
                           "--state-dir", str(state), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def _applier(root: Path, state: Path, probation: float) -> subprocess.Popen:
    """A process that applies a change and waits out its probation like `metaltune apply` does."""
    code = textwrap.dedent(f"""
        import time
        from safety import Journal, Transaction, Policy, ProbationExpired
        from tuner.host import open_host
        from tuner.knobs.registry import discover
        knobs = discover(open_host("sim", {str(root)!r}), providers=["gpu"])
        t = Transaction(Journal({str(state / 'journal.db')!r}), knobs,
                        {{"gpu0.power_limit_w": 600, "gpu0.locked_clocks_mhz": [1500, 1500]}},
                        policy=Policy.from_dict({{"rules": [{{"knob": "gpu*"}}]}}),
                        probation_s={probation}, label="try 600 W").begin()
        print("applied", flush=True)
        try:
            while t.remaining() > 0:
                t.check()
                time.sleep(0.05)
            t.confirm()
            print("kept", flush=True)
        except ProbationExpired as e:
            print("rolled back:", e, flush=True)
    """)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def test_status_confirm_rollback_recover_cli(sim, tmp_path):
    root, knobs = sim
    state = tmp_path / "state"
    r = _metaltune(root, state, "status", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["pending"] is None and s["baseline"] == {} and s["incidents"] == []
    assert s["current"]["gpu0.power_limit_w"] == 700
    assert not state.exists()  # a read creates nothing

    p = _applier(root, state, probation=60)
    try:
        assert p.stdout.readline().strip() == "applied"
        s = json.loads(_metaltune(root, state, "status", "--json").stdout)
        assert set(s) >= {"baseline", "current", "pending", "incidents"}
        assert s["baseline"]["gpu0.power_limit_w"] == 700 and s["current"]["gpu0.power_limit_w"] == 600
        assert s["pending"]["label"] == "try 600 W" and s["pending"]["state"] == "probation"
        assert 0 < s["pending"]["remaining_s"] <= 60
        assert [c["knob"] for c in s["pending"]["changes"]] == ["gpu0.power_limit_w", "gpu0.locked_clocks_mhz"]
        r = _metaltune(root, state, "confirm")
        assert r.returncode == 0 and "confirmed transaction 1" in r.stdout, r.stderr
        assert p.stdout.readline().strip() == "kept"  # the applier sees it at its next check
        assert p.wait(timeout=10) == 0
    finally:
        p.kill()
    s = json.loads(_metaltune(root, state, "status", "--json").stdout)
    assert s["pending"] is None and s["current"]["gpu0.locked_clocks_mhz"] == [1500, 1500]
    assert _metaltune(root, state, "confirm").returncode == 1  # nothing pending

    # rollback while another writer is in probation: undone through the journal at once
    p = _applier(root, state, probation=60)
    try:
        assert p.stdout.readline().strip() == "applied"
        r = _metaltune(root, state, "rollback")
        assert r.returncode == 0, r.stderr
        assert "restored to baseline: gpu0.power_limit_w, gpu0.locked_clocks_mhz" in r.stdout
        assert p.stdout.readline().startswith("rolled back: ")
    finally:
        p.kill()
        p.wait()
    assert knobs["gpu0.power_limit_w"].read() == 700 and knobs["gpu0.locked_clocks_mhz"].read() is None
    j = Journal(state / "journal.db")
    assert [t["state"] for t in j.txns()][:2] == ["confirmed", "rolled_back"]  # newest first
    assert j.txns()[0]["label"] == "rollback to baseline"

    r = _metaltune(root, state, "recover")
    assert r.returncode == 0 and "nothing to recover" in r.stdout
    r = _metaltune(root, state, "status")
    assert r.returncode == 0 and "pending: none" in r.stdout


def test_spawned_watchdog_rebuilds_sim_knobs_and_restores_after_sigkill(sim, tmp_path):
    """The robust watchdog: a fresh interpreter that rebuilds the knobs by name
    (tuner.ops.safety.knob_factory) and restores the sim when the caller is killed."""
    import signal

    root, knobs = sim
    state = tmp_path / "state"
    code = textwrap.dedent(f"""
        import time
        from safety import Journal, Transaction, Policy
        from tuner.host import open_host
        from tuner.knobs.registry import discover
        from tuner.ops.safety import knob_factory
        host = open_host("sim", {str(root)!r})
        t = Transaction(Journal({str(state / 'journal.db')!r}), discover(host, providers=["gpu"]),
                        {{"gpu0.power_limit_w": 550}}, policy=Policy.from_dict({{"rules": [{{"knob": "gpu*"}}]}}),
                        probation_s=60, knob_factory=knob_factory(host)).begin()
        print("applied", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert p.stdout.readline().strip() == "applied"
        assert knobs["gpu0.power_limit_w"].read() == 550
        p.send_signal(signal.SIGKILL)
        p.wait()
        end = time.monotonic() + 10
        while knobs["gpu0.power_limit_w"].read() != 700:
            assert time.monotonic() < end
            time.sleep(0.01)
    finally:
        p.kill()
        p.wait()
    j = Journal(state / "journal.db")
    end = time.monotonic() + 10
    while j.txn_state(1) != "rolled_back" and time.monotonic() < end:
        time.sleep(0.01)
    s = json.loads(_metaltune(root, state, "status", "--json").stdout)
    assert s["pending"] is None and "died" in s["recent"][0]["reason"]
