"""The one A/B measuring routine: incumbent (A) against candidate (B) in interleaved pairs.

Every evaluator measures through `AB.run` (host knobs, runtime settings, mixed candidates; a
kernel's own timing A/B happens inside kernelsearch's harness, which stands alone):

- pairs in ABBA order (A B, B A, A B, ...), so slow drift (temperature, other tenants) hits
  both sides alike;
- the sequential extension: after `pairs` pairs, `decided(a, b)` says whether the evidence is
  in; while it is not, more pairs up to `max_pairs` (small true gains need more samples to
  show; a clear loser stops early). Without `decided`, exactly `pairs` pairs;
- the monitor poll: `poll()` after every candidate sample (it raises on an incident, after the
  safety transaction rolled back). With a poll, the last sample is the candidate's, so the
  monitors judge the state the candidate left, not the incumbent's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from tuner.trial import Measurement

Side = str  # "a": the incumbent, "b": the candidate


@dataclass
class AB:
    """The samples of one A/B. They stay readable after `run` raised (an incident, a hang):
    what a rolled-back candidate measured is still part of its trial."""

    a: list[Measurement] = field(default_factory=list)
    b: list[Measurement] = field(default_factory=list)

    def run(self, measure: Callable[[Side], Measurement], pairs: int, *,
            max_pairs: Optional[int] = None,
            decided: Optional[Callable[[list[Measurement], list[Measurement]], bool]] = None,
            poll: Optional[Callable[[], None]] = None) -> "AB":
        """`measure(side)` puts the host/workload in that side's state and measures it once.
        `pairs` pairs are measured before `decided` is first asked (then after every pair)."""
        limit = max(pairs, max_pairs or pairs)
        n, last = 0, "a"
        while n < limit:
            for side in (("a", "b") if n % 2 == 0 else ("b", "a")):
                self._sample(measure, side, poll)
                last = side
            n += 1
            if n >= pairs and (decided is None or decided(self.a, self.b)):
                break
        if poll is not None and last == "a":
            self._sample(measure, "b", poll)
        return self

    def _sample(self, measure: Callable[[Side], Measurement], side: Side,
                poll: Optional[Callable[[], None]]) -> None:
        (self.b if side == "b" else self.a).append(measure(side))
        if side == "b" and poll is not None:  # the incumbent's own state is not this change's doing
            poll()
