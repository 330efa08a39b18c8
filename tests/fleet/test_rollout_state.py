"""Rollout planning and its durable state: waves, resume rules, one controller at a time."""
import json
from pathlib import Path

import pytest

from tuner.errors import BadInput, OperationFailed
from tuner.fleet.rollout import Options, RolloutState, plan_waves, prepare_resume


def test_waves_canary_first_then_fixed_size():
    names = ["a", "b", "c", "d", "e"]
    assert plan_waves(names, 1, 2) == [["a"], ["b", "c"], ["d", "e"]]
    assert plan_waves(names, 2, 0) == [["a", "b"], ["c", "d", "e"]]
    assert plan_waves(names, 0, 0) == [names]
    assert plan_waves(["a"], 3, 1) == [["a"]]
    with pytest.raises(BadInput):
        plan_waves(names, -1, 0)


def _state(tmp_path: Path) -> RolloutState:
    prof = tmp_path / "p.yaml"
    prof.write_text("knobs: {}\n")
    return RolloutState.create(tmp_path / "s.json", prof, str(prof), tmp_path / "inv.yaml",
                               plan_waves(["a", "b", "c"], 1, 0), Options())


def test_every_transition_is_on_disk_with_its_history(tmp_path):
    st = _state(tmp_path)
    st.set_host("a", "applied", "applied; health check", applied=True)
    st.set_host("a", "done", "applied and healthy")
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["hosts"]["a"]["state"] == "done" and doc["hosts"]["a"]["applied"] is True
    assert [h["state"] for h in doc["hosts"]["a"]["history"]] == ["applied", "done"]
    assert doc["profile_sha256"] and doc["waves"] == [["a"], ["b", "c"]]
    assert not list(tmp_path.glob("*.tmp"))


def test_halted_rollout_resumes_only_when_asked(tmp_path):
    st = _state(tmp_path)
    st.set_host("a", "rolled_back", "rolled back (was: Xid 79)")
    st.doc.update(status="halted", halt_reason="a: Xid 79")
    st.save()
    st = RolloutState.load(tmp_path / "s.json")
    with pytest.raises(BadInput, match="--resume-halted"):
        prepare_resume(st, resume_halted=False)
    prepare_resume(st, resume_halted=True)
    assert st.doc["status"] == "running" and st.host("a")["state"] == "pending"
    assert json.loads((tmp_path / "s.json").read_text())["hosts"]["a"]["state"] == "pending"


def test_one_controller_per_rollout(tmp_path):
    st = _state(tmp_path)
    held = st.lock()
    try:
        with pytest.raises(OperationFailed, match="another `fleet apply`"):
            RolloutState.load(tmp_path / "s.json").lock()
    finally:
        held.close()
    RolloutState.load(tmp_path / "s.json").lock().close()


def test_state_file_of_another_kind_is_bad_input(tmp_path):
    (tmp_path / "x.json").write_text('{"schema": "something/else"}')
    with pytest.raises(BadInput, match="field schema"):
        RolloutState.load(tmp_path / "x.json")
