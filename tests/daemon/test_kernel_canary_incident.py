"""The kernel canary's incidents reach the safety journal (issue 24): a profile installs a table
whose stored source computes right for N calls and then wrong (its launch swapped for one that
doubles the output, as a guard hole or a silent device fault would); a model process (this
test's, a patched tiny Llama under Triton's interpreter) runs it; its canary catches the wrong
output, removes the entry, quarantines the source and appends the incident to
STATE_DIR/kernels/canary.jsonl. Then, through the real CLI and daemon on a simulated host:

- with the daemon running and the profile confirmed, the daemon journals a fatal
  `canary_kernel` incident naming the digest, family, shape and error against the
  `kernels.table` change, rolls the host back to its baseline (the table file goes), and
  `metaltune status --json` shows it;
- during an apply's probation, the apply's own monitors see it and roll the profile back;

and the model keeps running on the fallback with the plain model's logits."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (its jit reads it)

import torch  # noqa: E402
import yaml  # noqa: E402

from kernelsearch import dispatch
from kernelsearch.integrations import transformers as mt
from kernelsearch.store import SourceStore, environment
from tests.daemon.conftest import REPO, base_env, metaltune, write_config
from tests.kernelsearch.canary_helpers import go_wrong  # noqa: E402
from tests.kernelsearch.test_store import ACCEPTED, SRC

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")

N = 8  # honest calls before it goes wrong


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KERNELSEARCH_CANARY_RATE", "0.25")
    monkeypatch.delenv("KERNELSEARCH_CANARY_LOG", raising=False)
    yield
    dispatch.install(None)
    dispatch._incidents.clear()  # the process's record: the next test starts with none


@pytest.fixture
def llama(_interpreter):
    from tuner.workloads.hf import HFModel

    m = HFModel("tiny-llama")
    ids = torch.randint(3, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = m.model(ids).logits
    return m, ids, plain


def _profile(path: Path, sha: str, cols: int) -> Path:
    path.write_text(yaml.safe_dump({"name": path.stem, "knobs": {}, "kernels": {
        "version": 1, "device": "cpu", "meta": {}, "entries": [
            {"family": "rmsnorm", "dtype": "float32", "match": {"cols": cols},
             "ranges": {"rows": [1, 4096]}, "variant": f"src:{sha}", "config": {}}]}}))
    return path


def _store(state: Path) -> tuple[SourceStore, str]:
    st = SourceStore(state / "kernels" / "sources")
    return st, st.put("rmsnorm", SRC, {}, ACCEPTED, env=environment("cpu")).sha256


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _run_until_caught(state: Path, llama) -> dict:
    """The model process: install the applied table from the state dir, run N honest calls
    (replayed and agreeing), then let the source go wrong until its canary catches it. Returns
    the incident; the model is left patched, on the fallback."""
    m, ids, plain = llama
    seen = len(dispatch.incidents())  # the process's earlier ones (another test's)
    dispatch.install(state / "kernels" / "active.json", store=state / "kernels" / "sources")
    assert dispatch.refused() == {} and len(dispatch.installed().entries) == 1
    mt.patch(m.model)
    calls = 0
    while calls < N:
        k0 = dispatch.stats()["kernel"]
        assert torch.allclose(_logits(m.model, ids), plain, atol=1e-4)
        calls += dispatch.stats()["kernel"] - k0
    assert dispatch.incidents()[seen:] == []
    undo = go_wrong()  # from now on the launch writes twice the right answer
    try:
        for _ in range(16):
            _logits(m.model, ids)
            if dispatch.incidents()[seen:]:
                break
    finally:
        undo()
    (inc,) = dispatch.incidents()[seen:]
    return inc


def _still_runs_on_the_fallback(llama) -> None:
    m, ids, plain = llama
    try:
        s0 = dispatch.stats()
        assert torch.allclose(_logits(m.model, ids), plain, atol=1e-4)
        s1 = dispatch.stats()
        assert s1["kernel"] == s0["kernel"] and s1["fallback"] > s0["fallback"]
    finally:
        mt.unpatch(m.model)


def _journal_incidents(state: Path) -> list[dict]:
    import sqlite3

    c = sqlite3.connect(f"file:{state / 'journal.db'}?mode=ro", uri=True, timeout=30)
    c.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in c.execute("SELECT * FROM incidents WHERE type='canary_kernel'")]
    finally:
        c.close()
    for r in rows:
        r["data"] = json.loads(r["data"] or "{}")
    return rows


def _wait(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _sim_args(tmp: Path) -> list[str]:
    return ["--backend", "sim", "--sim-root", str(tmp / "sim"), "--state-dir", str(tmp / "state")]


def test_the_daemon_journals_a_canary_incident_and_rolls_the_table_back(
        tmp_path, sim_host, start_daemon, llama):
    state = tmp_path / "state"
    env = base_env(tmp_path / "run")
    store, sha = _store(state)
    prof = _profile(tmp_path / "k.yaml", sha, llama[0].config.hidden_size)
    metaltune(*_sim_args(tmp_path), "apply", str(prof), "--probation", "0", env=env)
    active = state / "kernels" / "active.json"
    assert json.loads(active.read_text())["meta"]["profile"] == "k"
    d = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    d.wait_ready()
    assert "KernelCanaryMonitor" in d.call("daemon")["result"]["monitors"]

    inc = _run_until_caught(state, llama)
    assert inc["source_sha256"] == sha and inc["log"] == str(state / "kernels" / "canary.jsonl")
    assert inc["max_abs_error"] > 0.1 and inc["shape"][-1] == llama[0].config.hidden_size

    (row,) = _wait(lambda: _journal_incidents(state), 30, "the canary incident in the journal")
    assert row["severity"] == "fatal" and row["source"] == "kernel_canary"
    assert row["knob"] == "kernels.table" and row["txn_id"] is not None
    assert row["data"]["source_sha256"] == sha and row["data"]["family"] == "rmsnorm"
    assert row["data"]["shape"] == inc["shape"] and row["data"]["id"] == inc["id"]
    assert row["data"]["max_abs_error"] == pytest.approx(inc["max_abs_error"])
    assert sha[:12] in row["detail"] and "max abs error" in row["detail"]
    # the safety layer's handling of a fatal incident with a confirmed change in force
    _wait(lambda: not active.exists(), 30, "the rollback to baseline to remove the table")
    (row,) = _wait(lambda: [r for r in _journal_incidents(state)
                            if (r["action"] or "").startswith("rolled back")], 30, "the action")
    assert store.record(sha).quarantined  # the model process quarantined it in the store
    st = json.loads(d.cli("status", "--json").stdout)
    (shown,) = [i for i in st["incidents"] if i["type"] == "canary_kernel"]
    assert shown["data"]["source_sha256"] == sha and shown["knob"] == "kernels.table"
    assert st["current"]["kernels.table"] == "none"
    _still_runs_on_the_fallback(llama)
    # a restart reads the log again from its cursor: the incident is not journalled twice
    d.stop()
    d2 = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    d2.wait_ready()
    time.sleep(1.0)
    assert len(_journal_incidents(state)) == 1


def test_an_apply_on_probation_rolls_back_when_the_canary_catches_its_kernel(tmp_path, llama):
    assert subprocess.run([sys.executable, "-m", "tuner", "sim", "init", str(tmp_path / "sim")],
                          cwd=REPO, env=base_env(tmp_path / "run"), capture_output=True).returncode == 0
    state = tmp_path / "state"
    store, sha = _store(state)
    prof = _profile(tmp_path / "k.yaml", sha, llama[0].config.hidden_size)
    active = state / "kernels" / "active.json"
    apply = subprocess.Popen([sys.executable, "-m", "tuner", *_sim_args(tmp_path), "apply",
                              str(prof), "--probation", "120"], cwd=REPO,
                             env=base_env(tmp_path / "run"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: active.exists() or apply.poll() is not None, 120, "the table installed")
        assert active.exists(), apply.communicate()
        inc = _run_until_caught(state, llama)
        out, err = apply.communicate(timeout=60)
    finally:
        if apply.poll() is None:
            apply.kill()
    assert apply.returncode == 1 and "kernel canary" in err and sha[:12] in err, (out, err)
    assert not active.exists()
    (row,) = _journal_incidents(state)
    assert row["data"]["id"] == inc["id"] and row["knob"] == "kernels.table"
    assert row["severity"] == "fatal"
    _still_runs_on_the_fallback(llama)
