"""The small protocol `safety` needs from a knob.

`safety` never imports `tuner`: anything with these members can be snapshotted, journalled,
applied, read back and rolled back. `tuner.knobs.base.Knob` satisfies it.

Optional members the policy uses when a knob has them: `validate(value)` (normalise a value or
raise; the transaction journals the normalised value) and `default()` (the device's factory value,
for `min_fraction_of_default`).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class SafeKnob(Protocol):
    #: stable name, e.g. "gpu0.power_limit_w"
    name: str
    #: when a written value takes effect: "now", "reboot", "bmc_reset" or "driver_reload"
    effect: str

    def read(self) -> Any:
        """The value in force now (for reboot-effect knobs: the value that is active, not pending)."""

    def apply(self, value: Any) -> Any:
        """Write `value`, read it back, return what was read; raise if the read-back disagrees."""

    def limits(self) -> Any:
        """The allowed domain as reported by the device (has `.validate(value)` and `.model_dump()`)."""

    def identity(self) -> str:
        """Which physical thing this knob belongs to (GPU UUID, PCI BDF, BMC system id...)."""


@runtime_checkable
class PendingKnob(SafeKnob, Protocol):
    """A knob whose writes only take effect later (BIOS, driver module options)."""

    def pending(self) -> Any | None:
        """The value waiting for the next reboot/reset, or None."""

    def clear_pending(self) -> None:
        """Drop a waiting change: this is how a pending change is rolled back."""
