"""`metaltune search mixed`: host, runtime and kernel candidates in one search, any proposer.

Everything the user gives is checked before anything is measured or written (BadInput, exit 2).
Then: the joint space (tuner.search.mixed.space), the incumbent measured once, the loop with the
MixedEvaluator (tuner.search.mixed.evaluator), the kept dispatch table written to STATE_DIR/kernels/."""
from __future__ import annotations

import fnmatch
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from kernelsearch import dispatch
from kernelsearch.shipped import shipped_tables
from kernelsearch.table import DispatchTable, TableError
from tuner.errors import BadInput
from tuner.knobs import registry
from tuner.knobs.base import values_equal
from tuner.proposers import SearchSpace, make
from tuner.proposers.llm.context import host_context
from tuner.proposers.seeded import seeded
from tuner.search import loop
from tuner.search.host.evaluator import HostEvaluator
from tuner.search.host.run import DEFAULT_KNOBS, clamp_to_budget, kept_side, require_metric
from tuner.search.mixed.evaluator import MixedEvaluator, first_step_gain
from tuner.search.mixed.space import (TORCH, Incumbent, JointSpace, kernel_slots, kinds_of,
                                      stored_sources, suggested_point)
from tuner.search import objective as O
from tuner.search.objective import THROUGHPUT, tok_per_j
from tuner.search.options import AUTO, NONE, MixedSearchOptions
from tuner.search.runtime import RuntimeEvaluator
from tuner.search.safety_context import SafetyContext
from tuner.search.sources import sources_dir, store_in
from tuner.search.store import TrialStore
from tuner.sim import register_workloads
from tuner.trial import Trial
from tuner.workloads.base import Tunable
from tuner.workloads.factory import make_held

log = logging.getLogger(__name__)


def make_mixed_workload(host: Any, workload: Optional[str], metric_regex: Optional[str],
                        timeout_s: float) -> Tunable:
    """What `search host` takes, defaulting to `sim-llama` on a sim host (the CPU Llama scaled by
    the sim host's model, so host and kernel effects show in one metric) and `llama` elsewhere,
    held as its registry entry says (tuner.workloads.factory): an entry with `model_process`
    has its model in a model process, confined as the judge's child is, the only place a
    table's stored sources run."""
    register_workloads()  # `sim` and `sim-llama` are named (and refused off a sim host)
    if workload is None:
        workload = "sim-llama" if host.backend == "sim" else "llama"
    wl = make_held(host, workload, metric_regex, timeout_s)  # BadInput for a name it lacks
    if not isinstance(wl, Tunable):
        raise BadInput(f"--workload {workload}: not searchable here (it does not declare "
                       "tuner.workloads.base.Tunable)")
    return wl


def _start_table(table: Optional[str]) -> Any:
    if table is None:
        return dispatch.installed()
    try:
        return DispatchTable.load(table)
    except TableError as e:
        raise BadInput(f"--table: {e}") from None


def _suggest_tables(suggest: Optional[list[str]]) -> list[Any]:
    """--suggest-table: "auto" (the tables shipped for this process's GPU; none without one),
    "none", or table paths, in the order a slot takes their choices."""
    names = list(suggest or [AUTO])  # 'auto' or 'none' alone: MixedSearchOptions
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


