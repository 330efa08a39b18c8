"""The model process's server reads what a workload declares (tuner.workloads.base: Tunable's
`first_step_s`, Served's `check_outputs`, `timing()`, `prepare()`); it probes no private
attribute, so a workload built on `Untuned` is served as well as the built-in models."""
from __future__ import annotations

from tuner.workloads import model_server
from tuner.workloads.base import Served, Tunable, Untuned


class Plain(Untuned):
    """A workload with nothing to tune but the host, as a user might register one."""
    name = "plain"

    def measure(self, repeats: int = 5, timeout_s=None):
        raise AssertionError("not measured here")


def test_the_protocol_declares_what_the_server_reads():
    assert "first_step_s" in Tunable.__annotations__
    for attr in ("check_outputs", "timing", "prepare"):
        assert attr in Served.__dict__ or attr in Served.__annotations__, attr
    for attr in ("first_step_s", "check_outputs", "timing", "prepare"):
        assert hasattr(Untuned, attr), attr


def test_a_plain_tunable_is_served_from_its_declared_answers():
    wl = Plain()
    assert isinstance(wl, Served)
    info = model_server.info(wl)
    assert info["first_step"] is False and info["timing"] is None
    assert model_server.prepare(wl) is None  # nothing to set up: no bench, no runners


def test_a_holistic_workload_declares_its_grid_and_prepares_its_runners():
    from tuner.workloads.llama import LlamaWorkload

    wl = LlamaWorkload(model="tiny", contexts=[16], decode_batches=[2], decode_steps=2,
                       device="cpu")
    try:
        assert isinstance(wl, Served)
        info = model_server.info(wl)
        assert info["first_step"] is True
        assert info["timing"] == {"decode_steps": 2,
                                  "sizes": [list(s) for s in wl.bench.grid.sizes()]}
        assert wl.check_outputs is True
        model_server.prepare(wl)
        assert wl.bench.at is None  # every size's runner built, none left marked as failing
    finally:
        wl.close()
