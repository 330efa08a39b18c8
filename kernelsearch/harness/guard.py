"""Static guard on candidate source (AST, never regex, never executed): an allow-list.

A candidate is a module defining `forward(...)` that launches module-level `@triton.jit` (or
`@gluon.jit`) kernels. Everything it may name is listed here, so what it can reach is decided
by construction rather than by the tricks someone thought of:

- imports: only the modules in `MODULES` (and `from M import n` only for an allowed `M.n`);
- a dotted path rooted at an imported module must be an entry of `PATHS` for the context it is
  used in (host code, a Triton kernel, a Gluon kernel, an annotation); a module itself is never
  a value (`typing.sys`, `tl.core.builtins`, `torch.os` are not entries, so they cannot appear);
- any other name must be a parameter or local, this file's function, kernel or constant, or an
  allowed builtin (no `__name__`, `getattr`, `type`, `str`, `vars`, frames ...);
- an attribute of a value (a tensor, an int) must be in `VALUE_ATTRS` (host) or `JIT_ATTRS`
  (kernel bodies); never one that starts with `_`; never on a function or kernel;
- calls: allowed paths, allowed builtins, this file's functions, `kernel[grid](...)`, allowed
  methods on values; no f-strings, `%` formatting or `.format` (the text of a kernel object
  shows its launch state);
- every annotation (module level, arguments, returns) and every decorator is checked.
Size and nesting are bounded before anything is parsed (`guard_bounds`). Each violation has a
stable rule name (the verdict's `rule`, which the LLM proposer's context shows by the code)."""
from __future__ import annotations

import ast

from kernelsearch.harness import guard_bounds
from dataclasses import dataclass

# ---- what may be imported and named ---------------------------------------------------------
TL = "triton.language"
GL = "triton.experimental.gluon.language"
HOPPER = f"{GL}.nvidia.hopper"
AMPERE = f"{GL}.nvidia.ampere"
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


@dataclass
class Violation:
    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: [guard:{self.rule}] {self.message}"


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):
        return _dotted(node.func) + "()"
    return "?"


def _chain(node: ast.Attribute) -> tuple[ast.AST, list[str]]:
    """(base expression, attribute names from the base outwards) of `a.b.c`."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return node, names[::-1]


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> full dotted path, for the module's allowed imports (others are reported
    by the checker and bound to nothing)."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES:
                    if a.asname:
                        out[a.asname] = a.name
                    else:
                        out[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in MODULES or full in PATHS:
                    out[a.asname or a.name] = full
    return out


def _resolve(node: ast.AST, aliases: dict[str, str], local: set[str]) -> str | None:
    """The full dotted path of `alias.a.b` (None if the base is not an imported alias)."""
    if isinstance(node, ast.Name):
        if node.id in aliases and node.id not in local:
            return aliases[node.id]
        return None
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, aliases, local)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _decorator_kind(d: ast.AST, aliases: dict[str, str]) -> str | None:
    target = d.func if isinstance(d, ast.Call) else d
    return _resolve(target, aliases, set())


def _jit_kind(fn: ast.FunctionDef, aliases: dict[str, str]) -> str | None:
    """JIT (triton.jit) or GLUON (gluon.jit) or None (a plain function)."""
    kinds = {_decorator_kind(d, aliases) for d in fn.decorator_list}
    if "triton.experimental.gluon.jit" in kinds:
        return GLUON
    if kinds & JIT_DECORATORS:
        return JIT
    return None


def _is_jit(fn: ast.FunctionDef, aliases: dict[str, str] | None = None) -> bool:
    if aliases is None:  # ghost_source and friends: by the decorator's last name
        return any(_dotted(d.func if isinstance(d, ast.Call) else d).split(".")[-1]
                   in ("jit", "autotune", "heuristics") for d in fn.decorator_list)
    return _jit_kind(fn, aliases) is not None


def _const_expr(node: ast.AST, aliases: dict[str, str] | None = None) -> bool:
    """Immutable constants (no caches, no registries): numbers, strings, tuples, arithmetic,
    `tl.constexpr(const)`."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(_const_expr(e, aliases) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _const_expr(node.operand, aliases)
    if isinstance(node, ast.BinOp) and not isinstance(node.op, ast.Mod):
        return _const_expr(node.left, aliases) and _const_expr(node.right, aliases)
    if isinstance(node, ast.Call) and not node.keywords and aliases is not None \
            and _resolve(node.func, aliases, set()) in (f"{TL}.constexpr", f"{GL}.constexpr"):
        return all(_const_expr(a, aliases) for a in node.args)
    return False