def run_mixed_search(settings: Any, opts: Optional[MixedSearchOptions] = None, *,
                     on_trial: Optional[Callable[[Trial], None]] = None,
                     **kw: Any) -> dict[str, Any]:
    """`opts` (or the same as keyword arguments) as the operation takes them."""
    o = opts if opts is not None else MixedSearchOptions.parse("search_mixed", kw)
    knobs, fams = o.knobs, (list(o.families) if o.families else None)
    workload, table, suggest, runtime = o.workload, o.table, o.suggest, o.runtime
    # the user's tables, read and checked before a host or workload is touched
    start_table = _start_table(table)
    suggestions = _suggest_tables(suggest) if fams != [NONE] else []
    host = settings.host()
    chosen: dict[str, Any] = {}
    found = registry.discover(host)  # every knob: a power budget holds for every board
    if knobs != [NONE]:
        if knobs:
            chosen = registry.select(found, knobs)  # UnknownKnob (exit 2) for a name with no match
        else:  # the defaults this host has (none on a host without GPUs)
            for pat in DEFAULT_KNOBS:
                chosen.update({n: k for n, k in found.items() if fnmatch.fnmatchcase(n, pat)})
        chosen = {n: k for n, k in chosen.items() if k.limits().search_values()}
        if knobs and not chosen:
            raise BadInput("--knob: no searchable knob among them on this host")
    wl = make_mixed_workload(host, workload, o.metric_regex, o.timeout_s)
    own_dims = wl.runtime_dims()
    if runtime and not own_dims:
        raise BadInput("--runtime: runtime settings need a workload that has them "
                       "(llama, sim-llama, deepseek, hf:<config>, llama-tp)")
    runtime_dims = {} if runtime is False else own_dims

    slots, notes = [], []
    if fams != [NONE]:
        why = wl.kernels_usable()
        if why and fams:
            raise BadInput(f"--family: {why}")
        if why:
            notes.append(f"no kernel slots: {why}")
        else:
            sources = stored_sources(store_in(settings.state_dir))
            if sources and not wl.runs_stored_sources:  # as its registry entry says
                notes.append(f"stored kernel sources not tried: {wl.name} runs in the search's "
                             "process (its workload is not registered with model_process)")
                sources = {}
            slots = kernel_slots(wl.kernel_calls(), fams, o.max_choices, start_table,
                                 sources=sources, suggest=suggestions,
                                 variants=wl.kernel_variants())
            missing = sorted(set(fams or []) - {s.family for s in slots})
            if missing:
                raise BadInput(f"--family {missing[0]}: this workload makes no {missing[0]} call "
                               "in a dtype the family takes")
    if not (chosen or runtime_dims or slots):
        raise BadInput("nothing to search: no host knob, runtime setting or kernel slot")

    obj = O.of(o)
    guard = SafetyContext(host, settings.ensure_state_dir(), policy=o.policy,  # BadInput: policy
                          measure_timeout_s=o.timeout_s)
    try:
        res = _run(host, guard, wl, chosen, runtime_dims, slots, start_table, suggestions,
                    budget=o.budget, proposer=o.proposer, seed=o.seed, repeats=o.repeats,
                    rounds=o.rounds, timeout_s=o.timeout_s, isolate=o.isolate, on_trial=on_trial,
                    meta={"knobs": sorted(chosen), "families": fams,
                          "workload": workload or wl.name, **obj.describe()}, objective=obj,
                    others=found)
    finally:
        guard.close()
        wl.close()  # e.g. the rank processes of a multi-GPU workload
    return {**res, "notes": notes}


def build_evaluator(knobs: dict[str, Any], workload: Tunable, guard: Any,
                    runtime_dims: dict[str, list[Any]], slots: list[Any], start_table: Any = None,
                    *, rounds: int = 3, repeats: int = 3, timeout_s: float = 600.0,
                    isolate: Optional[bool] = None, store_dir: Optional[Path] = None,
                    objective: Any = None) -> Any:
    """The MixedEvaluator over the joint space (its `.joint`), the host's current values, the
    workload's runtime and the start table's choices as the incumbent."""
    inc = Incumbent.at_start({n: k.read() for n, k in knobs.items()},
                             workload.runtime_settings(), slots, start_table)
    joint = JointSpace(knobs, runtime_dims, slots, inc)

    host_ev = HostEvaluator(knobs, workload, guard, incumbent=inc.host, timeout_s=timeout_s,
                            objective=objective or THROUGHPUT)
    rt_ev = RuntimeEvaluator(workload, incumbent=inc.runtime, rounds=rounds, repeats=repeats,
                             validate=workload.validate_runtime)
    if workload.first_step_s is not None:
        rt_ev.micro = lambda c: first_step_gain(workload, dict(inc.runtime),
                                                {**inc.runtime, **c.runtime})
    return MixedEvaluator(host_ev, rt_ev, joint, device=workload.device, isolate=isolate,
                          store_dir=store_dir)


