"""A search's trial budget against the policy's hourly change limits (`max_changes_per_hour`,
counted from the journal across runs): planned up front and said, then watched while the
search runs, so a search that reaches the limit stops (or waits, `--wait-for-policy`) and says
so, instead of spending the rest of its budget on refused trials (issue 42, item 11).

Every trial of a host search writes each knob it changes once (and the journal counts every
intent), so a knob with `left` changes to go can take part in `left` more trials; the search
can go on while any knob can still change."""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

log = logging.getLogger(__name__)
WINDOW_S = 3600.0


@dataclass
class KnobRate:
    name: str
    limit: int
    used: int

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)


class RateBudget:
    """The rate-limited knobs of one search, read from `journal` under `policy`."""

    def __init__(self, policy: Any, journal: Any, names: list[str],
                 clock: Callable[[], float] = time.time):
        self.policy, self.journal, self.clock = policy, journal, clock
        self.limits = {n: lim for n in names if (lim := policy.rate_limit(n)) is not None}
        self.unlimited = [n for n in names if n not in self.limits]

    def rates(self) -> list[KnobRate]:
        since = self.clock() - WINDOW_S
        return [KnobRate(n, lim, self.journal.count_changes(n, since))
                for n, lim in sorted(self.limits.items())]

    def trials_left(self) -> Optional[int]:
        """How many more trials can change something (None: a knob has no limit)."""
        if self.unlimited or not self.limits:
            return None
        return max(r.left for r in self.rates())

    def exhausted(self) -> bool:
        return self.trials_left() == 0

    def free_in_s(self) -> float:
        """Seconds until some knob may change again (0: one may now)."""
        now, waits = self.clock(), []
        for r in self.rates():
            if r.left:
                return 0.0
            times = self.journal.change_times(r.name, now - WINDOW_S)
            if len(times) > r.used - r.limit:
                waits.append(times[r.used - r.limit] + WINDOW_S - now)
        return max(0.0, min(waits)) if waits else 0.0

    def describe(self) -> dict[str, Any]:
        return {"window_s": WINDOW_S, "policy": self.policy.source,
                "knobs": {r.name: {"max_changes_per_hour": r.limit, "used": r.used,
                                   "left": r.left} for r in self.rates()}}

    def plan(self, budget: int, wait: bool) -> Optional[str]:
        """The line a user reads before the search starts when `budget` trials do not fit in
        what the policy allows this hour (None: they fit)."""
        left = self.trials_left()
        if left is None or left >= budget:
            return None
        rates = self.rates()
        most = max(r.limit for r in rates)
        hours = 1 + math.ceil((budget - left) / most) if most else math.inf
        allows = ", ".join(f"{r.name} {r.limit} ({r.left} left)" for r in rates)
        need = f"{budget} trials need about {hours} h" if hours != math.inf else \
            f"{budget} trials can never run"
        then = (f"from about trial {left} the search waits for the hourly window "
                "(--wait-for-policy)" if wait else
                f"the search will stop at about trial {left} (a trial that leaves a knob alone "
                "does not count; --wait-for-policy waits for the hourly window instead)")
        return (f"policy {self.policy.source} allows changes/hour: {allows}; {need}; {then}")

    def wait(self, on_wait: Callable[[str], None] = log.warning,
             sleep: Callable[[float], None] = time.sleep) -> None:
        """Block until some knob may change again, saying how long first."""
        s = self.free_in_s()
        if s > 0:
            on_wait(f"policy rate limit reached ({self._limits_text()}): waiting {s:.0f} s "
                    "for the hourly window (--wait-for-policy)")
            sleep(s + 0.5)

    def _limits_text(self) -> str:
        return ", ".join(f"{r.name} {r.limit}/hour" for r in self.rates())

    def stopped(self, at_trial: int, budget: int) -> dict[str, Any]:
        """The summary's record of a search the limit stopped."""
        s = self.free_in_s()
        return {"reason": "policy_rate_limit", "after_trial": at_trial, "budget": budget,
                "limits": self.describe()["knobs"], "free_in_s": round(s),
                "message": f"search stopped after trial {at_trial} of {budget}: the policy's "
                           f"hourly change limit is reached ({self._limits_text()}; "
                           f"{self.policy.source}); the next change is allowed in {s / 60:.0f} "
                           "min: run again then, or pass --wait-for-policy"}


def for_knobs(policy: Any, journal: Any, knobs: Mapping[str, Any]) -> RateBudget:
    return RateBudget(policy, journal, sorted(knobs))
