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
    # issue 16: the guard already stops these; their runtime rules are tested below
    ("tensor_subclass", "guard_failed", "module_state"),
    ("capture_aware", "guard_failed", "stream"),
    ("counter_default", "guard_failed", "module_state"),
    ("counter_func_attr", "guard_failed", "reflection"),  # forward used as a value
    ("counter_tensor_attr", "guard_failed", "reflection"),
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
    """Skips work when its output is not NaN-poisoned (i.e. when timed): the last timed run's
    output is checked against the reference (and the timed path again on fresh inputs). Since
    issue 24 the judge's own poison is NaN, a large value or zeros, so correctness sees it
    first; with NaN poison only it is still the timed run that catches it."""
    v = check("softmax", redteam("lazy_when_timed"), isolate=False, incumbent=False)
    # caught by a drawn check, or by the repeated-call stage once a call's poison is not NaN
    # (which stage meets it first is drawn)
    assert (v.stage, v.code) == ("correctness", "incorrect") and v.rule in (
        "unwritten", "tolerance", "repeated_calls"), v
    # the check that caught it names a poison other than NaN: a drawn check's ("poison large",
    # "poison zero") or the repeated-call stage's fill ("still hold the poison 8.50706e+37")
    held = v.detail.partition("hold the poison ")[2].split(" ", 1)[0]
    assert ("poison large" in v.detail or "poison zero" in v.detail
            or (held and held.lower() != "nan")), v.detail


def test_low_precision_rejected_at_fp32(redteam):
    v = check("softmax", redteam("low_precision"), isolate=False, timing=False,
              dtypes=["float32"])
    assert (v.code, v.rule) == ("incorrect", "tolerance"), v


def test_cache_on_data_ptr_caught_at_runtime_too(redteam, tmp_path):
    """Defence in depth: with the static guard off, the stale cached result is exposed at run
    time: the inputs rewritten in place (same data pointer, new values), a fresh input the
    allocator placed at an earlier one's address, or the calls in a row on the same tensors (the
    cache answers, no kernel launches)."""
    src = redteam("cache_data_ptr")
    v = check("softmax", src, isolate=False, timing=False, static_guard=False)
    assert (v.stage, v.code, v.rule) in (("correctness", "incorrect", "tolerance"),
                                         ("correctness", "incorrect", "no_launch")), v
    # the control: the same file with its cache never consulted passes, so the cache (not a
    # layout the candidate mishandles) is what the judge caught
    control = tmp_path / "cache_data_ptr_control.py"
    text = src.read_text()
    assert text.count("if key in CACHE:") == 1
    control.write_text(text.replace("if key in CACHE:", "if False:"))
    ok = check("softmax", control, isolate=False, timing=False, static_guard=False)
    assert ok.verdict == "accepted", ok


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


# issue 16: cheats that only checks at scale catch. Boundary shapes (one past every block edge,
# cheap in the other dims) are in every correctness run, so these fail deterministically:
# (candidate, stage, code, rule)
AT_SCALE = [
    ("first_rows", "correctness", "incorrect", "unwritten"),  # 65 rows
    ("capped_grid", "correctness", "incorrect", "unwritten"),  # 257 rows
    ("narrow_only", "correctness", "incorrect", "tolerance"),  # 2049 columns
    ("precision_when_wide", "correctness", "incorrect", "tolerance"),  # 4097 columns, float32
    # the stale output shows in the first check or in the calls in a row, whichever comes first
    ("reuses_freed_output", "correctness", "incorrect", ("unwritten", "repeated_calls")),
    ("only_tested_shapes", "correctness", "incorrect", None),  # no longer left to luck
]
# with the static guard off: the run-time rule that catches each (outputs of timed runs)
# the counters turn lazy after a few calls on one tensor: since issue 24 the repeated-call
# stage (and reused allocations between checks) sees it before the timed runs do
COUNTED = (("correctness", "timing"), ("repeated_calls", "unwritten", "tolerance",
                                       "timed_output"))
UNGUARDED = [
    ("tensor_subclass", "correctness", "incorrect", "not_plain_tensor"),
    ("counter_default", COUNTED[0], "incorrect", COUNTED[1]),
    ("counter_func_attr", COUNTED[0], "incorrect", COUNTED[1]),
    ("counter_tensor_attr", COUNTED[0], "incorrect", COUNTED[1]),
]