def _literal(node: ast.AST) -> bool:
    """A decorator argument: constants, and lists/dicts/tuples of them."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k) for k in node.keys) and all(
            _literal(v) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return False


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module):
        self.v: list[Violation] = []
        self.tree = tree
        self.aliases = _aliases(tree)
        self.jit_names: set[str] = set()
        self.module_funcs: set[str] = set()
        self.constants: set[str] = set()
        self.launched: set[str] = set()
        self.local: set[str] = set()
        self.attr_bases: set[int] = set()

    def add(self, rule: str, node: ast.AST, msg: str) -> None:
        self.v.append(Violation(rule, getattr(node, "lineno", 0), msg))

    # ---- module level -------------------------------------------------------------------
    def run(self) -> list[Violation]:
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                self.module_funcs.add(node.name)
                if _jit_kind(node, self.aliases):
                    self.jit_names.add(node.name)
            elif isinstance(node, ast.Assign) and _const_expr(node.value, self.aliases):
                self.constants |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and node.value is not None \
                    and isinstance(node.target, ast.Name) \
                    and _const_expr(node.value, self.aliases):
                self.constants.add(node.target.id)
        shadow = (self.module_funcs | self.constants) & (set(self.aliases) | BUILTINS_ALLOWED)
        for n in sorted(shadow):
            self.add("name_not_allowed", self.tree, f"{n} rebinds an import or a builtin")
        for node in self.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import_stmt(node)
            elif isinstance(node, ast.FunctionDef):
                self._function(node)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # docstring
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                value = node.value
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if isinstance(node, ast.AnnAssign):
                    self._annotation(node.annotation)
                if not all(isinstance(t, ast.Name) for t in targets) or value is None \
                        or not _const_expr(value, self.aliases):
                    self.add("module_state", node, "module-level state other than constants "
                             "(caches and registries are not allowed)")
            elif isinstance(node, ast.ClassDef):
                self.add("module_state", node, f"class {node.name} at module level")
            else:
                self.add("module_state", node,
                         f"module-level {type(node).__name__} statement (only imports, "
                         "functions and constants)")
        if "forward" not in self.module_funcs:
            self.add("no_forward", self.tree, "the module defines no forward(...)")
        elif "forward" in self.jit_names:
            self.add("no_forward", self.tree, "forward must be a plain Python function")
        if not self.launched:
            self.add("no_launch", self.tree,
                     "no module-level @triton.jit kernel is launched (kernel[grid](...))")
        return self.v

    def _import_stmt(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                self._import(node, a.name, a.name in MODULES)
            return
        mod = node.module or ""
        if node.level:
            self.add("import", node, "relative import")
            return
        for a in node.names:
            full = f"{mod}.{a.name}"
            if mod == "__future__" and a.name == "annotations":
                continue
            if a.name == "*":
                self.add("import", node, f"from {mod} import *")
            elif full in MODULES or full in PATHS:
                continue
            elif mod in MODULES and mod == "torch":
                self.add("import", node, f"from torch import {a.name}: only allocation and "
                         "dtypes may be named from torch")
            else:
                self._import(node, full, False)

    def _import(self, node: ast.AST, name: str, ok: bool) -> None:
        root = name.split(".")[0]
        if root in THREAD_MODULES:
            self.add("thread", node, f"import of {name}: candidates may not start threads")
        elif root in TIMER_MODULES or name.startswith("triton.testing"):
            self.add("timer", node, f"import of {name}: candidates may not touch timers")
        elif not ok:
            self.add("import", node, f"import of {name} (allowed: {sorted(MODULES)[:12]} ...; "
                     "typing, os, sys and the rest are not)")

    # ---- annotations and decorators -------------------------------------------------------
    def _annotation(self, node: ast.AST | None, jit: bool = False) -> None:
        """An annotation is evaluated at import unless `from __future__ import annotations`
        (and triton reads a kernel's): only a short list of types, nothing computed."""
        if node is None:
            return
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute):
                path = _resolve(sub, self.aliases, set())
                if path is not None and ANNOT in PATHS.get(path, ()):
                    self.attr_bases |= {id(x) for x in ast.walk(sub) if x is not sub}
                    continue
                if id(sub) in self.attr_bases:
                    continue
                self.add("annotation_not_allowed", sub,
                         f"annotation {ast.unparse(sub)[:60]}: only int, float, bool, "
                         "tl.constexpr, torch.Tensor and the like")
                self.attr_bases |= {id(x) for x in ast.walk(sub) if x is not sub}
            elif isinstance(sub, ast.Name):
                if id(sub) in self.attr_bases:
                    continue
                if sub.id not in ANNOT_NAMES:
                    self.add("annotation_not_allowed", sub, f"annotation names {sub.id}")
            elif isinstance(sub, ast.Constant):
                if sub.value is not None:
                    self.add("annotation_not_allowed", sub,
                             "string annotations are not allowed (they are evaluated later)")
            elif not isinstance(sub, (ast.Subscript, ast.Tuple, ast.BinOp, ast.BitOr,
                                      ast.Load, ast.Index if hasattr(ast, "Index") else ast.Load)):
                self.add("annotation_not_allowed", sub,
                         f"annotation contains {type(sub).__name__} (only types)")

    def _signature(self, fn: ast.FunctionDef, jit: bool) -> None:
        a = fn.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
            self._annotation(arg.annotation, jit)
        self._annotation(fn.returns, jit)
        for default in a.defaults + [d for d in a.kw_defaults if d is not None]:
            if not _const_expr(default, self.aliases):
                self.add("module_state", default, f"mutable or computed default in {fn.name}")

    def _decorators(self, fn: ast.FunctionDef, kind: str | None) -> None:
        for d in fn.decorator_list:
            path = _decorator_kind(d, self.aliases)
            if kind is None or path not in JIT_DECORATORS:
                self.add("module_state", d, f"decorator {_dotted(d)} on {fn.name} "
                         "(only triton.jit, gluon.jit, triton.autotune, triton.heuristics)")
                continue
            if not isinstance(d, ast.Call):
                continue
            for arg in list(d.args) + [k.value for k in d.keywords]:
                if not self._decorator_arg(arg):
                    self.add("decorator_not_allowed", arg,
                             f"decorator argument {ast.unparse(arg)[:60]} on {fn.name}: only "
                             "constants and triton.Config(constants)")
            if any(k.arg is None for k in d.keywords):
                self.add("decorator_not_allowed", d, f"**kwargs in a decorator on {fn.name}")

    def _decorator_arg(self, node: ast.AST) -> bool:
        if _literal(node):
            return True
        if isinstance(node, (ast.List, ast.Tuple)):
            return all(self._decorator_arg(e) for e in node.elts)
        if isinstance(node, ast.Call) and _resolve(node.func, self.aliases, set()) == \
                "triton.Config":
            return all(self._decorator_arg(x) for x in list(node.args)
                       + [k.value for k in node.keywords if k.arg is not None]) \
                and all(k.arg is not None for k in node.keywords)
        return False

    # ---- functions ------------------------------------------------------------------------
    def _function(self, fn: ast.FunctionDef) -> None:
        kind = _jit_kind(fn, self.aliases)
        self._decorators(fn, kind)
        self._signature(fn, kind is not None)
        if kind is not None:
            self.v += jit_body_violations(fn, self.aliases, self.jit_names, self.constants,
                                          gluon=(kind == GLUON))
            return
        a = fn.args
        params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        params |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        stored = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                  and isinstance(n.ctx, (ast.Store, ast.Del))}
        stored |= {n.name for n in ast.walk(fn) if isinstance(n, ast.FunctionDef) and n is not fn}
        bad = (params | stored) & (set(self.aliases) | self.jit_names | self.module_funcs
                                   | DYNAMIC | REFLECTION)
        for n in sorted(bad):
            self.add("name_not_allowed", fn, f"{fn.name} rebinds {n}")
        prev, self.local = self.local, params | stored
        for stmt in fn.body:
            self.visit(stmt)
        self.local = prev

    # ---- host statements ------------------------------------------------------------------
    def visit_Import(self, node: ast.AST) -> None:
        self.add("import", node, "import inside a function")

    visit_ImportFrom = visit_Import

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.add("module_state", node, f"nested function {node.name}")

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.add("module_state", node, "lambda inside a candidate")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.add("module_state", node, f"class {node.name} inside a candidate")

    def visit_Try(self, node: ast.AST) -> None:
        self.add("try_except", node, "try/except (a fallback path) is not allowed")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_With(self, node: ast.With) -> None:
        self.generic_visit(node)  # a stream in the header is reported as such first
        self.add("context_manager", node, "with-statements are not allowed (streams, suppress)")

    def visit_Global(self, node: ast.AST) -> None:
        self.add("module_state", node, "global/nonlocal state")

    visit_Nonlocal = visit_Global

    def visit_Yield(self, node: ast.AST) -> None:
        self.add("module_state", node, "generators are not allowed")

    visit_YieldFrom = visit_Await = visit_Yield

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if any(isinstance(v, ast.FormattedValue) for v in node.values):
            self.add("reflection", node, "f-string formatting (the text of an object is "
                     "introspection)")
        self.generic_visit(node)

    def _targets(self, targets: list[ast.AST], node: ast.AST) -> None:
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    self.add("monkey_patch", node, f"assignment to attribute {_dotted(sub)}")
                    self.attr_bases.add(id(sub))
                elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    self.add("torch_compute", node,
                             f"write into {_dotted(sub.value)}[...] outside a kernel")
            self.visit(t)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node.targets, node)
        self.visit(node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._targets([node.target], node)
        self.visit(node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        self._targets([node.target], node)
        if node.value is not None:
            self.visit(node.value)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._targets(node.targets, node)

    # ---- host expressions -----------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if id(node) in self.attr_bases:
            self.generic_visit(node)
            return
        base, names = _chain(node)
        sub: ast.AST = node
        while isinstance(sub, ast.Attribute):  # the chain's own links, not its base's insides
            self.attr_bases.add(id(sub))
            sub = sub.value
        dotted = _dotted(node)
        under = [n for n in names if n.startswith("_")]
        path = _resolve(node, self.aliases, self.local)
        if under:
            self.add("reflection", node, f"private or dunder attribute .{under[0]}")
        elif any(any(w in n.lower() for w in STREAM_WORDS) for n in names):
            self.add("stream", node, f"{dotted}: streams, events, graphs and syncs belong to "
                     "the harness")
        elif set(names) & TIMER_WORDS:
            self.add("timer", node, f"{dotted}: candidates may not touch timers")
        elif path is not None:
            if path.startswith("torch.cuda"):
                self.add("stream", node, f"{dotted}: torch.cuda API inside a candidate")
            elif HOST not in PATHS.get(path, ()):
                rule = "torch_compute" if path.startswith("torch.") else "attribute_not_allowed"
                self.add(rule, node, f"{dotted} ({path}) is not on the host allow-list "
                         "(allocation, dtypes, triton.cdiv/next_power_of_2/jit)")
        elif isinstance(base, ast.Name) and (base.id in self.module_funcs
                                              or base.id in BUILTINS_ALLOWED) \
                and base.id not in self.local:
            self.add("attribute_not_allowed", node,
                     f"{dotted}: attributes of a function, kernel or builtin")
        else:
            bad = [n for n in names if n not in VALUE_ATTRS]
            if bad:
                call_parent = False  # a method call on a tensor is compute
                self.add("attribute_not_allowed" if not call_parent else "torch_compute", node,
                         f"{dotted}: .{bad[0]} is not a tensor view/metadata attribute")
        if not isinstance(base, ast.Name):
            self.visit(base)
        elif base.id not in self.aliases or base.id in self.local:
            self.visit(base)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.add("torch_compute", node, "matrix product (@) outside a kernel")
        if isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str):
            self.add("reflection", node, "%-formatting (the text of an object)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name):
            if f.id in DYNAMIC:
                self.add("dynamic_code", node, f"{f.id}(...) is not allowed")
            elif f.id in REFLECTION:
                self.add("reflection", node, f"{f.id}(...) is not allowed")
            elif f.id in self.jit_names:
                self.add("no_launch", node, f"{f.id} called without a launch grid")
            elif f.id in self.local:
                self.add("call_not_allowed", node, f"call of {f.id}(...), a parameter or local")
            elif f.id not in BUILTINS_ALLOWED | self.module_funcs and f.id not in self.aliases:
                self.add("dynamic_code", node, f"call of unknown name {f.id}")
            self.attr_bases.add(id(f))
            for a in node.args:
                self.visit(a)
            for k in node.keywords:
                self.visit(k.value)
            if f.id in self.aliases and f.id not in self.local:
                path = self.aliases[f.id]
                if HOST not in PATHS.get(path, ()):
                    self.add("call_not_allowed", node, f"call of {f.id} ({path})")
            return
        if isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name) \
                and f.value.id in self.jit_names and f.value.id not in self.local:
            self.launched.add(f.value.id)
            self.visit(f.slice)
            for a in node.args:
                self.visit(a)
            for k in node.keywords:
                self.visit(k.value)
            return
        if isinstance(f, ast.Attribute):
            path = _resolve(f, self.aliases, self.local)
            if isinstance(f.value, ast.Constant):
                self.add("reflection", node, f"method .{f.attr}(...) of a constant (formatting "
                         "an object is introspection)")
                self.attr_bases.add(id(f))
            elif path is None and f.attr not in METHOD_ALLOWED and not f.attr.startswith("_") \
                    and not any(w in f.attr.lower() for w in STREAM_WORDS) \
                    and f.attr not in TIMER_WORDS:
                base, _ = _chain(f)
                if not (isinstance(base, ast.Name) and base.id in self.module_funcs
                        and base.id not in self.local):
                    self.add("torch_compute", node, f".{f.attr}(...): only allocation, views "
                             "and metadata are allowed outside kernels")
                    self.attr_bases.add(id(f))
        elif not isinstance(f, ast.Attribute):
            self.add("call_not_allowed", node, f"call of a computed value "
                     f"{ast.unparse(f)[:40]}(...)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load) or id(node) in self.attr_bases:
            return
        n = node.id
        if n in DYNAMIC:
            self.add("dynamic_code", node, f"reference to {n}")
        elif n in REFLECTION:
            self.add("reflection", node, f"reference to {n}")
        elif n in self.local:
            return
        elif n in self.aliases:
            if HOST not in PATHS.get(self.aliases[n], ()):
                self.add("module_as_value" if self.aliases[n] in MODULES else
                         "reflection", node, f"module {n} used as a value")
        elif n in self.module_funcs:
            self.add("reflection", node, f"function {n} used as a value (only called or "
                     "launched)")
        elif n not in self.constants | BUILTINS_ALLOWED:
            self.add("name_not_allowed", node, f"name {n!r} is not a parameter, a local, an "
                     "import, this file's function or constant, or an allowed builtin")


# Within one line, the most telling rule first (the verdict names the first violation).
RULE_ORDER = ("syntax", "import", "thread", "timer", "annotation_not_allowed",
              "decorator_not_allowed", "monkey_patch", "dynamic_code", "reflection",
              "module_as_value", "attribute_not_allowed", "stream", "module_state",
              "name_not_allowed", "call_not_allowed", "try_except", "context_manager",
              "torch_compute", "jit_body", "no_forward", "no_launch")


def check_source(source: str) -> list[Violation]:
    """All guard violations in a candidate's source (empty list: the guard passes), by line
    and, within a line, most telling rule first."""
    try:
        tree = guard_bounds.parse(source)
    except SyntaxError as e:  # guard_bounds.Refused: its own rule and reason
        return [Violation(getattr(e, "rule", "syntax"), e.lineno or 0,
                          getattr(e, "why", f"syntax error: {e.msg}"))]
    v = _Checker(tree).run()
    rank = {r: i for i, r in enumerate(RULE_ORDER)}
    return sorted(v, key=lambda x: (x.line or 10 ** 9, rank.get(x.rule, len(rank))))


def uses_gluon(source: str) -> bool:
    """Whether the candidate defines a `@gluon.jit` kernel (it then runs only on an sm_90 GPU:
    Gluon has no interpreter path). False for a source that does not parse."""
    try:
        tree = guard_bounds.parse(source)
    except SyntaxError:
        return False
    aliases = _aliases(tree)
    return any(isinstance(n, ast.FunctionDef) and _jit_kind(n, aliases) == GLUON
               for n in tree.body)


def launched_kernels(source: str) -> set[str]:
    """Names of the jit kernels `forward` launches (for the runtime launch counter)."""
    c = _Checker(guard_bounds.parse(source))
    c.run()
    return c.launched


def ghost_source(source: str) -> str:
    """The candidate with every jit body replaced by a no-op (the 'ghost' run)."""
    tree = guard_bounds.parse(source)
    aliases = _aliases(tree)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and _is_jit(node, aliases):
            node.body = [ast.Pass()]
    return ast.unparse(ast.fix_missing_locations(tree))


# ---- jit bodies ---------------------------------------------------------------------------
# Under TRITON_INTERPRET=1 a kernel body runs as ordinary Python with the module's globals, so
# it is held to the same allow-list: names it may read, attribute names on values, paths on
# modules, calls. Tensor, block, descriptor and dtype attributes of triton.language (3.x).
JIT_ATTRS = {
    "T", "abs", "advance", "argmax", "argmin", "associative_scan", "atomic_add", "atomic_and",
    "atomic_cas", "atomic_load", "atomic_max", "atomic_min", "atomic_or", "atomic_poll",
    "atomic_store", "atomic_xchg", "atomic_xor", "broadcast_to", "cast", "cdiv", "ceil", "cos",
    "cumprod", "cumsum", "erf", "exp", "exp2", "expand_dims", "flip", "floor", "gather",
    "histogram", "log", "log2", "logical_and", "logical_or", "max", "min", "permute",
    "ravel", "reduce", "reduce_or", "reshape", "rsqrt", "sigmoid", "sin", "softmax", "sort",
    "split", "sqrt", "sqrt_rn", "store", "sum", "to", "trans", "view", "xor_sum", "load",
    "scatter", "block_shape", "block_type", "dtype", "element_ty", "shape", "numel", "type",
    "value", "scalar", "primitive_bitwidth", "is_ptr", "is_floating", "is_int", "is_bf16",
    "is_fp16", "is_fp32", "is_fp64", "is_fp8", "is_int_signed", "is_int_unsigned", "is_block",
    "is_bool", "int_bitwidth", "fp_mantissa_width", "with_element_ty",
    # Gluon values: shared memory descriptors, their slices, layouts
    "index", "slice", "permute", "reinterpret", "layout", "load", "store",
}
# Builtins a kernel may call (the ones triton's frontend understands)
JIT_BUILTINS = {"range", "min", "max", "int", "float", "bool", "len", "abs", "isinstance",
                "tuple", "zip", "enumerate", "True", "False", "None"}
JIT_NODES_FORBIDDEN = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                       ast.Yield, ast.YieldFrom, ast.Await, ast.AsyncFunctionDef, ast.ClassDef,
                       ast.Import, ast.ImportFrom, ast.JoinedStr, ast.Global, ast.Nonlocal,
                       ast.Try, ast.With)


def module_constants(tree: ast.Module) -> set[str]:
    """Module-level names bound to constants (a kernel may read them: BLOCK = 128)."""
    aliases = _aliases(tree)
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _const_expr(node.value, aliases):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None \
                and isinstance(node.target, ast.Name) and _const_expr(node.value, aliases):
            out.add(node.target.id)
    return out


def jit_body_violations(fn: ast.FunctionDef, aliases: dict[str, str], jit_names: set[str],
                        constants: set[str], gluon: bool = False) -> list[Violation]:
    """Everything in a kernel body that is not triton-language (or, in a Gluon kernel,
    gluon-language): rule `jit_body`."""
    out: list[Violation] = []
    ctx = GLUON if gluon else JIT

    def bad(node: ast.AST, msg: str) -> None:
        out.append(Violation("jit_body", getattr(node, "lineno", fn.lineno),
                             f"in kernel {fn.name}: {msg}"))

    args = fn.args
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    local = set(params)
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            local.add(node.id)
    for n in sorted(local & (set(aliases) | jit_names)):
        bad(fn, f"rebinds {n}")
    value_aliases = {k for k, v in aliases.items() if ctx in PATHS.get(v, ())}
    module_aliases = {k for k, v in aliases.items() if v in MODULES}
    readable = local | jit_names | constants | module_aliases | value_aliases | JIT_BUILTINS
    attr_bases: set[int] = set()

    def name(node: ast.Name) -> None:
        if node.id not in readable:
            bad(node, f"name {node.id!r} is not an argument, a local, a constant, tl or a "
                "kernel of this file")
        elif node.id in module_aliases - local and id(node) not in attr_bases:
            bad(node, f"module {node.id} used as a value")

    def attribute(node: ast.Attribute) -> None:
        base, names = _chain(node)
        sub = node
        while isinstance(sub, ast.Attribute):
            attr_bases.add(id(sub.value))
            attr_bases.add(id(sub))
            sub = sub.value
        where = ast.unparse(node)[:60]
        under = [n for n in names if n.startswith("_")]
        if under:
            out.append(Violation("reflection", node.lineno,
                                 f"in kernel {fn.name}: private or dunder attribute .{under[0]}"))
            return
        path = _resolve(node, aliases, local)
        if path is not None:
            if ctx not in PATHS.get(path, ()):
                bad(node, f"{where} ({path}) is not a "
                    f"{'gluon' if gluon else 'triton'}.language function or type")
            return
        if isinstance(base, ast.Name) and base.id not in local and base.id not in constants:
            if base.id not in readable:
                return  # `name` reports the unknown base (torch, os ...)
            bad(node, f"{where}: attributes of {base.id}")
            return
        bad_names = [n for n in names if n not in JIT_ATTRS]
        if bad_names:
            bad(node, f"{where}: .{bad_names[0]} is not a triton tensor/dtype attribute")

    def call(node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name):
            if f.id in local:
                bad(node, f"call of {f.id}(...), an argument or local")
            elif f.id not in jit_names | JIT_BUILTINS | value_aliases:
                bad(node, f"call of {f.id}(...): only tl.*, this file's kernels and "
                    f"{sorted(JIT_BUILTINS)}")
        elif not isinstance(f, ast.Attribute):
            bad(node, f"call of a computed value {ast.unparse(f)[:40]}(...)")

    for stmt in fn.body:
        for sub in ast.walk(stmt):
            if isinstance(sub, ast.Attribute) and id(sub) not in attr_bases:
                attribute(sub)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                name(sub)
            elif isinstance(sub, ast.Call):
                call(sub)
            elif isinstance(sub, ast.FunctionDef):
                bad(sub, f"nested function {sub.name}")
            elif isinstance(sub, JIT_NODES_FORBIDDEN):
                bad(sub, f"{type(sub).__name__} is not triton-language")
    return out
