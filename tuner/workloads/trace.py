"""The kernel calls a holistic workload makes: its own size grid run once under its current
runtime with a recording dispatcher, so the slots of a mixed search are exactly the (family,
dtype, shape) its call path dispatches."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # base holds pydantic types; the holistic workloads run without pydantic
    from tuner.workloads.base import KernelCall


class _Recorder:
    """Stands in for kernelsearch.dispatch while the workload runs once: records each call's
    (family, dtype, shape) and runs the plain torch op."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str, tuple[int, ...]], int] = {}

    def call(self, family: str, *args: Any) -> Any:
        from kernelsearch.families import get
        from kernelsearch.families.base import dtype_name

        fam = get(family)  # KeyError for a family kernelsearch lacks: Ops falls back
        if family == "matmul" and (args[0].dim() != 2 or args[1].dim() != 2):
            return fam.torch_default(*args)  # dispatch runs batched products in torch too
        if fam.layout_of is not None and fam.layout_of(*args) != fam.layout:
            return fam.torch_default(*args)  # dispatch hands other layouts to torch: no slot
        try:
            shape = tuple(int(v) for v in fam.shape_of(*args))
            self.calls[(family, dtype_name(args[0].dtype), shape)] = \
                self.calls.get((family, dtype_name(args[0].dtype), shape), 0) + 1
        except (AttributeError, IndexError, TypeError, ValueError):
            pass  # a layout the family's kernels do not take: torch handles it anyway
        return fam.torch_default(*args)


def trace_kernel_calls(llama: Any) -> dict[KernelCall, int]:
    """Run the Llama workload's own size grid once under its current runtime with a recording
    dispatcher: {(family, dtype, shape): calls}. Its own bench (and KV caches: no second set of
    them on the GPU); runners built with the recorder are dropped afterwards."""
    bench, rec = llama.bench, _Recorder()
    real = bench.dispatch
    bench.drop()
    bench.dispatch = rec
    try:
        bench.run(llama.runtime, repeats=1)
    finally:
        bench.dispatch = real
        bench.drop()
    return rec.calls
