"""The judge in one process: guard -> correctness -> timing. `runner.check` wraps it in a child
process; call this directly only for trusted code (the built-in variants) or inside that child."""
from __future__ import annotations

import os
import random
import time
import traceback
from pathlib import Path
from typing import Optional

from kernelsearch.harness import guard
from kernelsearch.harness.verdict import Rejected, Verdict


def guard_stage(source: str) -> Optional[Verdict]:
    v = guard.check_source(source)
    if v:
        return Verdict.reject("guard", "guard_failed", v[0].rule,
                              "; ".join(str(x) for x in v[:5]))
    return None


def gluon_stage(source: str, device: str) -> Optional[Verdict]:
    """A Gluon candidate where it cannot run (the interpreter, a GPU other than sm_90): one
    verdict saying so, rather than the compiler's failure to find a driver."""
    if not guard.uses_gluon(source):
        return None
    from kernelsearch.families import gluon

    why = gluon.why_not_on(device)
    if not why:
        return None
    return Verdict.reject("guard", "needs_gpu", "gluon",
                          f"a Gluon kernel runs only on an sm_90 GPU: {why}")


def classify(exc: BaseException, stage: str) -> Verdict:
    """An exception from the candidate: compile failure if triton's compiler/frontend raised it,
    a sandbox limit refusing it (`limits.py`); otherwise the candidate crashed."""
    from kernelsearch.harness import limits

    hit = limits.classify(exc)
    if hit:
        return Verdict.reject("process", "crashed", *hit)
    tb = traceback.extract_tb(exc.__traceback__)
    files = [f.filename for f in tb]
    name = type(exc).__name__
    mod = type(exc).__module__ or ""
    frontend = any(("/triton/compiler/" in f or "/triton/language/" in f
                    or "/triton/runtime/jit.py" in f or "/triton/backends/" in f) for f in files[-6:])
    if mod.startswith("triton") and ("Compil" in name or "OutOfResources" in name) or (
            frontend and not mod.startswith("torch")):
        return Verdict.reject(stage, "compile_failed", name, str(exc).strip()[-2000:])
    where = f"{Path(files[-1]).name}:{tb[-1].lineno}" if tb else "?"
    return Verdict.reject(stage, "crashed", f"exception:{name}",
                          f"{name} at {where}: {str(exc).strip()[-1500:]}")


def default_dtypes(family, device: str) -> list[str]:
    """Every dtype the family takes on the GPU; on the CPU interpreter float32 and float16 (its
    bf16 dot is not faithful, so dot-based families check float16 only). More than one dtype,
    so a candidate that ignores the input dtype cannot pass."""
    if device == "cuda":
        return list(family.dtypes)
    if family.bound == "compute" or family.name == "decode_attention":
        return ["float16"]
    return [d for d in ("float32", "float16") if d in family.dtypes]


def device_label(device: str) -> str:
    """What a verdict was reached on: the GPU's name, or the CPU interpreter."""
    if device != "cuda":
        return "cpu-interpreter"
    import torch

    return f"cuda:{torch.cuda.get_device_name(0)}"


def default_timing_shapes(family, device: str) -> list:
    """Where a kernel is timed when the caller names no shape: the family's sweep on a GPU (the
    sizes a user gets), one tiny shape on the CPU interpreter (its timing says nothing about
    GPU speed and the verdict says so)."""
    return [tuple(s) for s in (family.sweep_shapes if device == "cuda" else family.tiny_shapes[:1])]


def plan_shapes(family, device: str, shapes: Optional[list], timing_shapes: Optional[list],
                claimed: Optional[list], timing: bool, boundary: bool = True):
    """(shapes checked with repeats, boundary shapes checked once per dtype, skipped boundary
    shapes, timed shapes). The boundary set covers one past every declared edge and the
    largest value of every dim that a claimed, checked or timed shape takes; on a GPU the
    largest timed shape (by bytes) is checked in every dtype too."""
    given = [tuple(s) for s in (shapes or [])]
    shapes = given or [tuple(s) for s in family.tiny_shapes]
    timed = [tuple(s) for s in (timing_shapes or default_timing_shapes(family, device))] \
        if timing else []
    claims = [tuple(s) for s in (claimed or [])] + given + timed
    edge, skipped = family.boundary_shapes(claims, device) if boundary else ([], [])
    if device == "cuda" and timed:
        big = max(timed, key=lambda s: family.bytes_moved(s, 2))
        if big not in edge and big not in shapes:
            edge.append(big)
    return shapes, edge, skipped, timed


def _fingerprint(args) -> list:
    from kernelsearch.harness.correctness import fingerprint

    return [fingerprint(a) for a in args]


