import subprocess
import sys

from tuner.search.store import TrialStore
from tuner.trial import Candidate, GateResult, Trial


def test_trials_round_trip_with_gates_and_measurements(tmp_path):
    with TrialStore.in_state_dir(tmp_path) as s:
        run = s.new_run("demo", {"seed": 1})
        t = Trial(run_id=run, number=1, candidate=Candidate(knobs={"gpu0.power_limit_w": 600}),
                  gates=[GateResult(gate="policy", passed=True), GateResult(gate="holistic", passed=False, code="within_noise")],
                  measurements={"incumbent": {"samples": [1.0, 2.0]}}, verdict="reverted",
                  reason="within_noise", objective=1.5, gain=0.001)
        tid = s.add(t)
        s.add(Trial(run_id=run, number=2, candidate=Candidate(knobs={}), verdict="kept", reason="improved"))
    with TrialStore.in_state_dir(tmp_path) as s:
        got = s.list(run_id=run)
        assert [x.number for x in got] == [1, 2]
        assert got[0].id == tid and got[0].gates[1].code == "within_noise"
        assert got[0].candidate.knobs == {"gpu0.power_limit_w": 600}
        assert got[0].measurements["incumbent"]["samples"] == [1.0, 2.0]
        assert [x.number for x in s.list(verdict="kept")] == [2]
        assert [x.number for x in s.list(limit=1)] == [2]
        assert s.runs()[0]["trials"] == 2


def test_a_reported_trial_survives_kill_9(tmp_path):
    code = f"""
import os, signal
from tuner.search.store import TrialStore
from tuner.trial import Candidate, Trial
s = TrialStore.in_state_dir({str(tmp_path)!r})
r = s.new_run("x")
s.add(Trial(run_id=r, number=1, candidate=Candidate(), verdict="kept", reason="improved"))
print("added", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == -9 and "added" in p.stdout
    with TrialStore.in_state_dir(tmp_path) as s:
        assert len(s.list()) == 1
