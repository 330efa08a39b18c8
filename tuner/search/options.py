"""The options of each search operation, one pydantic model each: the CLI, the daemon's socket
and the daemon's search child all validate with it, so `{"budget": "many"}` or an unknown key is
the same bad input (exit 2, before any child starts) however it arrives.

Only checks that need nothing but the value live here (types, ranges, names from the
registries); what needs the host (a knob that exists, a workload that calls a family) stays with
the search that opens it."""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import BadInput
from tuner.validation import first_error

NONE = "none"  # --knob none / --family none: leave that kind out
AUTO = "auto"  # --suggest-table auto: the tables shipped for this GPU


def _proposer(name: str) -> str:
    from tuner import proposers

    if name not in proposers.names():
        raise ValueError(f"unknown proposer {name!r}; expected one of {', '.join(proposers.names())}")
    return name


def _family(name: str) -> str:
    from kernelsearch.families import NAMES

    if name not in NAMES:
        raise ValueError(f"unknown kernel family {name!r}; expected one of {', '.join(NAMES)}")
    return name


def _alone(flag: str, values: Optional[list[str]], *words: str) -> None:
    if values and any(w in values for w in words) and len(values) > 1:
        raise ValueError(f"{flag}: {' and '.join(repr(w) for w in words)} cannot be combined "
                         "with other values")


class SearchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, hide_input_in_errors=True,
                              frozen=True)
    #: field -> the CLI flag a user typed it as (for messages)
    FLAGS: ClassVar[dict[str, str]] = {}

    budget: int = Field(20, ge=1, description="Trials to run.")
    proposer: str = "random"
    seed: int = 0
    timeout_s: float = Field(600.0, gt=0, le=86400)
    #: what the keep rule keeps (tuner.search.objective): throughput | energy | power-capped
    objective: Literal["throughput", "energy", "power-capped"] = "throughput"
    throughput_floor: Optional[float] = Field(None, gt=0, le=1)
    power_budget_w: Optional[float] = Field(None, gt=0, le=100000)

    @field_validator("proposer")
    @classmethod
    def _check_proposer(cls, v: str) -> str:
        return _proposer(v)

    @model_validator(mode="after")
    def _objective_args(self) -> "SearchOptions":
        if self.throughput_floor is not None and self.objective != "energy":
            raise ValueError("--throughput-floor: only with --objective energy")
        if self.power_budget_w is not None and self.objective != "power-capped":
            raise ValueError("--power-budget: only with --objective power-capped")
        if self.objective == "power-capped" and self.power_budget_w is None:
            raise ValueError("--power-budget: required with --objective power-capped")
        return self

    @classmethod
    def parse(cls, op: str, args: dict[str, Any]) -> "SearchOptions":
        """The options, or BadInput naming the operation, the field (and its flag) and what was
        expected; the value is never echoed (an argument may hold a secret)."""
        try:
            return cls.model_validate(args)
        except ValidationError as e:
            raise BadInput(f"{op}: {first_error(e, unknown='unknown argument', names=cls.FLAGS, top='', label='argument')}") from None

    def kwargs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in type(self).model_fields}


_OBJECTIVE_FLAGS = {"objective": "--objective", "throughput_floor": "--throughput-floor",
                    "power_budget_w": "--power-budget"}
_COMMON_FLAGS = {"budget": "--budget", "proposer": "--proposer", "seed": "--seed",
                 "timeout_s": "--timeout", "policy": "--policy", "knobs": "--knob",
                 "repeats": "--repeats", "workload": "--workload", "metric_regex": "--metric-regex",
                 **_OBJECTIVE_FLAGS}


class HostSearchOptions(SearchOptions):
    """`metaltune search host`."""
    FLAGS: ClassVar[dict[str, str]] = _COMMON_FLAGS
    budget: int = Field(30, ge=1)
    proposer: str = "optuna"
    policy: Optional[str] = None
    knobs: Optional[list[str]] = None
    repeats: int = Field(3, ge=1)
    workload: Optional[str] = None
    metric_regex: Optional[str] = None


class MixedSearchOptions(HostSearchOptions):
    """`metaltune search mixed`."""
    FLAGS: ClassVar[dict[str, str]] = {**_COMMON_FLAGS, "families": "--family",
                                       "runtime": "--runtime", "rounds": "--rounds",
                                       "max_choices": "--max-choices", "table": "--table",
                                       "suggest": "--suggest-table", "isolate": "isolate"}
    budget: int = Field(20, ge=1)
    proposer: str = "random"
    families: Optional[list[str]] = None
    runtime: Optional[bool] = None
    rounds: int = Field(3, ge=1)
    max_choices: int = Field(6, ge=2, description="torch and one kernel at least")
    table: Optional[str] = None
    suggest: Optional[list[str]] = None
    isolate: Optional[bool] = None

    @field_validator("families")
    @classmethod
    def _families(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        _alone("--family", v, NONE)
        return [f if f == NONE else _family(f) for f in v] if v else v

    @model_validator(mode="after")
    def _alone_values(self) -> "MixedSearchOptions":
        _alone("--knob", self.knobs, NONE)
        _alone("--suggest-table", self.suggest, AUTO, NONE)
        return self


class KernelSearchOptions(SearchOptions):
    """`metaltune search kernel` (a proposer over a family's configs; `llm`: kernel sources)."""
    FLAGS: ClassVar[dict[str, str]] = {
        "family": "--family", "budget": "--budget", "proposer": "--proposer", "seed": "--seed",
        "device": "--device", "shapes": "--shape", "table_out": "--table",
        "timeout_s": "--timeout", "incumbent_table": "--incumbent", "ideas": "--idea",
        "max_tokens": "--max-tokens", "max_usd": "--max-usd", "stop_after": "--stop-after",
        "model": "--model", "gpu": "--gpu", "models": "--model-context",
        "diagnosis": "--diagnosis", **_OBJECTIVE_FLAGS}
    family: str
    proposer: str = "optuna"
    device: Optional[Literal["cpu", "cuda"]] = None
    shapes: Optional[list[list[int]]] = None
    table_out: Optional[str] = None
    timeout_s: float = Field(300.0, gt=0, le=86400)
    isolate: bool = True
    # --proposer llm only
    incumbent_table: Optional[str] = None
    ideas: Optional[list[str]] = None
    max_tokens: Optional[int] = Field(None, gt=0)
    max_usd: Optional[float] = Field(None, gt=0)
    stop_after: Optional[int] = Field(None, gt=0)
    model: Optional[str] = None
    gpu: Optional[str] = None
    models: Optional[list[str]] = None
    diagnosis: Optional[dict[str, Any]] = None

    @field_validator("family")
    @classmethod
    def _check_family(cls, v: str) -> str:
        return _family(v)

    LLM_ONLY: ClassVar[tuple[str, ...]] = ("incumbent_table", "ideas", "max_tokens", "max_usd",
                                           "stop_after", "model", "gpu", "models", "diagnosis")

    @model_validator(mode="after")
    def _llm_only(self) -> "KernelSearchOptions":
        if self.proposer != "llm":
            given = [f for f in self.LLM_ONLY if getattr(self, f) not in (None, [])]
            if given:
                raise ValueError(f"{self.FLAGS[given[0]]}: only for --proposer llm")
        return self
