"""Tool-use schemas (pydantic) for the two kinds of answer the LLM proposer accepts.

The model must answer by calling exactly one of these tools; the tool input is validated by the
same pydantic model the schema came from, so anything that does not fit is a `malformed`
trial, never a crash."""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

KnobValue = Union[bool, int, float, str, list[int], None]

HOST_TOOL = "propose_host_candidate"
KERNEL_TOOL = "propose_kernel_candidate"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HostProposal(_Strict):
    """A change to host settings and/or runtime settings, judged end to end."""

    knobs: dict[str, KnobValue] = Field(
        default_factory=dict,
        description="knob name -> new value, using only knob names listed in the policy section "
                    "(e.g. gpu0.power_limit_w: 650; gpu0.locked_clocks_mhz: [1980, 1980] or null)")
    runtime: dict[str, Union[bool, int, float, str, list[int], None]] = Field(
        default_factory=dict,
        description="runtime settings of the inference workload, e.g. cuda_graphs, "
                    "graph_capture_sizes, max_ctx_to_capture, fuse_projections")
    rationale: str = Field(min_length=1, max_length=4000,
                           description="why this should help, citing the diagnosis or history")
    expected_gain_pct: Optional[float] = Field(
        default=None, description="predicted end-to-end tokens/s gain in percent")


class KernelProposal(_Strict):
    """A Triton kernel candidate for one family: a whole Python module."""

    family: str = Field(description="kernel family, one of those offered in the context")
    source: str = Field(
        min_length=1, max_length=60000,
        description="complete Python module: imports torch/triton only, module-level @triton.jit "
                    "kernels, and `forward(...)` with the family's reference signature that "
                    "allocates outputs and launches the kernels")
    config: dict[str, Union[int, str, bool]] = Field(
        default_factory=dict, description="launch parameters / constexprs, e.g. BLOCK: 1024")
    shape_range: Optional[str] = Field(
        default=None, description="where this kernel should be used, e.g. 'rows<=64'")
    rationale: str = Field(min_length=1, max_length=4000)
    expected_gain_pct: Optional[float] = None


def tool(name: str, model: type[BaseModel], description: str) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    return {"name": name, "description": description, "input_schema": schema}


def tools(kinds: tuple[str, ...] = ("host", "kernel")) -> list[dict[str, Any]]:
    out = []
    if "host" in kinds:
        out.append(tool(HOST_TOOL, HostProposal,
                        "Propose one host/runtime candidate. It is checked against the policy, "
                        "applied inside a safety transaction and kept only if end-to-end inference "
                        "gets faster at every context length and batch size."))
    if "kernel" in kinds:
        out.append(tool(KERNEL_TOOL, KernelProposal,
                        "Propose one Triton kernel for a family. It passes a static guard, a "
                        "correctness check on fresh random inputs including held-out shapes, a "
                        "timing check against physical limits, then the end-to-end benchmark."))
    return out


MODELS = {HOST_TOOL: HostProposal, KERNEL_TOOL: KernelProposal}