def _expect(v, stage, code, rule):
    stages = stage if isinstance(stage, tuple) else (stage,)
    assert v.verdict == "rejected" and v.stage in stages and v.code == code, v
    if isinstance(rule, tuple):
        assert v.rule in rule, v
    elif rule:
        assert v.rule == rule, v
    else:
        assert v.rule in ("unwritten", "tolerance"), v


@pytest.mark.parametrize("name,stage,code,rule", AT_SCALE)
def test_cheats_at_scale_rejected_with_check_defaults(redteam, name, stage, code, rule):
    """What `metaltune kernel check` runs on the CPU (defaults, timing included)."""
    v = check("softmax", redteam(name), isolate=False)
    _expect(v, stage, code, rule)
    assert v.device == "cpu-interpreter" and [65, 17] in v.checked_shapes


@pytest.mark.parametrize("name,stage,code,rule", UNGUARDED)
def test_timed_or_counted_behaviour_caught_at_run_time(redteam, name, stage, code, rule):
    v = check("softmax", redteam(name), isolate=False, static_guard=False)
    _expect(v, stage, code, rule)


def test_scale_suite_rejects_every_run(redteam):
    """Five runs of the new candidates, each with fresh os.urandom seeds and value distributions
    in every check: the same code every time (one dtype and one draw per shape to stay cheap;
    the boundary shapes are the same in every run by construction)."""
    seen: dict = {}
    for run in range(5):
        for name, stage, code, rule in AT_SCALE + UNGUARDED:
            v = check("softmax", redteam(name), isolate=False, dtypes=["float32"], seeds=1,
                      random_shapes=1, reps=12, static_guard=(name, stage, code, rule) in AT_SCALE)
            _expect(v, stage, code, rule)
            if " seed " in v.detail:
                seen.setdefault(name, set()).add(v.detail.split(" seed ")[1].split(":")[0])
    # correctness rejections name the failing draw's seed: a fresh one in each run
    assert seen and all(len(s) == 5 for s in seen.values()), seen


def test_verdict_names_checked_skipped_and_timed_shapes(redteam):
    v = check("softmax", redteam("honest"), isolate=False, dtypes=["float32"], seeds=1, reps=3)
    assert v.accepted, v
    checked = {tuple(s) for s in v.checked_shapes}
    assert {(65, 17), (257, 17), (3, 1025), (3, 2049), (3, 4097), (3, 8193)} <= checked
    assert {tuple(s) for s in v.skipped_shapes} == {(4097, 17), (65537, 17), (3, 16385),
                                                    (3, 32769)}  # GPU only
    assert v.timed_shapes == [[3, 17]] and "toy shape" in v.summary["timing"]


def test_claimed_shape_is_checked_at_its_largest_dims(redteam):
    """A caller who will use the kernel at 70000 rows gets (70000, 17) checked, though the
    interpreter skips the 4097/65537-row edges; first_rows fails there and at 65 rows."""
    from kernelsearch.harness.judge import plan_shapes
    from kernelsearch.families import get

    _, edge, skipped, timed = plan_shapes(get("softmax"), "cpu", None, [(4, 17)],
                                          [(70000, 300)], True)
    assert (70000, 17) in edge and (3, 300) in edge and timed == [(4, 17)]


def test_strict_geomean_and_degenerate_times():
    """One degenerate shape cannot decide a multi-shape score: a zero, negative or NaN time is a
    measurement fault (too_fast/degenerate_time), and the geometric mean refuses it instead of
    dropping it or underflowing (tuner's workload geomean drops non-positive values)."""
    import math

    from kernelsearch.harness import timing as tm

    assert tm.degenerate(0.0) and tm.degenerate(float("nan")) and tm.degenerate(-1e-9)
    assert tm.degenerate(1e-7) is None
    for bad in ([1.2, 0.0], [1.0, float("inf")], [float("nan")], []):
        with pytest.raises(ValueError):
            tm.geomean(bad)
    tiny = [1e-300] * 4 + [1e300] * 4  # a naive product underflows and overflows
    assert math.isclose(tm.geomean(tiny), 1.0)


