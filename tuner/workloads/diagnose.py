"""Where the time goes: run the holistic workload under torch.profiler and classify each
operation as compute-bound, memory-bound or launch-bound.

- Each operation (aten op, grouped by input shapes) gets its time, FLOPs (the profiler's own
  count for matmuls) and an estimate of the bytes it must move (inputs read once, output written
  once, from the recorded shapes). Achieved FLOP/s and bytes/s against the measured ceilings
  give its class: `compute` or `memory` (whichever fraction of its ceiling is higher), or
  `launch` when its calls are too short to fill the device (average below `launch_us`) and it
  reaches under a third of either ceiling, or when it reaches under 5% of both (fixed per-call
  cost dominates).
- The timeline (device kernels on a GPU, leaf ops on a CPU) gives the idle gaps between
  operations: launch overhead that no kernel can remove, only CUDA graphs or fusion.
- On a GPU the step is also timed eagerly and as a CUDA graph replay: their difference is what
  graphs save (the CUDA-graphs-off trap, quantified).

`diagnose(...)` returns a plain dict (JSON-able); `summary_markdown` is what the LLM proposer
reads; `chart` draws it with matplotlib. Torch is imported inside functions.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional, Sequence

CLASSES = ("compute", "memory", "launch")
LAUNCH_US = {"cuda": 10.0, "cpu": 5.0}  # below this average an op cannot fill the device

ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


# -- ceilings ------------------------------------------------------------------------------------


def measure_ceilings(device: str, dtype: str = "bfloat16") -> dict[str, Any]:
    """Peak matmul FLOP/s and copy bytes/s on this device, measured now (~1 s)."""
    import torch

    dev = torch.device(device)
    dt = getattr(torch, dtype if dev.type == "cuda" else "float32")
    n = 4096 if dev.type == "cuda" else 512
    a = torch.randn(n, n, device=dev, dtype=dt)
    b = torch.randn(n, n, device=dev, dtype=dt)
    src = torch.randn((256 if dev.type == "cuda" else 16) * 2**20 // 4, device=dev)
    dst = torch.empty_like(src)

    def best(fn, reps):
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return min(times)

    t_mm = best(lambda: torch.mm(a, b), 10)
    t_cp = best(lambda: dst.copy_(src), 10)
    return {"flops_per_s": 2 * n**3 / t_mm, "bytes_per_s": 2 * src.numel() * 4 / t_cp,
            "source": f"measured now ({'bf16' if dev.type == 'cuda' else 'fp32'} {n}^3 matmul, "
                      f"{src.numel() * 4 >> 20} MiB copy)"}


def load_ceilings(path: str | Path) -> dict[str, Any]:
    """From a facts file: {flops_per_s, bytes_per_s} or the H200 baseline format
    (copy_GBps, matmul[].TFLOPs)."""
    from tuner.errors import BadInput

    from safety.inputs import load_json

    name = f"--ceilings {path}"
    d = load_json(path, name, error=BadInput)
    if not isinstance(d, dict):
        raise BadInput(f"{name}: expected a JSON object with flops_per_s and bytes_per_s, or "
                       f"copy_GBps and matmul[].TFLOPs, got {type(d).__name__}")

    def positive(v: Any, field: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise BadInput(f"{name}: field {field}: expected a positive number, got "
                           f"{type(v).__name__}")
        return float(v)

    if "flops_per_s" in d or "bytes_per_s" in d:
        return {"flops_per_s": positive(d.get("flops_per_s"), "flops_per_s"),
                "bytes_per_s": positive(d.get("bytes_per_s"), "bytes_per_s"), "source": str(path)}
    if "copy_GBps" not in d or "matmul" not in d:
        raise BadInput(f"{name}: expected flops_per_s and bytes_per_s, or copy_GBps and "
                       "matmul[].TFLOPs")
    mm = d["matmul"]
    if not isinstance(mm, list) or not mm or not all(isinstance(m, dict) for m in mm):
        raise BadInput(f"{name}: field matmul: expected a non-empty list of objects with TFLOPs")
    tflops = max(positive(m.get("TFLOPs"), f"matmul[{i}].TFLOPs") for i, m in enumerate(mm))
    copy = positive(d["copy_GBps"], "copy_GBps")
    return {"flops_per_s": tflops * 1e12, "bytes_per_s": copy * (1e12 if copy < 100 else 1e9),
            "source": str(path)}


# -- bytes an op must move -----------------------------------------------------------------------


def _numel(shape: Sequence[Any]) -> int:
    if not isinstance(shape, (list, tuple)) or not shape or not all(isinstance(s, int) for s in shape):
        return 0
    return math.prod(shape)


def op_bytes(name: str, shapes: Sequence[Any], elem: int) -> float:
    """Fewest bytes: every tensor input read once, the output written once (estimated from the
    input shapes: M x N for matrix products, else the largest input)."""
    tensors = [s for s in shapes if isinstance(s, (list, tuple)) and s and all(isinstance(x, int) for x in s)]
    if not tensors:
        return 0.0
    read = sum(_numel(s) for s in tensors)
    if any(k in name for k in ("mm", "matmul", "linear")) and len(tensors) >= 2:
        a, b = tensors[-2], tensors[-1]
        out = _numel(a[:-1]) * (b[-1] if len(b) >= 2 else 1)
    elif "attention" in name and len(tensors) >= 1:
        out = _numel(tensors[0])
    else:
        out = max(_numel(s) for s in tensors)
    return float((read + out) * elem)


# -- profiling -----------------------------------------------------------------------------------


def _phase_runner(wl_model: Any, phase: str, batch: int, ctx: int, runtime: Any) -> Any:
    from tuner.workloads.llama_runners import DecodeRunner, PrefillRunner

    cls = DecodeRunner if phase == "decode" else PrefillRunner
    return cls(wl_model, runtime, batch, ctx).prepare()


def _runner(model: Any, phase: str, batch: int, ctx: int, dispatch: Any, graphs: bool) -> Any:
    """A runner of the holistic Llama or of a transformers model (tuner.workloads.hf, whose
    "graphs" are its compiled fast path); a patched HF model calls the kernels itself."""
    from tuner.workloads import hf, llama

    if isinstance(model, hf.HFModel):
        cls = hf.DecodeRunner if phase == "decode" else hf.PrefillRunner
        return cls(model, hf.Runtime(compile=graphs), batch, ctx)
    cls = llama.DecodeRunner if phase == "decode" else llama.PrefillRunner
    return cls(model, llama.Runtime(cuda_graphs=graphs), batch, ctx, dispatch=dispatch)


def profile_phase(model: Any, phase: str, batch: int, ctx: int, steps: int, device: str,
                  dispatch: Any = None) -> dict[str, Any]:
    """Profile `steps` eager steps of one phase; returns op rows and the timeline."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    r = _runner(model, phase, batch, ctx, dispatch, graphs=False).prepare()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.no_grad(), profile(activities=acts, record_shapes=True, with_flops=True) as prof:
        for _ in range(steps):
            r.step()
        if device == "cuda":
            torch.cuda.synchronize()
    return {"prof": prof, "runner": r}


