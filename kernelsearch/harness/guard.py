"""Static guard on candidate source (AST, never regex, never executed).

A candidate is a module defining `forward(...)` that launches module-level `@triton.jit` kernels.
Outside kernel bodies it may allocate (torch.empty*, zeros*), take views and metadata, and do
integer arithmetic for grids; nothing else. Inside kernel bodies (which the CPU interpreter runs as
plain Python) only `tl.*`, arithmetic, comparisons, control flow, constants and the kernel's own
arguments and locals (`jit_body`, see `jit_body_violations`). Each violation has a rule name (the
verdict's `rule`)."""
from __future__ import annotations

import ast
from dataclasses import dataclass

ALLOWED_IMPORTS = {"torch", "triton", "triton.language", "math", "typing", "__future__"}
THREAD_MODULES = {"threading", "_thread", "concurrent", "multiprocessing", "asyncio"}
TIMER_MODULES = {"time", "timeit"}

TORCH_ALLOC = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like"}
TORCH_VALUES = {"float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8",
                "float8_e4m3fn", "float8_e5m2", "bool", "float", "half", "Tensor", "device",
                "dtype", "Size", "contiguous_format"}
TRITON_ALLOWED = {"jit", "cdiv", "next_power_of_2", "autotune", "heuristics", "Config",
                  "language"}
METHOD_ALLOWED = {"size", "stride", "numel", "dim", "is_contiguous", "contiguous", "view",
                  "reshape", "flatten", "unsqueeze", "squeeze", "t", "transpose", "permute",
                  "expand", "data_ptr", "element_size", "new_empty", "unbind", "bit_length",
                  "append", "get", "items", "keys", "values", "index"}
BUILTINS_ALLOWED = {"int", "float", "bool", "len", "range", "min", "max", "tuple", "list",
                    "isinstance", "abs", "divmod", "enumerate", "zip", "round", "pow", "all",
                    "any", "print", "str", "ValueError", "TypeError", "AssertionError"}
DYNAMIC = {"exec", "eval", "compile", "__import__"}
REFLECTION = {"getattr", "setattr", "delattr", "globals", "locals", "vars", "open",
              "breakpoint", "input", "type", "object", "super", "id", "hash", "memoryview",
              "__builtins__"}
STREAM_WORDS = ("stream", "event", "graph", "synchronize")
TIMER_WORDS = {"testing", "do_bench", "do_bench_cudagraph", "perf_counter", "elapsed_time",
               "monotonic", "time_ns", "process_time"}
JIT_DECORATORS = {"jit", "autotune", "heuristics"}


@dataclass
class Violation:
    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: [{self.rule}] {self.message}"


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


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if _dotted(target).split(".")[-1] in JIT_DECORATORS:
            return True
    return False