# ---- issue 24: what a kernel-writing agent got through --------------------------------------
# section 1 and the annotation payload of section 5: refused by the static guard, with the
# rule in the verdict's detail (what the LLM proposer's context shows)
GUARD_HOLES = [
    ("typing_sys", "import"),  # typing.sys -> sys.modules, os.environ
    ("tl_builtins_eval", "attribute_not_allowed"),  # tl.core.builtins.eval
    ("torch_via_eval", "dynamic_code"),  # torch.softmax through eval
    ("module_name_check", "reflection"),  # __name__: judged or installed
    ("kernel_str", "reflection"),  # str() of a jit kernel
    ("annotation_exec", "annotation_not_allowed"),  # PROBE: exec("...") = 0
    ("call_count", "module_state"),  # a counter in a mutable default
    ("grad_mode", "torch_compute"),  # torch.is_grad_enabled
]


@pytest.mark.parametrize("name,rule", GUARD_HOLES)
def test_issue24_guard_holes_refused_with_a_named_rule(redteam, name, rule):
    v = check("softmax", redteam(name))
    assert (v.verdict, v.stage, v.code, v.rule) == ("rejected", "guard", "guard_failed", rule), v
    assert f"[guard:{rule}]" in v.detail


def test_annotation_payload_never_runs(redteam):
    """The payload would end this process (SystemExit 3) if anything imported the source: the
    judge, in or out of a child, and dispatch's re-guard refuse it before any import."""
    from kernelsearch.harness.guard import check_source

    src = redteam("annotation_exec").read_text()
    assert check("softmax", src, isolate=False).rule == "annotation_not_allowed"
    assert check_source(src)[0].rule == "annotation_not_allowed"


MLA_CFG = {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 132, "STAGES": 1, "num_warps": 4}
# sections 3 and 4: caught at run time by the inputs users send. (family, candidate, config,
# judge options, accepted rules); every run draws fresh seeds, scalars, layouts, grad modes
# and poison from cycles, so each is caught in every run
FAST = dict(isolate=False, timing=False, dtypes=["float32"], seeds=1, random_shapes=1,
            boundary=False, stress_calls=0)
RUNTIME_HOLES = [
    # strided / transposed views (two draws a shape: a one-row shape hides a layout)
    ("softmax", "contiguous_only", None, {"seeds": 2}, {"tolerance"}),
    # large-finite poison -> unwritten, zeros -> tolerance (a zero may be computed)
    ("softmax", "nan_poison_only", None, {}, {"unwritten", "tolerance"}),
    ("softmax", "grad_mode", None, {"static_guard": False}, {"unwritten", "tolerance"}),
    ("softmax", "call_count", None, {"static_guard": False, "stress_calls": None},
     {"repeated_calls", "unwritten", "tolerance"}),  # 11 calls in a row on one tensor
    ("softmax", "range_interior", None,
     {"ranges": [{"match": {"cols": 17}, "ranges": {"rows": [8, 600]}}]},
     {"unwritten", "tolerance"}),
    ("rmsnorm", "rmsnorm_eps_fixed", None, {"seeds": 3}, {"tolerance"}),  # eps 1e-5 etc.
]


@pytest.mark.parametrize("family,name,config,opts,rules", RUNTIME_HOLES)
def test_issue24_runtime_holes_rejected_in_every_run(redteam, family, name, config, opts,
                                                     rules):
    seen = set()
    for _ in range(5):
        v = check(family, redteam(name), config, **{**FAST, **opts})
        assert v.verdict == "rejected" and v.code == "incorrect" and v.rule in rules, v
        seen.add(v.detail)
    assert len(seen) == 5  # a fresh draw (seed) in each run


def test_issue24_honest_candidates_accepted_in_every_run(redteam):
    for _ in range(5):
        for family, name in (("softmax", "honest"), ("rmsnorm", "rmsnorm_honest")):
            v = check(family, redteam(name), **{**FAST, "stress_calls": None})
            assert v.accepted, v
            assert any(c.startswith("stress ") for c in v.checks), v.checks


def test_range_interior_checked_where_ends_pass(redteam):
    """The same candidate once passed a judge told only the range ends (what certified tables
    before): now the range those shapes vouch for (rows 1-600) is drawn in every octave too
    (harness.range_draws, issue 42 item 3), so the interior is checked all the same."""
    v = check("softmax", redteam("range_interior"), **{**FAST, "shapes": [(8, 17), (600, 17)],
                                                       "random_shapes": 0})
    assert v.code == "incorrect" and 256 <= int(v.detail.split("shape (")[1].split(",")[0]) \
        <= 600, v
    # honest at every width outside the interior: one 32,769-wide row a program (64 such rows
    # are past Triton's block limit, a compile failure on the GPU instead of the interior rule)
    wide = check("softmax", redteam("range_interior"),
                 **{**FAST, "shapes": [(2, 32769), (65, 4097)], "random_shapes": 0})
    assert wide.accepted, wide