def judge(family_name: str, source: str, config: Optional[dict] = None, *, device: str = "cpu",
          dtypes: Optional[list] = None, shapes: Optional[list] = None, random_shapes: int = 2,
          seeds: int = 2, timing: bool = True, timing_shapes: Optional[list] = None,
          ceilings=None, incumbent: bool = True, graph: bool = False,
          reps: int = 30, static_guard: bool = True, timing_dtype: Optional[str] = None,
          against: Optional[tuple] = None, claimed: Optional[list] = None,
          boundary: bool = True, ranges: Optional[list] = None,
          stress_calls: Optional[int] = None, library: Optional[str] = None) -> Verdict:
    """static_guard=False skips the AST guard (red-team tests of the runtime checks only).
    against=(source, config): an incumbent kernel to A/B against (interleaved) besides torch.
    shapes: checked with repeats (default: the family's tiny shapes); timing_shapes: where it is
    timed (default: the sweep on a GPU, one tiny shape on the CPU); claimed: further shapes the
    caller will use it at (a table range's largest point): their largest dims are checked.
    ranges: table entries it will serve, each {"match": {dim: v}, "ranges": {dim: [lo, hi]}}:
    their ends, midpoints and a point of every octave inside are checked (Family.range_shapes).
    stress_calls: how many calls in a row the repeated-call stage makes (None: thousands on a
    GPU, what a second allows on the interpreter; 0: none).
    boundary=False drops the boundary shapes (harness self-tests only). library: judge `source`
    as the library variant over that library (kernelsearch.families.library): it must be the
    shipped wrapper, byte for byte; the guard is skipped (it reads Triton source, not the
    library's compiled code), shapes go through the variant's `fit`, dtypes are its own."""
    t0 = time.time()
    lib = None
    if library is not None:
        lib = _library_variant(family_name, source, library)
        if isinstance(lib, Verdict):
            lib.seconds = time.time() - t0
            return lib
        v = None
    else:
        v = guard_stage(source) if static_guard else None
        if v is None:
            v = gluon_stage(source, device)
    if v:
        v.seconds = time.time() - t0
        return v
    from kernelsearch.harness import sandbox

    keep = sandbox.loaded()
    try:
        return _judge(family_name, source, config, device=device, dtypes=dtypes, shapes=shapes,
                      random_shapes=random_shapes, seeds=seeds, timing=timing,
                      timing_shapes=timing_shapes, ceilings=ceilings, incumbent=incumbent,
                      graph=graph, reps=reps, timing_dtype=timing_dtype, against=against,
                      claimed=claimed, boundary=boundary, ranges=ranges,
                      stress_calls=stress_calls, t0=t0, lib=lib)
    finally:
        sandbox.cleanup(keep)  # the candidate's module files (ks-cand-*)


def _judge(family_name: str, source: str, config: Optional[dict], *, device, dtypes, shapes,
           random_shapes, seeds, timing, timing_shapes, ceilings, incumbent, graph, reps,
           timing_dtype, against, claimed, boundary, ranges, stress_calls, t0,
           lib=None) -> Verdict:
    checks = ["library: shipped wrapper (no guard)" if lib is not None else "guard"]
    import torch  # noqa: F401  (heavy imports only past the guard)

    from kernelsearch.families import get
    from kernelsearch.harness import correctness, random_shapes as drawn, range_draws
    from kernelsearch.harness import timing as tm

    family = get(family_name)
    dtypes = list(dtypes or default_dtypes(family, device))
    shapes, edge, skipped, timed = plan_shapes(family, device, shapes, timing_shapes, claimed,
                                               timing, boundary)
    shapes += drawn.random_shapes(family, random_shapes, big=(device == "cuda"))
    # the whole certified range, drawn new every run from a seed the verdict records
    # (range_draws): the caller's table ranges, or the range its shapes vouch for
    seed = int.from_bytes(os.urandom(8), "little")
    rng = random.Random(seed)
    span = ranges or range_draws.certified(family, shapes + timed + list(claimed or []))
    for s in range_draws.draw(family, span, rng, fixed=bool(ranges)):
        if s not in edge and s not in shapes:
            edge.append(s)
    kind: dict = {}
    if lib is not None:  # the shapes and dtypes the library takes
        fit = lib.fit or (lambda s: s)
        shapes, edge = (list(dict.fromkeys(tuple(fit(tuple(s))) for s in group))
                        for group in (shapes, edge))
        dtypes = [d for d in dtypes if not lib.dtypes or d in lib.dtypes] or list(lib.dtypes[:1])
        timing_dtype = timing_dtype if timing_dtype in dtypes else dtypes[0]
        from kernelsearch import libraries

        found = libraries.discover(lib.library)
        kind = dict(kind="library", library={"name": lib.library, "variant": lib.name,
                                             "version": found.version, "where": found.where})
    scope = dict(device=device_label(device),
                 checked_shapes=[list(s) for s in dict.fromkeys(shapes + edge)],
                 skipped_shapes=[list(s) for s in skipped],
                 timed_shapes=[list(s) for s in timed], shape_seed=seed)
    stage = "correctness"
    timings: dict = {}
    scope.update(kind)
    try:
        runner = correctness.Runner(source, config, library=lib is not None)
        correctness.check(runner, family, shapes, dtypes, device, seeds=seeds, log=checks,
                          boundary=edge, stress_calls=stress_calls,
                          fit=lib.fit if lib is not None else None)
        if timing:
            stage = "timing"
            for shape in timed:
                timings.update(_time_shape(runner, family, shape, dtypes, device, reps,
                                           ceilings, incumbent, graph, timing_dtype, against,
                                           own=lib.name if lib is not None else None))
            checks.append("timing")
    except Rejected as r:
        return r.verdict(timings=timings, checks=checks, seconds=time.time() - t0, **scope)
    except Exception as e:  # the candidate's own failure is a verdict, not a harness error
        v = classify(e, stage)
        v.timings, v.checks, v.seconds = timings, checks, time.time() - t0
        for k, x in scope.items():
            setattr(v, k, x)
        return v
    return Verdict(verdict="accepted", stage="timing" if timing else "correctness",
                   code="accepted", detail=f"{len(checks) - 1} checks passed",
                   timings=timings, checks=checks, seconds=time.time() - t0,
                   summary=_summary(timings, device), **scope)


