"""How the guard reads a candidate's tree: the violation it reports, dotted names and attribute
chains, import aliases resolved to full paths, which functions are kernels (and of which kind),
and which expressions are constants."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from kernelsearch.harness.guard_allow import (GL, GLUON, JIT, JIT_DECORATORS, MODULES, PATHS,
                                              TL)


@dataclass
class Violation:
    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: [guard:{self.rule}] {self.message}"


def dotted_name(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):
        return dotted_name(node.func) + "()"
    return "?"


def attr_chain(node: ast.Attribute) -> tuple[ast.AST, list[str]]:
    """(base expression, attribute names from the base outwards) of `a.b.c`."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return node, names[::-1]


def import_aliases(tree: ast.Module) -> dict[str, str]:
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


def resolve_path(node: ast.AST, aliases: dict[str, str], local: set[str]) -> str | None:
    """The full dotted path of `alias.a.b` (None if the base is not an imported alias)."""
    if isinstance(node, ast.Name):
        if node.id in aliases and node.id not in local:
            return aliases[node.id]
        return None
    if isinstance(node, ast.Attribute):
        base = resolve_path(node.value, aliases, local)
        return None if base is None else f"{base}.{node.attr}"
    return None


def decorator_path(d: ast.AST, aliases: dict[str, str]) -> str | None:
    target = d.func if isinstance(d, ast.Call) else d
    return resolve_path(target, aliases, set())


def jit_kind(fn: ast.FunctionDef, aliases: dict[str, str]) -> str | None:
    """JIT (triton.jit) or GLUON (gluon.jit) or None (a plain function)."""
    kinds = {decorator_path(d, aliases) for d in fn.decorator_list}
    if "triton.experimental.gluon.jit" in kinds:
        return GLUON
    if kinds & JIT_DECORATORS:
        return JIT
    return None


def is_jit(fn: ast.FunctionDef, aliases: dict[str, str] | None = None) -> bool:
    if aliases is None:  # ghost_source and friends: by the decorator's last name
        return any(dotted_name(d.func if isinstance(d, ast.Call) else d).split(".")[-1]
                   in ("jit", "autotune", "heuristics") for d in fn.decorator_list)
    return jit_kind(fn, aliases) is not None


def is_const(node: ast.AST, aliases: dict[str, str] | None = None) -> bool:
    """Immutable constants (no caches, no registries): numbers, strings, tuples, arithmetic,
    `tl.constexpr(const)`."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(is_const(e, aliases) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return is_const(node.operand, aliases)
    if isinstance(node, ast.BinOp) and not isinstance(node.op, ast.Mod):
        return is_const(node.left, aliases) and is_const(node.right, aliases)
    if isinstance(node, ast.Call) and not node.keywords and aliases is not None \
            and resolve_path(node.func, aliases, set()) in (f"{TL}.constexpr", f"{GL}.constexpr"):
        return all(is_const(a, aliases) for a in node.args)
    return False


def is_literal(node: ast.AST) -> bool:
    """A decorator argument: constants, and lists/dicts/tuples of them."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(is_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and is_literal(k) for k in node.keys) and all(
            is_literal(v) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return is_literal(node.operand)
    return False
