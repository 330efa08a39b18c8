"""`metaltune search host` on a simulated host, with each classical proposer starting from the
host's own state (unlocked clocks included: they have no point in the search grid)."""
from __future__ import annotations

import json

import pytest

from tests.simhelpers import REPO, run_cli
from tuner.sim.hostinit import init_host

pytestmark = pytest.mark.usefixtures("cli_env")
POLICY = str(REPO / "tuner/data/demo-policy.yaml")


@pytest.mark.parametrize("proposer", ["coordinate", "optuna", "grid", "random"])
def test_search_host_runs_from_the_hosts_own_state(capsys, tmp_path, proposer):
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "host", "--proposer", proposer,
                           "--budget", "4", "--workload", "sim", "--timeout", "1",
                           "--policy", POLICY, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["trials"] == 4
    assert res["start"]["gpu0.locked_clocks_mhz"] is None  # the driver's boost: unlocked
    # the first proposal is never the incumbent itself (a no-change trial)
    rc, out, _ = run_cli(capsys, "trials", "--json", "--limit", "0")
    first = json.loads(out)["trials"][0]
    assert first["reason"] != "duplicate"


@pytest.mark.parametrize("proposer", ["optuna", "random", "grid", "coordinate"])
def test_search_host_under_the_default_policy_never_proposes_a_refused_change(tmp_path, proposer):
    """The proposers draw inside the policy (power floor 75% of default, 150 W steps): no trial
    is spent on `policy_denied`, and the normal output is a summary a person reads."""
    from tests.simhelpers import SimCli

    mt = SimCli(tmp_path, "h200")
    r = mt("search", "host", "--budget", "12", "--proposer", proposer, "--timeout", "5")
    assert r.returncode == 0, r.stderr
    assert "12 trials" in r.stdout and "rejected: " in r.stdout
    assert "{'" not in r.stdout and "policy_denied" not in r.stdout, r.stdout  # no raw dict
    assert "gpu0.power_limit_w" in r.stdout and "best" in r.stdout
    trials = json.loads(mt("trials", "--json", "--limit", "0").stdout)["trials"]
    assert len(trials) == 12
    assert [t["reason"] for t in trials if t["reason"] == "policy_denied"] == []
    for t in trials:  # every value tried is inside the policy's floor and step from 700 W
        w = t["candidate"]["knobs"].get("gpu0.power_limit_w")
        assert w is None or 550 <= w <= 700, t["candidate"]
