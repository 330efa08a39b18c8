"""`--objective power-capped` holds every board on the host to the budget (issue 42 item 7),
through the real CLI on simulated H200s: a power limit left out of `--knob` is brought within
the budget before the search (and the output says so), with one GPU and with two; the watts that
decide are each board's, not their mean; a budget no board can reach is refused naming the board."""
from __future__ import annotations

import json

import pytest

from tests.simhelpers import PERMISSIVE, run_cli
from tuner.sim.hostinit import init_host
from tuner.sim.state import SimState

pytestmark = pytest.mark.usefixtures("cli_env")


def _host(tmp_path, gpus):
    return str(init_host(tmp_path / "h200", "h200", gpus=gpus, seed=1, os_tree=False))


def _limits(root):
    return [g["power_limit_mw"] for g in SimState(root).read()["gpus"]]


def _search(capsys, root, *args):
    return run_cli(capsys, "--sim-root", root, "search", "host", "--budget", "4",
                   "--workload", "sim", "--timeout", "0.5", "--policy", PERMISSIVE, "--seed", "2",
                   "--objective", "power-capped", "--power-budget", "600", *args)


def test_only_locked_clocks_selected_still_brings_the_board_under_budget(capsys, tmp_path):
    root = _host(tmp_path, 1)
    assert _limits(root) == [700_000]
    rc, out, err = _search(capsys, root, "--knob", "gpu0.locked_clocks_mhz")
    assert rc == 0, err
    assert _limits(root)[0] <= 600_000
    assert "brought within the budget before the search: gpu0.power_limit_w 700" in out, out
    rc, out, _ = run_cli(capsys, "trials", "--json", "--limit", "0")
    for t in json.loads(out)["trials"]:
        assert all(w <= 600 for w in (t["energy"].get("watts") or {}).values()), t["energy"]


def test_two_gpus_one_selected_the_other_is_brought_under_budget_too(capsys, tmp_path):
    root = _host(tmp_path, 2)
    rc, out, err = _search(capsys, root, "--knob", "gpu0.power_limit_w", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["budget_clamped"]["gpu1.power_limit_w"] == [700, 600]
    assert all(mw <= 600_000 for mw in _limits(root)), _limits(root)
    rc, out, _ = run_cli(capsys, "trials", "--json", "--limit", "0")
    decided = [t["measurements"]["decision"] for t in json.loads(out)["trials"]
               if "decision" in t["measurements"]]
    assert decided  # the hottest board's watts decided each measured trial
    assert all(max(d["candidate_watts"].values()) <= 600 for d in decided), decided


def test_a_budget_under_a_boards_lowest_limit_is_refused_naming_it(capsys, tmp_path):
    root = _host(tmp_path, 2)
    rc, out, err = run_cli(capsys, "--sim-root", root, "search", "host", "--budget", "2",
                           "--workload", "sim", "--policy", PERMISSIVE,
                           "--knob", "gpu0.locked_clocks_mhz",
                           "--objective", "power-capped", "--power-budget", "150")
    assert rc == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    assert "power_limit_w's lowest limit (200 W)" in lines[0] and "--power-budget 150" in lines[0]
    assert _limits(root) == [700_000, 700_000]  # nothing changed
