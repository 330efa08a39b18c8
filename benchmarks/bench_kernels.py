"""Kernel benchmark: per family, every valid config on every sweep shape (exhaustive grid), the
best against torch eager and torch.compile, the dispatch table it implies, and the grid timings
kept for the search-efficiency replay.

  GPU (the device machine; needs torch + triton only):
    python3 benchmarks/bench_kernels.py --out DIR [--families softmax,rmsnorm] [--budget-s 480]
  CPU smoke test of the script itself (Triton interpreter, tiny shapes, few configs):
    TRITON_INTERPRET=1 python benchmarks/bench_kernels.py --smoke --out /tmp/ks
  Search efficiency, replayed here on the GPU grid timings (needs tuner + optuna):
    python benchmarks/bench_kernels.py --replay benchmarks/results/kernels-h200.json

Times are medians of CUDA-event-timed runs with the L2 flushed before each run and inputs rotated
(kernelsearch.harness.timing.bench); 'graph' columns are per-call times inside one CUDA graph."""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COMPILE_FAMILIES = {"softmax", "rmsnorm", "swiglu", "decode_attention", "rope"}


def log(*a, end="\n"):
    print(*a, end=end, flush=True)


def measure_ceilings(dev: str) -> dict:
    import torch

    from kernelsearch.harness import timing as tm

    n = 2 ** 30  # 2 GiB of bf16
    a = torch.empty(n, dtype=torch.bfloat16, device=dev).normal_()
    b = torch.empty_like(a)
    t = tm.bench(lambda: b.copy_(a), [()], dev, warmup=3, reps=10, flush=False)["median_s"]
    copy = 4 * n / t
    t = tm.bench(lambda: a.sum(), [()], dev, warmup=3, reps=10, flush=False)["median_s"]
    read = 2 * n / t
    del a, b
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = tm.bench(lambda: x @ y, [()], dev, warmup=3, reps=10, flush=False)["median_s"]
    return {"copy_Bps": copy, "read_Bps": read, "bf16_flops": 2 * 8192 ** 3 / t}


def variant_forward(family: str, variant: str, cfg: dict):
    from kernelsearch.runtime import ensure_scratch_allocator

    ensure_scratch_allocator()  # device-built TMA descriptors (matmul/persistent)
    mod = importlib.import_module(f"kernelsearch.families.{family}.{variant}")
    return functools.partial(mod.forward, **cfg)


def load_incumbents(path: Optional[str]) -> dict:
    """{(family, shape): (variant, config)}: the best config per shape of an earlier results file,
    timed again beside the new variants (same run, same card state) for a new-vs-old table."""
    if not path:
        return {}
    out = {}
    for fr in json.loads(Path(path).read_text())["families"]:
        for r in fr["rows"]:
            if r.get("variant"):
                out[(fr["family"], tuple(r["shape"]))] = (r["variant"], r["config"])
    return out


