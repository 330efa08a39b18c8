"""With projections fused, the decode step rotates q and k in one `rope` op: a dispatch table
entry runs the Triton kernel (interpreter on the CPU, in a child process so the setting cannot
leak), and the decode output matches the plain torch path."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json
import torch
torch.set_num_threads(1)
from kernelsearch import dispatch
from tuner.workloads.llama import Llama, LlamaConfig, Ops, Runtime, check, rel_err

m = Llama(LlamaConfig.preset("tiny"), "cpu", seed=0)  # 4 + 2 heads of 16
dispatch.install({"entries": [{"family": "rope", "dtype": "float32", "match": {"NH": 6, "D": 16},
                               "ranges": {"B": [1, 8]}, "variant": "heads",
                               "config": {"BLOCK_H": 8, "num_warps": 1}}]})
fused = Runtime(fuse_projections=True)
res = {"check": check(m, fused, dispatch, batch=2, ctx=12), "after_check": dispatch.stats()}
toks = torch.tensor([3, 77, 150])
errs = []
with torch.no_grad():
    m.rope(32)
    caches = [m.new_cache(3, 21, seed=5) for _ in range(3)]
    for pos in (9, torch.tensor([20])):  # a Python position and a device-tensor position
        kern = m.decode_step(Ops(fused, dispatch), toks, pos, caches[0])
        plain = m.decode_step(Ops(Runtime(fuse_projections=True, use_dispatch=False)), toks, pos,
                              caches[1])
        unfused = m.decode_step(Ops(Runtime(use_dispatch=False)), toks, pos, caches[2])
        errs.append([rel_err(kern, plain), rel_err(kern, unfused),
                     max(rel_err(a[0][:, :, int(pos)], b[0][:, :, int(pos)])  # rotated k
                         for a, b in zip(caches[0], caches[1]))])
res.update(errs=errs, stats=dispatch.stats(), layers=m.cfg.n_layers)
print(json.dumps(res))
"""


def test_fused_decode_rotates_q_and_k_with_the_rope_kernel_and_matches_plain_torch():
    pytest.importorskip("kernelsearch.families.rope")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    # check(): one decode step through dispatch, one rope kernel per layer; prefill has none
    assert res["check"]["ok"] and res["check"]["dispatch"] is True, res["check"]
    assert res["check"]["errors"]["decode"] < 1e-5
    assert res["after_check"]["kernel"] == res["layers"]
    # two more decode steps: the rope kernel ran once per layer each (nothing else has an entry)
    assert res["stats"]["kernel"] == 3 * res["layers"]
    for kern_vs_plain, kern_vs_unfused, cache_err in res["errs"]:
        assert kern_vs_plain < 1e-5 and kern_vs_unfused < 1e-5 and cache_err < 1e-5