def _const_expr(node: ast.AST) -> bool:
    """Module-level values may only be immutable constants (no caches, no registries)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(_const_expr(e) for e in node.elts)
    if isinstance(node, (ast.UnaryOp,)):
        return _const_expr(node.operand)
    if isinstance(node, ast.BinOp):
        return _const_expr(node.left) and _const_expr(node.right)
    if isinstance(node, ast.Call) and _dotted(node.func) in ("tl.constexpr", "triton.language.constexpr"):
        return all(_const_expr(a) for a in node.args)
    return False


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module):
        self.v: list[Violation] = []
        self.aliases: dict[str, str] = {}  # local name -> module path
        self.jit_names: set[str] = set()
        self.module_funcs: set[str] = set()
        self.launched: set[str] = set()
        self.in_jit = False
        self.tree = tree

    def add(self, rule: str, node: ast.AST, msg: str) -> None:
        self.v.append(Violation(rule, getattr(node, "lineno", 0), msg))

    # ---- module level -------------------------------------------------------------------
    def run(self) -> list[Violation]:
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                self.module_funcs.add(node.name)
                if _is_jit(node):
                    self.jit_names.add(node.name)
        for node in self.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.visit(node)
            elif isinstance(node, ast.FunctionDef):
                self._function(node, top=True)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # docstring
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                value = node.value
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if not all(isinstance(t, ast.Name) for t in targets) or value is None \
                        or not _const_expr(value):
                    self.add("module_state", node, "module-level state other than constants "
                             "(caches and registries are not allowed)")
            elif isinstance(node, ast.ClassDef):
                self.add("module_state", node, f"class {node.name} at module level")
            else:
                self.add("module_state", node,
                         f"module-level {type(node).__name__} statement (only imports, "
                         "functions and constants)")
                self.generic_visit(node)
        self.v += module_value_violations(self.tree, self.aliases)
        if "forward" not in self.module_funcs:
            self.add("no_forward", self.tree, "the module defines no forward(...)")
        elif "forward" in self.jit_names:
            self.add("no_forward", self.tree, "forward must be a plain Python function")
        if not self.launched:
            self.add("no_launch", self.tree,
                     "no module-level @triton.jit kernel is launched (kernel[grid](...))")
        return self.v

    def _function(self, fn: ast.FunctionDef, top: bool) -> None:
        jit = _is_jit(fn)
        if not jit:
            for d in fn.decorator_list:
                self.add("module_state", d, f"decorator {_dotted(d)} on {fn.name} "
                         "(caching decorators are not allowed)")
        else:
            for d in fn.decorator_list:  # evaluated at import, outside any kernel
                self.visit(d)
            self.v += jit_body_violations(fn, self.aliases, self.jit_names,
                                          module_constants(self.tree))
        for default in fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None]:
            if not _const_expr(default):
                self.add("module_state", default, f"mutable or computed default in {fn.name}")
        prev, self.in_jit = self.in_jit, jit
        for stmt in fn.body:
            self.visit(stmt)
        self.in_jit = prev

    # ---- statements -----------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._import(node, a.name)
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        for a in node.names:
            full = f"{mod}.{a.name}"
            if mod == "triton" and a.name in TRITON_ALLOWED:
                self.aliases[a.asname or a.name] = full
            elif mod == "triton.language" or mod == "__future__" or mod == "typing":
                self.aliases[a.asname or a.name] = full
            elif mod == "torch" and a.name in TORCH_VALUES | TORCH_ALLOC:
                self.aliases[a.asname or a.name] = full
            else:
                self._import(node, full)

    def _import(self, node: ast.AST, name: str) -> None:
        root = name.split(".")[0]
        if root in THREAD_MODULES:
            self.add("thread", node, f"import of {name}: candidates may not start threads")
        elif root in TIMER_MODULES or name.startswith("triton.testing"):
            self.add("timer", node, f"import of {name}: candidates may not touch timers")
        elif name not in ALLOWED_IMPORTS:
            self.add("import", node, f"import of {name} (allowed: {sorted(ALLOWED_IMPORTS)})")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node, top=False)

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

    def _targets(self, targets: list[ast.AST], node: ast.AST) -> None:
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    self.add("monkey_patch", node, f"assignment to attribute {_dotted(sub)}")
                elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)) \
                        and not self.in_jit:
                    self.add("torch_compute", node,
                             f"write into {_dotted(sub.value)}[...] outside a kernel")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node.targets, node)
        self.visit(node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._targets([node.target], node)
        self.visit(node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._targets([node.target], node)
        if node.value is not None:
            self.visit(node.value)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._targets(node.targets, node)

    # ---- expressions ----------------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        low = name.lower()
        if name.startswith("_"):
            self.add("reflection", node, f"private or dunder attribute .{name}")
        elif any(w in low for w in STREAM_WORDS) and not self.in_jit:
            self.add("stream", node, f"{_dotted(node)}: streams, events, graphs and syncs "
                     "belong to the harness")
        elif name in TIMER_WORDS:
            self.add("timer", node, f"{_dotted(node)}: candidates may not touch timers")
        elif not self.in_jit:
            dotted = _dotted(node)
            root = dotted.split(".")[0]
            mod = self.aliases.get(root, "")
            if mod == "torch":
                rest = dotted.split(".")[1:]
                if rest and rest[0] == "cuda":
                    self.add("stream", node, f"{dotted}: torch.cuda API inside a candidate")
                elif rest and rest[0] not in TORCH_ALLOC | TORCH_VALUES:
                    self.add("torch_compute", node, f"{dotted}: torch ops are not allowed "
                             "outside allocation and views")
            elif mod == "triton":
                rest = dotted.split(".")[1:]
                if rest and rest[0] not in TRITON_ALLOWED:
                    self.add("reflection", node, f"{dotted}: triton internals are off limits")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self.in_jit:
            self.add("torch_compute", node, "matrix product (@) outside a kernel")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name):
            if f.id in DYNAMIC:
                self.add("dynamic_code", node, f"{f.id}(...) is not allowed")
            elif f.id in REFLECTION:
                self.add("reflection", node, f"{f.id}(...) is not allowed")
            elif not self.in_jit and f.id not in BUILTINS_ALLOWED | self.module_funcs \
                    and f.id not in self.aliases:
                self.add("dynamic_code", node, f"call of unknown name {f.id}")
            elif not self.in_jit and f.id in self.jit_names:
                self.add("no_launch", node, f"{f.id} called without a launch grid")
        elif isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name) \
                and f.value.id in self.jit_names and not self.in_jit:
            self.launched.add(f.value.id)
        elif isinstance(f, ast.Attribute) and not self.in_jit:
            root = _dotted(f).split(".")[0]
            if root not in self.aliases and f.attr not in METHOD_ALLOWED \
                    and not f.attr.startswith("_"):
                self.add("torch_compute", node, f".{f.attr}(...): only allocation, views and "
                         "metadata are allowed outside kernels")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in DYNAMIC | REFLECTION and isinstance(node.ctx, ast.Load) and not self.in_jit:
            self.add("reflection", node, f"reference to {node.id}")


def check_source(source: str) -> list[Violation]:
    """All guard violations in a candidate's source (empty list: the guard passes)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [Violation("syntax", e.lineno or 0, f"syntax error: {e.msg}")]
    return _Checker(tree).run()


