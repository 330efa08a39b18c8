"""What triton.language offers a `@triton.jit` kernel: the names the guard allows under `tl.`,
`tl.math.` and libdevice (the Gluon kernel API, `guard_gluon`, shares the dtypes)."""
from __future__ import annotations

TL = "triton.language"
TL_DTYPES = {"float32", "float16", "bfloat16", "float64", "int1", "int8", "int16", "int32",
             "int64", "uint8", "uint16", "uint32", "uint64", "float8e4nv", "float8e5",
             "float8e4b15", "float8e4b8", "float8e5b16", "void"}
# triton.language's kernel API (its __all__ in 3.6-3.9, minus the submodules and the functions
# that take arbitrary code: inline_asm_elementwise, map_elementwise)
TL_API = TL_DTYPES | {
    "PropagateNan", "TRITON_MAX_TENSOR_NUMEL", "abs", "add", "arange", "argmax", "argmin",
    "associative_scan", "assume", "atomic_add", "atomic_and", "atomic_cas", "atomic_load",
    "atomic_max", "atomic_min", "atomic_or", "atomic_poll", "atomic_store", "atomic_xchg",
    "atomic_xor", "bitonic_merge", "block_type", "broadcast", "broadcast_to", "cast", "cat",
    "cdiv", "ceil", "clamp", "condition", "const", "constexpr", "constexpr_type", "cos",
    "cumprod", "cumsum", "debug_barrier", "device_assert", "device_print", "div_rn", "dot",
    "dot_scaled", "dtype", "erf", "exp", "exp2", "expand_dims", "fdiv", "flip", "floor", "fma",
    "full", "gather", "histogram", "interleave", "join", "load", "load_tensor_descriptor", "log",
    "log2", "make_block_ptr", "make_tensor_descriptor", "max", "max_constancy",
    "max_contiguous", "maximum", "min", "minimum", "mul", "multiple_of", "num_programs",
    "pair_uniform_to_normal", "permute", "philox", "pointer_type", "program_id", "rand",
    "rand4x", "randint", "randint4x", "randn", "randn4x", "range", "ravel", "reduce",
    "reduce_or", "reshape", "rsqrt", "sigmoid", "sin", "slice", "softmax", "sort", "split",
    "sqrt", "sqrt_rn", "squeeze", "static_assert", "static_range", "store",
    "store_tensor_descriptor", "sub", "sum", "swizzle2d", "tensor", "tensor_descriptor",
    "to_tensor", "topk", "trans", "tuple", "uint_to_uniform_float", "umulhi", "unsqueeze",
    "view", "where", "xor_sum", "zeros", "zeros_like", "advance", "advance",
}
TL_MATH = {"abs", "ceil", "cos", "div_rn", "erf", "exp", "exp2", "fdiv", "floor", "fma", "log",
           "log2", "rsqrt", "sin", "sqrt", "sqrt_rn", "umulhi"}
LIBDEVICE = {"fast_expf", "fast_logf", "fast_powf", "fast_dividef", "exp", "exp2", "expm1",
             "log", "log2", "log1p", "pow", "tanh", "erf", "erfc", "rsqrt", "sqrt", "rint",
             "round", "trunc", "floor", "ceil", "isnan", "isinf", "isfinited", "finitef",
             "fmod", "div_rn", "div_rz", "rcp_rn", "sigmoid", "sin", "cos", "fma", "nearbyint"}
# Gluon's kernel API (triton.experimental.gluon.language) and the Hopper/Ampere names the MLA
