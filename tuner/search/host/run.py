"""Host search on the configured host (real or simulated): the same pieces as the demo, with the
user's policy, knob selection and workload."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tuner.errors import BadInput
from tuner.search.options import HostSearchOptions
from tuner.trial import Trial

DEFAULT_KNOBS = ["gpu*.power_limit_w", "gpu*.locked_clocks_mhz", "gpu*.locked_mem_clocks_mhz"]


@dataclass
class SearchRun:
    run_id: str
    trials: list[Trial]
    evaluator: Any  # tuner.search.host.evaluator.HostEvaluator: its .incumbent holds the kept settings
    baseline: Any  # Measurement of the starting settings
    start: dict[str, Any]
    seconds: float


def search_knobs(
    knobs: dict[str, Any], workload: Any, guard: Any, proposer: str, budget: int, *,
    seed: int = 0, repeats: int = 3, timeout_s: float = 600.0, baseline_repeats: int = 6,
    kind: str = "search-host", meta: Optional[dict[str, Any]] = None,
    proposer_kw: Optional[dict[str, Any]] = None,
    on_trial: Optional[Callable[[Trial], None]] = None,
    within_policy: bool = False,
    objective: Any = None,
) -> SearchRun:
    """The host search both `search host` and the demo run: the knobs' own domains as the
    space, the current values as the incumbent, trials through `guard` (a SafetyContext) into
    the trial store in the guard's state dir. `within_policy`: the space is cut to what the
    guard's policy allows (`search host`: no trial spent on a refusal); the demo keeps the
    whole domain, to show the policy gate refusing. `objective` (tuner.search.objective;
    default throughput): what the keep rule keeps; under power-capped the space holds no power
    limit over the budget."""
    from tuner.proposers import SearchSpace, make
    from tuner.search import loop
    from tuner.search import objective as O
    from tuner.search.host.evaluator import HostEvaluator
    from tuner.search.store import TrialStore

    obj = objective or O.THROUGHPUT
    start = {n: k.read() for n, k in knobs.items()}
    clamp_to_budget(knobs, guard, obj, start)  # power-capped: the run starts within the budget
    incumbent = dict(start)
    allowed = allowed_now = None
    if within_policy:
        counted = guard.policy_check_for(knobs)  # with the journal: rate limits too

        def allowed(name: str, before: Any, value: Any) -> bool:
            return guard.policy.check(knobs[name], before, value) is None  # bounds and steps

        def allowed_now(name: str, before: Any, value: Any) -> bool:
            return counted(name, before, value) is None

    space = SearchSpace.for_knobs(knobs, start=start, allowed=allowed,
                                  current=lambda: incumbent, allowed_now=allowed_now)
    for d in space.dims:  # power-capped: never propose a limit over the budget
        d.values = [v for v in d.values if O.within_budget(obj, d.name, knobs[d.name].limits().from_search(v))]
    space.dims = [d for d in space.dims if d.values]
    if not space.dims:
        raise BadInput("the policy allows no change of " + ", ".join(sorted(knobs))
                       + f" from the current values ({guard.policy.source})")
    prop = make(proposer, space, seed=seed, budget=budget, **(proposer_kw or {}))
    ev = HostEvaluator(knobs, workload, guard, repeats=repeats, incumbent=incumbent,
                       timeout_s=timeout_s, objective=obj)
    t0 = time.time()
    base = ev.measure_incumbent(repeats=baseline_repeats)
    with TrialStore.in_state_dir(guard.state_dir) as store:
        run_id = store.new_run(kind, {**(meta or {}), "proposer": proposer, "knobs": sorted(knobs),
                                      "baseline": base.model_dump(), "start": start,
                                      "policy": str(guard.policy.source), **obj.describe()})
        res = loop.run(prop, ev, store, run_id, budget, on_trial=on_trial)
    return SearchRun(run_id, res.trials, ev, base, start, round(time.time() - t0, 2))


def clamp_to_budget(knobs: dict[str, Any], guard: Any, obj: Any, start: dict[str, Any]) -> None:
    """power-capped: a power limit over the budget is brought down to the highest value of its
    grid within it before anything is measured, in a safety transaction confirmed like a kept
    change (so the A/B's incumbent side never runs past the budget either); `start` is updated
    in place. A policy that refuses it is bad input (exit 2): nothing within the budget could be
    tried."""
    from tuner.errors import OperationFailed
    from tuner.search.objective import within_budget

    changes = {}
    for n, v in start.items():
        if not within_budget(obj, n, v):
            grid = [g for g in knobs[n].limits().search_values() if within_budget(obj, n, g)]
            if not grid:
                raise BadInput(f"--power-budget {obj.power_budget_w:g}: below {n}'s lowest limit")
            changes[n] = max(grid)
    if not changes:
        return
    refused = guard.policy_check_for(knobs)
    for n, v in changes.items():
        why = refused(n, start[n], v)
        if why:
            raise BadInput(f"--power-budget {obj.power_budget_w:g}: the policy refuses {n}={v} "
                           f"({why}; {guard.policy.source})")
    try:
        txn = guard.begin(knobs, changes, label="power budget", candidate_key=None)
        txn.confirm()
    except OperationFailed as e:
        raise OperationFailed(f"--power-budget: could not bring the power limit within it: {e}") from None
    start.update(changes)


def run_host_search(settings: Any, opts: Optional[HostSearchOptions] = None, *,
                    on_trial: Optional[Callable[[Trial], None]] = None,
                    **kw: Any) -> dict[str, Any]:
    """`opts` (or the same as keyword arguments) as the operation takes them."""
    from tuner.knobs import registry
    from tuner.proposers.llm.context import host_context
    from tuner.search.safety_context import SafetyContext
    from tuner.sim import register_workloads
    from tuner.workloads.factory import make_workload

    register_workloads()  # `sim` and `sim-llama` are named (and refused off a sim host)

    o = opts if opts is not None else HostSearchOptions.parse("search_host", kw)
    budget, proposer, knobs, seed, repeats = o.budget, o.proposer, o.knobs, o.seed, o.repeats
    timeout_s = o.timeout_s
    from tuner.search.objective import Objective

    obj = Objective.of(o)
    host = settings.host()
    all_knobs = registry.discover(host)
    chosen = registry.select(all_knobs, knobs or DEFAULT_KNOBS)
    chosen = {n: k for n, k in chosen.items() if k.limits().search_values()}
    if not chosen:
        raise BadInput("no searchable knob among --knobs on this host")
    wl = make_workload(host, o.workload, o.metric_regex, timeout_s)
    guard = SafetyContext(host, settings.ensure_state_dir(), policy=o.policy,
                          measure_timeout_s=timeout_s)
    try:
        run = search_knobs(
            chosen, wl, guard, proposer, budget, seed=seed, repeats=repeats, timeout_s=timeout_s,
            baseline_repeats=max(4, repeats * 2), on_trial=on_trial, within_policy=True,
            objective=obj,
            proposer_kw=host_context(host, guard.policy) if proposer == "llm" else None)
    finally:
        guard.close()
    counts = Counter(t.verdict for t in run.trials)
    return {
        "run_id": run.run_id, "trials": len(run.trials), "kept": counts.get("kept", 0),
        "reverted": counts.get("reverted", 0), "rolled_back": counts.get("rolled_back", 0),
        "rejected": dict(Counter(t.reason for t in run.trials if t.verdict == "rejected")),
        "baseline": run.baseline.value, "start": run.start,
        "best_settings": dict(run.evaluator.incumbent), "seconds": run.seconds,
        **obj.describe(), "baseline_tok_per_j": _tpj(run.baseline),
    }


def _tpj(m: Any) -> Any:
    from tuner.search.objective import tok_per_j

    return tok_per_j(m)
