"""A model workload added the way any is: this one file and the one `register` line at its end.

`model_process=True`: a mixed search holds it in a model process (tuner.workloads.model_process),
which builds it by that same line (importing this module first), so the store's kernel sources
are tried on it as on the built-in models. A one-size tiny Llama on the CPU keeps it quick."""
from __future__ import annotations

from typing import Any

from tuner.workloads.factory import register

NAME = "tiny-model"


def build(spec: Any) -> Any:
    from tuner.workloads.llama import LlamaWorkload  # torch: where the model runs only

    return LlamaWorkload(model="tiny", contexts=[16], decode_batches=[2], decode_steps=2,
                         device="cpu")


register(NAME, build, f"{NAME} (tests)", model_process=True)
