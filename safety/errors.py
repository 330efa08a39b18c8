"""Safety errors. `safety` imports nothing from `tuner`, so each error carries the CLI exit code
(docs/ARCHITECTURE.md: 1 failed or rejected, 2 bad input) for the caller to map."""
from __future__ import annotations

from typing import Any


class SafetyError(Exception):
    exit_code = 1


class InputError(SafetyError):
    """An input file that cannot be used (not a regular file, too large, not UTF-8, not valid
    YAML/TOML, over a limit of `safety.inputs`)."""

    exit_code = 2


class PolicyError(InputError):
    """A policy file that cannot be used (unreadable, not YAML, a field of the wrong shape)."""

    exit_code = 2


class OutOfBounds(SafetyError):
    """A number outside what the safety layer accepts (NaN, infinity, beyond its range)."""

    exit_code = 2


class JournalDamaged(SafetyError):
    """The journal is not the one metaltune wrote (missing, emptied, cut short, replaced) while
    its anchor says changes were recorded: nothing is recorded over an unknown state."""


class StateUnwritable(SafetyError):
    """The state dir cannot take a write (read-only file system, no space left): the OS's
    reason; nothing was changed on the host."""


class PolicyDenied(SafetyError):
    """The allowed-change list refuses a change; nothing was written. `refusals` lists each one."""

    exit_code = 1

    def __init__(self, message: str, refusals: list[Any] | None = None):
        super().__init__(message)
        self.refusals = list(refusals or [])


class Quarantined(PolicyDenied):
    """The candidate caused a fatal incident before; it is never tried again."""


class Busy(SafetyError):
    """Another writer holds the host's writer lock."""


class ApplyFailed(SafetyError):
    """A write or its read-back failed; what had been applied was rolled back."""


class ProbationExpired(SafetyError):
    """The transaction was rolled back (deadline, incident or operator) before it was confirmed."""


class RollbackFailed(SafetyError):
    """A knob could not be restored; the journal keeps the change unresolved for `recover`."""


class Instability(SafetyError):
    """A fatal incident during probation; the transaction has been rolled back."""

    def __init__(self, incident: Any):
        super().__init__(f"instability: {incident}")
        self.incident = incident
