"""Two or more GPUs: all-reduce bus bandwidth and tensor-parallel decode, P2P on and off.

    python benchmarks/bench_tp.py --out OUT            # on a machine with 2+ GPUs (NCCL)
    python benchmarks/bench_tp.py --cpu --out OUT      # the same code on gloo CPU ranks (tiny)

1. How the GPUs are linked: `nvidia-smi topo -m` (read-only).
2. All-reduce bus bandwidth (nccl-tests' busbw) from 1 MB to 1 GB, with P2P on and with
   NCCL_P2P_DISABLE=1 (a box whose GPUs have no peer-to-peer path: traffic through host memory).
3. TP decode tokens/s (Llama-3-8B geometry, 4 layers, batch 8, CUDA graphs) at 4k and 32k with
   NCCL's defaults, then a coordinate sweep over the collective settings
   (tuner.workloads.tensor_parallel.RUNTIME_DIMS less cuda_graphs), best kept only if it beats the
   incumbent's geometric mean by more than the measured spread, then the defaults and the best
   re-measured in ABBA order; for P2P on and off.

NVLink multicast is off in every process (tuner.workloads.collectives.MULTICAST_OFF). Nothing here
changes a GPU setting. Needs torch only (no pydantic): it runs on bare GPU machines.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tuner.workloads.allreduce import allreduce_busbw  # noqa: E402
from tuner.workloads.collectives import Collectives  # noqa: E402
from tuner.workloads.stats import geomean, rel_spread  # noqa: E402
from tuner.workloads.tensor_parallel import RUNTIME_DIMS, TensorParallelWorkload  # noqa: E402

MB = 1 << 20


def topology() -> str:
    try:
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(nvidia-smi topo -m: {e})"


def geo(res: dict) -> float:
    per = res["per_size_samples"]
    return geomean([statistics.median(v) for v in per.values()])


def spread(res: dict) -> float:
    per = res["per_size_samples"]
    n = min(len(v) for v in per.values())
    return rel_spread([geomean([v[i] for v in per.values()]) for i in range(n)])


def measure(wl: TensorParallelWorkload, runtime: dict, repeats: int) -> dict:
    wl.configure(runtime)
    chk = wl.check()
    if not chk["ok"]:
        raise SystemExit(f"outputs differ under {runtime}: {chk}")
    return wl.bench(repeats=repeats)


def sweep(wl: TensorParallelWorkload, p2p: bool, repeats: int, log: list) -> tuple[dict, dict]:
    """Coordinate sweep over the collective dims from NCCL's defaults; returns (best, its result)."""
    best: dict = {"p2p": p2p}
    best_res = measure(wl, best, repeats)
    log.append({"runtime": dict(best), "geomean": geo(best_res), "spread": spread(best_res)})
    for dim, values in RUNTIME_DIMS.items():
        if dim == "cuda_graphs":
            continue  # a runtime setting of the model, not of the collectives
        for v in values:
            if best.get(dim) == v or (v is None and dim not in best):
                continue
            cand = {**best, dim: v}
            try:
                res = measure(wl, cand, repeats)
            except Exception as e:  # noqa: BLE001 (an NCCL setting this box refuses)
                log.append({"runtime": cand, "error": str(e)})
                continue
            g, noise = geo(res), max(spread(res), spread(best_res))
            log.append({"runtime": cand, "geomean": g, "spread": spread(res)})
            if g > geo(best_res) * (1 + noise):
                best, best_res = cand, res
    return best, best_res


def abba(wl: TensorParallelWorkload, a: dict, b: dict, repeats: int, rounds: int) -> tuple[dict, dict]:
    out: dict = {"a": {}, "b": {}}
    for r in range(rounds):
        for which in (("a", "b") if r % 2 == 0 else ("b", "a")):
            res = measure(wl, a if which == "a" else b, repeats)
            for k, v in res["per_size_samples"].items():
                out[which].setdefault(k, []).extend(v)
    return out["a"], out["b"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--cpu", action="store_true", help="gloo CPU ranks, tiny model and sizes")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--model", default=None)
    ap.add_argument("--contexts", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-allreduce", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    backend = "gloo" if args.cpu else "nccl"
    model = args.model or ("tiny" if args.cpu else "llama3-8b-4l")
    contexts = [int(x) for x in (args.contexts or ("16,64" if args.cpu else "4096,32768")).split(",")]
    report: dict = {"backend": backend, "tp": args.tp, "model": model, "contexts": contexts,
                    "batch": args.batch, "topology": topology() if not args.cpu else None}
    t0 = time.time()
    if not args.skip_allreduce:
        sizes = [1 * MB, 4 * MB, 16 * MB] if args.cpu else [MB << (2 * i) for i in range(6)]
        report["allreduce"] = {}
        for p2p in (True, False):
            r = allreduce_busbw(sizes, args.tp, backend, Collectives(p2p=p2p), repeats=5)
            report["allreduce"]["p2p on" if p2p else "p2p off"] = {str(k): v for k, v in r.items()}
    report["decode"] = {}
    for p2p in (True, False):
        wl = TensorParallelWorkload(model, tp=args.tp, backend=backend, contexts=contexts,
                                    decode_batches=[args.batch], prefill=False)
        try:
            log: list = []
            best, _ = sweep(wl, p2p, args.repeats, log)
            default = {"p2p": p2p}
            a, b = abba(wl, default, best, args.repeats, args.rounds)
        finally:
            wl.close()
        report["decode"]["p2p on" if p2p else "p2p off"] = {
            "sweep": log, "best": best, "default_samples": a, "best_samples": b}
    report["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(args.out, f"tp-{backend}.json"), "w") as f:
        json.dump(report, f, indent=1)
    if report["topology"]:
        print(report["topology"])
    if "allreduce" in report:
        print("all-reduce bus bandwidth, GB/s (median of 5)")
        print(f"{'size':>8} | {'p2p on':>8} | {'p2p off':>8}")
        for k in report["allreduce"]["p2p on"]:
            on = statistics.median(report["allreduce"]["p2p on"][k])
            off = statistics.median(report["allreduce"]["p2p off"][k])
            print(f"{int(k) // MB:>6}MB | {on:8.1f} | {off:8.1f}")
    print(f"\nTP={args.tp} decode tokens/s, batch {args.batch} (medians of the ABBA runs)")
    print(f"{'p2p':>7} | {'size':>16} | {'NCCL defaults':>13} | {'searched':>9} | x    | searched settings")
    for mode, d in report["decode"].items():
        settings = {k: v for k, v in d["best"].items() if k != "p2p"} or "(defaults kept)"
        for size in d["default_samples"]:
            a = statistics.median(d["default_samples"][size])
            b = statistics.median(d["best_samples"][size])
            print(f"{mode:>7} | {size:>16} | {a:13.0f} | {b:9.0f} | {b / a:.2f} | {settings}")
    print(f"({report['seconds']} s)")
    return 0 if all(math.isfinite(geo({"per_size_samples": d["best_samples"]}))
                    for d in report["decode"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
