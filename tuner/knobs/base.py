"""The Knob model: one host setting that reads itself, reports its domain, writes and reads back.

Knobs talk to a `Host` (tuner.host): the real machine or a simulated one rooted in a folder. The
same knob code runs on both; only `host.root` and `host.nvml` differ.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from enum import Enum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field

from tuner.errors import DryRunRefused, OutOfDomain, ReadbackMismatch


class Effect(str, Enum):
    NOW = "now"
    REBOOT = "reboot"
    BMC_RESET = "bmc_reset"
    DRIVER_RELOAD = "driver_reload"


# ---------------------------------------------------------------------------------------------
# Domains: what values a knob accepts, as reported by the device. Pydantic so `--json` and the
# LLM proposer's context get them for free.


class IntRange(BaseModel):
    kind: Literal["int_range"] = "int_range"
    min: int
    max: int
    step: int = 1
    unit: str = ""

    def validate_value(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()
        ):
            raise OutOfDomain(f"expected an integer {self.describe()}, got {value!r}")
        v = int(value)
        if v < self.min or v > self.max:
            raise OutOfDomain(f"{v} is outside {self.describe()}")
        if (v - self.min) % self.step:
            raise OutOfDomain(f"{v} is not on the {self.step}{self.unit} grid of {self.describe()}")
        return v

    def search_values(self) -> list[int]:
        return list(range(self.min, self.max + 1, self.step))

    def from_search(self, v: Any) -> int:
        return int(v)

    def to_search(self, value: Any) -> Any:
        return value

    def describe(self) -> str:
        return f"[{self.min}, {self.max}] step {self.step}{(' ' + self.unit) if self.unit else ''}"


class Choice(BaseModel):
    kind: Literal["choice"] = "choice"
    values: list[Any]
    unit: str = ""

    def validate_value(self, value: Any) -> Any:
        for v in self.values:
            if v == value and type(v) is type(value) or (
                isinstance(v, (int, float)) and not isinstance(v, bool)
                and isinstance(value, (int, float)) and not isinstance(value, bool) and v == value
            ):
                return v
        raise OutOfDomain(f"{value!r} is not one of {self.describe()}")

    def search_values(self) -> list[Any]:
        return list(self.values)

    def from_search(self, v: Any) -> Any:
        return v

    def to_search(self, value: Any) -> Any:
        return value

    def describe(self) -> str:
        return "{" + ", ".join(repr(v) for v in self.values) + "}"


class ClockLock(BaseModel):
    """Locked clocks: None (unlocked, the driver's boost) or [min_mhz, max_mhz] from `supported`.

    The search pins the clock (min == max): that is the setting whose stability and power use the
    device really changes; a range lock is still accepted from profiles and the CLI.
    """

    kind: Literal["clock_lock"] = "clock_lock"
    supported: list[int]
    unit: str = "MHz"

    def validate_value(self, value: Any) -> list[int] | None:
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value, value]
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise OutOfDomain(f"expected null or [min_mhz, max_mhz], got {value!r}")
        lo, hi = value
        for c in (lo, hi):
            if isinstance(c, bool) or not isinstance(c, (int, float)) or int(c) != c:
                raise OutOfDomain(f"clock {c!r} is not an integer MHz value")
            if int(c) not in self.supported:
                raise OutOfDomain(
                    f"{int(c)} MHz is not a supported clock (supported: {self.describe()})"
                )
        if lo > hi:
            raise OutOfDomain(f"min {lo} MHz is above max {hi} MHz")
        return [int(lo), int(hi)]

    def search_values(self) -> list[int]:
        return sorted(self.supported)

    def from_search(self, v: Any) -> list[int]:
        return [int(v), int(v)]

    def to_search(self, value: Any) -> Any:
        """A lock's upper clock (the search pins min == max); None for unlocked."""
        return value[-1] if isinstance(value, (list, tuple)) else value

    def describe(self) -> str:
        s = sorted(self.supported)
        if not s:
            return "none"
        steps = {b - a for a, b in zip(s, s[1:])}
        if len(steps) == 1:
            return f"{s[0]}..{s[-1]} MHz step {steps.pop()} ({len(s)} values)"
        return f"{len(s)} values {s[0]}..{s[-1]} MHz"


class Unsupported(BaseModel):
    """The device reports this knob exists but cannot be changed (e.g. VF offsets on an H200)."""

    kind: Literal["unsupported"] = "unsupported"
    reason: str

    def validate_value(self, value: Any) -> Any:
        raise OutOfDomain(f"not supported on this device: {self.reason}")

    def search_values(self) -> list[Any]:
        return []

    def from_search(self, v: Any) -> Any:
        raise OutOfDomain(self.reason)

    def to_search(self, value: Any) -> Any:
        return None

    def describe(self) -> str:
        return f"unsupported ({self.reason})"


Domain = Annotated[Union[IntRange, Choice, ClockLock, Unsupported], Field(discriminator="kind")]


def values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return a == b


class Knob(ABC):
    """One host setting. Subclasses implement `read`, `limits` and `_write`.

    `apply` validates against the device's own domain, refuses on a dry-run host, writes, and reads
    back: a write counts only when the read-back agrees (some nvidia-ml-py setters ignore the C
    return code).
    """

    name: str
    effect: Effect = Effect.NOW
    unit: str = ""
    description: str = ""

    def __init__(self, host: Any, name: str):
        self.host = host
        self.name = name

    # -- to implement ------------------------------------------------------------------------
    @abstractmethod
    def read(self) -> Any: ...

    @abstractmethod
    def limits(self) -> Any:  # returns one of the Domain models
        ...

    @abstractmethod
    def _write(self, value: Any) -> None: ...

    def identity(self) -> str:
        return self.name

    def default(self) -> Any | None:
        """The device's factory value where it reports one (e.g. default power limit)."""
        return None

    # -- shared behaviour --------------------------------------------------------------------
    def validate(self, value: Any) -> Any:
        try:
            return self.limits().validate_value(value)
        except OutOfDomain as e:
            raise OutOfDomain(f"{self.name}: {e}") from None

    def readback_matches(self, wanted: Any, got: Any) -> bool:
        return values_equal(wanted, got)

    def apply(self, value: Any) -> Any:
        v = self.validate(value)
        if getattr(self.host, "dry_run", False):
            raise DryRunRefused(f"{self.name}: dry run, not writing {v!r}")
        self._write(v)
        if self.effect is not Effect.NOW:
            got = self.pending() if hasattr(self, "pending") else self.read()
        else:
            got = self.read()
        if not self.readback_matches(v, got):
            raise ReadbackMismatch(f"{self.name}: wrote {v!r} but read back {got!r}")
        return got

    def describe(self) -> dict[str, Any]:
        """What `status --json` and the LLM context show for this knob."""
        try:
            lim = self.limits()
            dom = lim.model_dump()
            desc = lim.describe()
        except Exception as e:  # a knob that cannot report its domain is still listed
            dom, desc = {"kind": "error", "error": str(e)}, f"error: {e}"
        try:
            cur = self.read()
        except Exception as e:
            cur = None
            dom["read_error"] = str(e)
        return {
            "name": self.name,
            "value": cur,
            "unit": self.unit,
            "effect": self.effect.value,
            "domain": dom,
            "domain_text": desc,
            "identity": self.identity(),
            "description": self.description,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
