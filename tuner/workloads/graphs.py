"""CUDA graph capture that a garbage collection cannot break.

A CUDAGraph freed while another capture is running resets itself inside that capture (its
destructor frees its private pool and, in torch >= 2.10, clears the cuBLAS workspace of the
capture stream), which is illegal there: the capture is invalidated and fails later at an
unrelated op (`cudaErrorStreamCaptureInvalidated`, `CUBLAS_STATUS_EXECUTION_FAILED`, with
"operation not permitted when stream is capturing (function reset)" warnings). Dropped runners
whose closures refer to themselves are freed only by the cyclic collector, which may run at any
allocation, so on the H200 the mixed search failed this way right after it re-captured under a
new dispatch table. Here: collect first, then capture with the collector paused (what vLLM does
around its captures). torch imported only when called."""
from __future__ import annotations

import gc
from typing import Any, Callable


def capture(fn: Callable[[], Any], warmup: int = 1, device: Any = None) -> tuple[Any, Any]:
    """Warm `fn` up on a side stream, then capture one call: (graph, its output)."""
    import torch

    s = torch.cuda.Stream(device=device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    gc.collect()  # graphs of dropped runners go now, not in the middle of this capture
    enabled = gc.isenabled()
    gc.disable()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
    finally:
        if enabled:
            gc.enable()
    return graph, out
