"""How far the search trusts a model process's measurement (issue 33, item 3; issue 42, item 1).

The model process runs candidate code, so its reply can say anything: a candidate 100x slower
once reported the incumbent's tokens/s times 1.5 and was kept; later, one reported every sample
but one at 50x and put the rest of the time into one slow sample, so the total matched the
parent's clock while the medians the keep rule reads were forged. So the numbers a keep is
decided on are the parent's own:

- every sample is a round trip (`SampleClock`): the process marks a size's start and the end of
  each sample (`holistic.SAMPLE_MARK`) and waits for the parent's `go` before it goes on; the
  parent's clock from its `go` to the next mark is that sample's time, and its tokens over that
  time are the sample's tokens/s (`judge` rebuilds the Measurement from them: the reported
  samples stay in extra["reported_per_size_samples"]);
- the report is only checked against the parent's clock: a sample it says took longer than its
  window (impossible), a size it says ran more than twice as fast as the windows (a forgery), a
  sample count that differs, or a mark out of place is `measurement_untrusted`;
- the time outside the windows is bounded (`check`): the request's wall-clock time less the
  windows may not exceed a fixed overhead (OVERHEAD_S for the request, PER_SIZE_S per size for
  its warm-up and bookkeeping, SLACK of the wall-clock time for a loaded host), so work done
  between samples, where no window sees it, is caught once it exceeds that.

`measurement_untrusted` is a trial verdict (the evaluator rejects the trial, as for any
ModelProcessFailed, and the next request starts a fresh process): a candidate is kept only on
the parent's numbers, and only when what it reports agrees with them. What this cannot see: a
candidate that is fast only while measured (it skips work inside the windows, or does it
between them within the overhead allowance); the output check is what vouches for the work."""
from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional

OVERHEAD_S = 1.0  # the request itself: the pipe, JSON, Python between the samples
PER_SIZE_S = {"cuda": 0.6, "cpu": 0.1}  # per size: bookkeeping, a GPU's warm-up (WARM_S)
SLACK = 0.25  # of the wall-clock time: a loaded host descheduling it between samples
CODE = "measurement_untrusted"
_SIZE = re.compile(r"(prefill|decode)@ctx(\d+),b(\d+)")
MAX_MARKS = 100_000  # of one request: a process sending more is not measuring


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


def _tokens(key: str, timing: Mapping[str, Any]) -> int:
    """A sample's tokens at size `key` (decode: batch x decode steps; prefill: batch x ctx)."""
    m = _SIZE.fullmatch(key)
    if m is None or key not in {f"{k}@ctx{c},b{b}" for k, b, c in timing["sizes"]}:
        raise Untrusted(f"size {key[:60]!r} is not one it was asked to measure")
    kind, ctx, batch = m.group(1), int(m.group(2)), int(m.group(3))
    return batch * (int(timing["decode_steps"]) if kind == "decode" else ctx)


class SampleClock:
    """The parent's clock of one `measure` request's sample marks (ModelProcess.call's
    `on_mark`): `went(t)` when it sends a `go`, `mark(msg, t)` when a mark arrives. A mark
    with a rate ends a sample whose window opened at the last `go`."""

    def __init__(self) -> None:
        #: (size key, the rate it reports, the parent's seconds from its go to the mark)
        self.windows: list[tuple[str, Any, float]] = []
        self.stray: list[str] = []  # marks out of place
        self._key: Optional[str] = None
        self._go: Optional[float] = None

    def mark(self, msg: Mapping[str, Any], t: float) -> None:
        key, rate = str(msg.get("mark"))[:200], msg.get("rate")
        if len(self.windows) + len(self.stray) >= MAX_MARKS:
            self.stray.append(key)
        elif rate is None:  # a size starts
            self._key = key
        elif key == self._key and self._go is not None:
            self.windows.append((key, rate, t - self._go))
        else:
            self.stray.append(key)

    def went(self, t: float) -> None:
        self._go = t

    def samples(self, timing: Mapping[str, Any]) -> dict[str, list[float]]:
        """Per size, the tokens/s of each sample by the parent's clock."""
        out: dict[str, list[float]] = {}
        for key, _, dt in self.windows:
            out.setdefault(key, []).append(_tokens(key, timing) / max(dt, 1e-9))
        return out


def judge(measurement: Any, clock: SampleClock, wall_s: float, timing: Mapping[str, Any],
          device: str) -> Any:
    """The Measurement the search keeps: `measurement`'s samples replaced by the parent's
    (`clock`), its report checked against them and the whole against `wall_s`; Untrusted
    where they disagree."""
    from tuner.workloads.base import summarize

    reported = measurement.extra.get("per_size_samples")
    implied_seconds(reported, timing)  # its shape: sizes asked for, positive rates
    if clock.stray:
        raise Untrusted(f"{len(clock.stray)} sample marks out of place "
                        f"(first: {clock.stray[0][:60]!r})")
    ours = clock.samples(timing)
    for key in sorted(set(ours) | set(reported)):
        mine, theirs = ours.get(key, []), reported.get(key, [])
        if len(mine) != len(theirs):
            raise Untrusted(f"{key}: it reports {len(theirs)} samples, the search's clock "
                            f"timed {len(mine)}")
        tokens = _tokens(key, timing)
        windows = [tokens / r for r in mine]
        said = [tokens / r for r in theirs]
        for s, w in zip(said, windows):
            if s > w * 1.05 + 0.002:
                raise Untrusted(f"{key}: a sample it says took {s:.3g} s, but the search's "
                                f"clock saw {w:.3g} s")
        if 2 * sum(said) + 0.05 * len(said) < sum(windows):
            raise Untrusted(f"{key}: it reports {_median(theirs):.4g} tok/s, but the search's "
                            f"clock of its samples says {_median(mine):.4g} tok/s")
    extra = {k: v for k, v in measurement.extra.items()
             if k not in ("per_size_samples", "per_size_spread", "spread")}
    extra["reported_per_size_samples"] = reported
    out = summarize(measurement.metric, measurement.unit, ours, extra)
    check(out, wall_s, timing, device)  # the time outside the windows
    out.per_size_watts = dict(measurement.per_size_watts)
    out.energy_source = measurement.energy_source
    out.per_size_tok_per_j = {k: out.per_size[k] / w for k, w in out.per_size_watts.items()
                              if k in out.per_size and w > 0}
    return out


def _median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs) if xs else float("nan")