def _run(host: Any, guard: Any, wl: Any, chosen: dict[str, Any],
         runtime_dims: dict[str, list[Any]], slots: list[Any], start_table: Any,
         suggestions: list[Any], *, budget: int,
         proposer: str, seed: int, repeats: int, rounds: int, timeout_s: float,
         isolate: Optional[bool], on_trial: Optional[Callable[[Trial], None]],
         meta: dict[str, Any], objective: Any = None,
         others: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    if objective is not None:  # a workload without the objective's metric: refused up front
        require_metric(objective, wl, timeout_s)
    clamped = {}
    if objective is not None:  # power-capped: the run starts with every board within the budget
        clamped = clamp_to_budget(chosen, guard, objective,
                                  {n: k.read() for n, k in chosen.items()}, others)
    rate, plan = rate_plan(guard, chosen, budget)
    stopped: dict[str, Any] = {}
    ev = build_evaluator(chosen, wl, guard, runtime_dims, slots, start_table, rounds=rounds,
                         repeats=repeats, timeout_s=timeout_s, isolate=isolate,
                         store_dir=sources_dir(guard.state_dir), objective=objective)
    if objective is not None:  # power-capped: no power limit over the budget is proposed
        for d in ev.joint.host_dims:
            dom = ev.joint.doms[d.name]
            d.values[:] = [v for v in d.values if not isinstance(v, (int, float))
                           or objective.within_budget(d.name, dom.from_search(v))]
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
            "baseline": base.model_dump(), "start": start_host,
            "policy": str(guard.policy.source)})
        seen: list[Trial] = []

        def done() -> bool:  # the policy's hourly limit reached: stop and say so
            if rate is None or not rate.exhausted():
                return False
            stopped.update(rate.stopped(len(seen), budget))
            log.warning(stopped["message"])
            return True

        res = loop.run(prop, ev, store, run_id, budget, done=done,
                       on_trial=lambda t: (seen.append(t), on_trial and on_trial(t)))
    final = ev.incumbent_table()
    final.device, final.meta = ev.device, {"run_id": run_id, "by": "metaltune search mixed",
                                           **ev.host.objective.describe()}
    out = Path(guard.state_dir) / "kernels" / f"mixed-{run_id}.json"
    final.save(out)
    return {**summary(res.trials, run_id, inc, start_host, start_rt, base, out, final, joint,
                      round(time.time() - t0, 2)),
            **ev.host.objective.describe(), "budget_clamped": clamped,
            "policy_plan": plan, "stopped": stopped or None,
            "summary": ev.host.objective.summary([base], kept_side(res.trials) or [base])}


def rate_plan(guard: Any, knobs: dict[str, Any], budget: int) -> tuple[Any, Optional[str]]:
    """The budget against the policy's hourly change limits (tuner.search.rate_budget): refused
    up front when nothing may change this hour, said when it does not fit; (None, None): no
    host knob to limit."""
    if not knobs:
        return None, None
    from tuner.errors import OperationFailed
    from tuner.search import rate_budget

    rate = rate_budget.for_knobs(guard.policy, guard.journal, knobs)
    if rate.exhausted():
        raise OperationFailed(rate.stopped(0, budget)["message"])
    plan = rate.plan(budget, False)
    if plan:
        log.warning(plan)  # up front, before the baseline is measured
    return rate, plan


def _suggested_points(joint: Any, suggestions: list[Any]) -> list[dict[str, Any]]:
    """The incumbent with every slot a suggestion table covers set to its choice: one point,
    none when the tables change nothing (or the incumbent has no point: unsearchable host)."""
    change = suggested_point(joint.slots, joint.incumbent.kernels, suggestions)
    p = joint.incumbent_point(partial=True)
    if not change or p is None or set(p) != set(joint.space.names):
        return []
    return [{**p, **change}]


def summary(trials: list[Trial], run_id: str, inc: Any, start_host: dict[str, Any],
            start_rt: dict[str, Any], base: Any, table_path: Path, table: Any, joint: Any,
            seconds: float) -> dict[str, Any]:
    """The kept changes by kind, counts by kind and verdict:reason, the table's path."""
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
        "seconds": seconds, "baseline_tok_per_j": tok_per_j(base),
    }