def bench_family(name: str, dev: str, budget_s: float, ceil: dict, smoke: bool, reps: int,
                 variants: Optional[list] = None, incumbents: Optional[dict] = None,
                 compile_baseline: bool = True, grid_mode: str = "events",
                 only_shapes: Optional[list] = None) -> dict:
    """variants: search only these (default all); incumbents: {(family, shape): (variant,
    config)} timed first at their shape, marked "incumbent" in the grid. grid_mode "graph":
    every config and the torch baseline are timed per call inside a CUDA graph (GPU time, no
    launch overhead: what a CUDA-graph runtime sees; for h200-graphs.json), and the dispatch
    rule is the graph rule (beat torch eager in a graph by >2%; no eager-mode A/B)."""
    graph_grid = grid_mode == "graph" and dev == "cuda"
    import torch

    from kernelsearch.families import get
    from kernelsearch.families.base import element_size
    from kernelsearch.harness import correctness
    from kernelsearch.harness import timing as tm
    from kernelsearch.table import certify, evidence_of, largest_point, plan

    fam = get(name)
    dt = "float16" if smoke and name in ("matmul", "decode_attention") else (
        "float32" if smoke else "bfloat16")
    shapes = fam.tiny_shapes[:2] if smoke else fam.sweep_shapes
    if only_shapes:  # any shape of this family's rank (model shapes outside the sweep too)
        picked = [tuple(int(v) for v in x.split("x")) for x in only_shapes]
        shapes = [s for s in picked if len(s) == len(fam.shape_dims)] or shapes
    t_family = time.time()
    rows = []
    for si, shape in enumerate(shapes):
        shape_budget = (budget_s - (time.time() - t_family)) / (len(shapes) - si)
        t_shape = time.time()
        es = element_size(dt)
        nbytes, flops = fam.bytes_moved(shape, es), fam.flops(shape)
        nrot = tm.rotations(nbytes, dev, cap=8)
        sets = [fam.make_inputs(shape, dt, dev, torch.Generator().manual_seed(i), "normal")
                for i in range(nrot)]
        row = {"shape": list(shape), "dtype": dt, "bytes": nbytes, "flops": flops}
        eager = tm.bench(fam.torch_default, sets, dev, warmup=3, reps=reps)
        row["eager_s"] = eager["median_s"]
        if graph_grid:
            row["eager_events_s"] = row["eager_s"]
            row["eager_s"] = tm.bench_graph(fam.torch_default, sets)["median_s"]
            row["mode"] = "graph"
        if name in COMPILE_FAMILIES and not smoke and compile_baseline:
            try:
                torch._dynamo.reset()
                cfn = torch.compile(fam.torch_default, mode="max-autotune-no-cudagraphs",
                                    dynamic=False)
                t0 = time.time()
                cfn(*sets[0])
                torch.cuda.synchronize()
                row["compile_build_s"] = time.time() - t0
                row["compiled_s"] = tm.bench(cfn, sets, dev, warmup=3, reps=reps)["median_s"]
            except Exception as e:  # report, keep going
                row["compiled_error"] = f"{type(e).__name__}: {e}"[:300]
        want = fam.torch_default(*sets[0]).float()
        space = [(v, c) for v, c in fam.space(shape) if variants is None or v in variants]
        random.Random(0).shuffle(space)
        if smoke:
            space = space[:3]
        inc = (incumbents or {}).get((name, tuple(shape)))
        if inc is not None:
            space = [inc] + [p for p in space if p != inc]
        grid = []
        for variant, cfg in space:
            if time.time() - t_shape > shape_budget and len(grid) >= 3:
                row["grid_truncated"] = True
                break
            fwd = variant_forward(name, variant, cfg)
            try:
                out = fwd(*sets[0]).float()
                rel = float((out - want).norm() / want.norm())
                if not math.isfinite(rel) or rel > 3e-2:
                    grid.append({"variant": variant, "config": cfg, "error": f"rel {rel:.3g}"})
                    continue
                r = tm.bench_graph(fwd, sets) if graph_grid else tm.bench(
                    fwd, sets, dev, warmup=2, reps=reps)
                grid.append({"variant": variant, "config": cfg, "time_s": r["median_s"]})
                if inc is not None and (variant, cfg) == tuple(inc):
                    grid[-1]["incumbent"] = True
            except Exception as e:
                grid.append({"variant": variant, "config": cfg,
                             "error": f"{type(e).__name__}: {str(e)[:120]}"})
        row["grid"] = grid
        row["grid_size"] = len(space)
        ok = [g for g in grid if "time_s" in g]
        if ok:
            best = min(ok, key=lambda g: g["time_s"])
            row.update(variant=best["variant"], config=best["config"], time_s=best["time_s"])
            fwd = variant_forward(name, best["variant"], best["config"])
            # the full judge on the winner at this very shape (fresh fp64 reference, poisoned
            # allocations, in-place rewrite, bit-identical rerun, ghost run)
            try:
                src = fam.variants[best["variant"]].file.read_text()
                runner = correctness.Runner(src, best["config"])
                correctness.check(runner, fam, [shape], [dt], dev, seeds=1)
                row["verified"] = True
            except Exception as e:
                row["verified"] = False
                row["verify_error"] = str(e)[:300]
            baseline = min(row["eager_s"], row.get("compiled_s", float("inf")))
            base_fn = fam.torch_default
            if dev == "cuda":
                try:
                    row["graph_s"] = tm.bench_graph(fwd, sets)["median_s"]
                    row["eager_graph_s"] = tm.bench_graph(base_fn, sets)["median_s"]
                except Exception as e:
                    row["graph_error"] = str(e)[:200]
                ab = tm.ab(fwd, base_fn, sets, dev, rounds=6, reps=5)
                row["ab_speedup_vs_eager"] = ab["speedup"]
                row["ab_spread"] = [ab["speedup_p25"], ab["speedup_p75"]]
            row["baseline_s"] = baseline
        row["shape_s"] = time.time() - t_shape
        rows.append(row)
        log(f"  {name} {shape}: {len(ok)}/{len(space)} configs in {row['shape_s']:.1f}s; "
            f"best {row.get('variant')} {row.get('config')} {row.get('time_s', 0) * 1e6:.1f} us, "
            f"eager {row['eager_s'] * 1e6:.1f} us, compiled "
            f"{row.get('compiled_s', float('nan')) * 1e6:.1f} us")
        del sets
        if dev == "cuda":
            torch.cuda.empty_cache()
    # dispatch entries: the kernel only where it beats the fallback (torch eager) and passed the
    # judge; range ends are checked again before an entry is kept
    # a shape counts as a kernel win only if the interleaved A/B agrees (lower quartile of the
    # per-round speedups over eager above 1): at launch-bound sizes the sweep and the A/B can
    # disagree, and then torch keeps the shape
    results = [{"shape": r["shape"], "dtype": r["dtype"],
                "variant": r.get("variant") if graph_grid or r.get("ab_spread", [2])[0] > 1.0
                else None,
                "config": r.get("config"), "time_s": r.get("time_s", 0),
                "baseline_s": r["eager_s"]} for r in rows if r.get("verified")]
    entries = plan(name, results, device=dev)
    kept = []
    checked = [(r["variant"], r["config"], r["dtype"], r["shape"]) for r in results if r["variant"]]
    for e in entries:
        ends = []
        for r in rows:
            if r.get("verified") and fam.dims_dict(tuple(r["shape"])) and e.covers(
                    fam.dims_dict(tuple(r["shape"]))):
                base = fam.dims_dict(tuple(r["shape"]))
                for k, (lo, hi) in e.ranges.items():
                    for v in (lo, hi):
                        if v != base[k]:
                            ends.append(tuple(dict(base, **{k: v})[d] for d in fam.shape_dims))
                break
        # the largest point always (the table refuses an entry without it), then the other ends
        top = largest_point(e)
        ends = [top] + [x for x in sorted(set(ends)) if x != top][:1]
        try:
            src = fam.variants[e.variant].file.read_text()
            runner = correctness.Runner(src, e.config)
            correctness.check(runner, fam, ends, [e.dtype], dev, seeds=1)
            e.measured.append({"range_ends_checked": [list(s) for s in ends]})
            checked += [(e.variant, e.config, e.dtype, x) for x in ends]
            kept.append(e)
        except Exception as ex:
            log(f"  dropped entry {e.variant} {e.config} {e.ranges}: {str(ex)[:200]}")
    certify(kept, evidence_of(checked))
    return {"family": name, "rows": rows, "entries": [e.__dict__ for e in kept],
            "seconds": time.time() - t_family}


