"""Token use and dollar cost of LLM answers, per trial and per kept change.

Prices are US dollars per million tokens (input, output, cache write 5 min, cache read), from
Anthropic's published price list (2026-11). An unknown model keeps its token counts and gets no
`usd` (a wrong price is worse than none); METALTUNE_LLM_PRICE="in,out" sets one explicitly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

# model id prefix -> (input, output, cache write (5 min), cache read) in $ per MTok
PRICES: dict[str, tuple[float, float, float, float]] = {
    "claude-fable-5-1": (10.0, 50.0, 12.5, 1.0),
    "claude-opus-5-5": (4.0, 20.0, 5.0, 0.20),
    "claude-opus-5": (5.0, 25.0, 6.25, 0.50),
    "claude-sonnet-5-5": (2.0, 10.0, 2.50, 0.20),
    "claude-sonnet-5": (2.0, 10.0, 2.50, 0.20),
    "claude-opus-4-5": (5.0, 25.0, 6.25, 0.50),
    "claude-sonnet-4-5": (3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": (1.0, 5.0, 1.25, 0.10),
}

TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                "cache_read_input_tokens")


def price_for(model: str) -> Optional[tuple[float, float, float, float]]:
    env = os.environ.get("METALTUNE_LLM_PRICE")
    if env:
        i, o = (float(x) for x in env.split(",")[:2])
        return (i, o, 1.25 * i, 0.1 * i)
    best = None
    for prefix, p in PRICES.items():  # longest matching prefix (opus-5-5 before opus-5)
        if model.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, p)
    return best[1] if best else None


def usage_cost(model: str, usage: Any) -> dict[str, float]:
    """{tokens..., requests: 1, usd (when priced)} from an API response's `usage`."""
    out: dict[str, float] = {"requests": 1.0}
    for f in TOKEN_FIELDS:
        v = getattr(usage, f, None) if not isinstance(usage, dict) else usage.get(f)
        out[f] = float(v or 0)
    p = price_for(model)
    if p is not None:
        out["usd"] = (out["input_tokens"] * p[0] + out["output_tokens"] * p[1]
                      + out["cache_creation_input_tokens"] * p[2]
                      + out["cache_read_input_tokens"] * p[3]) / 1e6
    return out


def add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v
    return out


@dataclass
class Ledger:
    """Running totals: the whole search and the spend since the last kept change."""

    total: dict[str, float] = field(default_factory=dict)
    since_kept: dict[str, float] = field(default_factory=dict)
    kept: int = 0

    def charge(self, cost: dict[str, float]) -> None:
        self.total = add(self.total, cost)
        self.since_kept = add(self.since_kept, cost)

    def trial_cost(self, cost: dict[str, float], kept: bool) -> dict[str, float]:
        """What goes into Trial.cost: this answer's cost, the run's running total, and on a kept
        trial the whole spend that bought this change (every answer since the previous keep)."""
        out = dict(cost)
        out["run_usd"] = self.total.get("usd", 0.0)
        out["run_tokens"] = sum(self.total.get(f, 0.0) for f in TOKEN_FIELDS)
        if kept:
            self.kept += 1
            out["kept_change_usd"] = self.since_kept.get("usd", 0.0)
            out["kept_change_tokens"] = sum(self.since_kept.get(f, 0.0) for f in TOKEN_FIELDS)
            out["kept_change_requests"] = self.since_kept.get("requests", 0.0)
            self.since_kept = {}
        return out


def per_kept_change(trials: Iterable[Any]) -> list[dict[str, Any]]:
    """From stored trials (in order): the spend behind each kept change."""
    out, acc = [], {}
    for t in trials:
        acc = add(acc, {k: v for k, v in (t.cost or {}).items()
                        if k in TOKEN_FIELDS or k in ("usd", "requests")})
        if t.verdict == "kept" and t.reason != "baseline":
            out.append({"trial": t.number, "gain": t.gain, **acc})
            acc = {}
    return out
