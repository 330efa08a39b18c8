"""What a search keeps: the objective (`--objective`), one small class each, in a registry.

Adding an objective: a class with its metric, keep rule and gates (tuner.search.objective.base)
and one line in OBJECTIVES. The searches (host, mixed, kernel) hold one object, pass it into
the tables and summaries they write, and never branch on its name.

- `throughput` (default): most tokens/s (`tuner.search.keep`), throughput.py
- `energy`: most tokens/J, with a throughput floor, energy.py
- `power-capped`: most tokens/s within a per-board power budget, power_capped.py
- `goodput`: most requests/s meeting the latency SLOs, goodput.py
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tuner.search.objective.base import Objective
from tuner.search.objective.energy import DEFAULT_FLOOR, Energy
from tuner.search.objective.goodput import Goodput
from tuner.search.objective.power_capped import POWER_LIMIT_KNOBS, PowerCapped, board_watts
from tuner.search.objective.throughput import Throughput
from tuner.search.objective.views import goodput, project_energy, project_goodput, tok_per_j, watts

OBJECTIVES: dict[str, type[Objective]] = {c.name: c for c in (
    Throughput, Energy, PowerCapped, Goodput,
)}
NAMES = tuple(OBJECTIVES)
THROUGHPUT = Throughput()
#: the reasons the objectives add to the keep rule's (tuner.trial.REASONS)
OWN_REASONS = ("below_throughput_floor", "over_power_budget", "power_budget_met",
               "energy_unmeasured", "goodput_unmeasured")
project = project_energy  # the tokens/J view (kept name)

__all__ = ["DEFAULT_FLOOR", "NAMES", "OBJECTIVES", "OWN_REASONS", "POWER_LIMIT_KNOBS", "THROUGHPUT",
           "Energy", "Goodput", "Objective", "PowerCapped", "Throughput", "board_watts", "goodput",
           "help_text", "make", "of", "project", "project_goodput", "tok_per_j", "watts"]


def make(name: str = "throughput", **params: Any) -> Objective:
    """The objective `name` with its parameters (those left None take the defaults). A
    ValueError of one line naming the flag for an unknown name, a parameter it does not take,
    a missing required one or a value out of range."""
    cls = OBJECTIVES.get(name)
    if cls is None:
        raise ValueError(f"--objective: expected one of {', '.join(NAMES)}, got {name!r}")
    given = {k: v for k, v in params.items() if v is not None}
    for k in given:
        if k not in cls.model_fields:
            owners = [n for n, c in OBJECTIVES.items() if k in c.model_fields]
            flag = next((c.flags[k] for c in OBJECTIVES.values() if k in c.flags), k)
            raise ValueError(f"{flag}: only with --objective {' or '.join(owners)}")
    try:
        return cls(**given)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        flag = cls.flags.get(field, field)
        if err["type"] == "missing":
            raise ValueError(f"{flag}: required with --objective {name}") from None
        raise ValueError(f"{flag}: {err['msg']}") from None


def of(opts: Any) -> Objective:
    """From a search's options (tuner.search.options: `objective` and every objective's
    parameters by field name, such as throughput_floor and power_budget_w; absent ones take
    the defaults)."""
    fields = {f for c in OBJECTIVES.values() for f in c.model_fields}
    return make(getattr(opts, "objective", None) or "throughput",
                **{f: getattr(opts, f, None) for f in sorted(fields)})


def help_text() -> str:
    return "; ".join(f"{n}: {c.help}" for n, c in OBJECTIVES.items())
