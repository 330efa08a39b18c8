"""Candidate and Trial: what the loop passes around and the store keeps (pydantic at the edges)."""
from __future__ import annotations

import time
from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

from kernelsearch.harness.verdict import CODES as KERNEL_CODES  # plain data, no torch

Verdict = Literal["kept", "reverted", "rejected", "rolled_back"]

# Stable reason codes. Add new ones here (never rename: stores and dashboards key on them).
REASONS: dict[str, str] = {
    # kept
    "improved": "holistic metric better than the incumbent beyond the measured spread",
    "baseline": "the incumbent measured at the start of a run",
    # reverted
    "within_noise": "difference smaller than the measured spread",
    "worse": "slower than the incumbent",
    "size_regressed": "some context/batch size regressed beyond tolerance",
    "holistic_lost": "a micro-benchmark win that loses end to end",
    "below_throughput_floor": "objective energy: more tokens per joule, but some size's throughput fell below the floor (--throughput-floor of the incumbent's); objective power-capped: within the budget, but slower than the floor of the incumbent's tokens/s scaled to the budget",
    "over_power_budget": "objective power-capped: the candidate's power limit or measured mean watts exceed the power budget (--power-budget)",
    "power_budget_met": "objective power-capped: the incumbent drew more than the power budget and the candidate draws within it",
    "energy_unmeasured": "an energy objective, but a side measured no energy (no NVML counter, no power samples)",
    "goodput_unmeasured": "objective goodput, but a side reported no goodput (requests/s meeting the SLOs)",
    # rejected before anything was written
    "policy_denied": "the allowed-change list refuses this change",
    "unknown_knob": "the candidate names a knob this host does not have",
    "out_of_domain": "a value outside the device's own domain",
    "malformed": "the proposer's answer could not be parsed into a candidate",
    "duplicate": "already evaluated",
    "quarantined": "caused a fatal incident before; never tried again",
    # the kernel judge's rejections, as kernelsearch names them (it does not import tuner)
    **{code: text for code, text in KERNEL_CODES.items() if code != "accepted"},
    "apply_failed": "the write failed or the read-back disagreed",
    "measure_failed": "the workload failed to produce a metric",
    "engine_start_failed": "the serving engine exited before it was ready (a flag it refuses, too little KV-cache space); the end of its log is in the trial",
    "engine_timeout": "the serving engine did not answer /health within its start timeout; its process group was killed",
    "engine_crashed": "the serving engine died while its bench client ran",
    "bench_failed": "the engine's bench client failed or completed no request",
    "bench_timeout": "the engine's bench client exceeded its timeout; its process group was killed",
    "model_crashed": "the model process (where the workload runs a candidate table) died or failed; a fresh one measures next",
    "model_timeout": "the model process gave no answer in time; its process tree was killed",
    "measurement_untrusted": "the model process's tokens/s disagree with the search's own clock of the request (tuner.workloads.model_trust): not kept",
    "model_refused": "the model process could not be started confined (no sandbox user, an install it cannot read)",
    "workload_broken": "the candidate's run left the device unusable; the search stopped",
    "slower_than_library": "the judge timed the best installed library kernel at the slot's shape no slower than this kernel (kernelsearch.table.LIBRARY_MARGIN): dispatch runs the library there, so the choice is not measured end to end",
    "not_installable": "a kernel from source passed the judge in a mixed search, whose slots take shipped variants and stored sources (`metaltune search kernel --proposer llm` stores and installs sources)",
    # rolled back after apply
    "instability_xid": "an Xid event during probation",
    "instability_ecc": "ECC errors during probation",
    "instability_thermal": "thermal or power slowdown during probation",
    "instability_pcie": "PCIe replay/AER errors during probation",
    "instability_hang": "the workload or canary hung",
    "canary_failed": "the canary workload gave a wrong answer",
    "probation_expired": "not confirmed before the probation deadline",
}


class KernelChoice(BaseModel):
    family: str
    variant: Optional[str] = None
    config: dict[str, Any] = Field(default_factory=dict)
    shape_bucket: Optional[str] = None
    source: Optional[str] = None  # candidate source text (LLM proposer) or a file path


class Candidate(BaseModel):
    knobs: dict[str, Any] = Field(default_factory=dict)
    kernel: Optional[KernelChoice] = None
    runtime: dict[str, Any] = Field(default_factory=dict)  # e.g. {"cuda_graphs": false}
    #: several kernel choices at once (a mixed search changes one per shape-bucket slot;
    #: variant None = the torch op, no table entry). `kernel` stays the single-kernel form.
    kernels: list[KernelChoice] = Field(default_factory=list)
    proposer: str = ""
    rationale: str = ""

    def key(self) -> str:
        """Identity for de-duplication and quarantine."""
        import json

        d: dict[str, Any] = {"knobs": self.knobs,
                             "kernel": self.kernel.model_dump() if self.kernel else None,
                             "runtime": self.runtime}
        if self.kernels:  # only when used: keys stored before the field existed stay the same
            d["kernels"] = [k.model_dump() for k in self.kernels]
        return json.dumps(d, sort_keys=True, default=str)


class GateResult(BaseModel):
    gate: str  # "policy", "domain", "guard", "correctness", "apply", "probation", "holistic", ...
    passed: bool
    code: Optional[str] = None
    detail: str = ""
    seconds: float = 0.0


class Measurement(BaseModel):
    """One workload's result: the headline metric (higher is better) with its repeats."""

    metric: str
    unit: str = ""
    value: float  # median of samples
    samples: list[float] = Field(default_factory=list)
    per_size: dict[str, float] = Field(default_factory=dict)  # e.g. {"decode@ctx4096,b8": tok/s}
    per_size_tok_per_j: dict[str, float] = Field(default_factory=dict)  # tokens/J per size (higher is better)
    per_size_watts: dict[str, float] = Field(default_factory=dict)  # mean board watts per size
    #: requests/s meeting the latency SLOs per size (a serving workload's goodput; higher is better);
    #: the repeats, where kept, in extra["per_size_goodput_samples"]
    per_size_goodput: dict[str, float] = Field(default_factory=dict)
    energy_source: str = ""  # nvml_energy_counter | nvml_power_samples | sim_model | "" (not measured)
    extra: dict[str, Any] = Field(default_factory=dict)


class Trial(BaseModel):
    id: Optional[int] = None
    run_id: str = ""
    number: int = 0
    candidate: Candidate
    gates: list[GateResult] = Field(default_factory=list)
    measurements: dict[str, Any] = Field(default_factory=dict)
    verdict: Verdict
    reason: str
    objective: Optional[float] = None  # candidate's holistic value (None when never measured)
    incumbent: Optional[float] = None
    gain: Optional[float] = None  # objective / incumbent - 1
    incident: Optional[dict[str, Any]] = None
    cost: dict[str, float] = Field(default_factory=dict)  # e.g. tokens, usd (LLM proposer)
    ideas: list[str] = Field(default_factory=list)  # the operator's directions (--idea) it ran under
    #: the candidate's energy as measured (tuner.search.store.energy_of): tok_per_j and watts per
    #: size, their source; empty when the workload measured none
    energy: dict[str, Any] = Field(default_factory=dict)
    started_at: float = Field(default_factory=time.time)
    duration_s: float = 0.0
