"""The judge in one process: guard -> correctness -> timing. `runner.check` wraps it in a child
process; call this directly only for trusted code (the built-in variants) or inside that child."""
from __future__ import annotations

import os
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


def classify(exc: BaseException, stage: str) -> Verdict:
    """An exception from the candidate: compile failure if triton's compiler/frontend raised it,
    otherwise the candidate crashed."""
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


def judge(family_name: str, source: str, config: Optional[dict] = None, *, device: str = "cpu",
          dtypes: Optional[list] = None, shapes: Optional[list] = None, random_shapes: int = 2,
          seeds: int = 2, timing: bool = True, timing_shapes: Optional[list] = None,
          ceilings=None, incumbent: bool = True, graph: bool = False,
          reps: int = 30, static_guard: bool = True, timing_dtype: Optional[str] = None,
          against: Optional[tuple] = None) -> Verdict:
    """static_guard=False skips the AST guard (red-team tests of the runtime checks only).
    against=(source, config): an incumbent kernel to A/B against (interleaved) besides torch."""
    t0 = time.time()
    v = guard_stage(source) if static_guard else None
    if v:
        v.seconds = time.time() - t0
        return v
    from kernelsearch.harness import sandbox

    keep = sandbox.loaded()
    try:
        return _judge(family_name, source, config, device=device, dtypes=dtypes, shapes=shapes,
                      random_shapes=random_shapes, seeds=seeds, timing=timing,
                      timing_shapes=timing_shapes, ceilings=ceilings, incumbent=incumbent,
                      graph=graph, reps=reps, timing_dtype=timing_dtype, against=against, t0=t0)
    finally:
        sandbox.cleanup(keep)  # the candidate's module files (ks-cand-*)


def _judge(family_name: str, source: str, config: Optional[dict], *, device, dtypes, shapes,
           random_shapes, seeds, timing, timing_shapes, ceilings, incumbent, graph, reps,
           timing_dtype, against, t0) -> Verdict:
    checks = ["guard"]
    import torch  # noqa: F401  (heavy imports only past the guard)

    from kernelsearch.families import get
    from kernelsearch.harness import correctness, timing as tm

    family = get(family_name)
    dtypes = list(dtypes or default_dtypes(family, device))
    shapes = [tuple(s) for s in (shapes or family.tiny_shapes)]
    shapes += correctness.random_shapes(family, random_shapes, big=(device == "cuda"))
    stage = "correctness"
    timings: dict = {}
    try:
        runner = correctness.Runner(source, config)
        correctness.check(runner, family, shapes, dtypes, device, seeds=seeds, log=checks)
        if timing:
            stage = "timing"
            from kernelsearch.families.base import element_size

            for shape in [tuple(s) for s in (timing_shapes or shapes[:1])]:
                dt = timing_dtype or ("bfloat16" if device == "cuda" and "bfloat16" in dtypes
                                      else dtypes[0])
                es = element_size(dt)
                nbytes = family.bytes_moved(shape, es)
                nrot = tm.rotations(nbytes, device)
                sets = []
                for i in range(nrot):
                    g = torch.Generator().manual_seed(1000 + i)
                    sets.append(family.make_inputs(shape, dt, device, g, "normal"))
                fn = runner.fast_forward()
                r = tm.bench(fn, sets, device, reps=reps)
                # the timed path (no sandbox, no poison) must compute the same function: a
                # kernel that notices it is not being checked and skips work is caught here
                # (fresh inputs: a stale buffer from the timed runs cannot hold their answer)
                fresh = family.make_inputs(shape, dt, device, torch.Generator().manual_seed(
                    int.from_bytes(os.urandom(4), "little")), "normal")
                try:
                    correctness.compare(fn(*fresh), family.reference(*fresh), dt, family,
                                        f"timed path, shape {shape} {dt}")
                except Rejected as e:
                    raise Rejected("timing", "incorrect", "timed_path", e.detail) from None
                key = f"{'x'.join(map(str, shape))}:{dt}"
                rec = {"median_us": r["median_s"] * 1e6, "p25_us": r["p25_s"] * 1e6,
                       "p75_us": r["p75_s"] * 1e6, "mode": r["mode"],
                       "GBps": nbytes / r["median_s"] / 1e9,
                       "TFLOPs": family.flops(shape) / r["median_s"] / 1e12}
                why = tm.too_fast(r["median_s"], nbytes, family.flops(shape), ceilings)
                if why:
                    raise Rejected("timing", "too_fast", "below_floor", f"{key}: {why}")
                if graph and device == "cuda":
                    rec["graph_us"] = tm.bench_graph(fn, sets)["median_s"] * 1e6
                rec.update(tm.host_costs(fn, family.torch_default, sets, device))
                if incumbent:
                    ab = tm.ab(fn, lambda *a: family.torch_default(*a), sets, device,
                               rounds=4 if device != "cuda" else 8, reps=3 if device != "cuda" else 10)
                    rec["speedup_vs_torch"] = ab["speedup"]
                    rec["speedup_spread"] = [ab["speedup_p25"], ab["speedup_p75"]]
                if against is not None:
                    inc = correctness.Runner(against[0], against[1]).fast_forward()
                    ab = tm.ab(fn, inc, sets, device, rounds=4 if device != "cuda" else 8,
                               reps=3 if device != "cuda" else 10)
                    rec["speedup_vs_incumbent"] = ab["speedup"]
                    rec["incumbent_spread"] = [ab["speedup_p25"], ab["speedup_p75"]]
                timings[key] = rec
            checks.append("timing")
    except Rejected as r:
        return r.verdict(timings=timings, checks=checks, seconds=time.time() - t0)
    except Exception as e:  # the candidate's own failure is a verdict, not a harness error
        v = classify(e, stage)
        v.timings, v.checks, v.seconds = timings, checks, time.time() - t0
        return v
    return Verdict(verdict="accepted", stage="timing" if timing else "correctness",
                   code="accepted", detail=f"{len(checks) - 1} checks passed",
                   timings=timings, checks=checks, seconds=time.time() - t0)
