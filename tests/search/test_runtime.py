"""Runtime candidates through the real loop: gates, A/B, the holistic keep rule, the store."""
import pytest

from tuner.proposers.base import Dim, Proposer, SearchSpace
from tuner.search.loop import run as run_loop
from tuner.search.runtime import RuntimeEvaluator
from tuner.search.store import TrialStore
from tuner.trial import Candidate
from tuner.workloads.llama import LlamaWorkload, Runtime

pytestmark = pytest.mark.usefixtures("one_thread")  # timing: as in tests/workloads

EMU = {"emulate_launch_us": 100.0, "emulate_capture_us": 0.0}


class Scripted(Proposer):
    """Proposes the given runtime candidates in order."""

    name = "scripted"

    def __init__(self, runtimes):
        super().__init__(SearchSpace([Dim("x", [0])]))
        self.runtimes = list(runtimes)

    def ask(self):
        return Candidate(runtime=self.runtimes.pop(0), proposer=self.name)

    def ask_point(self):  # pragma: no cover
        raise NotImplementedError


def test_runtime_search_keeps_graphs_and_refuses_bad_or_repeated_candidates(tmp_path):
    wl = LlamaWorkload("tiny", contexts=[16, 64], decode_batches=[2], device="cpu", prefill=False)
    ev = RuntimeEvaluator(wl, incumbent={**EMU, "cuda_graphs": False}, rounds=2, repeats=3,
                          validate=Runtime.from_dict)
    prop = Scripted([{"cuda_graph": True},  # a typo: not a runtime setting
                     {"cuda_graphs": False},  # the incumbent itself
                     {"cuda_graphs": True},
                     {"cuda_graphs": False}])  # back to eager once graphs are kept
    res = run_loop(prop, ev, TrialStore(tmp_path / "t.db"), "r", budget=4)
    got = [(t.verdict, t.reason) for t in res.trials]
    assert got[0] == ("rejected", "out_of_domain") and "cuda_graph" in res.trials[0].gates[-1].detail
    assert got[1] == ("rejected", "duplicate")
    assert got[2] == ("kept", "improved") and ev.incumbent["cuda_graphs"] is True
    assert got[3][0] == "reverted" and got[3][1] in ("size_regressed", "worse")
    assert res.trials[3].measurements["holistic"]["per_size"]["decode@ctx16,b2"]["ratio"] < 0.7
