"""What `apply` and `rollback` print about what they did, through the real CLI (issue 33, item 15):
`rollback` during a probation said "nothing to do" though it undid the change; Ctrl-C in `apply`
exited 130 silently; the failed apply after an Xid did not mention the quarantine; the table after
"applied" still showed rows `drifted` with the old values."""
from __future__ import annotations

import json
import signal
import time

from tests.simhelpers import SimCli


def _wait_probation(mt: SimCli, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = mt("status", "--json")
        if r.returncode == 0 and (json.loads(r.stdout)["pending"] or {}).get("state") == "probation":
            return
        time.sleep(0.3)
    raise AssertionError("no transaction in probation")


def test_rollback_in_probation_says_it_undid_the_change(tmp_path):
    mt = SimCli(tmp_path, "h200")
    p = mt.popen("apply", "h200", "--probation", "300")
    try:
        _wait_probation(mt)
        r = mt("rollback")
        p.communicate(timeout=60)
    finally:
        p.kill()
    assert r.returncode == 0, r.stderr
    assert "rolled back 1 unconfirmed transaction(s): 1 (rolled_back)" in r.stdout, r.stdout
    assert "nothing to do" not in r.stdout
    s = json.loads(mt("status", "--json").stdout)
    assert s["current"]["os.numa_balancing"] == s["baseline"]["os.numa_balancing"] == 1
    # with nothing to undo it still says so
    r = mt("rollback")
    assert r.returncode == 0 and "restored to baseline: nothing to do" in r.stdout, r.stdout


def test_ctrl_c_in_apply_says_it_rolled_back(tmp_path):
    mt = SimCli(tmp_path, "h200")
    p = mt.popen("apply", "h200", "--probation", "300")
    try:
        _wait_probation(mt)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert "interrupted (Ctrl-C); transaction 1 rolled back" in err, err
    assert "Traceback" not in err
    s = json.loads(mt("status", "--json").stdout)  # and it did, at once (not at the deadline)
    assert s["pending"] is None and s["recent"][0]["state"] == "rolled_back", s["recent"]
    assert s["current"]["os.numa_balancing"] == s["baseline"]["os.numa_balancing"]


def test_an_xid_in_probation_names_the_quarantine_and_how_to_see_it(tmp_path):
    mt = SimCli(tmp_path, "h200")
    p = mt.popen("apply", "h200", "--probation", "300")
    try:
        _wait_probation(mt)
        assert mt("sim", "inject", str(mt.root), "xid", "79").returncode == 0
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("metaltune: error: apply h200: instability:"), err
    assert "transaction 1 rolled back" in last and "quarantined (entry #1)" in last, last
    assert "`metaltune quarantine list`" in last and "`metaltune quarantine clear 1`" in last, last
    # following it: the list shows that entry, the clear lets the profile be applied again
    q = mt("quarantine", "list", "--json")
    assert [e["id"] for e in json.loads(q.stdout)["quarantine"]] == [1], q.stdout
    assert mt("quarantine", "clear", "1").returncode == 0
    r = mt("apply", "h200", "--probation", "0")
    assert r.returncode == 0 and "applied (transaction" in r.stdout, r.stdout + r.stderr


def test_the_table_after_applied_shows_the_values_now_in_force(tmp_path):
    mt = SimCli(tmp_path, "h200")
    r = mt("apply", "h200", "--probation", "0", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "applied (transaction 1)" in r.stdout
    row = next(ln for ln in r.stdout.splitlines() if "os.numa_balancing" in ln)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:4] == ["os.numa_balancing", "applied", "0", "0"], row
    assert " drifted " not in r.stdout, r.stdout
    # and what verify then reads agrees with the table
    v = json.loads(mt("verify", "h200", "--json").stdout)
    assert {k["knob"]: k["status"] for k in v["knobs"]}["os.numa_balancing"] == "ok"
