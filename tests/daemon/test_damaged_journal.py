"""A damaged journal is not taken for a clean one (issue 15, item 2), end to end through the
daemon and the CLI: a change is in force, the daemon dies, the journal is emptied; the daemon
then refuses to start, the CLI refuses to record anything over the unknown state (exit 1, one
line naming the way out), and `recover --from-defaults` brings the host back to its driver
defaults, after which the daemon starts and works as before."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from tests.daemon.conftest import power_limit_w, write_config, write_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")


def _kill_with_watchdog(d, pending: dict) -> None:
    """A crash as systemd sees it: the daemon and its cgroup (the probation watchdog) at once."""
    os.kill(d.pid, signal.SIGKILL)
    if pending.get("watchdog_pid"):
        try:
            os.kill(pending["watchdog_pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    d.proc.wait()


def _one_line_error(r) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


def test_emptied_journal_with_a_change_in_probation(tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    prof = write_profile(tmp_path / "p.yaml", 600)
    threading.Thread(target=lambda: _ignore(lambda: d.call("apply", profile=str(prof), probation_s=60)),
                     daemon=True).start()
    d.wait_log("event=change.applied")
    pending = d.call("status")["result"]["pending"]
    assert pending["state"] == "probation" and power_limit_w(sim_host) == 600
    _kill_with_watchdog(d, pending)

    journal = tmp_path / "state" / "journal.db"
    os.truncate(journal, 0)  # what a careless `> journal.db` or a bad restore leaves

    # the daemon refuses to start: its recovery would find "nothing" and keep 600 as if tuned
    d2 = start_daemon(cfg)
    assert d2.proc.wait(timeout=60) == 1, d2.log()
    log = d2.log()
    assert "event=daemon.failed" in log and "is empty (0 bytes)" in log
    assert "gpu0.power_limit_w = 600" in log and "recover --from-defaults" in log
    assert power_limit_w(sim_host) == 600

    # the CLI (no daemon) refuses to record a new baseline over it, and says what to do
    other = write_profile(tmp_path / "q.yaml", 650)
    err = _one_line_error(d2.cli("--state-dir", str(tmp_path / "state"), "--backend", "sim",
                                 "--sim-root", str(sim_host), "apply", str(other), "--probation", "0.2",
                                 check=False))
    assert "baseline --accept-current" in err and "recover --from-defaults" in err
    assert power_limit_w(sim_host) == 600
    _one_line_error(d2.cli("--state-dir", str(tmp_path / "state"), "--backend", "sim",
                           "--sim-root", str(sim_host), "status", check=False))

    # the way out: the driver's defaults, journalled in a new journal; the old one kept
    r = d2.cli("--state-dir", str(tmp_path / "state"), "--backend", "sim", "--sim-root", str(sim_host),
               "recover", "--from-defaults")
    assert "gpu0.power_limit_w" in r.stdout and "damaged journal.db kept as" in r.stdout
    assert power_limit_w(sim_host) == 700
    assert list((tmp_path / "state").glob("journal.db.damaged-*"))

    # and the daemon works again on the new journal: baseline 700, apply, rollback
    d3 = start_daemon(cfg)
    d3.wait_ready()
    st = d3.call("status")["result"]
    assert st["baseline"]["gpu0.power_limit_w"] == 700 and st["pending"] is None
    assert d3.call("apply", profile=str(other), probation_s=0.3)["ok"]
    assert power_limit_w(sim_host) == 650
    assert d3.call("rollback")["ok"] and power_limit_w(sim_host) == 700
    assert d3.stop() == 0


def _ignore(fn) -> None:
    try:
        fn()
    except (ValueError, OSError):
        pass  # the daemon is killed under the request: no answer comes
