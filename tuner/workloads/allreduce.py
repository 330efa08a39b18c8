"""nccl-tests' all_reduce_perf in a few lines: one rank process per GPU (CPU ranks on gloo),
bus bandwidth = algbw * 2(n-1)/n per message size, under given collectives settings. Serves
`metaltune compare` and benchmarks/bench_tp.py. No torch at import."""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

from tuner.workloads.collectives import Collectives


def busbw_gbps(nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw * 2(n-1)/n."""
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


def allreduce_busbw(sizes: Sequence[int], world: int, backend: str = "nccl",
                    collectives: Optional[Collectives] = None, repeats: int = 5,
                    iters: Optional[int] = None, timeout_s: float = 600.0) -> dict[int, list[float]]:
    """Bus bandwidth (GB/s) per message size in bytes, `repeats` samples each, measured by
    `world` rank processes (one per GPU with nccl; CPU ranks with gloo)."""
    from tuner.workloads.ranks import Ranks

    ranks = Ranks("tuner.workloads.allreduce:allreduce_rank", world,
                  {"backend": backend}, (collectives or Collectives()).env(),
                  start_timeout_s=timeout_s, name="all-reduce rank")
    try:
        out = ranks.call(("sweep", list(sizes), repeats, iters), timeout_s=timeout_s)[0]
    finally:
        ranks.close()
    return {int(k): v for k, v in out.items()}


class _AllReduceRank:
    def __init__(self, start: dict[str, Any]):
        import torch
        import torch.distributed as dist

        self.rank, self.world = start["rank"], start["world"]
        self.cuda = start["spec"]["backend"] == "nccl"
        if self.cuda:
            torch.cuda.set_device(self.rank)
        else:
            torch.set_num_threads(1)
        dist.init_process_group(start["spec"]["backend"], init_method=start["init"],
                                rank=self.rank, world_size=self.world)

    def __call__(self, msg: Any) -> dict[int, list[float]]:
        import torch
        import torch.distributed as dist

        _, sizes, repeats, iters = msg
        dev = torch.device("cuda", self.rank) if self.cuda else torch.device("cpu")
        dtype = torch.bfloat16 if self.cuda else torch.float32
        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        out: dict[int, list[float]] = {}
        for nbytes in sizes:
            t = torch.ones(max(1, nbytes // dtype.itemsize), dtype=dtype, device=dev)
            # enough iterations that a sample is well past launch cost and timer resolution
            n = iters or (3 if not self.cuda else max(5, min(200, (256 << 20) // max(nbytes, 1))))
            for _ in range(3):
                dist.all_reduce(t)
            sync()
            samples = []
            for _ in range(repeats):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    dist.all_reduce(t)
                sync()
                samples.append(busbw_gbps(t.numel() * dtype.itemsize,
                                          (time.perf_counter() - t0) / n, self.world))
            out[nbytes] = samples
            del t
        return out

    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def allreduce_rank(start: dict[str, Any]) -> _AllReduceRank:
    return _AllReduceRank(start)
