"""The kernel canary: installed kernels stay verified in use.

`dispatch.call` hands the canary each call a table kernel ran; the canary replays a sample of
them against the family's float64 reference, with the judge's own tolerances
(`harness.correctness.compare`): the first call of each entry in every shape bucket it meets
(`dispatch.bucket`: the octave of every dim) after install, then one call in
1/rate, and at least one per entry every `interval_s` seconds it is in use (the schedule: an
entry called rarely is still checked). On a mismatch dispatch removes the entry (a shipped
variant: that entry only, its dtype and shape bucket; a stored source: every entry of it, as
the source is quarantined in its store and never installed or offered again), records an incident naming the variant and the source digest, tells the listeners (a
daemon or search journals it), and returns the fallback's output for that call, so the model
keeps running.

Not replayed: calls made while a CUDA graph is being captured or torch.compile traces (a
replay synchronises; the entry's next eager call takes the replay instead), and the
static-cache attention op (`ops.decode_attention_cache`), which resolves kernels itself. A
torch.compile'd model calls the op (`torch.ops.metaltune.<family>`, opaque to the compiler)
eagerly at run time, so its calls are sampled like any other; a CUDA graph's replays run no
Python and are never seen: a decode that only replays a captured graph is re-verified by its
eager calls only (prefill, warm-up, a recapture). tests/kernelsearch/test_canary_graphs.py.

Where an incident goes (besides `dispatch.incidents()`, the log and the listeners): one JSON
line appended to the incident log, `<store>/../canary.jsonl` (STATE_DIR/kernels/canary.jsonl for
the store metaltune's apply and searches use), or KERNELSEARCH_CANARY_LOG. kernelsearch knows no
journal: metaltune's daemon (and the health monitors of an apply's probation) read that file and
journal each line as a `canary_kernel` incident against the kernel table change in force
(`kernelsearch.canary_reader`). A process that cannot write it (a read-only state dir) logs why.

Settings (the model process's environment): KERNELSEARCH_CANARY_RATE, the fraction of calls
replayed (default 1/1024; 0 leaves only the first call and the schedule); KERNELSEARCH_CANARY_
INTERVAL_S, the schedule (default 300 s; 0: none); KERNELSEARCH_CANARY=off disables it;
KERNELSEARCH_CANARY_LOG, the incident log (a path; `off`: none)."""
from __future__ import annotations

import json
import logging
import math
import os
import secrets
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("kernelsearch.canary")

RATE_ENV, INTERVAL_ENV, SWITCH_ENV = ("KERNELSEARCH_CANARY_RATE", "KERNELSEARCH_CANARY_INTERVAL_S",
                                      "KERNELSEARCH_CANARY")
LOG_ENV = "KERNELSEARCH_CANARY_LOG"
LOG_NAME = "canary.jsonl"  # beside the store's folder: STATE_DIR/kernels/canary.jsonl
LOG_VERSION = 1
MAX_LINE = 16 << 10  # one incident line at most (the reader refuses longer ones)
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
            dtype = dtype_name(args[0].dtype)
            try:
                compare(out, ref, dtype, family, f"{family.name} {tuple(out.shape)}")
            except Exception as e:  # noqa: BLE001 - Rejected (tolerance, unwritten, ...) or worse
                if within_rounding(out, ref, family, dtype):
                    return None  # what the output dtype can hold, not a wrong kernel
                _last_error.clear()
                _last_error.update(_errors(out, ref))
                return f"{getattr(e, 'rule', type(e).__name__)}: {getattr(e, 'detail', e)}"
        return None


_last_error: dict[str, Any] = {}  # the last mismatch's error sizes, for its incident

#: a correct kernel's error in units of its output dtype's spacing at each value: the final
#: rounding (half a unit) and its own arithmetic on top
ULPS = 4.0


