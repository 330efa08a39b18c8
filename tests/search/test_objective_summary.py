"""Through the real CLI on a simulated H200: the search summary shows the objective's metric and
tokens/s, start -> kept; an objective whose metric the workload does not measure is refused up
front (exit 2, one line, no trial, nothing changed); `--objective goodput` searches on a
workload that reports goodput."""
from __future__ import annotations

import json
import re

import pytest

from tests.goodput_workload import NAME, register
from tests.simhelpers import PERMISSIVE, run_cli
from tuner.sim.hostinit import init_host
from tuner.sim.state import SimState

pytestmark = pytest.mark.usefixtures("cli_env")


@pytest.fixture
def root(tmp_path):
    return str(init_host(tmp_path / "h200", "h200", seed=1, os_tree=False))


def _search(capsys, root, *args):
    return run_cli(capsys, "--sim-root", root, "search", "host", "--budget", "6",
                   "--timeout", "0.5", "--policy", PERMISSIVE, "--seed", "4", *args)


def test_energy_summary_shows_tokens_per_joule_and_tokens_per_second(capsys, root):
    rc, out, err = _search(capsys, root, "--workload", "sim", "--objective", "energy", "--json")
    assert rc == 0, err
    s = json.loads(out)["summary"]
    assert (s["metric"], s["unit"], s["throughput"]["unit"]) == ("tokens per joule", "tok/J", "tok/s")
    assert s["start"] > 3.0 and s["kept"] >= s["start"] * 0.999
    assert s["throughput"]["start"] > 1000 and s["throughput"]["kept"] > 0
    rc, out, err = _search(capsys, root, "--workload", "sim", "--objective", "energy", "--seed", "5")
    assert rc == 0, err
    m = re.search(r"tokens per joule: ([\d.,]+) -> ([\d.,]+) tok/J", out)
    t = re.search(r"throughput: ([\d.,]+) -> ([\d.,]+) tok/s", out)
    assert m and t, out
    assert "objective energy (--throughput-floor 0.95)" in out


def test_throughput_summary_shows_tokens_per_second_once(capsys, root):
    rc, out, err = _search(capsys, root, "--workload", "sim")
    assert rc == 0, err
    assert "objective throughput" in out and re.search(r"throughput: [\d.,]+ -> [\d.,]+ tok/s", out)
    assert "tok/J" not in out


@pytest.mark.parametrize("workload, objective, words", [
    ("cmd:echo 123.5", ["--objective", "energy"], "measures no energy"),
    ("cmd:echo 123.5", ["--objective", "power-capped", "--power-budget", "600"], "measures no power"),
    ("sim", ["--objective", "goodput"], "measures no goodput"),
])
def test_a_workload_without_the_objectives_metric_is_refused_up_front(capsys, root, tmp_path,
                                                                       workload, objective, words):
    before = SimState(root).read()
    rc, out, err = _search(capsys, root, "--workload", workload, "--metric-regex", r"([\d.]+)",
                           *objective) if workload.startswith("cmd:") else \
        _search(capsys, root, "--workload", workload, *objective)
    assert rc == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err and words in lines[0], err
    assert f"--objective {objective[1]}" in lines[0]
    assert SimState(root).read()["gpus"][0]["power_limit_mw"] == before["gpus"][0]["power_limit_mw"]
    rc, out, _ = run_cli(capsys, "trials", "--json", "--limit", "0")
    assert json.loads(out)["trials"] == []  # no trial spent finding out


def test_goodput_search_keeps_by_goodput_and_shows_it(capsys, root):
    register()
    rc, out, err = _search(capsys, root, "--workload", NAME, "--objective", "goodput", "--json")
    assert rc == 0, err
    res = json.loads(out)
    s = res["summary"]
    assert res["objective"] == "goodput" and (s["metric"], s["unit"]) == ("goodput", "req/s")
    assert s["start"] == pytest.approx(s["throughput"]["start"] / 256, rel=0.05)
    rc, out, _ = run_cli(capsys, "trials", "--json", "--limit", "0")
    measured = [t for t in json.loads(out)["trials"] if t["verdict"] in ("kept", "reverted")]
    assert measured and all(t["reason"] != "goodput_unmeasured" for t in measured)
    for t in measured:  # what the proposer learns is goodput, not tokens/s
        assert t["objective"] == pytest.approx(
            t["measurements"]["candidate"]["per_size_goodput"]["all"], rel=0.05)


def test_mixed_summary_and_table_carry_the_objective(capsys, root):
    rc, out, err = run_cli(capsys, "--sim-root", root, "search", "mixed", "--budget", "8",
                           "--workload", "sim", "--family", "none", "--timeout", "0.5",
                           "--policy", PERMISSIVE, "--seed", "4", "--objective", "energy")
    assert rc == 0, err
    m = re.search(r"tokens per joule: ([\d.,]+) -> ([\d.,]+) tok/J \(start -> kept\)", out)
    t = re.search(r"throughput: ([\d.,]+) -> ([\d.,]+) tok/s \(start -> kept\)", out)
    assert m and t, out
    start_tpj, kept_tpj = (float(x.replace(",", "")) for x in m.groups())
    start_tok, kept_tok = (float(x.replace(",", "")) for x in t.groups())
    assert kept_tpj >= start_tpj * 0.999 and kept_tok >= 0.95 * start_tok * 0.98
    table = re.search(r"(\S+/kernels/mixed-\S+\.json)", out.replace("\n", ""))
    assert table and json.loads(open(table.group(1)).read())["meta"]["objective"] == "energy"
