"""Red team: one cheating candidate per trick, each rejected with the right reason code; an
honest one accepted. Process-level tricks (hang, crash, memory) go through the child runner."""
import pytest

from kernelsearch.harness import check
from kernelsearch.harness.timing import Ceilings

# (candidate, code, rule, stage) -- static rejections never execute candidate code
STATIC = [
    ("torch_op", "guard_failed", "torch_compute"),
    ("cache_data_ptr", "guard_failed", "module_state"),
    ("side_stream", "guard_failed", "stream"),
    ("starts_thread", "guard_failed", "thread"),
    ("patches_timer", "guard_failed", "monkey_patch"),
]

RUNTIME = [
    ("torch_operators", "guard_failed", "torch_compute"),
    ("partial_output", "incorrect", "unwritten"),
    ("only_tested_shapes", "incorrect", None),  # unwritten or tolerance, on a random shape
    ("mutates_input", "incorrect", "input_mutated"),
    ("never_launches", "incorrect", "no_launch"),
    ("wrong_dtype", "incorrect", "wrong_shape_or_dtype"),
    ("compile_error", "compile_failed", None),
]


@pytest.mark.parametrize("name,code,rule", STATIC)
def test_static_cheats_rejected_by_guard(redteam, name, code, rule):
    v = check("softmax", redteam(name))
    assert (v.verdict, v.stage, v.code, v.rule) == ("rejected", "guard", code, rule), v


@pytest.mark.parametrize("name,code,rule", RUNTIME)
def test_runtime_cheats_rejected(redteam, name, code, rule):
    v = check("softmax", redteam(name), isolate=False, timing=False)
    assert v.verdict == "rejected" and v.code == code, v
    if rule:
        assert v.rule == rule, v
    if name == "only_tested_shapes":
        assert v.rule in ("unwritten", "tolerance") and "shape" in v.detail


def test_lazy_when_not_watched_caught_on_the_timed_path(redteam):
    """Skips work when its output is not NaN-poisoned (i.e. when timed): the timed path's own
    output is checked on fresh inputs."""
    v = check("softmax", redteam("lazy_when_timed"), isolate=False, incumbent=False)
    assert (v.stage, v.code, v.rule) == ("timing", "incorrect", "timed_path"), v


def test_low_precision_rejected_at_fp32(redteam):
    v = check("softmax", redteam("low_precision"), isolate=False, timing=False,
              dtypes=["float32"])
    assert (v.code, v.rule) == ("incorrect", "tolerance"), v


def test_cache_on_data_ptr_caught_at_runtime_too(redteam):
    """Defence in depth: with the static guard off, rewriting the inputs in place (same data
    pointer, new values) exposes the stale cached result."""
    v = check("softmax", redteam("cache_data_ptr"), isolate=False, timing=False,
              static_guard=False)
    assert (v.code, v.rule) == ("incorrect", "tolerance") and "in place" in v.detail, v


def test_timer_patch_caught_at_runtime_and_undone(redteam):
    import torch

    before = torch.cuda.Event.elapsed_time
    v = check("softmax", redteam("patches_timer"), isolate=False, timing=False,
              static_guard=False)
    assert (v.code, v.rule) == ("guard_failed", "timer"), v
    assert torch.cuda.Event.elapsed_time is before  # the harness put it back


def test_thread_caught_at_runtime_too(redteam):
    v = check("softmax", redteam("starts_thread"), isolate=False, timing=False,
              static_guard=False)
    assert (v.code, v.rule) == ("guard_failed", "thread"), v


def test_hang_is_a_timeout_verdict(redteam):
    v = check("softmax", redteam("hangs"), timeout_s=12, timing=False)
    assert (v.verdict, v.stage, v.code) == ("rejected", "process", "timeout"), v


def test_segfault_is_a_crash_verdict(redteam):
    v = check("softmax", redteam("crash_wild_pointer"), timeout_s=60, timing=False)
    assert (v.code, v.rule) == ("crashed", "signal:SIGSEGV"), v


def test_memory_hog_is_killed(redteam):
    v = check("softmax", redteam("memory_hog"), timeout_s=60, mem_limit_mb=1200, timing=False)
    assert (v.code, v.rule) == ("crashed", "memory_limit"), v


def test_runtime_rejection_crosses_the_process_boundary(redteam):
    v = check("softmax", redteam("partial_output"), timeout_s=90, timing=False)
    assert (v.stage, v.code, v.rule) == ("correctness", "incorrect", "unwritten"), v


def test_honest_candidate_accepted_in_child(redteam):
    v = check("softmax", redteam("honest"), timeout_s=120, dtypes=["float32", "float16"])
    assert v.accepted, v
    assert "guard" in v.checks and "timing" in v.checks
    (t,) = v.timings.values()
    assert t["median_us"] > 0 and "speedup_vs_torch" in t


def test_too_fast_against_a_ceiling(redteam):
    """A time under bytes / (measured read ceiling x margin) is a measurement fault."""
    v = check("softmax", redteam("honest"), isolate=False,
              ceilings=Ceilings(read_Bps=1.0, flops=1.0, margin=1.0), incumbent=False)
    assert (v.stage, v.code, v.rule) == ("timing", "too_fast", "below_floor"), v
    ok = check("softmax", redteam("honest"), isolate=False,
               ceilings=Ceilings(read_Bps=1e15, flops=1e18), incumbent=False)
    assert ok.accepted, ok