def launched_kernels(source: str) -> set[str]:
    """Names of the jit kernels `forward` launches (for the runtime launch counter)."""
    c = _Checker(ast.parse(source))
    c.run()
    return c.launched


def ghost_source(source: str) -> str:
    """The candidate with every @triton.jit body replaced by a no-op (the 'ghost' run)."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and _is_jit(node):
            node.body = [ast.Pass()]
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


# ---- @triton.jit bodies ---------------------------------------------------------------------
# Under TRITON_INTERPRET=1 a kernel body runs as ordinary Python with the module's globals, so
# it is held to an allowlist: names it may read, attribute names it may use, calls it may make.
# Tensor, block, descriptor and dtype attributes of triton.language (triton 3.x), plus the few
# Python-side ones kernels read (`X.dtype.element_ty`, `constexpr.value`).
JIT_ATTRS = {
    "T", "abs", "advance", "argmax", "argmin", "associative_scan", "atomic_add", "atomic_and",
    "atomic_cas", "atomic_load", "atomic_max", "atomic_min", "atomic_or", "atomic_poll",
    "atomic_store", "atomic_xchg", "atomic_xor", "broadcast_to", "cast", "cdiv", "ceil", "cos",
    "cumprod", "cumsum", "erf", "exp", "exp2", "expand_dims", "flip", "floor", "gather",
    "histogram", "item", "log", "log2", "logical_and", "logical_or", "max", "min", "permute",
    "ravel", "reduce", "reduce_or", "reshape", "rsqrt", "sigmoid", "sin", "softmax", "sort",
    "split", "sqrt", "sqrt_rn", "store", "sum", "to", "trans", "view", "xor_sum", "load",
    "scatter", "block_shape", "block_type", "dtype", "element_ty", "shape", "numel", "type",
    "value", "scalar", "primitive_bitwidth", "is_ptr", "is_floating", "is_int", "is_bf16",
    "is_fp16", "is_fp32", "is_fp64", "is_fp8", "is_int_signed", "is_int_unsigned", "is_block",
    "is_bool", "int_bitwidth", "fp_mantissa_width", "with_element_ty",
}
# Builtins a kernel may call (the ones triton's frontend understands); anything else (open,
# __import__, exec, getattr ...) is out.
JIT_BUILTINS = {"range", "min", "max", "int", "float", "bool", "len", "abs", "print",
                "isinstance", "tuple", "zip", "enumerate"}
# Submodules of triton.language that hold kernel functions; its other submodules (core,
# standard, random, target_info) re-export Python modules (core.builtins, core.inspect ...).
TL_SUBMODULES = {"math": 1, "extra": 3}  # name -> how many further components may follow
TL_NOT_API = {"core", "standard", "random", "target_info", "builtins", "inspect", "ir", "knobs",
              "typing", "module", "pkgutil", "tl"}
JIT_NODES_FORBIDDEN = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                       ast.Yield, ast.YieldFrom, ast.Await, ast.AsyncFunctionDef, ast.ClassDef,
                       ast.Import, ast.ImportFrom)


def _chain(node: ast.Attribute) -> tuple[ast.AST, list[str]]:
    """(base expression, attribute names from the base outwards) of `a.b.c`."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return node, names[::-1]


