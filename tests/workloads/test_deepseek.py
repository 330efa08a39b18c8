"""The tiny DeepSeek workload: absorbed decode over the paged latent cache against the
non-absorbed prefill, V3.2's indexer and sparse attention, the tuned path (MLA kernels from a
table, Triton interpreter in a child process) against the plain torch path, and its place in
`search mixed` (workload name, traced kernel slots)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tuner.workloads.deepseek import DeepSeek, DeepSeekConfig, DeepSeekWorkload
from tuner.workloads.llama import Ops, Runtime, rel_err

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model():
    return DeepSeek(DeepSeekConfig.preset("tiny"), "cpu", seed=0)


def _toks(n, seed=5):
    return torch.randint(0, 256, (2, n), generator=torch.Generator().manual_seed(seed))


def test_absorbed_decode_matches_the_decompressed_prefill(model):
    """Decode attends the cached latent with W_UK folded into q and W_UV into the output;
    prefill decompresses per-head K and V. Same function, so each decoded token's logits are
    the prefill's at that position (the latent rows went through the shuffled page table)."""
    ops = Ops(Runtime(use_dispatch=False))
    toks = _toks(36)
    cache = model.new_cache(2, 36, fill="zeros")
    assert cache.block_table.flatten().tolist() != sorted(cache.block_table.flatten().tolist())
    with torch.no_grad():
        model.prefill(ops, toks[:, :33], cache)
        for pos in (33, 34, 35):  # past two 16-token pages
            step = model.decode_step(ops, toks[:, pos], pos, cache)
            full = model.prefill(ops, toks[:, :pos + 1], None)
            assert rel_err(step, full) < 5e-3
    assert step.std() > 0.1  # not a degenerate model


def test_v32_selects_top_k_and_attends_only_those():
    cfg = DeepSeekConfig.preset("tiny-v3.2")
    sparse, dense = DeepSeek(cfg, "cpu", seed=0), DeepSeek(
        DeepSeekConfig(**{**cfg.__dict__, "sparse": False}), "cpu", seed=0)
    ops = Ops(Runtime(use_dispatch=False))
    toks = _toks(41, seed=2)
    with torch.no_grad():
        # context below topk: the indexer selects every token, dense and sparse agree
        cs, cd = sparse.new_cache(2, 12, fill="zeros"), dense.new_cache(2, 12, fill="zeros")
        sparse.prefill(ops, toks[:, :11], cs)
        dense.prefill(ops, toks[:, :11], cd)
        assert rel_err(sparse.decode_step(ops, toks[:, 11], 11, cs),
                       dense.decode_step(ops, toks[:, 11], 11, cd)) < 1e-3
        # context past topk (16): only 16 of 41 tokens attended, the logits move
        cs, cd = sparse.new_cache(2, 41, fill="zeros"), dense.new_cache(2, 41, fill="zeros")
        sparse.prefill(ops, toks[:, :40], cs)
        dense.prefill(ops, toks[:, :40], cd)
        L = sparse.layers[0]
        lens = torch.full((2,), 40, dtype=torch.int32)
        h = torch.randn(2, cfg.dim, dtype=sparse.dtype)
        idx = sparse._indexer(L, cs, 0, torch.randn(2, cfg.q_lora, dtype=sparse.dtype), h, lens)
        assert idx.shape == (2, 16) and ((idx >= 0) & (idx < 40)).all()
        assert all(len(set(r.tolist())) == 16 for r in idx)
        assert rel_err(sparse.decode_step(ops, toks[:, 40], 40, cs),
                       dense.decode_step(ops, toks[:, 40], 40, cd)) > 1e-2


