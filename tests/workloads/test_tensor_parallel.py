"""The tensor-parallel Llama workload on CPU ranks (gloo): the same model as one process, the
collective settings in the ranks' environment only, ranks restarted when those change."""
from __future__ import annotations

import os

import psutil
import pytest

from tuner.errors import WorkloadFailed
from tuner.workloads.allreduce import allreduce_busbw
from tuner.workloads.collectives import MULTICAST_OFF, Collectives
from tuner.workloads.llama import Llama, LlamaConfig, Ops, Runtime
from tuner.workloads.tensor_parallel import (RUNTIME_DIMS, LlamaShard, TensorParallelWorkload,
                                             shard_config, split_runtime)


@pytest.fixture(scope="module")
def tp2():
    wl = TensorParallelWorkload("tiny", tp=2, backend="gloo")
    yield wl
    wl.close()


@pytest.mark.parametrize("runtime", [{}, {"fuse_projections": True}], ids=["unfused", "fused"])
def test_tp2_on_gloo_matches_the_single_process_model(tp2, runtime):
    tp2.configure(runtime)
    chk = tp2.check()
    # prefill logits and one decode step against the unsplit model, plain path, same weights
    assert chk["ok"], chk
    assert set(chk["errors"]) == {"prefill", "decode"}
    assert max(chk["errors"].values()) < 1e-5  # float32: only the all-reduce's summation order


def test_a_shard_holds_its_slice_in_the_layout_kernel_tables_are_measured_on():
    full = Llama(LlamaConfig.preset("tiny"))
    c = full.cfg
    s1 = LlamaShard(full, 1, 2)
    hd = c.head_dim
    L, S = full.layers[0], s1.layers[0]
    assert s1.cfg.n_heads == c.n_heads // 2 and s1.cfg.head_dim == hd
    # rank 1's query heads are the second half of the outputs; o takes the same heads as inputs
    q = slice(c.n_heads // 2 * hd, c.n_heads * hd)
    assert (S["wq"] == L["wq"][:, q]).all() and (S["wo"] == L["wo"][q, :]).all()
    f = slice(c.ffn_dim // 2, c.ffn_dim)
    assert (S["w_up"] == L["w_up"][:, f]).all() and (S["w_down"] == L["w_down"][f, :]).all()
    for w in S.values():
        if w.dim() == 2:  # an [in, out] view of contiguous [out, in] storage, as nn.Linear keeps
            assert w.t().is_contiguous()


def test_two_shards_summed_by_hand_are_the_model():
    """Without processes: the sum of the two ranks' row-parallel outputs is the full output."""
    import torch

    full = Llama(LlamaConfig.preset("tiny"))
    shards = [LlamaShard(full, r, 2) for r in range(2)]
    partial: list = []
    for s in shards:
        s.reduce = lambda t, acc=partial: (acc.append(t), t)[1]  # record, then sum below
    ops = Ops(Runtime(use_dispatch=False))
    h = torch.randn(3, full.cfg.dim)
    whole = full._mlp(ops, full.layers[0], h)
    parts = [s._mlp(ops, s.layers[0], h) for s in shards]
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-5, atol=1e-5)


def test_collective_settings_reach_only_the_ranks(tp2, monkeypatch):
    # the host's shell exported NCCL settings and multicast on: neither reaches the ranks
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    tp2.configure({"nccl_proto": "LL128", "nccl_max_channels": 4, "nccl_buffsize": 1 << 20})
    env = tp2.worker_env()
    assert env["NCCL_PROTO"] == "LL128" and env["NCCL_MAX_NCHANNELS"] == "4"
    assert env["NCCL_BUFFSIZE"] == str(1 << 20)
    assert "NCCL_ALGO" not in env  # not set by the candidate: NCCL's own choice
    for k, v in MULTICAST_OFF.items():
        assert env[k] == v
    assert "NCCL_PROTO" not in os.environ  # this process's environment is never changed
    tp2.configure({"p2p": False})
    assert tp2.worker_env()["NCCL_P2P_DISABLE"] == "1"
    tp2.configure({})


def test_ranks_run_per_collectives_setting_and_a_model_change_keeps_them(tp2):
    tp2.configure({})
    pids = [r["pid"] for r in tp2.pool().started]
    tp2.configure({"cuda_graphs": False})  # the model's setting: same ranks
    assert [r["pid"] for r in tp2.pool().started] == pids
    tp2.configure({"nccl_algo": "Ring"})  # NCCL reads it at communicator creation: new ranks
    ring = [r["pid"] for r in tp2.pool().started]
    assert set(ring).isdisjoint(pids)
    assert tp2.worker_env()["NCCL_ALGO"] == "Ring"
    tp2.configure({})  # an A/B alternates between the last two settings without restarts
    assert [r["pid"] for r in tp2.pool().started] == pids and "NCCL_ALGO" not in tp2.worker_env()
    tp2.configure({"nccl_algo": "Tree"})  # a third setting: the least recently used ranks go
    tree = [r["pid"] for r in tp2.pool().started]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in ring)
    assert set(tree).isdisjoint(pids + ring)
    tp2.configure({})


