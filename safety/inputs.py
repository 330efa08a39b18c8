"""Reading the YAML, TOML and JSON files an operator hands metaltune (profiles, policies,
inventories, the daemon config, bmc.yaml, dispatch tables, ceilings): one loader per format, so
every input gets the same limits and one-line errors.

- Regular files only: opened with O_NONBLOCK (a FIFO never blocks the open) and checked with
  fstat on the open descriptor before a byte is read (a FIFO, device or directory is refused,
  and the check cannot be raced by swapping the path).
- At most `MAX_BYTES` (1 MiB; the largest shipped input is a few KiB), read as bytes and decoded
  as strict UTF-8.
- YAML with PyYAML's SafeConstructor (no python tags; libyaml's parser where PyYAML has it, 3x
  faster) and our own composer, which enforces limits while the node graph is built, before
  anything is constructed: `MAX_DEPTH` nesting levels, `MAX_ALIASES`
  alias uses, `MAX_NODES` nodes counted with every alias expanded (a "billion laughs" document is
  refused after reading a few hundred bytes of it), no recursive aliases, no duplicate keys.
- Construction errors (an unknown tag, an impossible date such as 2024-02-30, an integer of a
  million digits) and NaN or infinity anywhere in a document end in one error too: no input of
  metaltune has a use for a non-finite number, and NaN in a bound silently disables it.

- JSON (`parse_json`, `load_json`): the same file rules; at most `MAX_DEPTH` nesting levels;
  NaN, Infinity and numbers that overflow to infinity refused; duplicate keys refused (JSON
  would silently keep the last).

Every error is `error(message)` with a message that names the file (and the line, or the field,
where known); callers pass their own error class (exit code 2) and a prefix such as "policy".
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from typing import Any, Callable, Optional

import yaml
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent

from safety.errors import InputError

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_ALIASES = 1000
MAX_NODES = 100_000

ErrorType = Callable[[str], Exception]

_KINDS = [(stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket")]


def _describe(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: str | os.PathLike[str], name: Optional[str] = None, *, limit: int = MAX_BYTES,
               follow_symlinks: bool = True, error: ErrorType = InputError) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; anything else is `error`.
    `follow_symlinks=False` refuses a symlink as the last component (O_NOFOLLOW)."""
    name = name or str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise error(f"{name}: is a symbolic link (refused)") from None
        raise error(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{name}: is {_describe(st.st_mode)}, expected a regular file")
        if st.st_size > limit:
            raise error(f"{name}: {st.st_size} bytes, more than the {_size(limit)} an input may have")
        chunks, total = [], 0
        while total <= limit:             # the file may grow between fstat and read
            b = os.read(fd, min(1 << 16, limit + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
        if total > limit:
            raise error(f"{name}: more than the {_size(limit)} an input may have")
        return b"".join(chunks)
    except OSError as e:
        raise error(f"{name}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def decode(data: bytes, name: str, error: ErrorType = InputError) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{name}: not UTF-8 text (byte 0x{data[e.start]:02x} at line {line})") from None


def read_text(path: str | os.PathLike[str], name: Optional[str] = None, *, limit: int = MAX_BYTES,
              follow_symlinks: bool = True, error: ErrorType = InputError) -> str:
    name = name or str(path)
    return decode(read_bytes(path, name, limit=limit, follow_symlinks=follow_symlinks, error=error),
                  name, error)


# -- YAML -------------------------------------------------------------------------------------
class _Limit(yaml.YAMLError):
    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _Duplicate(yaml.YAMLError):
    def __init__(self, field: str, mark: Any) -> None:
        super().__init__(field)
        self.field, self.mark = field, mark


try:  # libyaml's scanner and parser when present (3x faster), our composer either way
    from yaml._yaml import CParser
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    class _SafeBase(Composer, CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        def __init__(self, stream: Any) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
except ImportError:  # PyYAML built without libyaml
    _SafeBase = yaml.SafeLoader  # type: ignore[misc, assignment]


class Loader(_SafeBase):
    """A safe loader (SafeConstructor: no python tags) that bounds the node graph while composing it, before construction expands
    anything, and refuses non-finite floats."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._nodes = 0                       # nodes, each alias counted as its whole subtree
        self._sizes: dict[int, int] = {}      # id(node) -> expanded size, once composed
        self._path: list[str] = []            # where the node being composed sits, for messages

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Limit(f"more than {MAX_ALIASES} aliases", event.start_mark)
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                raise _Limit(f"alias *{event.anchor} refers to a node that contains it",
                             event.start_mark)
            self._count(size, event.start_mark)
            return node
        nested = isinstance(event, (SequenceStartEvent, MappingStartEvent))
        if nested:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _Limit(f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        start = self._nodes
        label = (f"[{index}]" if isinstance(index, int) else
                 str(index.value) if isinstance(index, yaml.ScalarNode) else "?" if index is not None else None)
        if label is not None:
            self._path.append(label)
        node = super().compose_node(parent, index)
        if label is not None:
            self._path.pop()
        if nested:
            self._depth -= 1
        self._count(1, event.start_mark)
        self._sizes[id(node)] = self._nodes - start
        return node

    def compose_mapping_node(self, anchor: Any) -> Any:
        """Duplicate keys are errors: YAML would silently keep the last one (a second `rules:`
        would drop the first list). Overriding a merged (`<<`) key is not a duplicate."""
        node = super().compose_mapping_node(anchor)
        seen: set[tuple[str, str]] = set()
        for k, _ in node.value:
            if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                if (k.tag, k.value) in seen:
                    field = "".join(p if p.startswith("[") else f".{p}" for p in [*self._path, str(k.value)])
                    raise _Duplicate(field.lstrip("."), k.start_mark)
                seen.add((k.tag, k.value))
        return node

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise _Limit(f"more than {MAX_NODES} nodes (with aliases expanded)", mark)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as e:  # datetime.date(2024, 2, 30), ...
            raise ConstructorError(None, None, f"{_short(node.value)} cannot be built: {e}",
                                   node.start_mark) from None

    def construct_yaml_float(self, node: Any) -> float:
        v = super().construct_yaml_float(node)
        if not math.isfinite(v):
            raise ConstructorError(None, None, f"{_short(node.value)} is not a finite number "
                                   "(NaN and infinity are refused)", node.start_mark)
        return v


Loader.add_constructor("tag:yaml.org,2002:float", Loader.construct_yaml_float)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _yaml_error(e: Exception, name: str, error: ErrorType) -> Exception:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return error(f"{name}: not valid YAML{where}: {problem}")


def compose_yaml(text: str, name: str, error: ErrorType = InputError) -> tuple[Any, Any]:
    """(data, node) of a single-document YAML text: the node keeps line numbers for messages.
    An empty document is (None, None)."""
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        return loader.construct_document(node), node
    except _Duplicate as e:
        raise error(f"{name}:{e.mark.line + 1}: field {e.field}: duplicate key") from None
    except yaml.YAMLError as e:
        raise _yaml_error(e, name, error) from None
    except RecursionError:  # not reachable with MAX_DEPTH, kept so no input ends in a traceback
        raise error(f"{name}: not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()


def parse_yaml(text: str, name: str, error: ErrorType = InputError) -> Any:
    return compose_yaml(text, name, error)[0]


def load_yaml(path: str | os.PathLike[str], name: Optional[str] = None, *,
              follow_symlinks: bool = True, error: ErrorType = InputError) -> Any:
    """The data of a YAML input file (None when it is empty)."""
    name = name or str(path)
    return parse_yaml(read_text(path, name, follow_symlinks=follow_symlinks, error=error), name, error)


# -- TOML -------------------------------------------------------------------------------------
def _non_finite(data: Any, path: str = "") -> Optional[str]:
    if isinstance(data, float) and not math.isfinite(data):
        return path or "(top level)"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        hit = _non_finite(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k))
        if hit:
            return hit
    return None


def parse_toml(text: str, name: str, error: ErrorType = InputError) -> dict[str, Any]:
    import tomllib

    try:
        data = tomllib.loads(text)
        bad = _non_finite(data)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{name}: not valid TOML: {e}") from None
    except RecursionError:
        raise error(f"{name}: not valid TOML: nested too deeply") from None
    if bad:
        raise error(f"{name}: field {bad}: not a finite number (NaN and infinity are refused)")
    return data


def load_toml(path: str | os.PathLike[str], name: Optional[str] = None, *,
              follow_symlinks: bool = True, error: ErrorType = InputError) -> dict[str, Any]:
    name = name or str(path)
    return parse_toml(read_text(path, name, follow_symlinks=follow_symlinks, error=error), name, error)



# -- JSON -------------------------------------------------------------------------------------
class _JSONRefused(ValueError):
    pass


def _no_constant(c: str) -> Any:
    raise _JSONRefused(f"{c} is not a finite number (NaN and infinity are refused)")


def _finite(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise _JSONRefused(f"{_short(s)[1:-1]} is not a finite number (it overflows to infinity)")
    return v


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise _JSONRefused(f"duplicate key {_short(k)}")
        d[k] = v
    return d


def _depth(data: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        node, d = todo.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:
                todo.extend((v, d + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_nesting(text: str) -> int:
    """How deep the brackets of a JSON text nest outside its strings, found without parsing it
    (the parser recurses once per level: a line of 10,000 `[` is refused before it). Exact
    above MAX_DEPTH; at most MAX_DEPTH otherwise (the count of opening brackets, when few)."""
    opening = text.count("[") + text.count("{")
    if opening <= MAX_DEPTH:
        return opening
    deepest = depth = 0
    for b in _JSON_BRACKET.findall(_JSON_STRING.sub("", text)):
        depth += 1 if b in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def parse_json(text: str, name: str, error: ErrorType = InputError) -> Any:
    if json_nesting(text) > MAX_DEPTH:
        raise error(f"{name}: not valid JSON: nested more than {MAX_DEPTH} levels deep")
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite,
                          object_pairs_hook=_no_duplicates)
    except _JSONRefused as e:
        raise error(f"{name}: {e}") from None
    except json.JSONDecodeError as e:
        raise error(f"{name}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:  # the C scanner's own guard, far below a stack overflow
        raise error(f"{name}: not valid JSON: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:  # an integer of more digits than int() takes
        raise error(f"{name}: not valid JSON: {e}") from None
    if _depth(data) > MAX_DEPTH:
        raise error(f"{name}: not valid JSON: nested more than {MAX_DEPTH} levels deep")
    return data


def load_json(path: str | os.PathLike[str], name: Optional[str] = None, *, limit: int = MAX_BYTES,
              follow_symlinks: bool = True, error: ErrorType = InputError) -> Any:
    """The data of a JSON input file: a regular file (a FIFO is refused, never waited on), at
    most `limit` bytes, strict UTF-8, within the limits above."""
    name = name or str(path)
    return parse_json(read_text(path, name, limit=limit, follow_symlinks=follow_symlinks,
                                error=error), name, error)