def fmt_cfg(v, cfg):
    short = {"num_warps": "w", "STAGES": "s", "BLOCK": "B", "ROWS": "R", "BLOCK_M": "m",
             "BLOCK_N": "n", "BLOCK_K": "k", "GROUP_M": "g", "SPLIT_K": "sk", "SPLIT": "sp",
             "BLOCK_R": "br", "BLOCK_C": "bc", "BLOCK_H": "h"}
    return f"{v}(" + ",".join(f"{short.get(k, k)}{x}" for k, x in cfg.items()) + ")"


def print_tables(res: dict, dispatch: Optional[dict] = None) -> list[float]:
    """One table per family; `dispatch` (a table's dict form) overrides the run's own entries
    for the dispatch column and the geometric mean."""
    ceil = res["ceilings"]
    ratios = []
    for fr in res["families"]:
        name = fr["family"]
        compute = name == "matmul"
        log(f"\n### {name} (bf16; ceiling: "
            + (f"cuBLAS 8192^3 {ceil['bf16_flops'] / 1e12:.0f} TFLOP/s" if compute else
               f"copy {ceil['copy_Bps'] / 1e12:.2f} TB/s") + ")")
        log("| shape | best config | time us | " + ("TFLOP/s" if compute else "GB/s")
            + " | % ceil | eager us | compile us | x eager | x compile | graph us (ours/eager) "
              "| dispatch |")
        log("|---|---|---|---|---|---|---|---|---|---|---|")
        ents = fr["entries"] if dispatch is None else [
            e for e in dispatch["entries"] if e["family"] == name]
        from kernelsearch.families import get

        fam = get(name)
        for r in fr["rows"]:
            if "time_s" not in r:
                log(f"| {r['shape']} | (no valid config) | | | | {r['eager_s'] * 1e6:.1f} | | | | | torch |")
                continue
            t = r["time_s"]
            rate = r["flops"] / t / 1e12 if compute else r["bytes"] / t / 1e9
            pct = 100 * (r["flops"] / t / ceil["bf16_flops"] if compute else
                         r["bytes"] / t / ceil["copy_Bps"])
            comp = r.get("compiled_s")
            dims = fam.dims_dict(tuple(r["shape"]))
            hit = any(all(dims[k] == v for k, v in e["match"].items())
                      and all(lo <= dims[k] <= hi for k, (lo, hi) in e["ranges"].items())
                      for e in ents)
            disp_t = t if hit else r["eager_s"]
            best_base = min(r["eager_s"], comp or float("inf"))
            ratios.append(best_base / disp_t)
            g = (f"{r['graph_s'] * 1e6:.1f}/{r['eager_graph_s'] * 1e6:.1f}"
                 if "graph_s" in r else "-")
            log(f"| {'x'.join(map(str, r['shape']))} | {fmt_cfg(r['variant'], r['config'])} | "
                f"{t * 1e6:.1f} | {rate:.0f} | {pct:.0f}% | {r['eager_s'] * 1e6:.1f} | "
                f"{comp * 1e6:.1f} | " if comp else
                f"| {'x'.join(map(str, r['shape']))} | {fmt_cfg(r['variant'], r['config'])} | "
                f"{t * 1e6:.1f} | {rate:.0f} | {pct:.0f}% | {r['eager_s'] * 1e6:.1f} | - | ", end="")
            log(f"{r['eager_s'] / t:.2f} | " + (f"{comp / t:.2f}" if comp else "-")
                + f" | {g} | {'kernel' if hit else 'torch'} |")
    if ratios:
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        log(f"\ngeometric mean over the sweep of (faster of eager/compile) / (dispatched time): "
            f"{gm:.2f}x over {len(ratios)} shapes; shapes slower than the faster baseline: "
            f"{sum(1 for x in ratios if x < 1.0)} (worst {min(ratios):.3f}x), of them more than "
            f"2% slower: {sum(1 for x in ratios if x < 0.98)}")
    return ratios