def test_measure_gives_every_size_and_the_settings_it_ran_with(tp2):
    tp2.configure({"nccl_algo": "Ring"})
    m = tp2.measure(repeats=2)
    assert set(m.per_size) == {"prefill@ctx16,b1", "decode@ctx16,b2", "prefill@ctx64,b1",
                               "decode@ctx64,b2"}
    assert all(v > 0 for v in m.per_size.values()) and len(m.samples) == 2
    assert m.extra["tp"] == 2 and m.extra["backend"] == "gloo"
    assert m.extra["runtime"]["nccl_algo"] == "Ring" and m.extra["env"]["NCCL_ALGO"] == "Ring"
    assert m.extra["check"]["ok"]
    tp2.configure({})


def test_a_dead_rank_is_a_failed_measurement_and_the_next_one_starts_fresh(tp2):
    tp2.configure({})
    victim = tp2.pool().started[1]["pid"]
    psutil.Process(victim).kill()
    with pytest.raises(WorkloadFailed, match="llama-tp"):
        tp2.measure(repeats=1)
    m = tp2.measure(repeats=1)
    assert victim not in [r["pid"] for r in tp2.pool().started] and m.value > 0


@pytest.mark.parametrize("runtime, field", [
    ({"nccl_algo": "NVLS"}, "nccl_algo"),  # multicast: never offered
    ({"nccl_proto": "fast"}, "nccl_proto"),
    ({"nccl_max_channels": 0}, "nccl_max_channels"),
    ({"nccl_min_channels": 8, "nccl_max_channels": 4}, "nccl_min_channels"),
    ({"nccl_buffsize": True}, "nccl_buffsize"),
    ({"nccl_p2p_level": "ANY"}, "nccl_p2p_level"),
    ({"p2p": "yes"}, "p2p"),
    ({"cuda_graph": True}, "cuda_graph"),  # a typo of a model setting
])
def test_bad_settings_are_refused_naming_the_key(runtime, field):
    with pytest.raises(ValueError, match=field):
        split_runtime(runtime)


def test_a_model_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match="kv heads 2 do not split over 4"):
        shard_config(LlamaConfig.preset("tiny"), 4)
    with pytest.raises(ValueError, match="tp must be 2"):
        TensorParallelWorkload("tiny", tp=1, backend="gloo")


def test_allreduce_bus_bandwidth_per_size_on_cpu_ranks():
    sizes = [1 << 16, 1 << 20]
    out = allreduce_busbw(sizes, 2, backend="gloo", collectives=Collectives(proto="Simple"),
                          repeats=2)
    assert sorted(out) == sizes
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in out.values())


@pytest.mark.usefixtures("cli_env")
def test_search_mixed_over_the_collective_settings_records_per_size_results(capsys, tmp_path):
    import json

    from tests.simhelpers import run_cli
    from tuner.search.store import TrialStore
    from tuner.sim.hostinit import init_host

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload",
                           "llama-tp:tiny:tp=2:backend=gloo", "--knob", "none", "--family", "none",
                           "--budget", "3", "--rounds", "1", "--repeats", "1", "--seed", "2",
                           "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["trials"] == 3 and set(res["by_kind"]) <= {"runtime", "none"}
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        trials = st.list(run_id=res["run_id"])
    searched = set(RUNTIME_DIMS)
    assert all(set(t.candidate.runtime) <= searched for t in trials)
    measured = [t for t in trials if "holistic" in t.measurements]
    assert measured
    for t in measured:  # every size of the TP workload, for the incumbent and the candidate
        per = t.measurements["holistic"]["per_size"]
        assert set(per) == {"prefill@ctx16,b1", "decode@ctx16,b2", "prefill@ctx64,b1",
                            "decode@ctx64,b2"}, per


@pytest.mark.usefixtures("cli_env")
@pytest.mark.parametrize("spec, expect", [
    ("llama-tp:tiny:tp=4:backend=gloo", "kv heads 2 do not split over 4"),
    ("llama-tp:tiny:fast=yes", "expected PRESET, tp=N"),
    ("llama-tp:nosuch:backend=gloo", "unknown preset 'nosuch'"),
])
def test_a_bad_workload_spec_is_one_line_and_exit_2(capsys, tmp_path, spec, expect):
    from tests.simhelpers import run_cli
    from tuner.sim.hostinit import init_host

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload", spec,
                           "--knob", "none", "--family", "none")
    assert rc == 2 and expect in err and err.count("\n") == 1, err


