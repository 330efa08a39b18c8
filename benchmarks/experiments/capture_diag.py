"""Which DeepSeek decode configurations fail CUDA graph capture (H200, 2026-12-01 search run:
first_step_s under fuse_projections with the tma mla_decode entry kept). Read-only kernel work."""
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from kernelsearch import dispatch
from kernelsearch.table import DispatchTable, Entry
from tuner.workloads.deepseek import DeepSeekConfig, DeepSeekWorkload
from tuner.workloads import llama as L

wl = DeepSeekWorkload(DeepSeekConfig.preset("deepseek-v3-3l"), contexts=[4096], decode_batches=[32],
                      decode_steps=3)
tma = Entry("mla_decode", "bfloat16", {"H": 128, "P": 64}, {"B": [32, 32], "L": [4160, 4160]}, "tma",
            {"BLOCK_H": 64, "BLOCK_N": 64, "GRID": 1056, "STAGES": 2, "WS": 1, "num_warps": 8})
split = Entry("mla_decode", "bfloat16", {"H": 128, "P": 64}, {"B": [32, 32], "L": [4160, 4160]},
              "splitkv", {"BLOCK_H": 64, "BLOCK_N": 64, "GRID": 1056, "STAGES": 2, "num_warps": 8})
cases = [("torch", None, True), ("tma", tma, False), ("tma", tma, True), ("splitkv", split, True),
         ("tma", tma, False)]
for name, e, fuse in cases:
    dispatch.install(DispatchTable([e]) if e else None)
    wl.dispatch_changed()
    wl.configure({"fuse_projections": fuse})
    for what, fn in (("first_step", lambda: wl.first_step_s()),
                     ("bench", lambda: wl.bench.run(wl.runtime, repeats=1))):
        try:
            fn()
            print(f"{name:8} fuse={fuse!s:5} {what:10}: ok", flush=True)
        except Exception as ex:
            print(f"{name:8} fuse={fuse!s:5} {what:10}: {type(ex).__name__}: {str(ex).splitlines()[0][:160]}", flush=True)
            torch.cuda.synchronize()
            wl.bench.drop()
# the same failing case captured with capture_error_mode="relaxed": an unsafe call (a sync, a
# cudaMalloc) rather than an illegal op makes global mode fail and relaxed pass
dispatch.install(DispatchTable([tma]))
wl.dispatch_changed()
wl.configure({"fuse_projections": True})
r = L.DecodeRunner(wl.model, wl.runtime, 32, 4096, dispatch=wl.dispatch)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    r._fn()
torch.cuda.current_stream().wait_stream(s)
for mode in ("thread_local", "relaxed"):
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            r._fn()
        print("capture", mode, ": ok")
    except Exception as ex:
        print("capture", mode, ":", type(ex).__name__, str(ex).splitlines()[0][:160])
        torch.cuda.synchronize()
