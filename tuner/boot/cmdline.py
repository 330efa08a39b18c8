"""Kernel command lines as token lists: the value of a parameter, a line with changes, and which
requested values a running line lacks. Later occurrences win, as in the kernel's own parser."""
from __future__ import annotations

import shlex
from typing import Any, Mapping

#: added by the boot loader itself; never part of an entry's options
LOADER_TOKENS = ("BOOT_IMAGE", "initrd")


def parse(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: the kernel splits on blanks then
        return text.split()


def value_of(tokens: list[str], key: str) -> Any:
    """`key=value` -> "value"; a bare `key` -> True; absent -> None (last occurrence wins)."""
    val: Any = None
    for t in tokens:
        k, eq, v = t.partition("=")
        if k == key:
            val = v if eq else True
    return val


def render(key: str, value: Any) -> str | None:
    if value is None or value is False:
        return None
    return key if value is True else f"{key}={value}"


def with_changes(tokens: list[str], changes: Mapping[str, Any]) -> list[str]:
    """`tokens` without the loader's own tokens and every occurrence of a changed key, then the
    changed keys' new tokens (None/False removes a key)."""
    out = [t for t in tokens if t.partition("=")[0] not in (*LOADER_TOKENS, *changes)]
    for k, v in changes.items():
        tok = render(k, v)
        if tok is not None:
            out.append(tok)
    return out


def same(a: Any, b: Any) -> bool:
    return (None if a is False else str(a) if a not in (None, True) else a) == \
        (None if b is False else str(b) if b not in (None, True) else b)


def missing(tokens: list[str], changes: Mapping[str, Any]) -> dict[str, Any]:
    """The requested keys whose value in `tokens` differs: {key: value found}."""
    return {k: value_of(tokens, k) for k, v in changes.items() if not same(value_of(tokens, k), v)}


def join(tokens: list[str]) -> str:
    return " ".join(shlex.quote(t) if any(c.isspace() for c in t) else t for t in tokens)
