"""What the Llama workload's kernel adapter (llama_ops) and runners (llama_runners) need from
the workload, in a module all three import (so none imports another's module upwards):

- `Runtime`: a candidate's runtime settings (Candidate.runtime);
- `DecoderModel`: the model a runner drives (`tuner.workloads.llama.Llama`, and any model with
  its interface: `tuner.workloads.deepseek`'s, a tensor-parallel shard).

No pydantic here (see tuner.workloads.llama).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

from tuner.workloads.holistic import RuntimeSettings


@dataclass
class Runtime(RuntimeSettings):
    """A candidate's runtime settings (Candidate.runtime)."""

    cuda_graphs: bool = True
    # batch sizes captured as graphs (vLLM's cudagraph_capture_sizes); None: every batch
    graph_capture_sizes: Optional[list[int]] = None
    # contexts above this run eagerly (vLLM's max_seq_len_to_capture); None: no limit
    max_ctx_to_capture: Optional[int] = None
    use_dispatch: bool = True  # route hot ops through kernelsearch.dispatch
    attn_impl: str = "sdpa"  # "sdpa" | "split_kv" (flash-decoding style, kv_split per chunk)
    kv_split: int = 256
    fuse_projections: bool = False  # one QKV matmul (and gate|up at decode sizes)
    compile_mode: Optional[str] = None  # torch.compile mode, e.g. "max-autotune" (benchmarks)
    emulate_launch_us: float = 0.0  # CPU only, see the module docstring
    emulate_capture_us: float = 0.0

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> "Runtime":
        rt = cls(**cls.known(d))
        if rt.attn_impl not in ("sdpa", "split_kv"):
            raise ValueError(f"runtime.attn_impl: expected 'sdpa' or 'split_kv', got {rt.attn_impl!r}")
        if int(rt.kv_split) < 1:
            raise ValueError(f"runtime.kv_split: expected a positive integer, got {rt.kv_split!r}")
        return rt

    def inductor_graphs(self) -> bool:
        """torch.compile modes that capture their own CUDA graphs (cudagraph trees)."""
        return self.compile_mode in ("reduce-overhead", "max-autotune")

    def graphs_for(self, batch: int, ctx: int) -> bool:
        """Whether this runner captures the decode step as a CUDA graph itself (a compiled
        step without inductor's own graphs is captured like an eager one, as vLLM does)."""
        if not self.cuda_graphs or self.inductor_graphs():
            return False
        if self.graph_capture_sizes is not None and batch not in self.graph_capture_sizes:
            return False
        return self.max_ctx_to_capture is None or ctx <= self.max_ctx_to_capture


class DecoderModel(Protocol):
    """A decoder the runners time: its config (`vocab`, `dtype`), device, rotary tables, KV cache,
    one prefill and one decode step through the hot operations (llama_ops.Ops). A model with its
    own cache type also says its length (`cache_len(cache)`)."""

    cfg: Any
    device: Any

    def rope(self, n: int) -> tuple[Any, Any]: ...

    def new_cache(self, batch: int, length: int, fill: str = "random", seed: int = 1) -> Any: ...

    def decode_step(self, ops: Any, tokens: Any, pos: Any, cache: Any) -> Any: ...

    def prefill(self, ops: Any, tokens: Any, cache: Any = None) -> Any: ...