def print_compare(res: dict) -> None:
    """New variants vs the incumbent config (same run) vs torch eager, per shape."""
    for fr in res["families"]:
        name = fr["family"]
        compute = name == "matmul"
        mode = ("per call inside a CUDA graph" if fr["rows"] and fr["rows"][0].get("mode") == "graph"
                else "CUDA events, L2 flushed")
        log(f"\n### {name}: new variants vs incumbent vs torch eager (same run, bf16; {mode})")
        log("| shape | new best | new us | " + ("TFLOP/s" if compute else "GB/s")
            + " | incumbent | inc. us | torch us | new x torch | inc. x torch | new x inc. |")
        log("|---|---|---|---|---|---|---|---|---|---|")
        for r in fr["rows"]:
            ok = [g for g in r.get("grid", []) if "time_s" in g]
            new = [g for g in ok if not g.get("incumbent")]
            inc = [g for g in ok if g.get("incumbent")]
            nb = min(new, key=lambda g: g["time_s"]) if new else None
            ib = inc[0] if inc else None
            e = r["eager_s"]
            rate = (lambda t: r["flops"] / t / 1e12) if compute else (lambda t: r["bytes"] / t / 1e9)
            cell = lambda g: f"{g['time_s'] * 1e6:.1f}" if g else "-"
            log(f"| {'x'.join(map(str, r['shape']))} | "
                f"{fmt_cfg(nb['variant'], nb['config']) if nb else '(none valid)'} | {cell(nb)} | "
                f"{rate(nb['time_s']):.0f} | " if nb else
                f"| {'x'.join(map(str, r['shape']))} | (none valid) | - | - | ", end="")
            log(f"{fmt_cfg(ib['variant'], ib['config']) if ib else '-'} | {cell(ib)} | "
                f"{e * 1e6:.1f} | {e / nb['time_s'] if nb else float('nan'):.2f} | "
                f"{e / ib['time_s'] if ib else float('nan'):.2f} | "
                f"{ib['time_s'] / nb['time_s'] if nb and ib else float('nan'):.2f} |")
        errs = [g for r in fr["rows"] for g in r.get("grid", []) if "error" in g]
        if errs:
            log(f"{len(errs)} configs failed, e.g. {fmt_cfg(errs[0]['variant'], errs[0]['config'])}:"
                f" {errs[0]['error'][:160]}")


