"""How far the search trusts a model process's measurement (issue 33, item 3).

The model process runs candidate code, so its reply can say anything: a candidate 100x slower
once reported the incumbent's tokens/s times 1.5 and was kept. What the parent can vouch for is
its own clock around the request. So `ModelWorkload.measure` first asks the process to set up
everything a measurement needs (`prepare`: output check, runners built, compiled, captured),
then times the `measure` request itself, and this module compares that wall-clock time with the
time the reply implies: for each size, its tokens per sample over each sample's tokens/s (the
grid and its decode steps come from the process's start, before any candidate code was loaded).

- implied time above the wall-clock time (plus slack): impossible, a forgery;
- implied time below the wall-clock time less a bounded overhead (OVERHEAD_S for the request,
  PER_SIZE_S per size for its warm-up and bookkeeping, SLACK of the wall-clock time for a loaded
  host): the process spent time it does not account for, a forgery.

Either is `measurement_untrusted`, a trial verdict (the evaluator rejects the trial, as for
any ModelProcessFailed, and the next request starts a fresh process): a candidate is kept only
when what it reports agrees with what the parent saw. What this cannot see: a slow-down smaller
than the overhead allowance, and a candidate that is fast only while measured."""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

OVERHEAD_S = 1.0  # the request itself: the pipe, JSON, Python between the samples
PER_SIZE_S = {"cuda": 0.6, "cpu": 0.1}  # per size: bookkeeping, a GPU's warm-up (WARM_S)
SLACK = 0.25  # of the wall-clock time: a loaded host descheduling it between samples
CODE = "measurement_untrusted"
_SIZE = re.compile(r"(prefill|decode)@ctx(\d+),b(\d+)")


class Untrusted(ValueError):
    """The reply disagrees with the parent's clock, or cannot be checked against it."""


def implied_seconds(per_size_samples: Any, timing: Mapping[str, Any]) -> tuple[float, float]:
    """(the seconds the samples imply, the sum over sizes of their longest step): each sample
    of a size is that size's tokens (decode: batch x decode steps; prefill: batch x context)
    over its tokens/s."""
    sizes = {f"{k}@ctx{c},b{b}" for k, b, c in timing["sizes"]}
    if not isinstance(per_size_samples, dict) or not per_size_samples:
        raise Untrusted("no per-size samples")
    total = steps = 0.0
    for key, samples in per_size_samples.items():
        m = _SIZE.fullmatch(str(key))
        if key not in sizes or m is None:
            raise Untrusted(f"size {str(key)[:60]!r} is not one it was asked to measure")
        kind, ctx, batch = m.group(1), int(m.group(2)), int(m.group(3))
        n = int(timing["decode_steps"]) if kind == "decode" else 1
        tokens = batch * (n if kind == "decode" else ctx)
        longest = 0.0
        for s in samples if isinstance(samples, list) and samples else [None]:
            if not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
                raise Untrusted(f"{key}: a sample that is not a positive rate ({s!r})")
            total += tokens / s
            longest = max(longest, tokens / s / n)
        steps += longest
    return total, steps


def check(measurement: Any, wall_s: float, timing: Mapping[str, Any], device: str) -> None:
    """Untrusted when `measurement`'s samples disagree with `wall_s`, the parent's own time of
    the request that produced it."""
    implied, steps = implied_seconds(measurement.extra.get("per_size_samples"), timing)
    n = len(measurement.extra["per_size_samples"])
    if implied > wall_s * 1.05 + 0.5:
        raise Untrusted(f"its samples take {implied:.3g} s, but the request took "
                        f"{wall_s:.3g} s by the search's clock")
    cpu = str(device).startswith("cpu")
    # a GPU warms each size up (holistic.warm: WARM_S of runs, in chunks that double, one
    # step at least): two of its steps as it reports them, on top of PER_SIZE_S
    allowed = OVERHEAD_S + PER_SIZE_S["cpu" if cpu else "cuda"] * n + SLACK * wall_s \
        + (0.0 if cpu else 2 * steps)
    if wall_s - implied > allowed:
        raise Untrusted(f"its samples account for {implied:.3g} s of the {wall_s:.3g} s the "
                        f"request took by the search's clock (at most {allowed:.3g} s of "
                        "overhead allowed): its tokens/s are not what it ran")
