"""`metaltune search mixed`: host, runtime and kernel candidates in one search, any proposer.

Everything the user gives is checked before anything is measured or written (BadInput, exit 2).
Then: the joint space (tuner.search.mixed.space), the incumbent measured once, the loop with the
MixedEvaluator (tuner.search.mixed.evaluator), the kept dispatch table written to STATE_DIR/kernels/."""
from __future__ import annotations

import fnmatch
import os
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from tuner.errors import BadInput
from tuner.trial import Trial

NONE = "none"  # --knob none / --family none: leave that kind out
AUTO = "auto"  # --suggest-table auto: the tables shipped for this GPU


def make_mixed_workload(host: Any, workload: Optional[str], metric_regex: Optional[str],
                        timeout_s: float) -> Any:
    """What `search host` takes, defaulting to `sim-llama` on a sim host (the CPU Llama scaled by
    the sim host's model, so host and kernel effects show in one metric) and `llama` elsewhere."""
    from tuner.workloads.factory import make_workload

    if workload is None:
        workload = "sim-llama" if host.backend == "sim" else "llama"
    return make_workload(host, workload, metric_regex, timeout_s)


def _llama_of(wl: Any) -> Any:
    """The holistic workload inside `wl` (Llama, or one that declares itself `holistic` with its
    own RUNTIME_DIMS and Runtime, as tuner.workloads.hf does), or None."""
    from tuner.workloads.llama import LlamaWorkload

    inner = getattr(wl, "llama", wl)
    return inner if isinstance(inner, LlamaWorkload) or getattr(inner, "holistic", False) else None


def _kernels_usable(llama: Any) -> Optional[str]:
    """Why table kernels cannot run in this workload, or None."""
    if llama.model.device.type == "cuda":
        return None
    if os.environ.get("TRITON_INTERPRET") != "1":
        return ("kernels run on the CPU only under Triton's interpreter: set TRITON_INTERPRET=1 "
                "(or --family none)")
    return None


def _start_table(table: Optional[str]) -> Any:
    from kernelsearch import dispatch
    from kernelsearch.table import DispatchTable, TableError

    if table is None:
        return dispatch.installed()
    try:
        return DispatchTable.load(table)
    except TableError as e:
        raise BadInput(f"--table: {e}") from None


def _suggest_tables(suggest: Optional[list[str]]) -> list[Any]:
    """--suggest-table: "auto" (the tables shipped for this process's GPU; none without one),
    "none", or table paths, in the order a slot takes their choices."""
    from kernelsearch.shipped import shipped_tables
    from kernelsearch.table import DispatchTable, TableError

    names = list(suggest or [AUTO])
    if (AUTO in names or NONE in names) and len(names) > 1:
        raise BadInput("--suggest-table: 'auto' and 'none' cannot be combined with other values")
    if names == [NONE]:
        return []
    paths = shipped_tables() if names == [AUTO] else names
    out = []
    for p in paths:
        try:
            out.append(DispatchTable.load(p))
        except TableError as e:
            raise BadInput(f"--suggest-table: {e}") from None
    return out


