"""Workloads by the name the user gives (`--workload NAME[:ARGS]`), a registry like the
proposers': each entry is a builder and the usage a help text shows. This folder registers its
own workloads below; a layer above registers its own with `register` (tuner/sim/__init__.py
registers `sim` and `sim-llama`), so nothing here imports it. Adding a workload: its module and
one `register(...)` line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

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
    #: a search holds its model in a model process (tuner.workloads.model_process), the only
    #: place a table's stored sources run: True, built there by this same entry (`module`
    #: imported first); a function, how it holds one itself (sim-llama: the sim host's factor
    #: here, its Llama there); False, it runs in the search's process, stored sources refused
    model_process: Union[bool, Callable[[Spec], Any]] = False
    module: Optional[str] = None  # what registers it (imported by the model process)


_REGISTRY: dict[str, Entry] = {}


def register(name: str, build: Callable[[Spec], Any], usage: Optional[str] = None, *,
             takes_args: bool = False, backend: Optional[str] = None,
             model_process: Union[bool, Callable[[Spec], Any]] = False,
             module: Optional[str] = None) -> None:
    """`module`: the module whose import runs this line (default: `build`'s)."""
    _REGISTRY[name] = Entry(build, usage or name, takes_args, backend, model_process,
                            module or getattr(build, "__module__", None))


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


def resolve(host: Any, workload: str, metric_regex: Optional[str],
            timeout_s: float) -> tuple[Spec, Entry]:
    """`workload` split and its entry, BadInput for a name it lacks or the wrong backend."""
    spec = parse(workload, host, metric_regex, timeout_s)
    entry = _REGISTRY[spec.name]
    if entry.backend is not None and getattr(host, "backend", None) != entry.backend:
        raise BadInput(f"--workload {workload} needs --backend {entry.backend}")
    return spec, entry


def make_workload(host: Any, workload: Optional[str], metric_regex: Optional[str],
                  timeout_s: float) -> Any:
    """The workload named, built in this process (default: `sim` on a simulated host, `llama`
    elsewhere)."""
    if workload is None:
        workload = "sim" if getattr(host, "backend", None) == "sim" else "llama"
    spec, entry = resolve(host, workload, metric_regex, timeout_s)
    return entry.build(spec)


def make_held(host: Any, workload: str, metric_regex: Optional[str], timeout_s: float) -> Any:
    """The workload named, as a search holds it: where its entry says, its model in a model
    process (torch and the model are imported there, not here), else built here."""
    spec, entry = resolve(host, workload, metric_regex, timeout_s)
    if callable(entry.model_process):
        return entry.model_process(spec)
    if not entry.model_process:
        return entry.build(spec)
    from tuner.workloads.model_process import ModelWorkload, Recipe

    return ModelWorkload(Recipe(workload=spec.text, timeout_s=spec.timeout_s, module=entry.module))


def _lazy(target: str) -> Callable[[Spec], Any]:
    """A builder `module:function` imported when first built (torch stays out of start-up)."""
    mod, _, fn = target.partition(":")

    def build(spec: Spec) -> Any:
        import importlib

        return getattr(importlib.import_module(mod), fn)(spec)

    build.__module__ = mod
    return build


# -- this folder's workloads (each parses its own arguments) --------------------------------
register("llama", _lazy("tuner.workloads.llama:from_spec"), model_process=True)
register("deepseek", _lazy("tuner.workloads.deepseek:from_spec"),
         "deepseek[:batch=N,..][:ctx=N,..][:heads=N][:sq=1|2][:ragged=0|1]", takes_args=True,
         model_process=True)
register("deepseek-v3.2", _lazy("tuner.workloads.deepseek:from_spec"),
         "deepseek-v3.2[:batch=N,..][:ctx=N,..][:heads=N][:ragged=0|1]", takes_args=True,
         model_process=True)
register("hf", _lazy("tuner.workloads.hf:from_spec"), "hf:<config>[:layers=N]", takes_args=True,
         model_process=True)
register("llama-tp", _lazy("tuner.workloads.tensor_parallel:from_spec"),
         "llama-tp[:PRESET][:tp=N]", takes_args=True)
register("cmd", _lazy("tuner.workloads.command:from_spec"), "cmd:<command line>",
         takes_args=True)
register("vllm", _lazy("tuner.workloads.serving.workload:from_spec"),
         "vllm:<serve.toml|yaml>|vllm:model=DIR[,key=value...]", takes_args=True)
