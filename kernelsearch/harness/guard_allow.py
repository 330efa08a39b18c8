"""The guard's allow-list: the modules a candidate may import, every dotted path it may name
with the contexts it may name it in (host code, a Triton kernel, a Gluon kernel, an annotation),
and the attributes, builtins and words host code may or may not use."""
from __future__ import annotations

from kernelsearch.harness.guard_gluon import (AMPERE, AMPERE_API, ASYNC_COPY_API, GL, GL_API,
                                              GL_LAYOUTS, HOPPER, HOPPER_API, MBARRIER_API,
                                              TMA_API)
from kernelsearch.harness.guard_triton import LIBDEVICE, TL, TL_API, TL_DTYPES, TL_MATH

MODULES = {
    "torch", "triton", TL, f"{TL}.math", f"{TL}.extra", f"{TL}.extra.cuda",
    f"{TL}.extra.cuda.libdevice", f"{TL}.extra.libdevice", "math", "__future__",
    "triton.experimental", "triton.experimental.gluon", GL, f"{GL}.nvidia", HOPPER,
    f"{HOPPER}.tma", f"{HOPPER}.mbarrier", AMPERE, f"{AMPERE}.async_copy", f"{AMPERE}.mbarrier",
    "triton.experimental.gluon.nvidia", "triton.experimental.gluon.nvidia.hopper",
    "triton.tools", "triton.tools.tensor_descriptor",
}
THREAD_MODULES = {"threading", "_thread", "concurrent", "multiprocessing", "asyncio"}
TIMER_MODULES = {"time", "timeit"}

TORCH_ALLOC = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like"}
TORCH_VALUES = {"float32", "float16", "bfloat16", "float64", "int32", "int64", "int16", "int8",
                "uint8", "float8_e4m3fn", "float8_e5m2", "bool", "float", "half", "Tensor",
                "device", "dtype", "Size", "contiguous_format"}
TRITON_HOST = {"jit", "cdiv", "next_power_of_2", "autotune", "heuristics", "Config"}
MATH_NAMES = {"sqrt", "ceil", "floor", "log", "log2", "log10", "exp", "exp2", "isqrt", "gcd",
              "lcm", "prod", "inf", "pi", "e", "nan", "tanh", "erf", "fabs", "copysign"}

HOST, JIT, GLUON, ANNOT = "host", "jit", "gluon", "annot"


def _paths() -> dict[str, set[str]]:
    """Full dotted path -> the contexts it may be used in."""
    p: dict[str, set[str]] = {}

    def add(prefix: str, names, *ctx: str) -> None:
        for n in names:
            p.setdefault(f"{prefix}.{n}", set()).update(ctx)

    add("torch", TORCH_ALLOC | TORCH_VALUES, HOST)
    add("torch", {"Tensor", "dtype"}, ANNOT)
    add("triton", TRITON_HOST, HOST)
    add("math", MATH_NAMES, HOST, JIT, GLUON)
    add(TL, TL_API, JIT, GLUON)
    add(TL, TL_DTYPES | {"constexpr"}, HOST)
    add(TL, {"constexpr", "tensor"}, ANNOT)
    add(f"{TL}.math", TL_MATH, JIT, GLUON)
    add(f"{TL}.extra.cuda.libdevice", LIBDEVICE, JIT, GLUON)
    add(f"{TL}.extra.libdevice", LIBDEVICE, JIT, GLUON)
    add("triton.experimental.gluon", {"jit"}, HOST)
    add(GL, GL_API, GLUON)
    add(GL, TL_DTYPES | GL_LAYOUTS | {"constexpr"}, HOST)
    add(GL, {"constexpr", "tensor", "shared_memory_descriptor"}, ANNOT)
    add(f"{GL}.NVMMASharedLayout", {"get_default_for"}, HOST, GLUON)
    add(HOPPER, HOPPER_API, GLUON)
    add(f"{HOPPER}.tma", TMA_API, GLUON)
    add(f"{HOPPER}.mbarrier", MBARRIER_API, GLUON)
    add(f"{HOPPER}.mbarrier", {"MBarrierLayout"}, HOST)
    add(AMPERE, AMPERE_API - {"async_copy", "mbarrier"}, GLUON)
    add(f"{AMPERE}.async_copy", ASYNC_COPY_API, GLUON)
    add(f"{AMPERE}.mbarrier", MBARRIER_API, GLUON)
    for mod in ("triton.experimental.gluon.nvidia.hopper", "triton.tools.tensor_descriptor"):
        add(mod, {"TensorDescriptor"}, HOST)
        add(f"{mod}.TensorDescriptor", {"from_tensor"}, HOST)
    return p


PATHS = _paths()

# Methods and attributes of values (tensors, sizes, ints, lists) host code may use: allocation,
# views and metadata. A method not here on a tensor is compute (`torch_compute`).
METHOD_ALLOWED = {"size", "stride", "numel", "dim", "is_contiguous", "contiguous", "view",
                  "reshape", "flatten", "unsqueeze", "squeeze", "t", "transpose", "permute",
                  "expand", "data_ptr", "element_size", "new_empty", "unbind", "bit_length",
                  "append", "get", "items", "keys", "values", "index", "storage_offset"}
VALUE_ATTRS = METHOD_ALLOWED | {"shape", "dtype", "device", "ndim", "is_cuda", "itemsize", "T"}
BUILTINS_ALLOWED = {"int", "float", "bool", "len", "range", "min", "max", "tuple", "list",
                    "isinstance", "abs", "divmod", "enumerate", "zip", "round", "pow", "all",
                    "any", "sum", "sorted", "reversed", "dict", "ValueError", "TypeError",
                    "AssertionError", "NotImplementedError", "True", "False", "None"}
ANNOT_NAMES = {"int", "float", "bool", "tuple", "list", "dict", "None"}
DYNAMIC = {"exec", "eval", "compile", "__import__"}
REFLECTION = {"getattr", "setattr", "delattr", "hasattr", "globals", "locals", "vars", "open",
              "breakpoint", "input", "type", "object", "super", "id", "hash", "memoryview",
              "__builtins__", "dir", "str", "repr", "format", "print", "ascii", "callable",
              "classmethod", "staticmethod", "property", "__name__", "__file__", "__spec__",
              "__loader__", "__dict__", "__doc__", "__package__", "__debug__"}
STREAM_WORDS = ("stream", "event", "graph", "synchronize")
TIMER_WORDS = {"testing", "do_bench", "do_bench_cudagraph", "perf_counter", "elapsed_time",
               "monotonic", "time_ns", "process_time"}
JIT_DECORATORS = {"triton.jit", "triton.autotune", "triton.heuristics",
                  "triton.experimental.gluon.jit"}
