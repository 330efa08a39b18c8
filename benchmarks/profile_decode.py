"""Kernel-by-kernel view of one graphed decode step, for several runtimes side by side: which
kernels run, how many, and how long each takes on the GPU (torch profiler over CUDA-graph
replays). This is how the gap between the tuned path and torch.compile was located.

    python3 benchmarks/profile_decode.py --ctx 4096 --batch 8 --out DIR
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tuner.workloads.llama import DecodeRunner, Llama, LlamaConfig, Runtime  # noqa: E402

RUNTIMES = {
    "torch+graphs": {"use_dispatch": False, "cuda_graphs": True},
    "tuned+graphs": {"use_dispatch": True, "cuda_graphs": True, "fuse_projections": True},
    "compile+graphs": {"use_dispatch": False, "compile_mode": "max-autotune-no-cudagraphs",
                       "cuda_graphs": True},
}


def short(name: str) -> str:
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"\(.*", "", name)
    return name[:60]


def profile(rt_name: str, model: Llama, batch: int, ctx: int, table: str, steps: int) -> dict:
    from kernelsearch import dispatch

    rt = Runtime.from_dict(RUNTIMES[rt_name])
    dispatch.install(table if rt.use_dispatch else None)
    r = DecodeRunner(model, rt, batch, ctx, dispatch=dispatch if rt.use_dispatch else None).prepare()
    for _ in range(5):
        r.step()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(50):
        r.step()
    e1.record()
    torch.cuda.synchronize()
    step_us = e0.elapsed_time(e1) * 1e3 / 50
    from torch.profiler import ProfilerActivity, profile as prof

    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            r.step()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(list)
    evs = [e for e in p.events() if e.device_type.name == "CUDA"]
    for e in evs:
        per[short(e.name)].append(e.device_time)
    busy = sum(e.device_time for e in evs) / steps
    kernels = len(evs) / steps
    rows = sorted(({"kernel": k, "calls": len(v) / steps, "us_per_step": sum(v) / steps,
                    "avg_us": sum(v) / len(v)} for k, v in per.items()),
                  key=lambda x: -x["us_per_step"])
    del r
    torch.cuda.empty_cache()
    return {"runtime": rt_name, "step_us": step_us, "busy_us": busy, "kernels_per_step": kernels,
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b-4l")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--table", default="host_profiles/kernels/h200-graphs.json")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    model = Llama(LlamaConfig.preset(a.model), device="cuda")
    res = []
    for name in a.runtimes.split(","):
        r = profile(name, model, a.batch, a.ctx, a.table, a.steps)
        res.append(r)
        print(f"\n== {name}: step {r['step_us']:.1f} us, GPU busy {r['busy_us']:.1f} us, "
              f"{r['kernels_per_step']:.0f} kernels/step")
        for row in r["rows"][:30]:
            print(f"  {row['us_per_step']:8.1f} us  {row['calls']:5.1f}x  {row['avg_us']:7.2f} us  {row['kernel']}")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"profile-decode-{a.ctx}-b{a.batch}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
