"""What a `@gluon.jit` kernel may name: Gluon's kernel API and the Hopper/Ampere modules
(TMA, mbarriers, warpgroup MMA, async copies). `guard_allow` places them in the Gluon context;
`guard_jit` holds a Gluon kernel body to them."""
from __future__ import annotations

from kernelsearch.harness.guard_triton import TL_DTYPES

GL = "triton.experimental.gluon.language"
HOPPER = f"{GL}.nvidia.hopper"
AMPERE = f"{GL}.nvidia.ampere"
# kernels use (TMA, mbarriers, warpgroup MMA, async copies); 3.6's and 3.9's names (3.6's
# thread_barrier is 3.9's barrier: the same CTA barrier)
GL_LAYOUTS = {"AutoLayout", "BlockedLayout", "CoalescedLayout", "DistributedLinearLayout",
              "DotOperandLayout", "NVMMADistributedLayout", "NVMMASharedLayout",
              "PaddedSharedLayout", "SharedLinearLayout", "SliceLayout", "SwizzledSharedLayout"}
GL_API = TL_DTYPES | GL_LAYOUTS | {
    "CachePolicy", "abs", "add", "allocate_shared_memory", "arange", "associative_scan",
    "assume", "atomic_add", "atomic_and", "atomic_cas", "atomic_load", "atomic_max",
    "atomic_min", "atomic_or", "atomic_poll", "atomic_store", "atomic_xchg", "atomic_xor",
    "barrier", "block_type", "broadcast", "cast", "cdiv", "ceil", "clamp", "constexpr",
    "convert_layout", "cos", "cumprod", "cumsum", "device_assert", "device_print",
    "distributed_type", "div_rn", "dot_fma", "dtype", "erf", "exp", "exp2", "expand_dims",
    "fdiv", "floor", "fma", "full", "full_like", "gather", "histogram", "join", "load", "log",
    "log2", "max", "max_constancy", "max_contiguous", "maximum", "min", "minimum", "mul",
    "multiple_of", "num_ctas", "num_programs", "num_warps", "permute", "pointer_type",
    "program_id", "ravel", "reduce", "reduce_or", "reshape", "rsqrt", "set_auto_layout",
    "shared_memory_descriptor", "sin", "split", "sqrt", "sqrt_rn", "static_assert",
    "static_range", "store", "sub", "sum", "tensor", "thread_barrier", "to_tensor", "tuple",
    "umulhi", "warp_specialize", "where", "xor_sum", "zeros", "zeros_like",
}
HOPPER_API = {"fence_async_shared", "warpgroup_mma", "warpgroup_mma_init", "warpgroup_mma_wait",
              "warpgroup_mma_accumulator", "mma_v2", "async_copy", "cluster"}
TMA_API = {"async_copy_global_to_shared", "async_copy_shared_to_global", "async_load",
           "async_store", "store_wait", "make_tensor_descriptor", "tensor_descriptor"}
MBARRIER_API = {"MBarrierLayout", "allocate_mbarrier", "arrive", "expect", "init", "invalidate",
                "wait"}
AMPERE_API = {"mma_v2", "async_copy", "mbarrier"}
ASYNC_COPY_API = {"async_copy_global_to_shared", "commit_group", "wait_group",
                  "mbarrier_arrive"}