def run_mixed_search(
    settings: Any, budget: int = 20, proposer: str = "random", policy: Optional[str] = None,
    knobs: Optional[list[str]] = None, families: Optional[list[str]] = None,
    runtime: Optional[bool] = None, seed: int = 0, repeats: int = 3, rounds: int = 3,
    workload: Optional[str] = None, metric_regex: Optional[str] = None, timeout_s: float = 600.0,
    max_choices: int = 6, table: Optional[str] = None, isolate: Optional[bool] = None,
    on_trial: Optional[Callable[[Trial], None]] = None, suggest: Optional[list[str]] = None,
) -> dict[str, Any]:
    from tuner import proposers
    from tuner.knobs import registry
    from tuner.search.mixed.space import RUNTIME_DIMS, kernel_slots, trace_kernel_calls

    if budget < 1:
        raise BadInput(f"--budget: expected a number ≥ 1, got {budget}")
    if rounds < 1 or repeats < 1:
        raise BadInput("--rounds/--repeats: expected numbers ≥ 1")
    if max_choices < 2:
        raise BadInput(f"--max-choices: expected ≥ 2 (torch and one kernel), got {max_choices}")
    if proposer not in proposers.names():
        raise BadInput(f"--proposer: unknown proposer {proposer!r}; expected one of "
                       f"{', '.join(proposers.names())}")
    for opt, vals in (("--knob", knobs), ("--family", families)):
        if vals and NONE in vals and len(vals) > 1:
            raise BadInput(f"{opt}: 'none' cannot be combined with other values")
    fams = list(families) if families else None
    if fams and NONE not in fams:
        from kernelsearch.families import NAMES

        bad = [f for f in fams if f not in NAMES]
        if bad:
            raise BadInput(f"--family: unknown kernel family {bad[0]!r}; expected one of "
                           f"{', '.join(NAMES)} or none")
    # the user's tables, read and checked before a host or workload is touched
    start_table = _start_table(table)
    suggestions = _suggest_tables(suggest) if fams != [NONE] else []
    host = settings.host()
    chosen: dict[str, Any] = {}
    if knobs != [NONE]:
        from tuner.search.host.run import DEFAULT_KNOBS

        found = registry.discover(host)
        if knobs:
            chosen = registry.select(found, knobs)  # UnknownKnob (exit 2) for a name with no match
        else:  # the defaults this host has (none on a host without GPUs)
            for pat in DEFAULT_KNOBS:
                chosen.update({n: k for n, k in found.items() if fnmatch.fnmatchcase(n, pat)})
        chosen = {n: k for n, k in chosen.items() if k.limits().search_values()}
        if knobs and not chosen:
            raise BadInput("--knob: no searchable knob among them on this host")
    wl = make_mixed_workload(host, workload, metric_regex, timeout_s)
    llama = _llama_of(wl)
    own_dims = getattr(wl, "runtime_dims", None)  # a workload with runtime settings of its own
    if runtime and llama is None and own_dims is None:
        raise BadInput("--runtime: runtime settings need a workload that has them "
                       "(llama, sim-llama, deepseek, hf:<config>, llama-tp)")
    runtime_dims = {} if runtime is False else (
        dict(own_dims) if own_dims is not None else
        dict(getattr(llama, "RUNTIME_DIMS", RUNTIME_DIMS)) if llama is not None else {})

    slots, notes = [], []
    if fams != [NONE]:
        why = "kernel slots need the llama, sim-llama or hf:<config> workload" if llama is None else _kernels_usable(llama)
        if why and fams:
            raise BadInput(f"--family: {why}")
        if why:
            notes.append(f"no kernel slots: {why}")
        else:
            from tuner.search.sources import store_in
            from tuner.search.mixed.space import stored_sources

            slots = kernel_slots(trace_kernel_calls(llama), fams, max_choices, start_table,
                                 sources=stored_sources(store_in(settings.state_dir)),
                                 suggest=suggestions,
                                 variants=getattr(llama, "KERNEL_VARIANTS", None))
            missing = sorted(set(fams or []) - {s.family for s in slots})
            if missing:
                raise BadInput(f"--family {missing[0]}: this workload makes no {missing[0]} call "
                               "in a dtype the family takes")
    if not (chosen or runtime_dims or slots):
        raise BadInput("nothing to search: no host knob, runtime setting or kernel slot")

    from tuner.search.safety_context import SafetyContext

    guard = SafetyContext(host, settings.ensure_state_dir(), policy=policy,  # BadInput: policy
                          measure_timeout_s=timeout_s)
    try:
        res = _run(host, guard, wl, chosen, runtime_dims, slots, start_table, suggestions,
                    budget=budget, proposer=proposer, seed=seed, repeats=repeats, rounds=rounds,
                    timeout_s=timeout_s, isolate=isolate, on_trial=on_trial,
                    meta={"knobs": sorted(chosen), "families": fams, "workload": workload or
                          getattr(wl, "name", "")})
    finally:
        guard.close()
        close = getattr(wl, "close", None)  # e.g. the rank processes of a multi-GPU workload
        if close is not None:
            close()
    return {**res, "notes": notes}


def build_evaluator(knobs: dict[str, Any], workload: Any, guard: Any,
                    runtime_dims: dict[str, list[Any]], slots: list[Any], start_table: Any = None,
                    *, rounds: int = 3, repeats: int = 3, timeout_s: float = 600.0,
                    isolate: Optional[bool] = None, store_dir: Optional[Path] = None) -> Any:
    """The MixedEvaluator over the joint space (its `.joint`), the host's current values, the
    workload's runtime and the start table's choices as the incumbent."""
    from tuner.search.host.evaluator import HostEvaluator
    from tuner.search.mixed.evaluator import MixedEvaluator, first_step_gain
    from tuner.search.mixed.space import Incumbent, JointSpace
    from tuner.search.runtime import RuntimeEvaluator

    llama = _llama_of(workload)
    searched = {s.family for s in slots}
    inc = Incumbent(
        host={n: k.read() for n, k in knobs.items()},
        runtime=_runtime_settings(workload, llama),
        kernels={s.name: s.covered_by(start_table) for s in slots},
        base_entries=[e for e in (start_table.entries if start_table else [])
                      if e.family not in searched])
    joint = JointSpace(knobs, runtime_dims, slots, inc)
    host_ev = HostEvaluator(knobs, workload, guard, incumbent=inc.host, timeout_s=timeout_s)
    rt_ev = RuntimeEvaluator(workload, incumbent=inc.runtime, rounds=rounds, repeats=repeats,
                             validate=_runtime_validator(workload, llama))
    if llama is not None:
        rt_ev.micro = lambda c: first_step_gain(workload, dict(inc.runtime),
                                                {**inc.runtime, **c.runtime})
    device = llama.model.device.type if llama is not None else "cpu"
    return MixedEvaluator(host_ev, rt_ev, joint, device=device, isolate=isolate,
                          store_dir=store_dir)