def _summary(timings: dict, device: str) -> dict:
    """Both yardsticks over the timed shapes: torch, and the best library kernel offered at
    each shape (`speedup_vs_library_*`: >1 means faster than the library; absent where no
    library kernel is offered)."""
    from kernelsearch.harness import timing as tm

    sp = [t["speedup_vs_torch"] for t in timings.values() if "speedup_vs_torch" in t]
    out: dict = {"timing": "gpu" if device == "cuda" else
                 "cpu-interpreter wall time at a toy shape: no statement about GPU speed"}
    if sp:
        out["speedup_geomean"] = tm.geomean(sp)
        out["speedup_min"] = min(sp)
    lib = [t["speedup_vs_library"] for t in timings.values() if "speedup_vs_library" in t]
    if lib:
        out["speedup_vs_library_geomean"] = tm.geomean(lib)
        out["speedup_vs_library_min"] = min(lib)
        out["library"] = sorted({t["library"] for t in timings.values() if "library" in t})
    return out


def _library_variant(family_name: str, source: str, library: str):
    """The library variant `source` is (a Variant), or the rejection saying why not."""
    from kernelsearch import libraries
    from kernelsearch.families import get, library as libvars

    var = libvars.shipped(get(family_name), source)
    if var is None or var.library != library:
        return Verdict.reject("guard", "guard_failed", "library_claim",
                              f"judged as a {library} library variant of {family_name}, but the "
                              "source is none of the shipped library wrappers: Triton source "
                              "goes through the guard")
    found = libraries.discover(library)
    if not found.present:
        return Verdict.reject("process", "crashed", "library_unavailable",
                              f"{library} is {found.status} here: {found.reason}",
                              kind="library", library={"name": library, "variant": var.name})
    return var


def _library_yardstick(family, shape, dtype: str, own: Optional[str]):
    """(name, forward) of the best library kernel offered at this shape, other than the one
    judged; None where there is none."""
    from kernelsearch.families import library as libvars

    for name in libvars.offered(family, shape, dtype):
        if name != own:
            return name, libvars.forward(family.name, name)
    return None


