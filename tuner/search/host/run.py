"""Host search on the configured host (real or simulated): the same pieces as the demo, with the
user's policy, knob selection and workload."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tuner.errors import BadInput
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
) -> SearchRun:
    """The host search both `search host` and the demo run: the knobs' own domains as the
    space, the current values as the incumbent, trials through `guard` (a SafetyContext) into
    the trial store in the guard's state dir."""
    from tuner.proposers import SearchSpace, make
    from tuner.search import loop
    from tuner.search.host.evaluator import HostEvaluator
    from tuner.search.store import TrialStore

    start = {n: k.read() for n, k in knobs.items()}
    space = SearchSpace.for_knobs(knobs, start=start)
    prop = make(proposer, space, seed=seed, budget=budget, **(proposer_kw or {}))
    ev = HostEvaluator(knobs, workload, guard, repeats=repeats, incumbent=dict(start),
                       timeout_s=timeout_s)
    t0 = time.time()
    base = ev.measure_incumbent(repeats=baseline_repeats)
    with TrialStore.in_state_dir(guard.state_dir) as store:
        run_id = store.new_run(kind, {**(meta or {}), "proposer": proposer, "knobs": sorted(knobs),
                                      "baseline": base.model_dump(), "start": start})
        res = loop.run(prop, ev, store, run_id, budget, on_trial=on_trial)
    return SearchRun(run_id, res.trials, ev, base, start, round(time.time() - t0, 2))


def run_host_search(
    settings: Any, budget: int = 30, proposer: str = "optuna", policy: Optional[str] = None,
    knobs: Optional[list[str]] = None, seed: int = 0, repeats: int = 3,
    workload: Optional[str] = None, metric_regex: Optional[str] = None, timeout_s: float = 600.0,
    on_trial: Optional[Callable[[Trial], None]] = None,
) -> dict[str, Any]:
    from tuner.knobs import registry
    from tuner.proposers.llm.context import host_context
    from tuner.search.safety_context import SafetyContext
    from tuner.workloads.factory import make_workload

    if budget < 1:
        raise BadInput("--budget: expected a number ≥ 1")
    host = settings.host()
    all_knobs = registry.discover(host)
    chosen = registry.select(all_knobs, knobs or DEFAULT_KNOBS)
    chosen = {n: k for n, k in chosen.items() if k.limits().search_values()}
    if not chosen:
        raise BadInput("no searchable knob among --knobs on this host")
    wl = make_workload(host, workload, metric_regex, timeout_s)
    guard = SafetyContext(host, settings.ensure_state_dir(), policy=policy, measure_timeout_s=timeout_s)
    try:
        run = search_knobs(
            chosen, wl, guard, proposer, budget, seed=seed, repeats=repeats, timeout_s=timeout_s,
            baseline_repeats=max(4, repeats * 2), on_trial=on_trial,
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
    }
