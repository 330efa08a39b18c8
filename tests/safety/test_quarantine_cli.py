"""Quarantine is not a one-way door: after an Xid rolls an apply back, `apply --dry-run` says
the change set is quarantined, `apply` refuses naming the way out, `quarantine list` shows the
entry and `quarantine clear ID` (journalled) lets it be tried again."""
from __future__ import annotations

import json
import time

from safety import Journal
from tests.simhelpers import SimCli


def _xid_during_apply(mt: SimCli) -> tuple[int, str]:
    p = mt.popen("apply", "h200", "--probation", "120")
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            s = json.loads(mt("status", "--json").stdout)
            if s["pending"] and s["pending"]["state"] == "probation":
                break
            time.sleep(0.3)
        r = mt("sim", "inject", str(mt.root), "xid", "79")
        assert r.returncode == 0, r.stderr
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    return p.returncode, err


def test_quarantine_list_dry_run_refusal_and_clear(tmp_path):
    mt = SimCli(tmp_path, "h200")
    assert "nothing is quarantined" in mt("quarantine", "list").stdout
    rc, err = _xid_during_apply(mt)
    assert rc == 1 and "rolled back" in err, err

    q = json.loads(mt("quarantine", "list", "--json").stdout)["quarantine"]
    assert len(q) == 1 and "xid" in q[0]["reason"].lower() and q[0]["txn"] == 1
    assert q[0]["knobs"]["os.numa_balancing"] == 0
    text = mt("quarantine", "list").stdout
    assert "os.numa_balancing=0" in text and "quarantine clear" in text

    d = json.loads(mt("apply", "h200", "--dry-run", "--json").stdout)
    pols = {it["policy"].split(":")[0] for it in d["plan"] if it["status"] == "drifted"}
    assert pols == {"quarantined"} and d["policy_summary"] == {"quarantined": len(d["changes"])}
    dry = mt("apply", "h200", "--dry-run")
    assert "quarantined" in dry.stdout and "allowed" not in dry.stdout

    a = mt("apply", "h200", "--probation", "0")
    assert a.returncode == 1
    assert f"metaltune quarantine clear {q[0]['id']}" in a.stderr and "quarantine list" in a.stderr

    assert mt("quarantine", "clear").returncode == 2  # neither ids nor --all
    assert mt("quarantine", "clear", "99").returncode == 1  # no such entry: nothing cleared
    c = mt("quarantine", "clear", str(q[0]["id"]))
    assert c.returncode == 0 and f"cleared quarantine #{q[0]['id']}" in c.stdout, c.stderr
    assert json.loads(mt("quarantine", "list", "--json").stdout)["quarantine"] == []
    j = Journal(mt.state / "journal.db")
    rec = j.txns(1)[0]  # the operator's decision is in the journal, with what was lifted
    assert rec["label"].startswith("quarantine cleared") and "xid" in rec["reason"].lower()
    d = json.loads(mt("apply", "h200", "--dry-run", "--json").stdout)
    assert {it["policy"] for it in d["plan"] if it["status"] == "drifted"} == {"allowed"}
