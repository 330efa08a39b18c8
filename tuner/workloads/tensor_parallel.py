"""The Llama workload split over several GPUs (tensor parallel), as serving engines run it.

Megatron's split: q/k/v and gate/up are column-parallel (rank r owns n_heads/tp query heads,
n_kv_heads/tp KV heads and ffn/tp MLP columns), o and down are row-parallel, and their partial
outputs are summed by one all-reduce after attention and one after the MLP (`LlamaShard.reduce`):
what decode waits on when the GPUs talk over PCIe. Embedding, norms and the LM head are
replicated (Megatron also splits the vocabulary; at decode sizes that is one more collective,
left out). Every rank draws the same full model from the seed and keeps its slice, so rank 0 can
hold the single-process model too and `check` compares the two on the same weights.

The workload starts its own processes (one per GPU; gloo ranks on CPUs) and drives them over
pipes, so the search loop and the daemon stay single-process. Decode is replayed as a CUDA graph
on GPUs, all-reduces included. Runtime settings are the Llama workload's (`Runtime`) plus the
collectives' (`tuner.workloads.collectives`: `nccl_algo`, `nccl_proto`, channels, buffer size,
P2P level, `p2p`); the latter live in the workers' environment only, and a change restarts them.

No pydantic at import (GPU machines run `bench()` without it); `measure` builds a Measurement.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional, Sequence

from tuner.workloads.collectives import RUNTIME_KEYS, Collectives
from tuner.workloads.holistic import GridDefaults, SizeGrid, size_grid
from tuner.workloads.llama import Llama, LlamaConfig, Runtime
from tuner.workloads.llama_ops import Ops, load_dispatch
from tuner.workloads.llama_runners import Bench, default_tolerance, rel_err
from tuner.workloads.ranks import RankError, Ranks

#: what a mixed search may change in this workload: CUDA graphs and the collectives (`p2p` is the
#: box being reproduced, a workload option, not a setting to search: disabling P2P never helps)
RUNTIME_DIMS: dict[str, list[Any]] = {
    "cuda_graphs": [True, False],
    "nccl_algo": [None, "Ring", "Tree"],
    "nccl_proto": [None, "LL", "LL128", "Simple"],
    "nccl_max_channels": [None, 2, 4, 8, 16, 32],
    "nccl_buffsize": [None, 1 << 20, 16 << 20],
}


def split_runtime(runtime: Optional[Mapping[str, Any]]) -> tuple[Runtime, Collectives]:
    """A runtime dict -> the model's Runtime and the Collectives (ValueError naming the key)."""
    d = dict(runtime or {})
    coll = Collectives.from_runtime(d)
    return Runtime.from_dict({k: v for k, v in d.items() if k not in RUNTIME_KEYS}), coll


# -- the shard ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardConfig(LlamaConfig):
    """A rank's slice of a LlamaConfig: its heads and MLP columns, the full model's head dim."""

    full_head_dim: int = 0

    @property
    def head_dim(self) -> int:  # dim // n_heads no longer holds once the heads are split
        return self.full_head_dim


