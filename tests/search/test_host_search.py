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
