"""Adding an objective is one class and one registry line (tuner/search/objective/__init__.py):
a class registered in OBJECTIVES, and nothing else, is taken by `--objective`, decides the
search's keeps by its own rule and is named in the run's summary."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import pytest

from tests.simhelpers import PERMISSIVE, run_cli
from tuner.search import objective as objectives
from tuner.search.objective import Throughput
from tuner.sim.hostinit import init_host
from tuner.trial import Measurement

pytestmark = pytest.mark.usefixtures("cli_env")


class Eager(Throughput):
    """Keeps every candidate that measured: a rule no stock objective has."""
    name = "eager"
    help = "keep every measured candidate (a test objective)"

    def decide_sizes(self, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
                     tolerance: float = 0.01, micro_gain: Any = None,
                     anchor: Any = None) -> tuple[str, str, dict[str, Any]]:
        return "kept", "improved", {}

    def decide(self, incumbent, candidate, pooled_noise=0.0, z=2.0, anchor=None):
        d = super().decide(incumbent, candidate, pooled_noise=pooled_noise, z=z)
        return dataclasses.replace(d, verdict="kept", reason="improved")


def test_a_registered_objective_is_taken_by_the_cli_and_decides_the_search(capsys, tmp_path,
                                                                         monkeypatch):
    with pytest.raises(ValueError, match="expected one of"):
        objectives.make("eager")
    monkeypatch.setitem(objectives.OBJECTIVES, Eager.name, Eager)  # the one registry line
    assert isinstance(objectives.make("eager"), Eager)

    def search(name: str) -> dict:
        root = init_host(tmp_path / name, "h200", seed=1, os_tree=False)
        rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "host", "--budget", "5",
                               "--timeout", "0.5", "--policy", PERMISSIVE, "--seed", "4",
                               "--workload", "sim",
                               "--objective", name, "--json")
        assert rc == 0, err
        return json.loads(out)

    # the same search under the stock rule keeps nothing; under the new class, what it measured
    assert search("throughput")["kept"] == 0
    doc = search("eager")
    assert doc["kept"] >= 3 and doc["trials"] == 5, doc
    assert doc["objective"] == doc["summary"]["objective"] == "eager"
