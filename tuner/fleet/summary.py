"""Rich tables for fleet results (the summary printed at the end of every fleet command)."""
from __future__ import annotations

from typing import Any

from tuner.fleet.remote import Outcome

_STYLE = {"ok": "green", "done": "green", "unreachable": "yellow", "pending": "dim",
          "rolled_back": "magenta", "refused": "red", "applied": "cyan", "failed": "red", "host_key_rejected": "red", "auth_failed": "red"}


def outcomes_table(title: str, outcomes: dict[str, Outcome], columns: list[tuple[str, Any]] = ()) -> Any:
    from rich.table import Table

    t = Table(title=title)
    for c in ("host", "result", *[c for c, _ in columns], "detail", "s"):
        t.add_column(c)
    for name, o in outcomes.items():
        style = _STYLE.get(o.kind, "red" if not o.ok else "green")
        t.add_row(name, f"[{style}]{o.kind}[/{style}]", *[str(fn(o)) for _, fn in columns],
                  o.detail[:120], f"{o.seconds:.1f}")
    return t


def rollout_table(doc: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"rollout of {doc['profile']}: {doc['status'].upper()}")
    for c in ("host", "wave", "state", "detail"):
        t.add_column(c)
    for name, h in doc["hosts"].items():
        wave = "canary" if h["wave"] == 0 and doc["options"].get("canary") else str(h["wave"])
        style = _STYLE.get(h["state"], "white")
        t.add_row(name, wave, f"[{style}]{h['state']}[/{style}]", h["detail"][:140])
    return t


def print_table(t: Any) -> None:
    from rich.console import Console

    Console(width=160).print(t)
