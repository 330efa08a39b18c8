"""Workloads by the name the user gives (`--workload NAME[:ARGS]`), a registry like the
proposers': each entry is a builder and the usage a help text shows. This folder registers its
own workloads below; a layer above registers its own with `register` (tuner/sim/__init__.py
registers `sim` and `sim-llama`), so nothing here imports it. Adding a workload: its module and
one `register(...)` line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from tuner.errors import BadInput


@dataclass(frozen=True)
class Spec:
    """One `--workload` value, split once: `name[:args]`, with what builders may need."""
    text: str
    name: str
    args: str  # after the first ':' ("" when none)
    host: Any
    metric_regex: Optional[str]
    timeout_s: float


@dataclass(frozen=True)
class Entry:
    build: Callable[[Spec], Any]
    usage: str  # e.g. "hf:<config>[:layers=N]"
    takes_args: bool = False  # `name:args` (cmd:, hf:, llama-tp:)
    backend: Optional[str] = None  # only on this host backend ("sim")


_REGISTRY: dict[str, Entry] = {}


def register(name: str, build: Callable[[Spec], Any], usage: Optional[str] = None, *,
             takes_args: bool = False, backend: Optional[str] = None) -> None:
    _REGISTRY[name] = Entry(build, usage or name, takes_args, backend)


def names() -> list[str]:
    return list(_REGISTRY)


def usage(first: Optional[str] = None) -> str:
    """`a | b | hf:<config>[:layers=N] | ...` for a help text (`first` named first)."""
    order = sorted(_REGISTRY, key=lambda n: (n != first, list(_REGISTRY).index(n)))
    return " | ".join(_REGISTRY[n].usage for n in order)


def parse(text: str, host: Any = None, metric_regex: Optional[str] = None,
          timeout_s: float = 600.0) -> Spec:
    name, sep, args = text.partition(":")
    entry = _REGISTRY.get(name)
    if entry is None or (sep and not entry.takes_args):
        raise BadInput(f"--workload: expected {usage()}, got {text!r}")
    return Spec(text, name, args, host, metric_regex, timeout_s)


def make_workload(host: Any, workload: Optional[str], metric_regex: Optional[str],
                  timeout_s: float) -> Any:
    """The workload named (default: `sim` on a simulated host, `llama` elsewhere)."""
    backend = getattr(host, "backend", None)
    if workload is None:
        workload = "sim" if backend == "sim" else "llama"
    spec = parse(workload, host, metric_regex, timeout_s)
    entry = _REGISTRY[spec.name]
    if entry.backend is not None and backend != entry.backend:
        raise BadInput(f"--workload {workload} needs --backend {entry.backend}")
    return entry.build(spec)


# -- this folder's workloads ------------------------------------------------------------------
def _llama(spec: Spec) -> Any:
    from tuner.workloads.llama import LlamaWorkload

    return LlamaWorkload()


def _deepseek(spec: Spec) -> Any:
    """`deepseek[-v3.2][:batch=B[,B..]][:ctx=C[,C..]]`: the size grid's decode batches and
    contexts (default: the workload's own grid)."""
    import torch

    from tuner.workloads.deepseek import DeepSeekConfig, DeepSeekWorkload

    grid: dict[str, list[int]] = {}
    for part in spec.args.split(":") if spec.args else []:
        key, eq, value = part.partition("=")
        nums = value.split(",")
        if not (eq and key in ("batch", "ctx") and all(n.isdigit() and int(n) > 0 for n in nums)):
            raise BadInput(f"--workload {spec.text}: expected batch=N[,N..] or ctx=N[,N..] "
                           f"(positive integers), got {part!r}")
        grid["decode_batches" if key == "batch" else "contexts"] = [int(n) for n in nums]
    # the real three layers on a GPU, the tiny preset on the CPU (interpreter kernels)
    big = torch.cuda.is_available()
    preset = {("deepseek", True): "deepseek-v3-3l", ("deepseek", False): "tiny",
              ("deepseek-v3.2", True): "deepseek-v3.2-3l",
              ("deepseek-v3.2", False): "tiny-v3.2"}[(spec.name, big)]
    return DeepSeekWorkload(DeepSeekConfig.preset(preset), **grid)


def _hf(spec: Spec) -> Any:
    from tuner.workloads.hf import HFWorkload, parse_spec

    try:
        parsed = parse_spec(spec.text)
        import transformers  # noqa: F401
    except ValueError as e:
        raise BadInput(str(e)) from None
    except ImportError:
        raise BadInput("--workload hf:...: needs transformers (pip install 'metaltune[hf]')") from None
    return HFWorkload(spec.text, parsed=parsed)


def _command(spec: Spec) -> Any:
    from tuner.workloads.command import CommandWorkload

    if not spec.metric_regex:
        raise BadInput("--workload cmd:... needs --metric-regex")
    return CommandWorkload(spec.args, spec.metric_regex, timeout_s=spec.timeout_s)


def _tensor_parallel(spec: Spec) -> Any:
    """`llama-tp[:PRESET][:tp=N][:p2p=on|off][:backend=nccl|gloo]` (defaults: tiny on CPUs and
    llama3-8b-4l on GPUs, tp 2, P2P on, NCCL when there are tp GPUs)."""
    from tuner.workloads.tensor_parallel import TensorParallelWorkload

    kw: dict[str, Any] = {}
    for part in spec.args.split(":") if spec.args else []:
        key, eq, value = part.partition("=")
        if not eq:
            kw["model"] = key
        elif key == "tp" and value.isdigit():
            kw["tp"] = int(value)
        elif key == "p2p" and value in ("on", "off"):
            kw["p2p"] = value == "on"
        elif key == "backend" and value in ("nccl", "gloo"):
            kw["backend"] = value
        else:
            raise BadInput(f"--workload {spec.text}: expected PRESET, tp=N, p2p=on|off or "
                           f"backend=nccl|gloo, got {part!r}")
    if "model" not in kw:
        import torch

        kw["model"] = "llama3-8b-4l" if torch.cuda.device_count() >= kw.get("tp", 2) else "tiny"
    try:
        return TensorParallelWorkload(**kw)
    except ValueError as e:
        raise BadInput(f"--workload {spec.text}: {e}") from None


register("llama", _llama)
register("deepseek", _deepseek, "deepseek[:batch=N,..][:ctx=N,..]", takes_args=True)
register("deepseek-v3.2", _deepseek, "deepseek-v3.2[:batch=N,..][:ctx=N,..]", takes_args=True)
register("hf", _hf, "hf:<config>[:layers=N]", takes_args=True)
register("llama-tp", _tensor_parallel, "llama-tp[:PRESET][:tp=N]", takes_args=True)
register("cmd", _command, "cmd:<command line>", takes_args=True)