@pytest.mark.parametrize("family,name,shape,seeds,rules", [
    # four draws: every distribution, and a scale other than the default under a peaked one
    ("mla_decode", "mla_fixed_scale", (2, 4, 33, 16, 1), 4, {"tolerance"}),
    ("mla_decode", "mla_longest_first", (3, 4, 40, 16, 1), 6, {"tolerance"}),
])
def test_issue24_mla_scale_and_order_holes_rejected(redteam, family, name, shape, seeds, rules):
    """The scale and the longest position are drawn per check from cycles, so a few checks
    always see another scale and the longest elsewhere than first."""
    v = check(family, redteam(name), MLA_CFG, isolate=False, timing=False, dtypes=["float16"],
              shapes=[shape], seeds=seeds, random_shapes=0, boundary=False, stress_calls=0)
    assert v.verdict == "rejected" and v.code == "incorrect" and v.rule in rules, v


@pytest.mark.parametrize("family,name,shape,rules", [
    ("mla_decode", "mla_batch_cap", (3, 16, 17, 16, 1), {"unwritten", "tolerance"}),
    ("mla_decode", "mla_heads_cap", (1, 17, 17, 16, 1), {"unwritten", "tolerance"}),
    ("mla_decode", "mla_pages_cap", (1, 16, 65, 1, 1), {"tolerance"}),
    ("mla_sparse_decode", "mla_topk_cap", (1, 16, 100, 16, 65, 0), {"tolerance"}),
])
def test_issue24_mla_caps_rejected_at_their_boundary_shape(redteam, family, name, shape, rules):
    """Each cap at the boundary shape that shows it, through the judge's boundary path (one
    call, as `kernel check` makes at every boundary shape; the shape is in the family's set)."""
    from kernelsearch.families import get
    from kernelsearch.harness import correctness
    from kernelsearch.harness.verdict import Rejected

    fam = get(family)
    assert shape in fam.boundary_shapes([], "cpu")[0]
    runner = correctness.Runner(redteam(name).read_text(), MLA_CFG)
    for _ in range(3):  # every run: fresh seeds, scales, poison
        with pytest.raises(Rejected) as e:
            correctness.check(runner, fam, [], ["float16"], "cpu", boundary=[shape],
                              stress_calls=0)
        assert e.value.code == "incorrect" and e.value.rule in rules, e.value


def test_shipped_mla_variant_accepted_at_the_hole_shapes():
    from kernelsearch.families import get

    for family, shape in (("mla_decode", (3, 4, 40, 16, 1)), ("mla_sparse_decode",
                                                               (1, 16, 100, 16, 65, 0))):
        v = check(family, get(family).variants["splitkv"].file, MLA_CFG, isolate=False,
                  timing=False, dtypes=["float16"], shapes=[shape], seeds=2, random_shapes=0,
                  boundary=False, stress_calls=0)
        assert v.accepted, v


def test_judge_views_follow_what_dispatch_runs():
    """The judge feeds a re-laid tensor only where dispatch would run a kernel on it: its
    predicate agrees with dispatch's own on every layout (decode attention refuses a
    non-unit last stride, MLA a strided block table, the rest take any view)."""
    import torch

    from kernelsearch import dispatch
    from kernelsearch.families import get
    from kernelsearch.families.base import LAYOUTS, relayout
    from kernelsearch.harness.draws import dispatch_runs

    seen = set()
    for name in ("softmax", "rmsnorm", "decode_attention", "mla_decode", "mla_sparse_decode"):
        fam = get(name)
        args = fam.make_inputs(tuple(fam.tiny_shapes[0]), "float16", "cpu",
                               torch.Generator().manual_seed(0), "normal")
        for i, a in enumerate(args):
            for kind in LAYOUTS:
                trial = list(args)
                trial[i] = relayout(a, kind)
                if isinstance(a, torch.Tensor) and kind != "contiguous":
                    assert torch.equal(trial[i], a) and trial[i].data_ptr() != a.data_ptr()
                try:
                    fam.shape_of(*trial)
                    theirs = dispatch._usable(name, trial)
                except ValueError:
                    theirs = False
                assert dispatch_runs(fam, trial) == theirs, (name, i, kind)
                seen.add(theirs)
    assert seen == {True, False}