def _timeline(prof: Any, device: str) -> dict[str, float]:
    """Busy time and gaps over the profiled span (device kernels on a GPU, leaf aten ops on a
    CPU), in microseconds."""
    ivals = []
    for e in prof.events():
        if device == "cuda":
            if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
                ivals.append((e.time_range.start, e.time_range.end))
        elif e.name.startswith("aten::") and not e.cpu_children:
            ivals.append((e.time_range.start, e.time_range.end))
    if not ivals:
        return {"span_us": 0.0, "busy_us": 0.0, "gap_us": 0.0, "gap_frac": 0.0, "kernels": 0}
    ivals.sort()
    busy, cur_s, cur_e = 0.0, ivals[0][0], ivals[0][1]
    for s, e in ivals[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = ivals[-1][1] - ivals[0][0]
    span = max(span, max(e for _, e in ivals) - ivals[0][0])
    return {"span_us": float(span), "busy_us": float(busy), "gap_us": float(span - busy),
            "gap_frac": float((span - busy) / span) if span else 0.0, "kernels": len(ivals)}


def classify(avg_us: float, flops_frac: float, bytes_frac: float, launch_us: float) -> str:
    """compute / memory / launch for one operation (see the module docstring)."""
    best = max(flops_frac, bytes_frac)
    # too short to fill the device, or nowhere near either ceiling: fixed cost dominates
    if (avg_us < launch_us and best < 1 / 3) or best < 0.05:
        return "launch"
    return "compute" if flops_frac > bytes_frac else "memory"


def _rows(prof: Any, device: str, elem: int, ceil: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    rows = []
    launch_us = LAUNCH_US["cuda" if device == "cuda" else "cpu"]
    for ev in prof.key_averages(group_by_input_shape=True):
        if not ev.key.startswith("aten::"):
            continue
        t_us = float(ev.self_device_time_total if device == "cuda" else ev.self_cpu_time_total)
        if t_us <= 0:
            continue
        calls = int(ev.count)
        flops = float(getattr(ev, "flops", 0) or 0)
        shapes = list(getattr(ev, "input_shapes", []) or [])
        nbytes = op_bytes(ev.key, shapes, elem) * calls
        secs = t_us * 1e-6
        f_frac = flops / secs / ceil["flops_per_s"] if flops else 0.0
        b_frac = nbytes / secs / ceil["bytes_per_s"] if nbytes else 0.0
        avg = t_us / calls if calls else t_us
        cls = classify(avg, f_frac, b_frac, launch_us)
        rows.append({
            "op": ev.key, "shapes": json.dumps(shapes)[:120], "calls_per_step": calls / steps,
            "time_us_per_step": t_us / steps, "avg_us": avg, "tflops_per_s": flops / secs / 1e12,
            "gb_per_s": nbytes / secs / 1e9, "flops_frac": f_frac, "bytes_frac": b_frac,
            "class": cls,
        })
    rows.sort(key=lambda r: -r["time_us_per_step"])
    total = sum(r["time_us_per_step"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["time_us_per_step"] / total
    return rows


def _graph_vs_eager(model: Any, batch: int, ctx: int, steps: int, dispatch: Any) -> dict[str, float]:
    out = {}
    for name, graphs in (("eager", False), ("graph", True)):
        r = _runner(model, "decode", batch, ctx, dispatch, graphs).prepare()
        out[f"{name}_ms"] = batch / r.tokens_per_s(steps) * 1e3
    out["graph_speedup"] = out["eager_ms"] / out["graph_ms"]
    return out


def diagnose(model: str = "tiny", phase: str = "decode", batch: Optional[int] = None,
             ctx: Optional[int] = None, steps: int = 5, device: Optional[str] = None,
             ceilings: Optional[dict[str, Any]] = None, use_dispatch: bool = True,
             top: int = 15) -> dict[str, Any]:
    import torch

    from tuner.workloads.llama import Llama, LlamaConfig
    from tuner.workloads.llama_ops import load_dispatch

    if phase not in ("decode", "prefill"):
        from tuner.errors import BadInput

        raise BadInput(f"--phase: expected decode or prefill, got {phase!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device == "cuda"
    batch = batch or ((8 if gpu else 2) if phase == "decode" else 1)
    ctx = ctx or (4096 if gpu else 64)
    dispatch = load_dispatch() if use_dispatch else None
    m: Any
    if model.startswith("hf:"):  # a transformers model (tuner.workloads.hf), patched if a table is
        from tuner.workloads.hf import HFModel

        m = HFModel(model, device)
        dtype = m.dtype_name
        table = dispatch.installed() if dispatch is not None else None
        m.set_patch(table is not None, table)
    else:
        cfg = LlamaConfig.preset(model)
        m, dtype = Llama(cfg, device), cfg.dtype
    ceil = ceilings or measure_ceilings(device, dtype)
    elem = ELEMENT.get(dtype, 4)
    res = profile_phase(m, phase, batch, ctx, steps, device, dispatch)
    prof = res["prof"]
    rows = _rows(prof, device, elem, ceil, steps)
    tl = _timeline(prof, device)
    by_class = {c: sum(r["time_us_per_step"] for r in rows if r["class"] == c) for c in CLASSES}
    by_class["gaps"] = tl["gap_us"] / steps
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "workload": {"model": model, "phase": phase, "batch": batch, "ctx": ctx, "steps": steps,
                     "dtype": dtype, "dispatch": dispatch is not None},
        "ceilings": ceil, "ops": rows[:top], "ops_total": len(rows),
        "timeline": {**tl, "per_step_us": tl["span_us"] / steps},
        "by_class_us_per_step": by_class,
    }
    if gpu and phase == "decode":
        out["graphs"] = _graph_vs_eager(m, batch, ctx, 20, dispatch)
    if hasattr(m, "set_patch"):
        m.set_patch(False)  # the rotary wrapper is per modeling module: leave it as found
    out["findings"] = findings(out)
    return out


def findings(d: dict[str, Any]) -> list[str]:
    """A few plain sentences: what dominates and what would help."""
    bc = d["by_class_us_per_step"]
    total = sum(bc.values()) or 1.0
    lines = []
    share = {k: v / total for k, v in bc.items()}
    lines.append("time per step: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()))
    if share.get("gaps", 0) + share.get("launch", 0) > 0.3:
        lines.append("launch-bound: idle gaps and tiny kernels take "
                     f"{share.get('gaps', 0) + share.get('launch', 0):.0%}; CUDA graphs or fusion "
                     "remove it, faster kernels do not")
    mem = [r for r in d["ops"] if r["class"] == "memory"]
    if mem:
        worst = max(mem, key=lambda r: r["time_us_per_step"] * (1 - min(1.0, r["bytes_frac"])))
        lines.append(f"memory-bound: {worst['op']} {worst['shapes']} at {worst['bytes_frac']:.0%} "
                     f"of the bandwidth ceiling ({worst['time_us_per_step']:.1f} us/step)")
    comp = [r for r in d["ops"] if r["class"] == "compute"]
    if comp:
        c = comp[0]
        lines.append(f"compute-bound: {c['op']} {c['shapes']} at {c['flops_frac']:.0%} of the "
                     f"matmul ceiling")
    g = d.get("graphs")
    if g:
        lines.append(f"CUDA graphs: step {g['eager_ms']:.2f} ms eager vs {g['graph_ms']:.2f} ms "
                     f"replayed ({g['graph_speedup']:.2f}x): never turn them off")
    return lines


def summary_markdown(d: dict[str, Any], top: int = 10) -> str:
    w = d["workload"]
    lines = [f"## Diagnosis: where the time goes ({d['device']}, {w['phase']} batch {w['batch']} "
             f"ctx {w['ctx']}, {w['model']})", ""]
    lines += [f"- {f}" for f in d["findings"]]
    lines += ["", "| op | shapes | us/step | share | class | % FLOP ceiling | % bandwidth |",
              "|---|---|---|---|---|---|---|"]
    for r in d["ops"][:top]:
        lines.append(f"| {r['op']} | {r['shapes'][:60]} | {r['time_us_per_step']:.1f} | "
                     f"{r['share']:.0%} | {r['class']} | {r['flops_frac']:.0%} | {r['bytes_frac']:.0%} |")
    return "\n".join(lines) + "\n"


def chart(d: dict[str, Any], path: str | Path, top: int = 12) -> Path:
    """Horizontal bars of time per step for the top operations and the idle gaps, coloured by
    class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"compute": "#d62728", "memory": "#1f77b4", "launch": "#ff7f0e", "gaps": "#7f7f7f"}
    rows = d["ops"][:top]
    labels = [f"{r['op'].replace('aten::', '')} {r['shapes'][:28]}" for r in rows] + ["idle gaps"]
    vals = [r["time_us_per_step"] for r in rows] + [d["by_class_us_per_step"]["gaps"]]
    cols = [colors[r["class"]] for r in rows] + [colors["gaps"]]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(vals) + 1.5))
    ax.barh(range(len(vals))[::-1], vals, color=cols)
    ax.set_yticks(range(len(vals))[::-1], labels, fontsize=8)
    ax.set_xlabel("microseconds per step")
    w = d["workload"]
    ax.set_title(f"{d['device']}: {w['phase']} b{w['batch']} ctx{w['ctx']} ({w['model']})")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items()], loc="lower right")
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
