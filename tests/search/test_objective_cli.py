"""`--objective` on `metaltune search host|mixed` through the real CLI on a simulated H200: bad
values exit 2 with one line and change nothing; energy lands in the trial records and `trials`;
power-capped never applies a power limit past the budget (the journal says so)."""
from __future__ import annotations

import json
import sqlite3

import pytest

from tests.simhelpers import PERMISSIVE, run_cli
from tuner.sim.hostinit import init_host
from tuner.sim.state import SimState

pytestmark = pytest.mark.usefixtures("cli_env")


@pytest.fixture
def root(tmp_path):
    return str(init_host(tmp_path / "h200", "h200", seed=1, os_tree=False))


def _limit(root):
    return SimState(root).read()["gpus"][0]["power_limit_mw"]


@pytest.mark.parametrize("cmd", ["host", "mixed"])
@pytest.mark.parametrize("args, words", [
    (["--objective", "speed"], ["--objective", "throughput", "energy", "power-capped"]),
    (["--objective", "power-capped"], ["--power-budget", "required"]),
    (["--power-budget", "500"], ["--power-budget", "only with --objective power-capped"]),
    (["--objective", "energy", "--throughput-floor", "1.5"], ["--throughput-floor"]),
    (["--objective", "energy", "--throughput-floor", "nan"], ["--throughput-floor"]),
    (["--objective", "power-capped", "--power-budget", "-3"], ["--power-budget"]),
])
def test_bad_objective_arguments_exit_2_with_one_line(capsys, root, cmd, args, words):
    rc, out, err = run_cli(capsys, "--sim-root", root, "search", cmd, "--budget", "2",
                           "--workload", "sim", "--policy", PERMISSIVE, *args)
    assert rc == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]
    assert _limit(root) == 700_000  # nothing changed


def test_a_budget_the_policy_refuses_is_bad_input_and_changes_nothing(capsys, root):
    # the default policy keeps the H200 at >= 75% of its 700 W default: 500 W is refused
    rc, out, err = run_cli(capsys, "--sim-root", root, "search", "host", "--budget", "2",
                           "--workload", "sim", "--objective", "power-capped",
                           "--power-budget", "500")
    assert rc == 2 and "--power-budget 500" in err and "policy" in err, err
    assert _limit(root) == 700_000


def test_energy_search_records_tokens_per_joule_and_watts(capsys, root, tmp_path):
    rc, out, err = run_cli(capsys, "--sim-root", root, "search", "host", "--budget", "6",
                           "--workload", "sim", "--timeout", "0.5", "--policy", PERMISSIVE,
                           "--objective", "energy", "--seed", "4", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["objective"] == "energy" and res["throughput_floor"] == 0.95
    assert res["baseline_tok_per_j"] > 3.0
    rc, out, _ = run_cli(capsys, "trials", "--json", "--limit", "0")
    trials = json.loads(out)["trials"]
    measured = [t for t in trials if t["verdict"] in ("kept", "reverted")]
    assert measured
    for t in measured:
        e = t["energy"]
        assert e["source"] == "sim_model" and set(e) == {"tok_per_j", "watts", "source"}
        assert 150 < e["watts"]["all"] <= 700 and e["tok_per_j"]["all"] > 1.0
        # what the proposer learns: tokens/J, penalised where throughput fell under the floor
        if t["measurements"]["decision"]["below_floor"]:
            assert t["objective"] < e["tok_per_j"]["all"]
        else:
            assert t["objective"] == pytest.approx(e["tok_per_j"]["all"], rel=0.05)
    rc, out, _ = run_cli(capsys, "trials", "--limit", "0")
    assert rc == 0 and "tok/J" in out and " W " in out
    chart = tmp_path / "chart.png"
    rc, out, _ = run_cli(capsys, "trials", "--stats", "--json", "--chart", str(chart))
    assert rc == 0
    stats = json.loads(out)["proposers"]["optuna"]
    kept = [t for t in trials if t["verdict"] == "kept"]
    assert kept  # tokens/J of the kept settings after each trial, from the first keep on
    assert stats["tok_per_j_over_time"][-1]["tok_per_j"] == pytest.approx(
            kept[-1]["energy"]["tok_per_j"]["all"])
    assert chart.stat().st_size > 0


def test_power_capped_never_applies_a_limit_past_the_budget(capsys, root, tmp_path):
    rc, out, err = run_cli(capsys, "--sim-root", root, "search", "host", "--budget", "8",
                           "--workload", "sim", "--timeout", "0.5", "--policy", PERMISSIVE,
                           "--objective", "power-capped", "--power-budget", "500", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["start"]["gpu0.power_limit_w"] == 500  # brought within the budget first
    db = sqlite3.connect(str(tmp_path / "state" / "journal.db"))
    applied = [json.loads(a) for (a,) in db.execute(
        "SELECT after FROM changes WHERE knob = 'gpu0.power_limit_w' AND applied_at IS NOT NULL")]
    assert applied and max(applied) <= 500
    assert _limit(root) <= 500_000
    rc, out, _ = run_cli(capsys, "trials", "--json", "--limit", "0")
    for t in json.loads(out)["trials"]:
        if t["energy"]:
            assert max(t["energy"]["watts"].values()) <= 500


@pytest.mark.parametrize("args, words", [
    (["--objective", "speed"], ["--objective"]),
    (["--objective", "power-capped"], ["--power-budget", "required"]),
    (["--throughput-floor", "0.9"], ["--throughput-floor", "only with --objective energy"]),
])
def test_search_kernel_takes_the_same_objective_arguments(capsys, args, words):
    rc, out, err = run_cli(capsys, "search", "kernel", "--family", "softmax", "--budget", "1",
                           "--device", "cpu", *args)
    assert rc == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), err