def _tl_path_ok(names: list[str]) -> bool:
    """`tl.<api>`, `tl.math.<fn>`, `tl.extra.<backend>[.libdevice].<fn>`; never a path that goes
    through one of triton.language's re-exported Python modules."""
    if not names:
        return True
    if any(n in TL_NOT_API for n in names):
        return False
    head = names[0]
    if head in TL_SUBMODULES:
        return len(names) - 1 <= TL_SUBMODULES[head]
    return len(names) == 1 or all(n in JIT_ATTRS for n in names[1:])


def _module_alias_kinds(aliases: dict[str, str]) -> tuple[set[str], set[str]]:
    """(names bound to triton.language, names bound to the math module)."""
    tl_names = {k for k, v in aliases.items() if v == "triton.language"}
    math_names = {k for k, v in aliases.items() if v == "math"}
    return tl_names, math_names


def module_constants(tree: ast.Module) -> set[str]:
    """Module-level names bound to constants (a kernel may read them: BLOCK = 128)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _const_expr(node.value):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None \
                and isinstance(node.target, ast.Name) and _const_expr(node.value):
            out.add(node.target.id)
    return out


def jit_body_violations(fn: ast.FunctionDef, aliases: dict[str, str], jit_names: set[str],
                        constants: set[str]) -> list[Violation]:
    """Everything in a @triton.jit function (signature annotations included: Python evaluates
    them at import) that is not triton-language: rule `jit_body`."""
    out: list[Violation] = []

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
    tl_names, math_names = _module_alias_kinds(aliases)
    tl_values = {k for k, v in aliases.items() if v.startswith("triton.language.")}
    readable = local | jit_names | constants | tl_names | math_names | tl_values | JIT_BUILTINS
    attr_bases: set[int] = set()

    def expr(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and id(sub) not in attr_bases:
                attribute(sub)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                name(sub)
            elif isinstance(sub, ast.Call):
                call(sub)
            elif isinstance(sub, ast.FunctionDef) and sub is not fn:
                bad(sub, f"nested function {sub.name}")
            elif isinstance(sub, JIT_NODES_FORBIDDEN):
                bad(sub, f"{type(sub).__name__} is not triton-language")

    def name(node: ast.Name) -> None:
        if node.id not in readable:
            bad(node, f"name {node.id!r} is not an argument, a local, a constant, tl or a "
                "kernel of this file")
        elif node.id in (tl_names | math_names) - local and id(node) not in attr_bases:
            bad(node, f"module {node.id} used as a value")

    def attribute(node: ast.Attribute) -> None:
        base, names = _chain(node)
        sub = node
        while isinstance(sub, ast.Attribute):
            attr_bases.add(id(sub.value))
            sub = sub.value
        if any(n.startswith("_") for n in names):
            return  # the general `reflection` rule reports it
        where = ast.unparse(node)
        if isinstance(base, ast.Name) and base.id not in local:
            if base.id in tl_names:
                if not _tl_path_ok(names):
                    bad(node, f"{where}: not a triton.language function or type")
                return
            if base.id in math_names:
                if len(names) != 1:
                    bad(node, f"{where}: only math.<name>")
                return
            if base.id not in readable:
                return  # `name` reports the unknown base (torch, os ...)
        bad_names = [n for n in names if n not in JIT_ATTRS]
        if bad_names:
            bad(node, f"{where}: .{bad_names[0]} is not a triton tensor/dtype attribute")

    def call(node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name):
            if f.id in local and f.id not in jit_names:
                bad(node, f"call of {f.id}(...), an argument or local")
            elif f.id not in jit_names | JIT_BUILTINS | tl_values:
                bad(node, f"call of {f.id}(...): only tl.*, this file's kernels and "
                    f"{sorted(JIT_BUILTINS)}")
        elif not isinstance(f, ast.Attribute):
            bad(node, f"call of a computed value {ast.unparse(f)[:40]}(...)")

    for a in args.posonlyargs + args.args + args.kwonlyargs:
        if a.annotation is not None:
            expr(a.annotation)
    if fn.returns is not None:
        expr(fn.returns)
    for stmt in fn.body:
        expr(stmt)
    return out


def module_value_violations(tree: ast.Module, aliases: dict[str, str]) -> list[Violation]:
    """A module (torch, triton, tl, math) used as a value (passed to a kernel, bound to a name):
    it would carry `torch.os` into code the rules above cannot follow."""
    mods = {k for k, v in aliases.items() if v in ALLOWED_IMPORTS}
    bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return [Violation("reflection", n.lineno, f"module {n.id} used as a value")
            for n in ast.walk(tree)
            if isinstance(n, ast.Name) and n.id in mods and isinstance(n.ctx, ast.Load)
            and id(n) not in bases]
