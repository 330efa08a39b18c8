"""The monitor that reads the kernel canary's incident log (STATE_DIR/kernels/canary.jsonl) as
untrusted input: what kernelsearch.canary writes becomes one fatal `canary_kernel` incident
naming the digest; a line cut short is read once complete; garbage, oversized and forged lines
are skipped; the daemon's cursor survives a restart (nothing journalled twice, nothing missed);
a transaction's monitor sees only what is new since it was armed; a symlink is never followed."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernelsearch import canary
from kernelsearch.canary_reader import KernelCanaryMonitor

SHA = "ab" * 32


def _incident(**kw) -> dict:
    return {"kind": "canary_failure", "family": "rmsnorm", "variant": f"src:{SHA}",
            "source_sha256": SHA, "config": {}, "shape": [6, 64], "dtype": "float32",
            "detail": "tolerance: rel-norm error 1 (bound 0.01)", "removed_entries": 1,
            "quarantined": "no store", "max_abs_error": 2.5, "nonfinite": 0,
            "id": os.urandom(8).hex(), "time": 1.0e9, "pid": 1234, **kw}


@pytest.fixture
def state(tmp_path) -> Path:
    (tmp_path / "kernels").mkdir()
    return tmp_path


def _log(state: Path) -> Path:
    return state / "kernels" / canary.LOG_NAME


def test_a_line_written_by_the_canary_becomes_a_fatal_incident_naming_the_digest(state):
    assert canary.log_path(state / "kernels" / "sources") == _log(state)
    m = KernelCanaryMonitor(state)
    m.arm()
    assert m.poll() == []
    inc = _incident()
    canary.append(_log(state), inc)
    (got,) = m.poll()
    assert got.type == "canary_kernel" and got.fatal and got.reason == "canary_failed"
    assert got.data["source_sha256"] == SHA and got.data["id"] == inc["id"]
    assert got.data["shape"] == [6, 64] and got.data["max_abs_error"] == 2.5
    assert SHA[:12] in got.detail and "max abs error 2.5" in got.detail
    assert got.data["store_quarantine"] == "not in this host's store"
    assert m.poll() == []  # read once


def test_a_shipped_variants_removal_is_an_incident_too(state):
    """dispatch writes a null digest for a shipped variant (no stored source): that line was
    skipped as "not an incident", so a removal of a shipped kernel reached no journal and no
    `status` (issue 42, item 4)."""
    from kernelsearch.canary_reader import recent

    m = KernelCanaryMonitor(state)
    m.arm()
    inc = _incident(variant="flat", family="swiglu", source_sha256=None, dtype="float16")
    canary.append(_log(state), inc)
    (got,) = m.poll()
    assert got.fatal and got.data["source_sha256"] == "" and "swiglu flat" in got.detail
    assert m.skipped == 0
    (shown,) = recent(state)
    assert shown["id"] == inc["id"] and shown["variant"] == "flat"


def test_partial_garbage_and_forged_lines(state):
    m = KernelCanaryMonitor(state)
    m.arm()
    good = json.dumps({"v": 1, **_incident()})
    with open(_log(state), "ab") as f:
        f.write(b"not json\n")
        f.write(json.dumps({"v": 1, **_incident(kind="xid")}).encode() + b"\n")  # not ours
        f.write(json.dumps({"v": 1, **_incident(shape="rm -rf /")}).encode() + b"\n")
        f.write(b"x" * (canary.MAX_LINE + 10) + b"\n")
        f.write(good[:40].encode())  # the writer is mid-line
    assert m.poll() == []
    with open(_log(state), "ab") as f:
        f.write(good[40:].encode() + b"\n")
    (got,) = m.poll()
    assert got.data["source_sha256"] == SHA


def test_the_daemon_cursor_survives_a_restart_and_a_transaction_skips_the_backlog(state):
    first, second = _incident(), _incident()
    canary.append(_log(state), first)
    d = KernelCanaryMonitor(state, cursor=True)
    d.arm()  # no cursor yet: the whole log (written while no daemon ran)
    assert [i.data["id"] for i in d.poll()] == [first["id"]]
    txn = KernelCanaryMonitor(state)
    txn.arm()
    canary.append(_log(state), second)
    assert [i.data["id"] for i in txn.poll()] == [second["id"]]
    d2 = KernelCanaryMonitor(state, cursor=True)  # the daemon restarted
    d2.arm()
    assert [i.data["id"] for i in d2.poll()] == [second["id"]]
    assert d2.poll() == []
    # the log replaced (rotated): read from its start
    _log(state).unlink()
    third = _incident()
    canary.append(_log(state), third)
    assert [i.data["id"] for i in d2.poll()] == [third["id"]]


def test_a_symlinked_log_is_never_followed(state, tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    canary.append(target, _incident())
    _log(state).symlink_to(target)
    m = KernelCanaryMonitor(state, cursor=True)
    m.arm()
    with pytest.raises(OSError):
        m.poll()
    with pytest.raises(OSError):  # nor does the canary write through one
        canary.append(_log(state), _incident())
    assert len(target.read_text().splitlines()) == 1


def test_a_log_setting_of_off_writes_nothing(state, monkeypatch):
    monkeypatch.setenv(canary.LOG_ENV, "off")
    assert canary.log_path(state / "kernels" / "sources") is None
    monkeypatch.setenv(canary.LOG_ENV, str(state / "x.jsonl"))
    assert canary.log_path() == state / "x.jsonl"


def test_a_nested_line_is_counted_and_skipped_before_it_is_parsed(state):
    """10 KB of nested brackets (issue 33): refused by its depth, never handed to the parser
    (its RecursionError used to leave the offset where it was, blinding the monitor)."""
    m = KernelCanaryMonitor(state)
    m.arm()
    inc = _incident()
    with open(_log(state), "ab") as f:
        f.write(b"[" * 10240 + b"\n" + b'{"a":' * 2000 + b"\n")
    canary.append(_log(state), inc)
    (got,) = m.poll()
    assert got.data["id"] == inc["id"] and m.skipped == 2
    assert m.poll() == []
