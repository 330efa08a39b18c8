"""The kernel canary's incident log and cursor as hostile input (issue 33, items 4-6), through
the real daemon and CLI on a simulated host:

- a line of 10 KB of nested brackets is counted, logged and skipped: the incident after it is
  journalled by the daemon, and an apply's probation still rolls back on it;
- a canary incident is attributed only to the `kernels.table` change in force that names its
  kernel and was applied before it happened; otherwise it is journalled and nothing is rolled
  back (never the latest confirmed clocks or sysctls profile);
- a damaged `canary.cursor`, a FIFO there or at `canary.cursor.tmp` neither stops the daemon
  from starting, nor blocks its stop, nor freezes the health loop (a fatal Xid is rolled back).
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemon.conftest import (REPO, base_env, metaltune, power_limit_w, write_config,
                                   write_profile)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")

SHA = "cd" * 32
NESTED = b"[" * 10240 + b"\n"  # 10 KB: under the 16 KiB line bound, 10,000 levels deep


def _line(when: float, sha: str = SHA) -> bytes:
    """One incident line as kernelsearch.canary.append writes it."""
    return json.dumps({"v": 1, "kind": "canary_failure", "id": os.urandom(8).hex(), "time": when,
                       "family": "rmsnorm", "variant": f"src:{sha}", "source_sha256": sha,
                       "config": {}, "shape": [6, 64], "dtype": "float32",
                       "detail": "tolerance: rel-norm error 1 (bound 0.01)", "removed_entries": 1,
                       "quarantined": "quarantined", "max_abs_error": 2.5, "nonfinite": 0,
                       "pid": 4321}, sort_keys=True).encode() + b"\n"


def _append(state: Path, data: bytes) -> None:
    (state / "kernels").mkdir(parents=True, exist_ok=True)
    with open(state / "kernels" / "canary.jsonl", "ab") as f:
        f.write(data)


def _rows(state: Path, sql: str) -> list[dict]:
    c = sqlite3.connect(f"file:{state / 'journal.db'}?mode=ro", uri=True, timeout=30)
    c.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in c.execute(sql).fetchall()]
    finally:
        c.close()


def _canary_rows(state: Path) -> list[dict]:
    return _rows(state, "SELECT * FROM incidents WHERE type='canary_kernel' ORDER BY id")


def _wait(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _daemon_with_a_confirmed_power_profile(tmp_path, sim_host, start_daemon):
    d = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    d.wait_ready()
    r = d.call("apply", profile=str(write_profile(tmp_path / "p.yaml", 600)), probation_s=0.3)
    assert r["ok"], r
    assert power_limit_w(sim_host) == 600
    return d, r["result"]["transaction"]


# -- item 4: one nested line ------------------------------------------------------------------
def test_a_deeply_nested_line_is_skipped_and_the_next_incident_is_journalled(
        tmp_path, sim_host, start_daemon):
    state = tmp_path / "state"
    d, _ = _daemon_with_a_confirmed_power_profile(tmp_path, sim_host, start_daemon)
    _append(state, NESTED + _line(time.time()))
    (row,) = _wait(lambda: _canary_rows(state), 20, "the incident after the nested line")
    assert json.loads(row["data"])["source_sha256"] == SHA
    log = d.wait_log("nested more than", 10)
    assert "skipped" in log and "RecursionError" not in log
    # later lines are still read: the offset moved past both
    _append(state, _line(time.time(), "ef" * 32))
    _wait(lambda: len(_canary_rows(state)) == 2, 20, "a second incident")
    assert d.stop() == 0


def test_an_apply_on_probation_still_rolls_back_after_a_nested_line(tmp_path, sim_host):
    state = tmp_path / "state"
    env = base_env(tmp_path / "run")
    args = ["--backend", "sim", "--sim-root", str(sim_host), "--state-dir", str(state)]
    prof = write_profile(tmp_path / "p.yaml", 600)
    apply = subprocess.Popen([sys.executable, "-m", "tuner", *args, "apply", str(prof),
                              "--probation", "20"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: power_limit_w(sim_host) == 600 or apply.poll() is not None, 60,
              "the profile applied")
        time.sleep(0.5)  # its monitors armed
        _append(state, NESTED + _line(time.time()))
        out, err = apply.communicate(timeout=60)
    finally:
        if apply.poll() is None:
            apply.kill()
    assert apply.returncode == 1 and "kernel canary" in err, (apply.returncode, out, err)
    assert power_limit_w(sim_host) == 700  # rolled back, not confirmed


# -- item 5: attribution ----------------------------------------------------------------------
def test_a_canary_line_that_names_no_table_in_force_rolls_nothing_back(
        tmp_path, sim_host, start_daemon):
    """A clocks/power profile is confirmed; one line is dated before it was applied, one names
    a kernel no table in force holds. Both are journalled; the power profile stays."""
    state = tmp_path / "state"
    d, txn = _daemon_with_a_confirmed_power_profile(tmp_path, sim_host, start_daemon)
    _append(state, _line(time.time() - 3600) + _line(time.time()))
    rows = _wait(lambda: [r for r in _canary_rows(state) if r["action"]]
                 if len(_canary_rows(state)) == 2 else None, 20, "both incidents")
    assert len(rows) == 2
    for r in rows:
        assert r["txn_id"] is None and r["knob"] in (None, ""), r
        assert "no kernel table" in r["action"] and not r["action"].startswith("rolled"), r
    time.sleep(1.0)  # several health ticks
    assert power_limit_w(sim_host) == 600
    assert _rows(state, "SELECT state FROM txns WHERE id=?".replace("?", str(txn))) == \
        [{"state": "confirmed"}]
    assert not _rows(state, "SELECT * FROM txns WHERE label LIKE 'rollback to baseline%'")
    assert d.stop() == 0


def test_a_canary_line_is_attributed_to_the_table_that_names_it_by_time(
        tmp_path, sim_host, start_daemon):
    """A profile with a kernel table and a power limit is confirmed. A line naming its kernel
    but dated before the apply is journalled only; the same kernel caught after it rolls the
    table back (the knob it names is `kernels.table`)."""
    from kernelsearch.store import SourceStore
    from tests.kernelsearch.test_store import ACCEPTED, SRC

    state = tmp_path / "state"
    from importlib.metadata import version  # kernelsearch.store.environment("cpu"), sans torch

    env = {"gpu": "cpu (triton interpreter)", "driver": "", "torch": version("torch"),
           "triton": version("triton")}
    sha = SourceStore(state / "kernels" / "sources").put("rmsnorm", SRC, {}, ACCEPTED, env=env).sha256
    prof = tmp_path / "k.yaml"
    prof.write_text(json.dumps({"name": "k", "knobs": {"gpu0.power_limit_w": 600}, "kernels": {
        "version": 1, "device": "cpu", "meta": {}, "entries": [
            {"family": "rmsnorm", "dtype": "float32", "match": {"cols": 64},
             "ranges": {"rows": [1, 4096]}, "variant": f"src:{sha}", "config": {}}]}}))
    before = time.time() - 5
    d = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    d.wait_ready()
    r = d.call("apply", profile=str(prof), probation_s=0.3)
    assert r["ok"], r
    active = state / "kernels" / "active.json"
    assert active.exists() and power_limit_w(sim_host) == 600
    _append(state, _line(before, sha))
    (row,) = _wait(lambda: [x for x in _canary_rows(state) if x["action"]], 20, "the early line")
    assert row["txn_id"] is None and "no kernel table" in row["action"], row
    time.sleep(1.0)
    assert active.exists() and power_limit_w(sim_host) == 600
    _append(state, _line(time.time(), sha))
    _wait(lambda: not active.exists(), 20, "the table rolled back")
    rows = _canary_rows(state)
    assert rows[-1]["txn_id"] == r["result"]["transaction"] and rows[-1]["knob"] == "kernels.table"
    assert d.stop() == 0


# -- item 6: the cursor files -----------------------------------------------------------------
@pytest.mark.parametrize("damage", ["nested", "overflow", "binary"])
def test_a_damaged_cursor_does_not_stop_the_daemon(tmp_path, sim_host, start_daemon, damage):
    state = tmp_path / "state"
    (state / "kernels").mkdir(parents=True)
    (state / "kernels" / "canary.cursor").write_bytes(
        {"nested": b"[" * 4000, "overflow": b'{"ino": 1e400, "offset": 1e400}',
         "binary": os.urandom(4096)}[damage])
    _append(state, _line(time.time()))
    d = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    d.wait_ready()
    # read from the start of the log instead: the line is journalled (nothing in force)
    _wait(lambda: _canary_rows(state), 20, "the log read from its start")
    assert d.stop() == 0


def test_a_fifo_cursor_neither_blocks_start_up_nor_stop(tmp_path, sim_host, start_daemon):
    state = tmp_path / "state"
    (state / "kernels").mkdir(parents=True)
    os.mkfifo(state / "kernels" / "canary.cursor")
    d = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    try:
        d.wait_ready(30)
    finally:
        d.proc.send_signal(signal.SIGTERM)
        try:
            rc = d.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = None
    assert rc == 0, d.log()[-3000:]


def test_a_fifo_cursor_tmp_does_not_freeze_the_health_loop(tmp_path, sim_host, start_daemon):
    state = tmp_path / "state"
    d, _ = _daemon_with_a_confirmed_power_profile(tmp_path, sim_host, start_daemon)
    tmp = state / "kernels" / "canary.cursor.tmp"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        tmp.unlink()
    os.mkfifo(tmp)
    _append(state, _line(time.time()))  # read, then the cursor is saved through the FIFO
    _wait(lambda: _canary_rows(state), 20, "the canary line journalled")
    metaltune("sim", "inject", str(sim_host), "xid", "79", env=base_env(tmp_path / "run"))
    _wait(lambda: power_limit_w(sim_host) == 700, 20, "the Xid rolled back")
    _append(state, _line(time.time(), "ef" * 32))  # and the loop goes on reading
    _wait(lambda: len(_canary_rows(state)) == 2, 20, "a second incident")
    assert d.stop() == 0