def _run(host: Any, guard: Any, wl: Any, chosen: dict[str, Any],
         runtime_dims: dict[str, list[Any]], slots: list[Any], start_table: Any,
         suggestions: list[Any], *, budget: int,
         proposer: str, seed: int, repeats: int, rounds: int, timeout_s: float,
         isolate: Optional[bool], on_trial: Optional[Callable[[Trial], None]],
         meta: dict[str, Any]) -> dict[str, Any]:
    from tuner.proposers import SearchSpace, make
    from tuner.proposers.llm.context import host_context
    from tuner.proposers.seeded import seeded
    from tuner.search import loop
    from tuner.search.store import TrialStore

    from tuner.search.sources import sources_dir

    ev = build_evaluator(chosen, wl, guard, runtime_dims, slots, start_table, rounds=rounds,
                         repeats=repeats, timeout_s=timeout_s, isolate=isolate,
                         store_dir=sources_dir(guard.state_dir))
    joint, inc = ev.joint, ev.joint.incumbent
    start_host, start_rt = dict(inc.host), dict(inc.runtime)
    space, kw = joint.space, {}
    if proposer == "llm":
        # host knobs and runtime through its schema (the prompt lists only host dims); sources
        # it would write go through `search kernel --proposer llm`, whose stored winners are
        # slot choices here
        space = SearchSpace(list(joint.host_dims), joint.to_candidate, joint.from_candidate)
        kw = {**host_context(host, guard.policy), "kinds": ("host",), "runtime_options": runtime_dims}
    elif proposer == "coordinate":
        kw = {"points_per_sweep": 3}  # many dims of few values: short sweeps
    prop = make(proposer, space, seed=seed, budget=budget, **kw)
    seeds = _suggested_points(joint, suggestions) if space is joint.space else []
    prop = seeded(prop, seeds, rationale="the dispatch table shipped for this GPU, every slot "
                                         "it covers")
    t0 = time.time()
    base = ev.measure_incumbent()
    with TrialStore.in_state_dir(guard.state_dir) as store:
        run_id = store.new_run("search-mixed", {
            **meta, "proposer": proposer, "seed": seed, "budget": budget,
            "dims": {d.name: len(d.values) for d in joint.space.dims},
            "baseline": base.model_dump(), "start": start_host})
        res = loop.run(prop, ev, store, run_id, budget, on_trial=on_trial)
    final = ev.incumbent_table()
    final.device, final.meta = ev.device, {"run_id": run_id, "by": "metaltune search mixed"}
    out = Path(guard.state_dir) / "kernels" / f"mixed-{run_id}.json"
    final.save(out)
    return summary(res.trials, run_id, inc, start_host, start_rt, base, out, final, joint,
                   round(time.time() - t0, 2))


def _suggested_points(joint: Any, suggestions: list[Any]) -> list[dict[str, Any]]:
    """The incumbent with every slot a suggestion table covers set to its choice: one point,
    none when the tables change nothing (or the incumbent has no point: unsearchable host)."""
    from tuner.search.mixed.space import suggested_point

    change = suggested_point(joint.slots, joint.incumbent.kernels, suggestions)
    p = joint.incumbent_point(partial=True)
    if not change or p is None or set(p) != set(joint.space.names):
        return []
    return [{**p, **change}]


def _runtime_settings(workload: Any, llama: Any) -> dict[str, Any]:
    own = getattr(workload, "runtime_settings", None)
    if own is not None:
        return dict(own())
    return asdict(llama.runtime) if llama is not None else {}


def _runtime_validator(workload: Any, llama: Any) -> Any:
    own = getattr(workload, "validate_runtime", None)
    if own is not None:
        return own
    if llama is None:
        return None
    from tuner.workloads.llama import Runtime

    return getattr(llama, "Runtime", Runtime).from_dict


def summary(trials: list[Trial], run_id: str, inc: Any, start_host: dict[str, Any],
            start_rt: dict[str, Any], base: Any, table_path: Path, table: Any, joint: Any,
            seconds: float) -> dict[str, Any]:
    """The kept changes by kind, counts by kind and verdict:reason, the table's path."""
    from tuner.knobs.base import values_equal
    from tuner.search.mixed.space import TORCH, kinds_of

    by_kind: dict[str, Counter] = {}
    for t in trials:
        for kind in kinds_of(t.candidate) or ["none"]:
            by_kind.setdefault(kind, Counter())[f"{t.verdict}:{t.reason}"] += 1
    return {
        "run_id": run_id, "trials": len(trials),
        "by_verdict": dict(Counter(t.verdict for t in trials)),
        "by_kind": {k: dict(sorted(c.items())) for k, c in sorted(by_kind.items())},
        "kept": {
            "host": {n: v for n, v in inc.host.items() if not values_equal(v, start_host.get(n))},
            "runtime": {k: v for k, v in inc.runtime.items() if v != start_rt.get(k)},
            "kernels": {n: v for n, v in inc.kernels.items() if v != TORCH},
        },
        "best_settings": dict(inc.host), "start": start_host,
        "slots": [s.name for s in joint.slots],
        "baseline": base.value, "table": str(table_path), "table_entries": len(table.entries),
        "seconds": seconds,
    }
