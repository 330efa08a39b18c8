"""`metaltune set KNOB VALUE`: one setting through the same path as `apply` (domain, policy,
journal, probation, rollback): a dry run writes nothing, a set is journalled and undone by
`rollback`, never becomes the active profile, and bad input or a policy refusal changes nothing."""
from __future__ import annotations

import json

from safety import Journal
from tests.simhelpers import SimCli, host_digest


def _power(mt: SimCli) -> int:
    knobs = json.loads(mt("host", "--json").stdout)["knobs"]
    return next(k["value"] for k in knobs if k["name"] == "gpu0.power_limit_w")


def test_set_one_knob_through_the_safety_layer(tmp_path):
    mt = SimCli(tmp_path, "h200")
    before = host_digest(mt.root)
    r = mt("set", "gpu0.power_limit_w", "650", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["changes"] == {"gpu0.power_limit_w": 650} and res["plan"][0]["policy"] == "allowed"
    assert host_digest(mt.root) == before

    r = mt("set", "gpu0.power_limit_w", "650", "--probation", "0")
    assert r.returncode == 0, r.stderr
    assert "applied (transaction" in r.stdout
    assert _power(mt) == 650
    j = Journal(mt.state / "journal.db")
    txn = j.txns(1)[0]
    j.close()
    assert txn["label"] == "set gpu0.power_limit_w=650" and txn["state"] == "confirmed"
    assert json.loads(mt("status", "--json").stdout)["active_profile"] is None

    assert mt("rollback").returncode == 0
    assert _power(mt) == 700


def test_set_refuses_bad_input_and_policy_without_writing(tmp_path):
    mt = SimCli(tmp_path, "h200")
    before = host_digest(mt.root)
    for args, rc, says in ((["gpu0.power_limt_w", "650"], 2, "no such knob"),
                           (["gpu0.power_limit_w", "5000"], 2, "outside [200, 700]"),
                           (["gpu0.power_limit_w", "{a: 1}"], 2, "expected a number"),
                           (["gpu0.power_limit_w", "300"], 1, "the policy refuses")):
        r = mt("set", *args)
        assert r.returncode == rc and says in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert host_digest(mt.root) == before
