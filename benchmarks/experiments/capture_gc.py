"""The failure the mixed search met on the H200, reduced: a CUDA graph left in a reference cycle
is freed by the cyclic collector while another graph is being captured, and the capture dies
("operation not permitted when stream is capturing (function reset)"). torch.cuda.graph alone
against tuner.workloads.graphs.capture (collect first, collector paused)."""
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

from tuner.workloads.graphs import capture

a = torch.randn(1024, 1024, device="cuda")


def body():
    return a @ a


class Runner:  # a closure over itself: only the cyclic collector frees it
    def __init__(self):
        self.fn = lambda: self
        self.graph, self.out = capture(body)


for name in ("torch.cuda.graph", "graphs.capture"):
    Runner()  # dropped at once: cyclic garbage holding a captured graph
    try:
        if name == "torch.cuda.graph":
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                body()
                gc.collect()  # what an allocation-triggered collection does mid-capture
        else:
            g, _ = capture(lambda: (body(), gc.collect() if gc.isenabled() else None))
        print(f"{name}: ok")
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
        torch.cuda.synchronize()