def run(args) -> int:
    import torch

    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if dev == "cpu" and not args.smoke:
        log("no GPU: use --smoke (Triton interpreter, tiny shapes) or run on the device machine")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu-interpreter",
           "torch": torch.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "families": []}
    import triton

    res["triton"] = triton.__version__
    res["ceilings"] = measure_ceilings(dev) if dev == "cuda" else {
        "copy_Bps": 1e9, "read_Bps": 1e9, "bf16_flops": 1e9}
    log(f"ceilings: {json.dumps({k: round(v / 1e12, 3) for k, v in res['ceilings'].items()})} (T/s)")
    fams = args.families.split(",")
    weights = {"softmax": 2.6, "rmsnorm": 1.0, "swiglu": 0.6, "matmul": 1.2, "decode_attention": 0.8,
               "rope": 0.4}
    for i, name in enumerate(fams):
        left = args.budget_s - (time.time() - t0)
        share = left * weights.get(name, 1) / sum(weights.get(n, 1) for n in fams[i:])
        log(f"== {name}: budget {share:.0f}s")
        try:
            fr = bench_family(name, dev, share, res["ceilings"], args.smoke, args.reps,
                              variants=args.variants.split(",") if args.variants else None,
                              incumbents=load_incumbents(args.incumbents),
                              compile_baseline=not args.no_compile, grid_mode=args.grid_mode,
                              only_shapes=args.shapes.split(",") if args.shapes else None)
        except Exception as e:  # one family's failure must not lose the others' results
            import traceback

            traceback.print_exc()
            res.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:500]
            continue
        res["families"].append(fr)
        (out / "kernels-results.json").write_text(json.dumps(res, indent=1, default=str))
    from kernelsearch.table import DispatchTable, Entry

    table = DispatchTable([Entry(**e) for fr in res["families"] for e in fr["entries"]],
                          device=res["device"],
                          meta={"measured": res["started"], "torch": res["torch"],
                                "triton": res["triton"], "source": "benchmarks/bench_kernels.py",
                                "fallback": "torch eager outside every range"})
    table.save(out / "dispatch-table.json")
    res["seconds"] = time.time() - t0
    (out / "kernels-results.json").write_text(json.dumps(res, indent=1, default=str))
    print_tables(res)
    if args.incumbents:
        print_compare(res)
    log(f"\ntotal {res['seconds']:.0f}s; results in {out}")
    return 0