def _time_shape(runner, family, shape, dtypes, device, reps, ceilings, incumbent, graph,
                timing_dtype, against, own: Optional[str] = None) -> dict:
    """Time one shape, then check what the timed runs computed: the last timed run's output
    and (graph mode) every output of the last replay against the reference on their inputs,
    the inputs unchanged, and a fresh call on new inputs. A kernel that behaves differently
    when repeated, timed or captured is caught here."""
    import torch

    from kernelsearch.families.base import element_size
    from kernelsearch.harness import correctness, timing as tm

    dt = timing_dtype or ("bfloat16" if device == "cuda" and "bfloat16" in dtypes
                          else dtypes[0])
    key = f"{'x'.join(map(str, shape))}:{dt}"
    nbytes = family.bytes_moved(shape, element_size(dt))

    def fail(rule: str, e: Rejected, what: str):
        return Rejected("timing", "incorrect", rule, f"{what}: {e.detail}")

    def seed() -> int:
        return int.from_bytes(os.urandom(4), "little")

    sets = [family.make_inputs(shape, dt, device, torch.Generator().manual_seed(seed()), "normal")
            for _ in range(tm.rotations(nbytes, device))]
    prints = [_fingerprint(s) for s in sets]
    fn = runner.fast_forward()

    def refresh(args) -> None:  # new values, same tensors, for the last timed run
        new = family.make_inputs(shape, dt, device, torch.Generator().manual_seed(seed()),
                                 "normal")
        for a, f in zip(args, new):
            if isinstance(a, torch.Tensor):
                a.copy_(f)
        prints[next(i for i, s in enumerate(sets) if s is args)] = _fingerprint(args)

    r = tm.bench(fn, sets, device, reps=reps, refresh=refresh)
    last, li = r.pop("last"), r.pop("last_index")
    try:
        correctness.compare(last, family.reference(*sets[li]), dt, family,
                            f"last timed run, shape {shape} {dt}")
    except Rejected as e:
        raise fail("timed_output", e, "the output of a timed run differs") from None
    del last
    why = tm.degenerate(r["median_s"])
    if why:
        raise Rejected("timing", "too_fast", "degenerate_time", f"{key}: {why}")
    rec = {"median_us": r["median_s"] * 1e6, "p25_us": r["p25_s"] * 1e6,
           "p75_us": r["p75_s"] * 1e6, "mode": r["mode"],
           "GBps": nbytes / r["median_s"] / 1e9,
           "TFLOPs": family.flops(shape) / r["median_s"] / 1e12}
    why = tm.too_fast(r["median_s"], nbytes, family.flops(shape), ceilings)
    if why:
        raise Rejected("timing", "too_fast", "below_floor", f"{key}: {why}")
    if graph and device == "cuda":
        g = tm.bench_graph(fn, sets, keep_outputs=True)
        outs = g.pop("outputs")
        try:
            for i, (o, a) in enumerate(zip(outs, sets)):
                correctness.compare(o, family.reference(*a), dt, family,
                                    f"graph replay, call {i}, shape {shape} {dt}")
        except Rejected as e:
            raise fail("graph_output", e, "a CUDA-graph replay computed something else") from None
        del outs
        rec["graph_us"] = g["median_s"] * 1e6
    rec.update(tm.host_costs(fn, family.torch_default, sets, device))
    ab_kw = dict(rounds=4 if device != "cuda" else 8, reps=3 if device != "cuda" else 10)
    if incumbent:
        ab = tm.ab(fn, lambda *a: family.torch_default(*a), sets, device, **ab_kw)
        rec["speedup_vs_torch"] = ab["speedup"]
        rec["speedup_spread"] = [ab["speedup_p25"], ab["speedup_p75"]]
    if against is not None:
        inc = correctness.Runner(against[0], against[1]).fast_forward()
        ab = tm.ab(fn, inc, sets, device, **ab_kw)
        rec["speedup_vs_incumbent"] = ab["speedup"]
        rec["incumbent_spread"] = [ab["speedup_p25"], ab["speedup_p75"]]
    yard = _library_yardstick(family, shape, dt, own)
    rec.update(tm.energy_costs(fn, yard[1] if yard else None, sets, device))  # J a call, mean W
    if yard is not None:  # the second yardstick: the best installed library kernel
        try:
            ab = tm.ab(fn, yard[1], sets, device, **ab_kw)
            rec.update(library=yard[0], speedup_vs_library=ab["speedup"],
                       library_spread=[ab["speedup_p25"], ab["speedup_p75"]])
        except Exception as e:  # noqa: BLE001  (the library failing is no verdict on this kernel)
            rec.update(library=yard[0], library_error=f"{type(e).__name__}: {str(e)[:300]}")
    if [_fingerprint(s) for s in sets] != prints:
        raise Rejected("timing", "incorrect", "input_mutated",
                       f"shape {shape} {dt}: an input changed while the kernel was timed")
    del sets
    # the timed path (no sandbox, no poison) must compute the same function: a kernel that
    # notices it is not being checked and skips work is caught here (fresh inputs: no earlier
    # run computed their answer, so no freed buffer can hold it; the reference runs after)
    fresh = family.make_inputs(shape, dt, device, torch.Generator().manual_seed(seed()), "normal")
    try:
        correctness.compare(fn(*fresh), family.reference(*fresh), dt, family,
                            f"timed path, shape {shape} {dt}")
    except Rejected as e:
        raise Rejected("timing", "incorrect", "timed_path", e.detail) from None
    return {key: rec}
