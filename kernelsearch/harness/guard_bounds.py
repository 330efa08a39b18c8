"""How large and how deep a candidate's source may be, checked before it is parsed.

`ast.parse` recurses once per level of nesting, and so do the guard's visitor and
`ast.unparse`: a 2 KB source with a 1000-deep attribute chain, or 100,000 unary minus signs,
ends in a RecursionError or a MemoryError instead of a verdict. So, in this order:

1. size: at most MAX_SOURCE characters (the largest shipped variant is about 21 KB);
2. the tokens, read iteratively (`tokenize` does not recurse): brackets nested at most
   MAX_BRACKETS deep, and at most MAX_OPERATORS operators (`.`, arithmetic, comparison,
   unary; not commas, brackets or `=`) in one statement, which bounds the depth of the
   expression trees the parser would build;
3. `ast.parse`, its own RecursionError or MemoryError refused as well;
4. the tree at most MAX_DEPTH nodes deep (measured with a stack, not recursion).

The shipped variants and the test sources are at most 18 nodes deep. A source beyond a bound
is refused with the rule `source_too_large` or `nesting_too_deep` (`Refused`, a SyntaxError,
so every caller that handles a source that does not parse handles this one too)."""
from __future__ import annotations

import ast
import io
import token
import tokenize

MAX_SOURCE = 256 << 10
MAX_BRACKETS = 64
MAX_OPERATORS = 400
MAX_DEPTH = 100

_NOT_OPERATORS = {"(", ")", "[", "]", "{", "}", ",", ":", "=", ";", "->"}
_OPENING, _CLOSING = {"(", "[", "{"}, {")", "]", "}"}


class Refused(SyntaxError):
    """A source beyond a bound: `rule` names which, `msg` says why in one line."""

    def __init__(self, rule: str, line: int, msg: str):
        super().__init__(msg)
        self.rule, self.lineno, self.msg, self.why = rule, line, msg, msg


def check(source: str) -> None:
    """Raise Refused when the source is too large or nested too deep to be parsed safely."""
    if len(source) > MAX_SOURCE:
        raise Refused("source_too_large", 0, f"the source has {len(source)} characters, more "
                                             f"than the {MAX_SOURCE} a candidate may have")
    depth = ops = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == token.NEWLINE:
                ops = 0
            elif tok.type == token.OP or tok.string in ("not", "and", "or", "is", "in"):
                s = tok.string
                depth += (s in _OPENING) - (s in _CLOSING)
                ops += s not in _NOT_OPERATORS
                if depth > MAX_BRACKETS:
                    raise Refused("nesting_too_deep", tok.start[0],
                                  f"brackets nested more than {MAX_BRACKETS} deep")
                if ops > MAX_OPERATORS:
                    raise Refused("nesting_too_deep", tok.start[0],
                                  f"more than {MAX_OPERATORS} operators in one statement")
    except (tokenize.TokenError, IndentationError):
        return  # not Python: ast.parse says where, as a syntax error


def parse(source: str) -> ast.Module:
    """`ast.parse` within the bounds above; Refused (or the parser's own SyntaxError)."""
    check(source)
    try:
        tree = ast.parse(source)
    except (RecursionError, MemoryError):
        raise Refused("nesting_too_deep", 0, "nested too deeply for the parser") from None
    todo = [(tree, 1)]
    while todo:
        node, d = todo.pop()
        if d > MAX_DEPTH:
            raise Refused("nesting_too_deep", getattr(node, "lineno", 0),
                          f"expressions nested more than {MAX_DEPTH} levels deep")
        todo.extend((c, d + 1) for c in ast.iter_child_nodes(node))
    return tree
