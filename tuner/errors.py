"""Error classes with the exit code the CLI maps them to (docs/ARCHITECTURE.md: 1 failed, 2 bad input)."""
from __future__ import annotations


class MetaltuneError(Exception):
    exit_code = 1


class BadInput(MetaltuneError):
    """Bad usage or input (malformed file, unknown knob, value outside the domain): exit 2."""

    exit_code = 2


class UnknownKnob(BadInput):
    pass


class OutOfDomain(BadInput):
    pass


class OperationFailed(MetaltuneError):
    exit_code = 1


class ReadbackMismatch(OperationFailed):
    pass


class DryRunRefused(OperationFailed):
    pass


class KnobUnavailable(OperationFailed):
    """The device or interface behind a knob is not there (no NVML, no sysfs file, no BMC)."""


class WorkloadHang(OperationFailed):
    """A workload or canary did not finish within its timeout."""


class WorkloadFailed(OperationFailed):
    """A workload ran but produced no usable metric."""

    #: the trial's stable reason (tuner.trial.REASONS) where the workload knows one (a serving
    #: engine that did not start: `engine_start_failed`); None: `measure_failed`
    code: str | None = None


class WorkloadBroken(OperationFailed):
    """A workload's run failed and left its device unusable (a sticky CUDA error such as an
    illegal memory access: every later call on the context fails). Not a WorkloadFailed on
    purpose: no candidate is to blame for what comes after, so a search stops with this one
    line rather than rejecting every later trial; only a new process gets a working device."""
