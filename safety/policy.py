"""The allowed-change list. Deny by default: a change goes through only when a rule matches its
knob (first match wins, like a firewall) and every check of that rule passes. Every refusal names
the policy file, the rule (index and pattern) and what failed.

```yaml
version: 1
defaults: {probation_s: 120, max_changes_per_hour: 12}
forbidden: ["bios.*", "gpu*.gpc_clock_offset_mhz"]     # never, whatever the rules say
rules:
  - knob: "gpu*.power_limit_w"       # fnmatch glob on the knob name
    within_device_limits: true       # the device's own domain (NVML constraints, supported clocks)
    range: [null, 700]               # inclusive bounds, null = open; lists (clock locks) per element
    values: [...]                    # or an explicit list of allowed values
    min_fraction_of_default: 0.75    # floor relative to the device's default value
    max_step: 150                    # |after - before| per change
    max_changes_per_hour: 30         # counted from the journal, across restarts
    probation_s: 120                 # used when the caller gives none
    allow_reboot_effect: false       # changes that take effect on reboot / BMC reset / reload
    allow_null: true                 # returning to "unset" (e.g. unlocking clocks)
```
"""
from __future__ import annotations

import fnmatch
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from safety.bounds import MAX_PROBATION_S
from safety.errors import PolicyDenied, PolicyError
from safety.restore import effect_of

POLICY_DIR = Path(__file__).with_name("policies")
Number = float
#: a probation that ends: `.inf` would hold the writer forever
ProbationS = Annotated[float, Field(ge=0, le=MAX_PROBATION_S)]


class _Strict(BaseModel):
    # NaN compares false with every bound (the check would be skipped) and `.inf` never ends:
    # no float field of a policy takes either
    model_config = ConfigDict(extra="forbid", strict=False, allow_inf_nan=False)


class Defaults(_Strict):
    probation_s: ProbationS = 60.0
    max_changes_per_hour: Optional[int] = Field(None, ge=0)


class Rule(_Strict):
    knob: str = Field(min_length=1)
    values: Optional[list[Any]] = None
    range: Optional[tuple[Optional[Number], Optional[Number]]] = None
    within_device_limits: bool = True
    min_fraction_of_default: Optional[float] = Field(None, gt=0, le=1)
    max_step: Optional[Number] = Field(None, gt=0)
    max_changes_per_hour: Optional[int] = Field(None, ge=0)
    probation_s: Optional[ProbationS] = None
    allow_reboot_effect: bool = False
    allow_null: bool = True
    note: str = ""

    @field_validator("values")
    @classmethod
    def _finite_values(cls, v: Any) -> Any:
        for x in v or ():
            for y in (x if isinstance(x, (list, tuple)) else [x]):
                if isinstance(y, float) and not math.isfinite(y):
                    raise ValueError(f"{y!r} is not a finite number")
        return v

    @field_validator("range")
    @classmethod
    def _ordered(cls, v: Any) -> Any:
        if v is not None and v[0] is not None and v[1] is not None and v[0] > v[1]:
            raise ValueError(f"min {v[0]} is above max {v[1]}")
        return v

    @model_validator(mode="after")
    def _one_domain(self) -> "Rule":
        if self.values is not None and self.range is not None:
            raise ValueError("give either 'values' or 'range', not both")
        return self


class PolicyModel(_Strict):
    version: int = Field(1, ge=1, le=1)
    description: str = ""
    defaults: Defaults = Field(default_factory=Defaults)
    forbidden: list[str] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=list)

    @field_validator("forbidden")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        for i, p in enumerate(v):
            if not p:
                raise ValueError(f"pattern {i} is empty")
        return v


@dataclass
class Refusal:
    knob: str
    value: Any
    rule: str  # "rule #2 (knob 'gpu*.power_limit_w')", "forbidden 'bios.*'", "no rule"
    failed: str
    source: str

    def __str__(self) -> str:
        return f"{self.source}: {self.knob} = {self.value!r} refused by {self.rule}: {self.failed}"

    def to_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "value": self.value, "rule": self.rule, "failed": self.failed,
                "source": self.source}


def _nums(v: Any) -> Optional[list[float]]:
    """A value's numbers (scalar or a list such as a [min, max] clock lock), or None."""
    items = v if isinstance(v, (list, tuple)) else [v]
    if not items:
        return None
    out = []
    for x in items:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return None
        out.append(float(x))
    return out


