"""The guard's rules for kernel bodies (`@triton.jit`, and `@gluon.jit` against Gluon's API)."""
from __future__ import annotations

import ast

from kernelsearch.harness.guard_allow import GLUON, JIT, MODULES, PATHS
from kernelsearch.harness.guard_ast import (Violation, attr_chain, import_aliases, is_const,
                                            resolve_path)

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
    aliases = import_aliases(tree)
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and is_const(node.value, aliases):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None \
                and isinstance(node.target, ast.Name) and is_const(node.value, aliases):
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
        base, names = attr_chain(node)
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
        path = resolve_path(node, aliases, local)
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
