"""The kernel canary's cost, as a share of decode tokens/s: a patched Hugging Face model decoding
with a dispatch table (rmsnorm and swiglu kernels at every layer), the canary off, at its default
rate (1/1024 plus the first call of each entry and one per 300 s) and at rate 1 (every call
replayed: the price of one replay), interleaved rounds, median tokens/s of each. Also the cost of
the per-call bookkeeping (`Canary.due`) alone.

  TRITON_INTERPRET=1 python benchmarks/bench_canary.py            # CPU, tiny-llama
  python benchmarks/bench_canary.py --device cuda --config llama3-8b:layers=4

On the CPU the kernels run in Triton's interpreter (milliseconds per call), which flatters the
canary's share; on a GPU a call is microseconds and the per-call bookkeeping is what counts: the
`due` line gives it in ns, to set against the decode step's time per kernel call."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def table_for(cfg, dtype: str):
    from kernelsearch.table import DispatchTable, Entry

    return DispatchTable([
        Entry("rmsnorm", dtype, {"cols": cfg.hidden_size}, {"rows": [1, 65536]}, "row",
              {"ROWS": 1, "num_warps": 1 if dtype == "float32" else 4}),
        Entry("swiglu", dtype, {"cols": cfg.intermediate_size}, {"rows": [1, 65536]}, "flat",
              {"BLOCK": 128 if dtype == "float32" else 1024, "num_warps": 1 if dtype == "float32" else 4}),
    ])


def decode_tps(model, ids, steps: int, device: str) -> float:
    import torch
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache()
        out = model(ids, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(tok, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
        if device == "cuda":
            torch.cuda.synchronize()
        return steps * ids.shape[0] / (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--config", default="tiny-llama")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.rounds < 1 or a.batch < 1:
        print("bench_canary: --steps, --rounds and --batch must be positive", file=sys.stderr)
        return 2
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from kernelsearch import canary, dispatch
    from kernelsearch.integrations import transformers as mt
    from tuner.workloads.hf import HFModel

    m = HFModel(a.config, device=a.device)
    model = m.model
    dtype = "float32" if a.device == "cpu" else "bfloat16"
    ids = torch.randint(3, 200, (a.batch, 8), generator=torch.Generator().manual_seed(0)).to(a.device)
    table = table_for(m.config, dtype)
    modes = {"off": {canary.SWITCH_ENV: "off"}, "default": {},
             "every call": {canary.RATE_ENV: "1"}}
    tps: dict[str, list[float]] = {k: [] for k in modes}
    replays: dict[str, int] = {k: 0 for k in modes}
    mt.patch(model, table)
    for _ in range(a.rounds):
        for name, env in modes.items():
            for var in (canary.SWITCH_ENV, canary.RATE_ENV):
                os.environ.pop(var, None)
            os.environ.update(env)
            dispatch.install(table)  # a fresh canary with this mode's settings
            tps[name].append(decode_tps(model, ids, a.steps, a.device))
            replays[name] += dispatch.canary_stats().get("replays", 0)
    mt.unpatch(model)
    c = canary.Canary()
    st, n = c.state(), 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        c.due(st)
    t1 = time.perf_counter()
    for _ in range(n):
        pass
    due_ns = ((t1 - t0) - (time.perf_counter() - t1)) / n * 1e9  # less the loop's own cost
    med = {k: statistics.median(v) for k, v in tps.items()}
    res = {"device": a.device, "config": a.config, "steps": a.steps, "rounds": a.rounds,
           "batch": a.batch, "tokens_per_s": med, "replays": replays,
           "overhead_default_pct": 100 * (1 - med["default"] / med["off"]),
           "overhead_every_call_pct": 100 * (1 - med["every call"] / med["off"]),
           "due_ns_per_call": due_ns}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        for k in modes:
            print(f"{k:>11}: {med[k]:8.2f} tokens/s (median of {a.rounds}; "
                  f"{replays[k]} replays in all)")
        print(f"canary at its default rate: {res['overhead_default_pct']:+.2f}% of decode "
              f"tokens/s; every call replayed: {res['overhead_every_call_pct']:+.2f}%; "
              f"per-call bookkeeping {due_ns:.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