class Policy:
    def __init__(self, model: PolicyModel, source: str = "<policy>"):
        self.model = model
        self.source = source

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, source: str = "<policy>") -> "Policy":
        from safety.inputs import parse_yaml

        data = parse_yaml(text, f"policy {source}", PolicyError)
        if not isinstance(data, dict):
            raise PolicyError(f"policy {source}: expected a mapping with 'rules' (and optionally"
                              f" 'forbidden', 'defaults'), got {type(data).__name__}")
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<policy>") -> "Policy":
        try:
            return cls(PolicyModel.model_validate(dict(data)), source)
        except ValidationError as e:
            err = e.errors()[0]
            field = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p))
                            for i, p in enumerate(err["loc"])) or "(top level)"
            got = err.get("input")
            got_s = repr(got)
            if len(got_s) > 60:
                got_s = got_s[:57] + "..."
            more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
            raise PolicyError(f"policy {source}: field {field}: {err['msg']} (got {got_s}){more}") from None

    @classmethod
    def allow_nothing(cls) -> "Policy":
        return cls(PolicyModel(), "<deny-all>")

    # -- decisions -------------------------------------------------------------------------
    def forbidden_by(self, name: str) -> Optional[str]:
        for p in self.model.forbidden:
            if fnmatch.fnmatchcase(name, p):
                return p
        return None

    def rule_for(self, name: str) -> Optional[tuple[int, Rule]]:
        for i, r in enumerate(self.model.rules):
            if fnmatch.fnmatchcase(name, r.knob):
                return i, r
        return None

    def rate_limit(self, name: str) -> Optional[int]:
        """The changes an hour the policy allows `name` (its rule's, else the default; None:
        unlimited, or a knob no rule allows at all)."""
        hit = self.rule_for(name)
        if hit is None or self.forbidden_by(name) is not None:
            return None
        r = hit[1]
        return r.max_changes_per_hour if r.max_changes_per_hour is not None \
            else self.model.defaults.max_changes_per_hour

    def probation_for(self, names: list[str]) -> float:
        """The longest probation any of the knobs' rules asks for."""
        out = 0.0
        for n in names:
            hit = self.rule_for(n)
            p = hit[1].probation_s if hit and hit[1].probation_s is not None else None
            out = max(out, p if p is not None else self.model.defaults.probation_s)
        return out

    def check(self, knob: Any, before: Any, after: Any, journal: Any = None,
              now: Optional[float] = None) -> Optional[Refusal]:
        """None when allowed, else the first check that fails."""
        name = knob.name
        pat = self.forbidden_by(name)
        if pat is not None:
            return Refusal(name, after, f"forbidden {pat!r}", "this knob is never changed",
                           self.source)
        hit = self.rule_for(name)
        if hit is None:
            return Refusal(name, after, "no rule", "no rule allows this knob (deny by default)",
                           self.source)
        i, r = hit
        rule = f"rule #{i} (knob {r.knob!r})"

        def no(why: str) -> Refusal:
            return Refusal(name, after, rule, why, self.source)

        eff = effect_of(knob)
        if eff != "now" and not r.allow_reboot_effect:
            return no(f"takes effect on {eff} and allow_reboot_effect is false")
        if after is None:
            return None if r.allow_null else no("returning to unset (null) is not allowed")
        if r.within_device_limits:
            try:
                validate = getattr(knob, "validate", None)
                if validate is not None:
                    validate(after)
                else:
                    lim = knob.limits()
                    getattr(lim, "validate_value", None) and lim.validate_value(after)
            except Exception as e:
                return no(f"outside the device's domain: {e}")
        if r.values is not None and not any(_eq(after, v) for v in r.values):
            return no(f"not one of the allowed values {r.values!r}")
        nums = _nums(after)
        if r.range is not None:
            lo, hi = r.range
            if nums is None:
                return no(f"range [{lo}, {hi}] needs a number, got {after!r}")
            for x in nums:
                if lo is not None and x < lo:
                    return no(f"{x:g} is below the range minimum {lo:g}")
                if hi is not None and x > hi:
                    return no(f"{x:g} is above the range maximum {hi:g}")
        if r.min_fraction_of_default is not None:
            dflt = knob.default() if hasattr(knob, "default") else None
            d = _nums(dflt)
            if d is None or nums is None:
                return no(f"min_fraction_of_default needs the device default (got {dflt!r})")
            floor = r.min_fraction_of_default * max(d)
            if min(nums) < floor:
                return no(f"{min(nums):g} is below the floor {r.min_fraction_of_default:g} x"
                          f" default {max(d):g} = {floor:g}")
        if r.max_step is not None:
            b = _nums(before)
            if nums is not None and b is not None and len(b) == len(nums):
                step = max(abs(x - y) for x, y in zip(nums, b))
                if step > r.max_step:
                    return no(f"step {step:g} from {before!r} exceeds max_step {r.max_step:g}")
        limit = r.max_changes_per_hour if r.max_changes_per_hour is not None \
            else self.model.defaults.max_changes_per_hour
        if limit is not None and journal is not None:
            now = time.time() if now is None else now
            n = journal.count_changes(name, now - 3600)
            if n >= limit:
                return no(f"rate limit: {n} changes in the last hour, max_changes_per_hour {limit}")
        return None

    def enforce(self, knobs: Mapping[str, Any], changes: Mapping[str, Any],
                before: Mapping[str, Any], journal: Any = None) -> None:
        refusals = [r for n, v in changes.items()
                    if (r := self.check(knobs[n], before.get(n), v, journal)) is not None]
        if refusals:
            raise PolicyDenied("; ".join(str(r) for r in refusals), refusals)


def _eq(a: Any, b: Any) -> bool:
    from safety.restore import same

    return same(a, b)


def load(path: str | os.PathLike[str]) -> Policy:
    from safety.inputs import read_text

    p = Path(path)
    return Policy.parse(read_text(p, f"policy {p}", error=PolicyError), str(p))


def load_default() -> Policy:
    return load(POLICY_DIR / "default.yaml")


def load_permissive() -> Policy:
    return load(POLICY_DIR / "permissive.yaml")
