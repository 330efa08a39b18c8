"""The workload registry: a new workload is one file plus one `register` line
(tests/workloads/doubling_workload.py), and from then on it is a `--workload` for the searches,
named in their help, with its runtime settings searched like the built-in workloads'."""
from __future__ import annotations

import json

import pytest

from tests.simhelpers import REPO, run_cli
from tuner.sim.hostinit import init_host

POLICY = str(REPO / "tuner/data/demo-policy.yaml")


@pytest.fixture
def doubling():
    from tuner.workloads import factory

    import importlib

    before = dict(factory._REGISTRY)
    import tests.workloads.doubling_workload as mod

    importlib.reload(mod)  # its register line runs (again, after an earlier test's cleanup)
    yield
    factory._REGISTRY.clear()
    factory._REGISTRY.update(before)


@pytest.mark.usefixtures("cli_env", "doubling")
def test_a_registered_workload_is_searched_end_to_end(capsys, tmp_path):
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload",
                           "doubling", "--knob", "none", "--family", "none", "--proposer",
                           "grid", "--budget", "2", "--rounds", "1", "--policy", POLICY, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["kept"]["runtime"] == {"fast": True}
    assert res["by_verdict"].get("kept") == 1, res


@pytest.mark.usefixtures("cli_env", "doubling")
def test_a_registered_workload_is_named_in_the_help_and_the_error(capsys, monkeypatch):
    from tuner.workloads.factory import make_workload

    monkeypatch.setenv("COLUMNS", "400")  # rich wraps help to the terminal: all of it on a line

    rc, out, _ = run_cli(capsys, "search", "mixed", "--help")
    assert rc == 0 and "doubling (tests)" in " ".join(out.split())
    from tuner.errors import BadInput

    with pytest.raises(BadInput, match=r"doubling \(tests\)"):
        make_workload(None, "doubling:x", None, 60)
