"""Holistic inference benchmark: decode and prefill tokens/s at several context lengths for

  torch+graphs     plain torch, decode replayed as a CUDA graph (what serving engines run)
  dispatch+graphs  the same with the kernel search's dispatch table installed
  tuned+graphs     dispatch table + tuned runtime settings (fused QKV and gate|up projections)
  compile          torch.compile(mode="max-autotune") of the plain model (its own CUDA graphs),
                   bounded by --compile-budget-s (sizes not reached are listed as skipped)
  tuned-no-graphs  the tuned path with CUDA graphs off (the canonical trap)

then applies the holistic keep rule (tuner.search.keep.decide_sizes) to tuned vs torch+graphs and
to graphs-off vs tuned (with its micro-benchmark: time to the first decoded token, capture
included). Needs no pydantic to time (the GPU machine has none): if tuner.search.keep cannot be
imported the verdicts are computed later with `--report FILE` on a machine that has it.

  python benchmarks/bench_holistic.py --out benchmarks/results/holistic-h200.json
  python benchmarks/bench_holistic.py --report benchmarks/results/holistic-h200.json
  python benchmarks/bench_holistic.py --device cpu --model tiny --contexts 16,64 --compile-budget-s 0
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.workloads.llama import (Bench, Llama, LlamaConfig, Runtime, SizeGrid,  # noqa: E402
                                   check, load_dispatch, size_key)

BASE = "torch+graphs"


def variants(table_ok: bool) -> dict[str, dict]:
    return {
        BASE: {"use_dispatch": False, "cuda_graphs": True},
        "dispatch+graphs": {"use_dispatch": True, "cuda_graphs": True},
        "tuned+graphs": {"use_dispatch": True, "cuda_graphs": True, "fuse_projections": True},
        "compile": {"use_dispatch": False, "compile_mode": "max-autotune"},
        # the same kernels without inductor's cudagraph trees, captured by this runner as a
        # CUDA graph (how vLLM combines the two)
        "compile+graphs": {"use_dispatch": False, "compile_mode": "max-autotune-no-cudagraphs",
                           "cuda_graphs": True},
        "tuned-no-graphs": {"use_dispatch": True, "cuda_graphs": False, "fuse_projections": True},
    }


def find_table(arg: str, gpu: str) -> str | None:
    if arg == "none":
        return None
    if arg != "auto":
        return arg
    root = Path(__file__).resolve().parents[1]
    cands = sorted(glob.glob(str(root / "host_profiles" / "kernels" / "*.json")))
    key = "h200" if "H200" in gpu else gpu.lower().split()[-1] if gpu else ""
    pref = [c for c in cands if key and key in Path(c).name.lower()]
    # a table selected inside CUDA graphs (h200-graphs.json) suits the graph runtimes measured here
    graphs = [c for c in pref if "graph" in Path(c).name]
    return (graphs or pref or cands or [None])[-1]


def run(args: argparse.Namespace) -> dict:
    import torch

    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    ctxs = [int(x) for x in args.contexts.split(",")]
    dbs = [int(x) for x in args.decode_batches.split(",")]
    cfg = LlamaConfig.preset(args.model)
    t_start = time.time()
    model = Llama(cfg, dev, seed=0)
    model.rope(max(ctxs) + 2)  # build the rotary table once, before any capture or compile
    dispatch = load_dispatch()
    table_path = find_table(args.table, gpu)
    table_info: dict = {"path": table_path}
    if dispatch is not None and table_path:
        t = dispatch.install(table_path)
        table_info["entries"] = len(getattr(t, "entries", []) or [])
    out: dict = {
        "env": {"gpu": gpu, "torch": torch.__version__, "python": platform.python_version(),
                "triton": _version("triton"), "model": args.model, "config": cfg.__dict__,
                "params": cfg.params(), "dispatch_available": dispatch is not None,
                "table": table_info, "started": time.strftime("%Y-%m-%d %H:%M:%S")},
        "contexts": ctxs, "decode_batches": dbs, "prefill_batch": args.prefill_batch,
        "variants": {}, "micro": {},
    }
    grid = SizeGrid(contexts=ctxs, decode_batches=dbs,
                    prefill_batches=[args.prefill_batch], decode_steps=args.decode_steps)
    bench = Bench(model, grid, dispatch)
    dec_all = [("decode", b, c) for b in dbs for c in ctxs]
    pre = [("prefill", args.prefill_batch, c) for c in ctxs]
    wanted = args.variants.split(",") if args.variants else [v for v in variants(True) if v != "compile+graphs"]
    if "prefill" not in args.phases:
        pre = []
    if "decode" not in args.phases:
        dec_all = []
    for name, rtd in variants(bool(table_path)).items():
        if name not in wanted:
            continue
        rt = Runtime.from_dict(rtd)
        t0 = time.time()
        rec: dict = {"runtime": rtd}
        is_compile = rt.compile_mode is not None
        dec = [s for s in dec_all if s[1] == dbs[0]] if is_compile else dec_all
        if is_compile and args.compile_budget_s <= 0:
            rec["skipped"] = [size_key(*s) for s in dec_all + pre]
            rec["note"] = "compile skipped (--compile-budget-s 0)"
            out["variants"][name] = rec
            continue
        before = dispatch.stats() if dispatch is not None and hasattr(dispatch, "stats") else {}
        deadline = time.time() + args.compile_budget_s if is_compile else None
        try:
            if not is_compile:
                rec["check"] = check(model, rt, dispatch, batch=2, ctx=min(256, max(ctxs)))
            rd = bench.run(rt, repeats=args.repeats, sizes=dec, deadline=deadline)
            rp = bench.run(rt, repeats=args.prefill_repeats, sizes=pre, deadline=deadline)
        except Exception as e:  # report, keep going: one variant's failure must not lose the rest
            rec["error"] = f"{type(e).__name__}: {str(e)[:500]}"
            rd = rp = {"per_size_samples": {}, "setup_s": {}, "skipped": [size_key(*s) for s in dec + pre]}
        rec["per_size_samples"] = {**rd["per_size_samples"], **rp["per_size_samples"]}
        rec["setup_s"] = {**rd["setup_s"], **rp["setup_s"]}
        rec["skipped"] = rd["skipped"] + rp["skipped"] + [size_key(*s) for s in dec_all if s not in dec]
        if dispatch is not None and hasattr(dispatch, "stats"):
            after = dispatch.stats()
            rec["dispatch_calls"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        try:
            rec["decode_check"] = _decode_check(bench, model, rt, dec)
        except Exception as e:
            rec["decode_check"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        rec["seconds"] = time.time() - t0
        out["variants"][name] = rec
        print(f"[{time.time() - t_start:6.1f}s] {name}: {rec['seconds']:.1f}s"
              + (f" skipped {rec['skipped']}" if rec["skipped"] else "")
              + (f" ERROR {rec['error']}" if "error" in rec else ""), flush=True)
        _save(out, args)  # partial results survive a kill
        bench.drop(rt)
        if dev == "cuda":
            torch.cuda.empty_cache()
    # the micro-benchmark that favours graphs off: first decoded token, setup included
    from tuner.workloads.llama import DecodeRunner, _sync

    for name in ("tuned+graphs", "tuned-no-graphs"):
        if name not in wanted:
            continue
        rt = Runtime.from_dict(variants(True)[name])
        times = []
        try:
            for _ in range(3):
                t0 = time.perf_counter()
                r = DecodeRunner(model, rt, dbs[0], ctxs[0], dispatch=dispatch).prepare(warmup=1)
                r.step()
                _sync(model.device)
                times.append(time.perf_counter() - t0)
                del r
            out["micro"][name] = {"first_token_s": times}
        except Exception as e:
            out["micro"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    out["total_s"] = time.time() - t_start
    return out


def _out_path(res: dict, args: argparse.Namespace) -> Path:
    name = res["env"]["gpu"].lower().replace("nvidia ", "").replace(" ", "-")
    return Path(args.out or Path(__file__).parent / "results" / f"holistic-{name}.json")


def _save(res: dict, args: argparse.Namespace) -> Path:
    out = _out_path(res, args)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(res, indent=1, default=str)
    out.write_text(text)
    if os.environ.get("OUT"):  # the device tool's result folder
        Path(os.environ["OUT"], out.name).write_text(text)
    return out


def _decode_check(bench: Bench, model: Llama, rt: Runtime, dec: list) -> dict:
    """The benchmarked runner's own output at the first decode size (graph replay, compiled or
    eager) against the plain torch decode step on the same cache and tokens."""
    import torch

    from tuner.workloads.llama import Ops, default_tolerance, rel_err

    for kind, b, c in dec:
        key = (rt.key(), kind, b, c)
        r = bench._runners.get(key)
        if r is None:
            continue
        with torch.no_grad():
            out = r.step().clone()
            ref = model.decode_step(Ops(Runtime(use_dispatch=False)), r.tokens, c, r.cache)
        err = rel_err(out, ref)
        return {"size": size_key(kind, b, c), "rel_err": err,
                "ok": err <= default_tolerance(model.cfg.dtype)}
    return {}


def diag(args: argparse.Namespace, out: Path) -> None:
    import gc

    import torch

    from tuner.workloads import diagnose as D

    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    ctx = int(args.contexts.split(",")[0])
    b = int(args.decode_batches.split(",")[0])
    d = D.diagnose(args.model, "decode", b, ctx, steps=5, device=args.device)
    stem = out.with_name(out.stem.replace("holistic", "diagnose"))
    text = json.dumps(d, indent=1, default=str)
    stem.with_suffix(".json").write_text(text)
    png = D.chart(d, stem.with_suffix(".png"))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], stem.name + ".json").write_text(text)
        Path(os.environ["OUT"], stem.name + ".png").write_bytes(png.read_bytes())
    print()
    print(D.summary_markdown(d))


def _version(mod: str) -> str:
    try:
        return __import__(mod).__version__
    except Exception:
        return "n/a"


def report(res: dict) -> None:
    ctxs, vs = res["contexts"], res["variants"]
    base = vs.get(BASE, {}).get("per_size_samples", {})

    def med(v: dict, k: str):
        s = v.get("per_size_samples", {}).get(k)
        return statistics.median(s) if s else None

    e = res["env"]
    print(f"\n{e['gpu']}  torch {e['torch']}  triton {e['triton']}  model {e['model']} "
          f"({e['params'] / 1e9:.2f}B params)  table {e['table'].get('path')} "
          f"({e['table'].get('entries', 0)} entries)")
    for kind, b in [("decode", b) for b in res["decode_batches"]] + [("prefill", res["prefill_batch"])]:
        print(f"\n{kind} tokens/s (batch {b}); x = ratio to {BASE}")
        head = f"{'variant':18s}" + "".join(f"{'ctx ' + str(c):>22s}" for c in ctxs)
        print(head)
        for name, v in vs.items():
            cells = []
            for c in ctxs:
                k = size_key(kind, b, c)
                m = med(v, k)
                if m is None:
                    cells.append(f"{'skipped':>22s}")
                    continue
                spread = v.get("per_size_samples", {}).get(k)
                sp = (max(spread) - min(spread)) / 2 / m if spread and len(spread) > 1 else 0
                bm = statistics.median(base[k]) if base.get(k) else None
                x = f" {m / bm:5.2f}x" if bm else ""
                cells.append(f"{m:>10,.0f} ±{sp:4.1%}{x}")
            print(f"{name:18s}" + "".join(f"{c:>22s}" for c in cells))
    for name, v in vs.items():
        for k in ("error", "note"):
            if k in v:
                print(f"{name}: {k}: {v[k]}")
        if v.get("decode_check", {}).get("size"):
            d = v["decode_check"]
            print(f"{name}: benchmarked decode output vs plain torch at {d['size']}: "
                  f"{'ok' if d['ok'] else 'MISMATCH'} (rel err {d['rel_err']:.2e})")
        if "check" in v:
            c = v["check"]
            print(f"{name}: outputs vs plain torch: {'ok' if c['ok'] else 'MISMATCH'} "
                  f"(prefill {c['errors']['prefill']:.2e}, decode {c['errors']['decode']:.2e})"
                  + (f"; dispatch calls {v.get('dispatch_calls')}" if v.get("dispatch_calls") else ""))
    # the targets, decode at the first (serving) batch size
    b0 = res["decode_batches"][0]
    comp = vs.get("compile+graphs") or vs.get("compile", {})
    for tname in ("dispatch+graphs", "tuned+graphs"):
        tuned = vs.get(tname, {})
        print(f"\ntargets (decode, batch {b0}): {tname} >= 1.15x {BASE} and >= compile at every context")
        for c in ctxs:
            k = size_key("decode", b0, c)
            t, p, cm = med(tuned, k), (statistics.median(base[k]) if base.get(k) else None), med(comp, k)
            r1 = f"{t / p:.2f}x plain ({'met' if t / p >= 1.15 else 'NOT met'})" if t and p else "n/a"
            r2 = f"{t / cm:.2f}x compile ({'met' if t >= cm else 'NOT met'})" if t and cm else "compile not measured"
            print(f"  ctx {c}: {r1}; {r2}")
    try:
        from tuner.search.keep import decide_sizes
        from tuner.workloads.base import summarize
    except ImportError as ex:
        print(f"\nholistic verdicts: not computed here ({ex}); run --report on this JSON")
        return

    def meas(v: dict):
        ps = {k: s for k, s in v.get("per_size_samples", {}).items() if s}
        return [summarize("tokens_per_s", "tok/s", ps)] if ps else []

    def verdict(a: str, b: str, micro=None) -> None:
        if not (meas(vs.get(a, {})) and meas(vs.get(b, {}))):
            return
        ma, mb = meas(vs[a]), meas(vs[b])
        common = set(ma[0].per_size) & set(mb[0].per_size)
        ma = [summarize("tokens_per_s", "tok/s", {k: vs[a]["per_size_samples"][k] for k in common})]
        mb = [summarize("tokens_per_s", "tok/s", {k: vs[b]["per_size_samples"][k] for k in common})]
        v, r, st = decide_sizes(ma, mb, micro_gain=micro)
        worst = min(st["per_size"].items(), key=lambda kv: kv[1]["ratio"])
        print(f"  {b} vs {a}: {v} ({r}); holistic {st['gain']:+.1%} (noise {st['noise']:.1%}); "
              f"worst size {worst[0]} {worst[1]['ratio'] - 1:+.1%}"
              + (f"; micro-benchmark {micro:+.0%}" if micro is not None else ""))

    print("\nholistic keep rule (tuner.search.keep.decide_sizes, tolerance 1%):")
    verdict(BASE, "dispatch+graphs")
    verdict(BASE, "tuned+graphs")
    mic = res.get("micro", {})
    micro = None
    if all("first_token_s" in mic.get(n, {}) for n in ("tuned+graphs", "tuned-no-graphs")):
        micro = min(mic["tuned+graphs"]["first_token_s"]) / min(mic["tuned-no-graphs"]["first_token_s"]) - 1
    verdict("tuned+graphs", "tuned-no-graphs", micro)
    verdict("compile", "tuned+graphs")
    verdict("compile+graphs", "tuned+graphs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3-8b-4l")
    ap.add_argument("--contexts", default="4096,16384,65536,131072")
    ap.add_argument("--decode-batches", default="8,1", help="decode batch sizes; torch.compile runs only the first")
    ap.add_argument("--prefill-batch", type=int, default=1)
    ap.add_argument("--decode-steps", type=int, default=20, help="graph replays per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefill-repeats", type=int, default=3)
    ap.add_argument("--table", default="auto", help="dispatch table: auto (host_profiles/kernels/*.json), a path, or none")
    ap.add_argument("--compile-budget-s", type=float, default=180.0)
    ap.add_argument("--variants", default="", help="comma-separated subset (compile+graphs only when named)")
    ap.add_argument("--phases", default="decode,prefill")
    ap.add_argument("--merge", nargs="+", default=None, help="merge the variants of several results JSONs into --out")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/holistic-<gpu>.json)")
    ap.add_argument("--report", default=None, help="print the table and verdicts of a results JSON")
    ap.add_argument("--diagnose", action="store_true", help="also run tuner.workloads.diagnose (decode, first "
                    "context and batch) and save its JSON and chart beside the results")
    args = ap.parse_args()
    if args.merge:
        res = json.loads(Path(args.merge[0]).read_text())
        for extra in args.merge[1:]:
            more = json.loads(Path(extra).read_text())
            res["variants"].update(more["variants"])
            res.setdefault("merged_from", []).append({"file": extra, "env": more["env"]})
        out = Path(args.out)
        out.write_text(json.dumps(res, indent=1, default=str))
        report(res)
        return 0
    if args.report:
        report(json.loads(Path(args.report).read_text()))
        return 0
    res = run(args)
    out = _save(res, args)
    report(res)
    if args.diagnose:
        try:
            diag(args, out)
        except Exception as e:  # the table above is what matters; say why the rest is missing
            print(f"diagnose failed: {type(e).__name__}: {str(e)[:500]}")
    print(f"\nresults: {out}  ({res['total_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
