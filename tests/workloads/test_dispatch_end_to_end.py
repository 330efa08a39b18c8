"""A kernel in the dispatch table shows up in the holistic workload, and its outputs are checked
against the plain torch path (Triton interpreter on the CPU, in a child process so the
interpreter setting cannot leak into other tests)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, sys
import torch
torch.set_num_threads(1)
from kernelsearch import dispatch
from tuner.workloads.llama import LlamaWorkload
table = {"entries": [{"family": "rmsnorm", "dtype": "float32", "match": {"cols": 64},
                      "ranges": {"rows": [1, 64]}, "variant": "row",
                      "config": {"ROWS": 1, "num_warps": 4}}]}
dispatch.install(table)
wl = LlamaWorkload("tiny", contexts=[8], decode_batches=[2], device="cpu")
m = wl.measure(repeats=1)
print(json.dumps({"check": m.extra["check"], "stats": dispatch.stats(), "per_size": m.per_size}))
"""


def test_table_kernel_runs_end_to_end_and_matches_plain_torch():
    pytest.importorskip("kernelsearch.families.rmsnorm")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["stats"]["kernel"] > 0  # the table's Triton rmsnorm really ran
    assert res["check"]["ok"] and res["check"]["dispatch"] is True
    assert res["check"]["errors"]["decode"] < 1e-5
    assert set(res["per_size"]) == {"prefill@ctx8,b1", "decode@ctx8,b2"}
