"""The harness's result: plain data (no pydantic: it must run on bare GPU hosts)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

# Stable codes, shared with tuner.trial.REASONS (kernelsearch does not import tuner).
CODES = {
    "accepted": "passed every stage",
    "guard_failed": "kernel source broke a static guard rule",
    "incorrect": "kernel output differs from the reference",
    "compile_failed": "kernel failed to compile",
    "needs_gpu": "a Gluon kernel, judged only on an sm_90 GPU (Gluon has no interpreter path)",
    "crashed": "candidate process crashed",
    "timeout": "candidate process exceeded its time limit",
    "too_fast": "faster than the physical floor: a measurement fault",
}

STAGES = ("guard", "correctness", "timing", "process")


@dataclass
class Verdict:
    verdict: str  # "accepted" | "rejected"
    stage: str  # last stage reached: guard | correctness | timing | process
    code: str  # one of CODES
    rule: str = ""  # finer sub-code: the guard rule or the check that fired
    detail: str = ""
    timings: dict[str, Any] = field(default_factory=dict)  # per shape: median_us, GBps, ...
    checks: list[str] = field(default_factory=list)  # what was checked and passed
    seconds: float = 0.0
    # what the verdict vouches for: "cuda:<device name>" or "cpu-interpreter" (Triton's
    # interpreter: correctness of the kernel's logic, no GPU speed, memory model or capture);
    # the shapes checked for correctness (boundary shapes included), those skipped (too costly
    # for the interpreter), and those timed; `summary`: speedup_geomean / speedup_min over
    # the timed shapes and a note on what the timing means
    device: str = ""
    checked_shapes: list[list[int]] = field(default_factory=list)
    skipped_shapes: list[list[int]] = field(default_factory=list)
    timed_shapes: list[list[int]] = field(default_factory=list)
    #: the seed of the shapes drawn across the certified range (harness.range_draws): a run
    #: is reproduced from it
    shape_seed: Optional[int] = None
    summary: dict[str, Any] = field(default_factory=dict)
    # how the candidate ran (runner.check): uid, Landlock ABI, the wall-clock timeout, the
    # memory limits and the resource limits of `limits.py` as set
    sandbox: dict[str, Any] = field(default_factory=dict)
    # "triton", or "library" for a wrapper over an installed library kernel (the guard does not
    # read compiled code): `library` then names it and its version
    kind: str = "triton"
    library: dict[str, Any] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @classmethod
    def reject(cls, stage: str, code: str, rule: str, detail: str, **kw) -> "Verdict":
        assert code in CODES, code
        return cls(verdict="rejected", stage=stage, code=code, rule=rule, detail=detail, **kw)


class Rejected(Exception):
    """Raised inside a stage; carries the verdict's fields."""

    def __init__(self, stage: str, code: str, rule: str, detail: str):
        super().__init__(f"{stage}/{code}/{rule}: {detail}")
        self.stage, self.code, self.rule, self.detail = stage, code, rule, detail

    def verdict(self, **kw) -> Verdict:
        return Verdict.reject(self.stage, self.code, self.rule, self.detail, **kw)


def optional(d: Optional[dict]) -> dict:
    return dict(d or {})