def shard_config(cfg: LlamaConfig, world: int) -> ShardConfig:
    for what, n in (("heads", cfg.n_heads), ("kv heads", cfg.n_kv_heads), ("ffn dim", cfg.ffn_dim)):
        if n % world:
            raise ValueError(f"tensor parallel: {what} {n} do not split over {world} ranks")
    return ShardConfig(**{**asdict(cfg), "n_heads": cfg.n_heads // world,
                          "n_kv_heads": cfg.n_kv_heads // world, "ffn_dim": cfg.ffn_dim // world},
                       full_head_dim=cfg.head_dim)


def _outputs(w: Any, lo: int, hi: int) -> Any:
    """Column-parallel: outputs lo:hi of an [in, out] view of [out, in] storage, same layout
    (the one kernel tables are measured on)."""
    return w.t()[lo:hi].contiguous().t()


def _inputs(w: Any, lo: int, hi: int) -> Any:
    """Row-parallel: inputs lo:hi, same layout."""
    return w.t()[:, lo:hi].contiguous().t()


class LlamaShard(Llama):
    """Rank `rank` of `world` of a full model; `reduce` all-reduces the row-parallel outputs."""

    def __init__(self, full: Llama, rank: int, world: int):  # noqa: D107 (takes full's tensors)
        c = full.cfg
        self.cfg = shard_config(c, world)
        self.device, self.dtype = full.device, full.dtype
        self.embed, self.final_norm, self.lm_head = full.embed, full.final_norm, full.lm_head
        self._rope, self._fused = None, False
        hd, s = c.head_dim, self.cfg
        q = slice(rank * s.n_heads * hd, (rank + 1) * s.n_heads * hd)
        kv = slice(rank * s.n_kv_heads * hd, (rank + 1) * s.n_kv_heads * hd)
        f = slice(rank * s.ffn_dim, (rank + 1) * s.ffn_dim)
        self.layers = []
        for L in full.layers:
            self.layers.append({
                "attn_norm": L["attn_norm"], "ffn_norm": L["ffn_norm"],
                "wq": _outputs(L["wq"], q.start, q.stop), "wk": _outputs(L["wk"], kv.start, kv.stop),
                "wv": _outputs(L["wv"], kv.start, kv.stop), "wo": _inputs(L["wo"], q.start, q.stop),
                "w_gate": _outputs(L["w_gate"], f.start, f.stop),
                "w_up": _outputs(L["w_up"], f.start, f.stop),
                "w_down": _inputs(L["w_down"], f.start, f.stop),
            })

    def reduce(self, partial: Any) -> Any:
        import torch.distributed as dist

        dist.all_reduce(partial)
        return partial


def check_shard(full: Optional[Llama], shard: LlamaShard, runtime: Runtime, dispatch: Any,
                batch: int = 2, ctx: int = 64, seed: int = 3) -> Optional[dict[str, Any]]:
    """The shard's candidate path against the single-process plain path (rank 0's `full`) on the
    same tokens: prefill logits and one decode step after it. Every rank must call it (the shard
    runs collectives); only rank 0 gets the errors."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    toks = torch.randint(0, shard.cfg.vocab, (batch, ctx + 1), generator=g).to(shard.device)
    cand = Ops(runtime, dispatch)
    with torch.no_grad():
        cache = shard.new_cache(batch, ctx + 1, fill="zeros")
        new_p = shard.prefill(cand, toks[:, :ctx], cache)
        new_d = shard.decode_step(cand, toks[:, ctx], ctx, cache)
        if full is None:
            return None
        plain = Ops(Runtime(use_dispatch=False))
        ref_cache = full.new_cache(batch, ctx + 1, fill="zeros")
        ref_p = full.prefill(plain, toks[:, :ctx], ref_cache)
        ref_d = full.decode_step(plain, toks[:, ctx], ctx, ref_cache)
    errs = {"prefill": rel_err(new_p, ref_p), "decode": rel_err(new_d, ref_d)}
    tol = default_tolerance(full.cfg.dtype)
    return {"ok": max(errs.values()) <= tol, "tol": tol, "errors": errs}


# -- the rank processes ------------------------------------------------------------------------


class ShardRank:
    """What one rank process holds: its shard (and on rank 0 the full model, for `check`), a
    Bench over the shard, and the answers to the workload's requests."""

    def __init__(self, start: dict[str, Any]):
        import torch
        import torch.distributed as dist

        spec, rank, world = start["spec"], start["rank"], start["world"]
        cuda = spec["backend"] == "nccl"
        if cuda:
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(1)  # one core a rank: ranks must not fight over the same cores
        dist.init_process_group(spec["backend"], init_method=start["init"], rank=rank,
                                world_size=world,
                                timeout=timedelta(seconds=spec["collective_timeout_s"]))
        full: Optional[Llama] = Llama(LlamaConfig(**spec["model"]),
                                      f"cuda:{rank}" if cuda else "cpu", spec["seed"])
        assert full is not None
        self.shard = LlamaShard(full, rank, world)
        self.full = full if rank == 0 and spec["check_outputs"] else None
        del full
        self.dispatch = load_dispatch()
        self.bench = Bench(self.shard, SizeGrid(**spec["grid"]), self.dispatch)

    def __call__(self, msg: Any) -> Any:
        op = msg[0]
        if op == "env":
            return {k: v for k, v in os.environ.items()
                    if k.startswith(("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_"))}
        if op == "check":
            return check_shard(self.full, self.shard, Runtime.from_dict(msg[1]), self.dispatch)
        if op == "bench":
            deadline = time.time() + msg[3] if msg[3] else None
            return self.bench.run(Runtime.from_dict(msg[1]), repeats=msg[2], deadline=deadline)
        if op == "drop":
            self.bench.drop()
            return None
        raise ValueError(f"unknown request {op!r}")

    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def shard_rank(start: dict[str, Any]) -> ShardRank:
    return ShardRank(start)


# -- the Workload ------------------------------------------------------------------------------


def _default_backend(tp: int) -> str:
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= tp else "gloo"


class TensorParallelWorkload:
    """The holistic workload (tuner.workloads.base.Workload) over `tp` processes: tokens/s
    geometric mean over prefill and decode sizes, outputs checked against the single-process
    model once per runtime (a mismatch raises WorkloadFailed)."""

    name = "llama-tp"
    #: no isolated first-step benchmark across ranks
    first_step_s: Optional[Callable[[], float]] = None
    CPU_GRID = GridDefaults(contexts=(16, 64), decode_batch=2, decode_steps=5)  # gloo ranks
    GPU_GRID = GridDefaults(contexts=(4096, 32768), decode_batch=8, decode_steps=20)

    def __init__(self, model: str | LlamaConfig | Mapping[str, Any] = "tiny", tp: int = 2,
                 backend: Optional[str] = None, contexts: Optional[Sequence[int]] = None,
                 decode_batches: Optional[Sequence[int]] = None,
                 prefill_batches: Optional[Sequence[int]] = None,
                 decode_steps: Optional[int] = None, seed: int = 0,
                 runtime: Optional[Mapping[str, Any]] = None, prefill: bool = True,
                 decode: bool = True, check_outputs: bool = True, p2p: bool = True,
                 start_timeout_s: float = 300.0, collective_timeout_s: float = 300.0):
        cfg = LlamaConfig.of(model)
        if tp < 2:
            raise ValueError(f"tensor parallel: tp must be 2 or more, got {tp}")
        shard_config(cfg.validate(), tp)  # ValueError now rather than in every rank
        self.tp, self.cfg = tp, cfg
        self.backend = backend or _default_backend(tp)
        if self.backend not in ("nccl", "gloo"):
            raise ValueError(f"tensor parallel: backend must be nccl or gloo, got {self.backend!r}")
        if self.backend == "nccl":
            import torch

            if torch.cuda.device_count() < tp:
                raise ValueError(f"tensor parallel: tp={tp} needs {tp} GPUs, "
                                 f"{torch.cuda.device_count()} found")
        self.grid = size_grid(self.CPU_GRID, self.GPU_GRID,
                              "cpu" if self.backend == "gloo" else "cuda", contexts,
                              decode_batches, prefill_batches, decode_steps, prefill, decode)
        self.seed, self.check_outputs = seed, check_outputs
        self.start_timeout_s, self.collective_timeout_s = start_timeout_s, collective_timeout_s
        self.p2p = p2p
        self.configure(runtime)
        # rank processes per collectives setting, the last two used: an A/B between two settings
        # alternates without restarting ranks (NCCL reads its settings once per communicator)
        self._pools: OrderedDict[str, Ranks] = OrderedDict()
        self._checked: dict[str, dict[str, Any]] = {}

    # runtime ------------------------------------------------------------------------------
    def configure(self, runtime: Optional[Mapping[str, Any]]) -> None:
        """The model's settings and the collectives'; keys left out keep the workload's P2P."""
        d = dict(runtime or {})
        d.setdefault("p2p", self.p2p)
        self.runtime, self.collectives = split_runtime(d)

    @staticmethod
    def validate_runtime(runtime: Mapping[str, Any]) -> Any:
        return split_runtime(runtime)

    def runtime_settings(self) -> dict[str, Any]:
        return {**asdict(self.runtime), **self.collectives.to_runtime()}

    # the rest of tuner.workloads.base.Tunable: runtime and collectives settings, no kernel
    # slots (the table would have to reach every rank)
    @property
    def device(self) -> str:
        return "cpu" if self.backend == "gloo" else "cuda"

    def runtime_dims(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in RUNTIME_DIMS.items()}

    def kernels_usable(self) -> Optional[str]:
        return "kernel slots need the llama, sim-llama, deepseek or hf:<config> workload"

    def kernel_calls(self) -> dict[Any, int]:
        return {}

    def kernel_variants(self) -> Optional[Mapping[str, Sequence[str]]]:
        return None

    runs_stored_sources = False

    def install_table(self, table: Any, store_dir: Optional[Any] = None) -> None:
        from tuner.workloads.base import install_here

        install_here(self, table, store_dir)

    def _key(self) -> str:
        return self.runtime.key() + self.collectives.key()

    # processes ----------------------------------------------------------------------------
    def pool(self) -> Ranks:
        """The ranks running under the current collectives settings (started on first use)."""
        key = self.collectives.key()
        if key in self._pools:
            self._pools.move_to_end(key)
            return self._pools[key]
        while len(self._pools) >= 2:
            self._pools.popitem(last=False)[1].close()
        spec = {"backend": self.backend, "model": asdict(self.cfg), "seed": self.seed,
                "grid": asdict(self.grid), "check_outputs": self.check_outputs,
                "collective_timeout_s": self.collective_timeout_s}
        self._pools[key] = Ranks("tuner.workloads.tensor_parallel:shard_rank", self.tp, spec,
                                 self.collectives.env(), self.start_timeout_s,
                                 name="llama-tp rank")
        return self._pools[key]

    def _call(self, *msg: Any, timeout_s: Optional[float] = None) -> Any:
        """Rank 0's reply (every rank answers; a failed rank stops them all)."""
        ranks = self.pool()
        try:
            return ranks.call(msg, timeout_s=timeout_s)[0]
        except RankError:
            # stopped by Ranks: the next request under these settings starts fresh ranks
            self._pools.pop(self.collectives.key(), None)
            raise

    def worker_env(self) -> dict[str, str]:
        """NCCL_* and multicast variables as the ranks see them."""
        return self._call("env", timeout_s=60)

    def dispatch_changed(self) -> None:
        for ranks in self._pools.values():
            ranks.call(("drop",), timeout_s=60)
        self._checked.clear()

    def close(self) -> None:
        while self._pools:
            self._pools.popitem()[1].close()

    # measuring ----------------------------------------------------------------------------
    def check(self) -> dict[str, Any]:
        key = self._key()
        if key not in self._checked:
            self._checked[key] = self._call("check", asdict(self.runtime),
                                            timeout_s=self.collective_timeout_s)
        return self._checked[key]

    def bench(self, repeats: int = 5, timeout_s: Optional[float] = None) -> dict[str, Any]:
        """Bench.run on every rank under the current settings; rank 0's result (plain dict)."""
        return self._call("bench", asdict(self.runtime), repeats, timeout_s,
                          timeout_s=(timeout_s or 0) + self.collective_timeout_s)

    def measure(self, repeats: int = 5, timeout_s: Optional[float] = None) -> Any:
        from tuner.errors import WorkloadFailed
        from tuner.workloads.base import summarize

        try:
            if self.check_outputs:
                chk = self.check()
                if not chk["ok"]:
                    raise WorkloadFailed(f"llama-tp: outputs differ from the plain torch path "
                                         f"(the single-process model): "
                                         f"{chk['errors']} (tolerance {chk['tol']})")
            res = self.bench(repeats, timeout_s)
        except RankError as e:  # a rank failed, died or hung: the next measure starts fresh ones
            raise WorkloadFailed(f"llama-tp: {e}") from None
        if res["skipped"]:
            raise WorkloadFailed(f"llama-tp: timed out after {timeout_s}s; not measured: "
                                 f"{', '.join(res['skipped'])}")
        return summarize("tokens_per_s", "tok/s", res["per_size_samples"], extra={
            "runtime": self.runtime_settings(), "setup_s": res["setup_s"], "tp": self.tp,
            "backend": self.backend, "env": self.collectives.env(),
            "check": self._checked.get(self._key()), "model": asdict(self.cfg)})


def from_spec(spec: Any) -> TensorParallelWorkload:
    """`llama-tp[:PRESET][:tp=N][:p2p=on|off][:backend=nccl|gloo]` (tuner.workloads.factory;
    defaults: tiny on CPUs and llama3-8b-4l on GPUs, tp 2, P2P on, NCCL when there are tp GPUs)."""
    from tuner.errors import BadInput

    kw: dict[str, Any] = {}
    for part in spec.args.split(":") if spec.args else []:
        key, eq, value = part.partition("=")
        if not eq:
            kw["model"] = key
        elif key == "tp" and value.isdigit():
            kw["tp"] = int(value)
        elif key == "p2p" and value in ("on", "off"):
            kw["p2p"] = value == "on"
        elif key == "backend" and value in ("nccl", "gloo"):
            kw["backend"] = value
        else:
            raise BadInput(f"--workload {spec.text}: expected PRESET, tp=N, p2p=on|off or "
                           f"backend=nccl|gloo, got {part!r}")
    if "model" not in kw:
        import torch

        kw["model"] = "llama3-8b-4l" if torch.cuda.device_count() >= kw.get("tp", 2) else "tiny"
    try:
        return TensorParallelWorkload(**kw)
    except ValueError as e:
        raise BadInput(f"--workload {spec.text}: {e}") from None
