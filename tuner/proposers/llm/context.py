"""The context the LLM proposer reads: hardware, model, policy, prohibitions, history, diagnosis.

Everything is plain Markdown assembled here so a human can read exactly what the model read
(`LLMProposer.last_prompt`). The static part (hardware, model, prohibitions, policy) goes in the
system prompt, which is cached between requests; the trial history and diagnosis change every
trial and go in the user message.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

CONTEXT_DIR = Path(__file__).resolve().parents[3] / "kernelsearch" / "context"

# GPU name (as NVML reports it) -> hardware file; first match wins
HARDWARE_MATCH: list[tuple[str, str]] = [
    (r"H200", "h200"), (r"H100", "h100"), (r"B200|GB200", "b200"), (r"L40S", "l40s"),
    (r"RTX\s*4090|GeForce", "rtx4090"),
]

PROHIBITIONS = """\
## Prohibitions (a candidate breaking any of these is rejected and counts against you)

- Change only the knobs listed under "Policy". Never propose driver module options, BIOS
  attributes, firmware updates, ECC or MIG changes, persistence mode, GPU resets, clock offsets
  on parts that do not support them, or anything needing a reboot unless the policy lists it.
- Stay inside the bounds and step sizes the policy gives; one change at a time is easiest to judge.
- Never trade correctness for speed: no lower precision than the family's dtype, no skipped
  work, no approximations the reference does not make.
- Kernel sources: a module that imports only torch, triton, triton.language, math and typing;
  module-level `@triton.jit` kernels; `forward(...)` with the family's exact signature that
  allocates outputs (torch.empty*) and launches kernels. No torch math outside kernels (no
  calling the reference or torch ops to compute the result), no caching or reusing results
  between calls, no reading timers or clocks, no threads, streams or graphs, no file, network or
  environment access, no exec/eval/import tricks, no introspection of the caller or the harness.
- The benchmark is the judge: a micro-benchmark win that loses end to end is reverted, and so is
  any change that slows one context length or batch size by more than 1%.
  Turning CUDA graphs off, shrinking the captured sizes or the measured sizes to look faster in
  isolation is a known trap.
- Do not invent hardware features or model architectures: use only what the hardware and model
  sections state.