def replay(args) -> int:
    """Search efficiency on the GPU grid timings: grid, random and Optuna with the project's
    proposers, replaying the measured time of each config (no GPU needed)."""
    from tuner.search.kernel import replay_efficiency

    res = json.loads(Path(args.replay).read_text())
    rows = replay_efficiency(res, seeds=args.seeds, budget_frac=0.2)
    log("\n### search efficiency (replayed H200 grid timings; per shape a budget of 20% of its "
        f"valid grid; buckets in sweep order, each seeded with the previous winner; {args.seeds} seeds)")
    log("| family | shape | grid | evals | configs within 2% | median/best | optuna % off "
        "| random % off | grid % off | within 2%: optuna / random / grid |")
    log("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for s in r["shapes"]:
            log(f"| {r['family']} | {s['shape']} | {s['grid_size']} | {s['budget']} | "
                f"{100 * s['within_2pct_share']:.0f}% | {s['median_over_best']:.2f} | "
                f"{s['optuna_pct']:.1f}% | {s['random_pct']:.1f}% | {s['grid_pct']:.1f}% | "
                f"{s['optuna_hits']}/{s['random_hits']}/{s['grid_hits']} of {r['seeds']} |")
        log(f"| **{r['family']}** | all | | | | | **{r['optuna_pct']:.1f}%** | {r['random_pct']:.1f}% "
            f"| {r['grid_pct']:.1f}% | **{r['optuna_hits']}**/{r['random_hits']}/{r['grid_hits']} "
            f"of {r['optuna_runs']} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "search-efficiency.json").write_text(json.dumps(rows, indent=1))
    return 0


def harness_check(args) -> int:
    """The judge itself on this machine: every built-in variant through the child-process
    harness (guard, correctness on the GPU, timing with the physical floor, CUDA-graph mode,
    A/B vs torch), and the red-team candidates; one line each."""
    import concurrent.futures as cf

    from kernelsearch.families import get, NAMES
    from kernelsearch.harness import check
    from kernelsearch.harness.timing import H200

    red = ROOT / "tests" / "kernelsearch" / "redteam"
    jobs = []
    for n in NAMES:
        fam = get(n)
        base = {"softmax": (4096, 8192), "rmsnorm": (4096, 8192), "swiglu": (4096, 8192),
                "matmul": (2048, 2048, 2048), "decode_attention": (8, 32, 8, 4096, 128),
                "rope": (64, 40, 128)}[n]
        for vname, var in fam.variants.items():
            if var.kind == "library":  # a wrapper, not a Triton source: check_library.py
                continue
            shape = base
            cfgs = var.configs(shape)
            if not cfgs:  # skinny takes M <= 16, split rows that are not a power of two: the
                # smallest shape it takes (the float64 reference of 32768x18992 needs 4.6 GiB)
                shape = min((tuple(s) for s in fam.search_shapes + fam.heldout_shapes
                             if var.configs(s)), key=math.prod)
                cfgs = var.configs(shape)
            jobs.append((f"{n}/{vname}", dict(family=n, candidate=var.file, config=cfgs[len(cfgs) // 2],
                         device="cuda", ceilings=H200, graph=True, timing_shapes=[shape],
                         shapes=[shape] + fam.heldout_shapes[:2], timeout_s=240)))
    for name, extra in [("honest", {}), ("torch_operators", {}), ("partial_output", {}),
                        ("only_tested_shapes", {}), ("mutates_input", {}), ("never_launches", {}),
                        ("wrong_dtype", {}), ("compile_error", {}), ("hangs", {"timeout_s": 40}),
                        ("crash_wild_pointer", {}), ("memory_hog", {"gpu_mem_limit_mb": 4096}),
                        ("low_precision", {"dtypes": ["float32"]}),
                        ("patches_timer", {"static_guard": False}),
                        ("cache_data_ptr", {"static_guard": False}),
                        ("torch_op", {}), ("side_stream", {}), ("starts_thread", {})]:
        kw = dict(family="softmax", candidate=red / f"{name}.py", device="cuda", ceilings=H200,
                  timeout_s=120)
        kw.update(extra)
        jobs.append((f"redteam/{name}", kw))
    rows = []
    with cf.ThreadPoolExecutor(max_workers=args.parallel) as ex:
        futs = {ex.submit(check, **kw): label for label, kw in jobs}
        for f in cf.as_completed(futs):
            v = f.result()
            rows.append((futs[f], v))
            t = next(iter(v.timings.values()), {})
            log(f"{futs[f]:<34} {v.verdict:<9} {v.stage:<12} {v.code:<15} {v.rule:<22} "
                f"{t.get('median_us', float('nan')):9.1f} us  graph "
                f"{t.get('graph_us', float('nan')):8.1f} us  x{t.get('speedup_vs_torch', float('nan')):.2f}"
                f"  {v.seconds:5.1f}s  {v.detail[:90]!r}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "harness-check.json").write_text(json.dumps(
            [dict(v.to_dict(), label=label) for label, v in sorted(rows, key=lambda r: r[0])],
            indent=1, default=str))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--families", default="softmax,rmsnorm,swiglu,matmul,decode_attention,rope")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--replay", default=None, help="kernels-results.json from a GPU run")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--tables", default=None, help="print the tables of a results file")
    ap.add_argument("--dispatch", default=None, help="with --tables: the dispatch table in force")
    ap.add_argument("--harness-check", action="store_true",
                    help="run the judge (child processes) on every variant and red-team candidate")
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--variants", default=None,
                    help="search only these variants (comma list), e.g. persistent,skinny")
    ap.add_argument("--incumbents", default=None,
                    help="earlier results file: its best config per shape is timed again beside "
                         "the new variants and a new-vs-incumbent-vs-torch table is printed")
    ap.add_argument("--grid-mode", choices=["events", "graph"], default="events",
                    help="graph: time the grid and torch per call inside a CUDA graph (GPU time)")
    ap.add_argument("--shapes", default=None,
                    help="only these shapes (comma list, e.g. 1x4096x4096,8x6144x4096; a family "
                         "takes those of its rank, sweep shapes or not)")
    ap.add_argument("--no-compile", action="store_true",
                    help="skip the torch.compile baseline (device time)")
    args = ap.parse_args()
    if args.harness_check:
        return harness_check(args)
    if args.tables:
        print_tables(json.loads(Path(args.tables).read_text()),
                     json.loads(Path(args.dispatch).read_text()) if args.dispatch else None)
        return 0
    return replay(args) if args.replay else run(args)


if __name__ == "__main__":
    sys.exit(main())