def within_rounding(out: Any, ref: Any, family: Any, dtype: str) -> bool:
    """Whether an output the judge's tolerance refused is as right as its dtype can hold: the
    exact reference rounded to fp16 fails that tolerance where values are tiny (fp16 below
    6.1e-5 is subnormal, its spacing a fixed 6e-8: 1.5% of 4e-6), so a correct kernel would be
    removed (issue 42, item 4). Elementwise: the family's bound plus ULPS units of the dtype's
    spacing at the reference (eps * max(|ref|, the smallest normal): the absolute floor for
    tiny values); the norm: the family's bound plus ULPS times the norm error of the reference
    rounded to the output dtype itself."""
    import torch

    if not (isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor)
            and out.shape == ref.shape and out.dtype.is_floating_point):
        return False
    fi = torch.finfo(out.dtype)
    o, r = out.detach().double(), ref.detach().double().to(out.device)
    if not bool(torch.isfinite(o).all()) or not bool(torch.isfinite(r).all()):
        return False
    atol, rtol, nrm = family.tolerance(dtype)
    scale: Any = max(float(r.pow(2).mean()) ** 0.5, 1e-30) if r.numel() else 1e-30
    if family.scale_of is not None:
        scale = family.scale_of(r).clamp_min(1e-30).expand_as(r)
    err = (o - r).abs()
    spacing = fi.eps * r.abs().clamp_min(fi.tiny)
    if bool((err > atol * scale + rtol * r.abs() + ULPS * spacing).any()):
        return False
    rounding = float((r.to(out.dtype).double() - r).norm())
    floor = ULPS * fi.eps * fi.tiny * r.numel() ** 0.5
    return float(err.norm()) <= nrm * float(r.norm()) + ULPS * rounding + floor


def _errors(out: Any, ref: Any) -> dict[str, Any]:
    """The largest absolute error of a wrong output and how many values are not finite (None
    where the output is not a tensor of the reference's shape)."""
    import torch

    if not (isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor)
            and out.shape == ref.shape):
        return {"max_abs_error": None, "nonfinite": None}
    o, r = out.detach().double(), ref.detach().double().to(out.device)
    bad = ~torch.isfinite(o)
    err = (o - r).abs().masked_fill(bad, 0.0)
    return {"max_abs_error": float(err.max()) if err.numel() else 0.0,
            "nonfinite": int(bad.sum())}


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
    """An incident dispatch recorded: completed (error sizes, a unique id, the time, this pid),
    appended to the incident log, then handed to each listener."""
    for k, v in _last_error.items():
        incident.setdefault(k, v)
    _last_error.clear()
    incident.setdefault("id", secrets.token_hex(8))
    incident.setdefault("time", time.time())
    incident.setdefault("pid", os.getpid())
    path = log_path(incident.get("store"))
    if path is not None:
        try:
            append(path, incident)
            incident["log"] = str(path)
        except (OSError, ValueError) as e:
            incident["log"] = f"not written: {e}"
            log.error("kernel canary: incident not written to %s: %s", path, e)
    for fn in list(listeners):
        try:
            fn(incident)
        except Exception as e:  # noqa: BLE001 - a listener never breaks the model's call
            log.error("canary listener %r failed: %s", fn, e)


def log_path(store_root: Optional[str | Path] = None) -> Optional[Path]:
    """The incident log: KERNELSEARCH_CANARY_LOG (`off`: None), else beside the folder of the
    store the installed table's sources came from (`store_root`; default: the default store)."""
    env = os.environ.get(LOG_ENV, "").strip()
    if env:
        return None if env.lower() == "off" else Path(env)
    if not store_root:
        from kernelsearch import store

        store_root = store.default_root()
    return Path(store_root).parent / LOG_NAME


def append(path: Path, incident: dict) -> None:
    """One JSON line, in one write on an O_APPEND descriptor that follows no symlink at the
    end (several model processes may append at once; a line is never split by another)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in incident.items()}  # an inf/nan error size is no JSON number
    line = json.dumps({"v": LOG_VERSION, **clean}, default=str, sort_keys=True,
                      separators=(",", ":"))
    data = (line + "\n").encode()
    if len(data) > MAX_LINE:
        raise ValueError(f"incident line of {len(data)} bytes (at most {MAX_LINE})")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)

