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
stable rule name (the verdict's `rule`, which the LLM proposer's context shows by the code).

This module is the entry point (`check_source`, `uses_gluon`, `launched_kernels`,
`ghost_source`); the rules live beside it, one module per thing they check: `guard_allow` (the
allow-list by context), `guard_triton` and `guard_gluon` (the two kernel APIs), `guard_host`
(the module level and host code), `guard_jit` (kernel bodies), `guard_ast` (reading the tree)."""
from __future__ import annotations

import ast

from kernelsearch.harness import guard_bounds
from kernelsearch.harness.guard_allow import GLUON
from kernelsearch.harness.guard_ast import Violation, import_aliases, is_jit, jit_kind
from kernelsearch.harness.guard_host import Checker

__all__ = ["Violation", "check_source", "ghost_source", "launched_kernels", "uses_gluon"]


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
    v = Checker(tree).run()
    rank = {r: i for i, r in enumerate(RULE_ORDER)}
    return sorted(v, key=lambda x: (x.line or 10 ** 9, rank.get(x.rule, len(rank))))


def uses_gluon(source: str) -> bool:
    """Whether the candidate defines a `@gluon.jit` kernel (it then runs only on an sm_90 GPU:
    Gluon has no interpreter path). False for a source that does not parse."""
    try:
        tree = guard_bounds.parse(source)
    except SyntaxError:
        return False
    aliases = import_aliases(tree)
    return any(isinstance(n, ast.FunctionDef) and jit_kind(n, aliases) == GLUON
               for n in tree.body)


def launched_kernels(source: str) -> set[str]:
    """Names of the jit kernels `forward` launches (for the runtime launch counter)."""
    c = Checker(guard_bounds.parse(source))
    c.run()
    return c.launched


def ghost_source(source: str) -> str:
    """The candidate with every jit body replaced by a no-op (the 'ghost' run)."""
    tree = guard_bounds.parse(source)
    aliases = import_aliases(tree)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and is_jit(node, aliases):
            node.body = [ast.Pass()]
    return ast.unparse(ast.fix_missing_locations(tree))