"""

INSTRUCTIONS = """\
You are the proposer in metaltune's verified search loop (propose -> gate -> measure -> keep or
revert). Propose exactly ONE candidate per answer by calling exactly one tool. Read the
diagnosis (where the time goes) and the trial history (what failed and why) first; do not repeat
a candidate that was already tried. Prefer the change with the largest predicted end-to-end gain,
and say what you predict in `expected_gain_pct`.
"""


def hardware_file(gpu_name: str) -> Optional[Path]:
    for pat, stem in HARDWARE_MATCH:
        if re.search(pat, gpu_name, re.IGNORECASE):
            return CONTEXT_DIR / "hardware" / f"{stem}.md"
    return None


def hardware_doc(gpu_name: Optional[str]) -> str:
    if not gpu_name:
        return "## Hardware\n\nUnknown GPU: propose only host-independent runtime settings.\n"
    p = hardware_file(gpu_name)
    if p is None or not p.is_file():
        return f"## Hardware\n\n{gpu_name}: no hardware notes on file; do not assume features.\n"
    return p.read_text()


def available_models() -> list[str]:
    return sorted(p.stem for p in (CONTEXT_DIR / "models").glob("*.md"))


def model_docs(names: Sequence[str]) -> str:
    parts = []
    for n in names:
        p = CONTEXT_DIR / "models" / f"{n}.md"
        if not p.is_file():
            raise ValueError(f"model context {n!r}: no file {p}; expected one of "
                             f"{', '.join(available_models())}")
        parts.append(p.read_text())
    return "\n\n".join(parts)


def policy_section(dims: Iterable[Any] = (), policy_text: Optional[str] = None,
                   runtime_options: Optional[dict[str, list[Any]]] = None,
                   kernel_families: Optional[dict[str, str]] = None) -> str:
    lines = ["## Policy: what you may change", ""]
    dims = list(dims)
    if dims:
        lines.append("Host knobs and the values the device and policy allow:")
        for d in dims:
            vals = list(d.values)
            shown = vals if len(vals) <= 12 else vals[:5] + ["..."] + vals[-5:]
            lines.append(f"- `{d.name}`: {json.dumps(shown, default=str)} ({len(vals)} values)")
    else:
        lines.append("No host knobs may change in this run.")
    if runtime_options:
        lines += ["", "Runtime settings of the inference workload:"]
        lines += [f"- `{k}`: {json.dumps(v, default=str)}" for k, v in runtime_options.items()]
    if kernel_families:
        lines += ["", "Kernel families you may write (signature):"]
        lines += [f"- `{k}`: `{sig}`" for k, sig in kernel_families.items()]
    if policy_text:
        lines += ["", "The policy file in force:", "", "```yaml", policy_text.strip(), "```"]
    return "\n".join(lines) + "\n"


def _summ(c: Any) -> str:
    parts = []
    if c.knobs:
        parts.append("knobs " + json.dumps(c.knobs, sort_keys=True, default=str))
    if c.runtime:
        parts.append("runtime " + json.dumps(c.runtime, sort_keys=True, default=str))
    if c.kernel is not None:
        k = c.kernel
        parts.append(f"kernel {k.family}/{k.variant or '-'} {json.dumps(k.config, sort_keys=True)}"
                     + (f" range {k.shape_bucket}" if k.shape_bucket else ""))
    return "; ".join(parts) or "(nothing)"


def history_section(trials: Sequence[Any], limit: int = 30) -> str:
    """The last `limit` trials as a Markdown table, each failure with its reason and detail."""
    if not trials:
        return "## Trial history\n\nNo trials yet: the incumbent is the current configuration.\n"
    rows = ["## Trial history (most recent last)", "",
            "| # | candidate | verdict | reason | gain | detail |", "|---|---|---|---|---|---|"]
    for t in list(trials)[-limit:]:
        failed = next((g for g in t.gates if not g.passed), None)
        # a failure's own detail; otherwise what was measured (a kernel's timings per bucket)
        detail = (failed.detail if failed else str(t.measurements.get("summary", "")))
        detail = detail[:300].replace("|", "/").replace("\n", " ")
        gain = f"{t.gain:+.2%}" if t.gain is not None else ""
        rows.append(f"| {t.number} | {_summ(t.candidate)[:300]} | {t.verdict} | {t.reason} | "
                    f"{gain} | {detail} |")
    return "\n".join(rows) + "\n"


def failure_key(t: Any) -> str:
    """A trial's outcome as `reason` or `reason/rule` (the judge's finer rule where one fired)."""
    rule = (t.measurements.get("judge") or {}).get("rule") if t.verdict == "rejected" else None
    return f"{t.reason}/{rule}" if rule else t.reason


def failures_section(trials: Sequence[Any]) -> str:
    """Every trial of the run counted by outcome: the model sees which mistakes keep recurring,
    also beyond the history window."""
    counts: dict[str, int] = {}
    for t in trials:
        if t.verdict != "kept":
            counts[failure_key(t)] = counts.get(failure_key(t), 0) + 1
    if not counts:
        return ""
    rows = ["## Failures so far, by reason code", "", "| reason | trials |", "|---|---|"]
    rows += [f"| {k} | {n} |" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "\n".join(rows) + "\n"


def ideas_section(ideas: Sequence[str]) -> str:
    """Directions from the operator (`--idea`): the search is theirs to steer."""
    if not ideas:
        return ""
    return ("## Direction from the operator (follow it unless the history shows it fails)\n\n"
            + "\n".join(f"- {i}" for i in ideas) + "\n")


def diagnosis_section(diagnosis: Optional[Any]) -> str:
    if not diagnosis:
        return ""
    if isinstance(diagnosis, str):
        return "## Diagnosis: where the time goes\n\n" + diagnosis.strip() + "\n"
    from tuner.workloads.diagnose import summary_markdown

    return summary_markdown(diagnosis)


def system_prompt(gpu_name: Optional[str], models: Sequence[str], policy: str) -> str:
    return "\n\n".join([INSTRUCTIONS, hardware_doc(gpu_name), model_docs(models), policy,
                        PROHIBITIONS])


def user_message(trials: Sequence[Any], diagnosis: Optional[Any], kinds: Sequence[str],
                 history_limit: int = 30, note: str = "", ideas: Sequence[str] = (),
                 task: str = "") -> str:
    """`task`: what this search asks for beyond the static context (a kernel search's family,
    reference, incumbent and best source so far); `ideas`: the operator's directions."""
    ask = {"host": "a host/runtime candidate", "kernel": "a kernel candidate"}
    want = " or ".join(ask[k] for k in kinds)
    parts = [ideas_section(ideas), task, diagnosis_section(diagnosis),
             failures_section(trials), history_section(trials, history_limit)]
    if note:
        parts.append(note)
    parts.append(f"Propose {want} now, through one tool call.")
    return "\n\n".join(p for p in parts if p)


def host_context(host: Any, policy: Any) -> dict[str, Any]:
    """What the LLM proposer is told about this host: the GPU model (its hardware context page)
    and the policy it must stay inside."""
    import yaml

    gpu = None
    if host.has_nvml():
        try:
            name = host.nvml.nvmlDeviceGetName(host.nvml.nvmlDeviceGetHandleByIndex(0))
            gpu = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # a GPU that cannot be named still gets the generic context
            gpu = None
    text = yaml.safe_dump(policy.model.model_dump(mode="json", exclude_none=True), sort_keys=False)
    return {"gpu": gpu, "policy_text": text}
