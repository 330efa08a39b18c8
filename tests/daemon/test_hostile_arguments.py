"""The real daemon process under arguments meant to stall it: a 100,000-character profile name
(its error answer is redacted: the old URL regex took ~25 s on it, holding the GIL over every
answer and the health loop) and a FIFO as `profile_export`'s kernel table (the old loader opened
it for a blocking read and held a client slot for good). Each is answered promptly, exit 2, and
the daemon keeps serving."""
from __future__ import annotations

import os
import time

from tests.daemon.conftest import write_config


def test_a_huge_profile_name_and_a_fifo_table_are_answered_promptly(tmp_path, sim_host, start_daemon):
    d = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    d.wait_ready()

    t = time.monotonic()
    bad = d.call("verify", timeout=30, profile="a" * 100_000)
    took = time.monotonic() - t
    assert bad["ok"] is False and bad["exit_code"] == 2, bad
    assert took < 3.0, took
    assert len(bad["error"]) < 20_000 and "not found" in bad["error"]

    fifo = tmp_path / "table.json"
    os.mkfifo(fifo)
    t = time.monotonic()
    bad = d.call("profile_export", timeout=30, profile="h200", kernels=str(fifo))
    assert time.monotonic() - t < 3.0
    assert bad["ok"] is False and bad["exit_code"] == 2, bad
    assert "is a FIFO, expected a regular file" in bad["error"], bad

    assert d.call("status", timeout=10)["ok"]  # still serving
    assert d.stop() == 0
