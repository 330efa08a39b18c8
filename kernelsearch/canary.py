"""The kernel canary: installed kernels stay verified in use.

`dispatch.call` hands the canary each call a table kernel ran; the canary replays a sample of
them against the family's float64 reference, with the judge's own tolerances
(`harness.correctness.compare`): the first call of each entry after install, then one call in
1/rate, and at least one per entry every `interval_s` seconds it is in use (the schedule: an
entry called rarely is still checked). On a mismatch dispatch removes the entry (every entry of
that stored source: the source is quarantined in its store and never installed or offered
again), records an incident naming the variant and the source digest, tells the listeners (a
daemon or search journals it), and returns the fallback's output for that call, so the model
keeps running.

Not replayed: calls made while a CUDA graph is being captured or torch.compile traces (a
replay synchronises), and the static-cache attention op (`ops.decode_attention_cache`), which
resolves kernels itself.

Settings (the model process's environment): KERNELSEARCH_CANARY_RATE, the fraction of calls
replayed (default 1/1024; 0 leaves only the first call and the schedule); KERNELSEARCH_CANARY_
INTERVAL_S, the schedule (default 300 s; 0: none); KERNELSEARCH_CANARY=off disables it."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("kernelsearch.canary")

RATE_ENV, INTERVAL_ENV, SWITCH_ENV = ("KERNELSEARCH_CANARY_RATE", "KERNELSEARCH_CANARY_INTERVAL_S",
                                      "KERNELSEARCH_CANARY")
DEFAULT_RATE = 1 / 1024
DEFAULT_INTERVAL_S = 300.0


@dataclass
class Canary:
    rate: float = DEFAULT_RATE
    interval_s: float = DEFAULT_INTERVAL_S
    enabled: bool = True
    replays: int = 0
    period: int = 0

    def __post_init__(self) -> None:
        self.configure(self.rate, self.interval_s)

    def configure(self, rate: float, interval_s: float) -> None:
        self.rate, self.interval_s = rate, interval_s
        self.period = max(1, round(1 / rate)) if rate > 0 else 0

    @classmethod
    def from_env(cls, environ: Optional[dict] = None) -> "Canary":
        """The settings above; ValueError naming the variable for a bad value."""
        env = os.environ if environ is None else environ
        out = cls()
        sw = env.get(SWITCH_ENV, "").strip().lower()
        if sw not in ("", "on", "off"):
            raise ValueError(f"{SWITCH_ENV}={sw!r}: expected on or off")
        out.enabled = sw != "off"
        for var, attr, lo, hi in ((RATE_ENV, "rate", 0.0, 1.0), (INTERVAL_ENV, "interval_s", 0.0, 1e9)):
            text = env.get(var, "").strip()
            if not text:
                continue
            try:
                v = float(text)
            except ValueError:
                v = float("nan")
            if not lo <= v <= hi:
                raise ValueError(f"{var}={text!r}: expected a number in [{lo:g}, {hi:g}]")
            setattr(out, attr, v)
        out.configure(out.rate, out.interval_s)
        return out

    def state(self) -> list:
        """A fresh per-entry state, [calls, time of the last replay]: dispatch keeps one per
        table entry in its lookup cache, so a call costs no hashing here."""
        return [0, 0.0]

    def due(self, st: list) -> bool:
        """Whether this call of the entry whose state is `st` is replayed (counts the call).
        On every kernel call: two list operations; the clock is read once in 64 calls (the
        schedule's resolution)."""
        n = st[0]
        st[0] = n + 1
        if n == 0 or (self.period and n % self.period == 0):
            return True
        return (not n & 63 and bool(self.interval_s)
                and time.monotonic() - st[1] >= self.interval_s)

    def check(self, st: list, family: Any, args: tuple, out: Any) -> Optional[str]:
        """Replay: the output against the family's reference. None when it agrees, else why."""
        import torch

        from kernelsearch.families.base import dtype_name
        from kernelsearch.harness.correctness import compare

        if _capturing(args):
            st[0] -= 1  # not replayed now: the next eager call is
            return None
        st[1] = time.monotonic()
        self.replays += 1
        with torch.no_grad():
            ref = family.reference(*args)
            try:
                compare(out, ref, dtype_name(args[0].dtype), family,
                        f"{family.name} {tuple(out.shape)}")
            except Exception as e:  # noqa: BLE001 - Rejected (tolerance, unwritten, ...) or worse
                return f"{getattr(e, 'rule', type(e).__name__)}: {getattr(e, 'detail', e)}"
        return None


def _capturing(args: tuple) -> bool:
    import torch

    try:
        if torch.compiler.is_compiling():
            return True
    except AttributeError:
        pass
    ts = [a for a in args if isinstance(a, torch.Tensor)]
    return bool(ts) and ts[0].is_cuda and torch.cuda.is_current_stream_capturing()


Listener = Callable[[dict], None]
listeners: list[Listener] = []  # called with each incident (a daemon or search journals it)


def add_listener(fn: Listener) -> None:
    listeners.append(fn)


def notify(incident: dict) -> None:
    for fn in list(listeners):
        try:
            fn(incident)
        except Exception as e:  # noqa: BLE001 - a listener never breaks the model's call
            log.error("canary listener %r failed: %s", fn, e)