SCRIPT = r"""
import json, sys
import torch
torch.set_num_threads(1)
from kernelsearch import dispatch
from tuner.workloads.deepseek import DeepSeekWorkload
cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 132, "STAGES": 1, "num_warps": 4}
dispatch.install({"entries": [
    {"family": "mla_decode", "dtype": "float16", "match": {"H": 4, "P": 16},
     "ranges": {"B": [1, 8], "L": [1, 4096]}, "variant": "tma", "config": cfg},
    {"family": "mla_sparse_decode", "dtype": "float16", "match": {"H": 4, "P": 16, "TOPK": 16},
     "ranges": {"B": [1, 8], "L": [1, 4096]}, "variant": "splitkv", "config": cfg}]})
out = {}
for preset in ("tiny", "tiny-v3.2"):
    wl = DeepSeekWorkload(preset, contexts=[20, 70], decode_batches=[2], device="cpu")
    s0 = dispatch.stats()
    m = wl.measure(repeats=1)
    s1 = dispatch.stats()
    out[preset] = {"check": m.extra["check"], "kernel": s1["kernel"] - s0["kernel"],
                   "per_size": m.per_size, "name": wl.name}
print(json.dumps(out))
"""


def test_tuned_path_runs_the_mla_kernels_and_matches_the_plain_path():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    for preset, r in res.items():
        assert r["kernel"] > 0, preset  # the table's MLA kernels really ran
        assert r["check"]["ok"] and r["check"]["dispatch"] is True, r
        assert r["check"]["errors"]["decode"] < 5e-3
        assert set(r["per_size"]) == {"decode@ctx20,b2", "decode@ctx70,b2"}
    assert res["tiny-v3.2"]["name"] == "deepseek-v3.2"


def test_search_mixed_sees_the_workload_and_its_mla_slot():
    from tuner.search.mixed.space import trace_kernel_calls
    from tuner.workloads.factory import make_workload
    from tuner.workloads.base import Tunable, Workload

    wl = make_workload(type("H", (), {"backend": "local"})(), "deepseek", None, 60)
    assert isinstance(wl, DeepSeekWorkload) and isinstance(wl, Workload)
    # runtime dims and kernel slots, as for the Llama workload
    assert isinstance(wl, Tunable) and wl.runtime_dims() == DeepSeekWorkload.RUNTIME_DIMS
    calls = trace_kernel_calls(wl)
    mla = [k for k in calls if k[0] == "mla_decode"]
    # one slot per context: (B, H, capacity, page, R) in the model's dtype
    assert sorted(k[2] for k in mla) == [(2, 4, 32, 16, 1), (2, 4, 80, 16, 1)]
    assert all(k[1] == "float16" for k in mla)
    with pytest.raises(ValueError, match="unknown preset"):
        DeepSeekConfig.preset("deepseek-v9")


@pytest.mark.usefixtures("cli_env")
def test_search_mixed_offers_only_the_runtime_settings_the_model_reads(capsys, tmp_path):
    """The model's attention is MLA (ops.mla_decode / mla_sparse_decode): Llama's attn_impl
    (sdpa / split_kv) would be a no-op dimension; CUDA graphs and fused projections are read."""
    from tests.simhelpers import REPO, run_cli
    from tuner.search.store import TrialStore
    from tuner.sim.hostinit import init_host

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload",
                           "deepseek", "--knob", "none", "--family", "none", "--budget", "3",
                           "--rounds", "1", "--repeats", "1", "--policy",
                           str(REPO / "tuner/data/demo-policy.yaml"), "--json")
    assert rc == 0, err
    res = json.loads(out)
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        run = next(r for r in st.runs() if r["id"] == res["run_id"])
        trials = st.list(run_id=res["run_id"])
    assert run["meta"]["dims"] == {"runtime.cuda_graphs": 2, "runtime.fuse_projections": 2}
    assert trials and all(set(t.candidate.runtime) <= {"cuda_graphs", "fuse_projections"}
                          for t in trials)
    assert DeepSeekWorkload.RUNTIME_DIMS == {"cuda_graphs": [True, False],
                                             "fuse_projections": [False, True]}
