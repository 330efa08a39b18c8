"""Host search on the configured host (real or simulated): the same pieces as the demo, with the
user's policy, knob selection and workload."""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tuner.errors import BadInput
from tuner.search.options import HostSearchOptions
from tuner.trial import Trial

log = logging.getLogger(__name__)
DEFAULT_KNOBS = ["gpu*.power_limit_w", "gpu*.locked_clocks_mhz", "gpu*.locked_mem_clocks_mhz"]
BOOT = "boot."  # boot-time knobs: tried by trial boots (tuner.boot), one candidate per reboot


@dataclass
class SearchRun:
    run_id: str
    trials: list[Trial]
    evaluator: Any  # tuner.search.host.evaluator.HostEvaluator: its .incumbent holds the kept settings
    baseline: Any  # Measurement of the starting settings
    start: dict[str, Any]
    seconds: float
    clamped: dict[str, list[Any]] = field(default_factory=dict)  # {knob: [before, after]}
    plan: Optional[str] = None  # the budget against the policy's hourly limits, when it did not fit
    stopped: Optional[dict[str, Any]] = None  # the limit stopped the search (rate_budget.stopped)


def search_knobs(
    knobs: dict[str, Any], workload: Any, guard: Any, proposer: str, budget: int, *,
    seed: int = 0, repeats: int = 3, timeout_s: float = 600.0, baseline_repeats: int = 6,
    kind: str = "search-host", meta: Optional[dict[str, Any]] = None,
    proposer_kw: Optional[dict[str, Any]] = None,
    on_trial: Optional[Callable[[Trial], None]] = None,
    within_policy: bool = False,
    objective: Any = None,
    others: Optional[dict[str, Any]] = None,
    wait_for_policy: bool = False,
) -> SearchRun:
    """The host search both `search host` and the demo run: the knobs' own domains as the
    space, the current values as the incumbent, trials through `guard` (a SafetyContext) into
    the trial store in the guard's state dir. `within_policy`: the space is cut to what the
    guard's policy allows (`search host`: no trial spent on a refusal); the demo keeps the
    whole domain, to show the policy gate refusing. `objective` (tuner.search.objective;
    default throughput): what the keep rule keeps; under power-capped the space holds no power
    limit over the budget, and no board's limit (`others`: every knob on the host) stays over it.
    Under `within_policy` the budget is planned against the policy's
    hourly change limits (tuner.search.rate_budget): said up front when it does not fit, and the
    search stops when they are reached (`wait_for_policy`: waits for the window instead)."""
    from tuner.proposers import SearchSpace, make
    from tuner.search import loop
    from tuner.search import objective as O
    from tuner.search.host.evaluator import HostEvaluator
    from tuner.search.store import TrialStore

    obj = objective or O.THROUGHPUT
    start = {n: k.read() for n, k in knobs.items()}
    # a budget the policy cannot reach is refused before the probe measures anything
    clamp_to_budget(knobs, guard, obj, dict(start), others, dry=True)
    require_metric(obj, workload, timeout_s)  # before anything is written or a trial spent
    clamped = clamp_to_budget(knobs, guard, obj, start, others)  # the run starts within budget
    rate, plan, stopped = None, None, {}
    if within_policy:
        from tuner.search import rate_budget

        rate = rate_budget.for_knobs(guard.policy, guard.journal, knobs)
        if rate.exhausted() and not wait_for_policy:  # a second search within the hour
            from tuner.errors import OperationFailed

            raise OperationFailed(rate.stopped(0, budget)["message"])
        plan = rate.plan(budget, wait_for_policy)
        if plan:
            log.warning(plan)  # up front, before the baseline is measured

    def done() -> bool:
        if rate is None or not rate.exhausted():
            return False
        if wait_for_policy:
            rate.wait()
            return False
        stopped.update(rate.stopped(len(res_trials), budget))
        log.warning(stopped["message"])
        return True

    res_trials: list[Trial] = []
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
        d.values = [v for v in d.values if obj.within_budget(d.name, knobs[d.name].limits().from_search(v))]
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
        def seen(t: Trial) -> None:
            res_trials.append(t)
            if on_trial:
                on_trial(t)

        res = loop.run(prop, ev, store, run_id, budget, on_trial=seen, done=done)
    return SearchRun(run_id, res.trials, ev, base, start, round(time.time() - t0, 2), clamped,
                     plan=plan, stopped=stopped or None)


def require_metric(obj: Any, workload: Any, timeout_s: float) -> None:
    """An objective that reads more than tokens/s (energy, power, goodput): one measurement of
    the workload first, and BadInput (exit 2) when it does not report that metric, so the
    search refuses up front instead of reverting every trial for it."""
    if not obj.needs:
        return
    probe = workload.measure(repeats=1, timeout_s=timeout_s)
    try:
        obj.require(probe, getattr(workload, "name", None) or type(workload).__name__)
    except ValueError as e:
        raise BadInput(str(e)) from None


def clamp_to_budget(knobs: dict[str, Any], guard: Any, obj: Any, start: dict[str, Any],
                    others: Optional[dict[str, Any]] = None, dry: bool = False,
                    ) -> dict[str, list[Any]]:
    """power-capped: every board's power limit over the budget is brought down to the highest
    value of its grid within it before anything is measured, in a safety transaction confirmed
    like a kept change (so the A/B's incumbent side never runs past the budget either). That is
    the searched knobs (`start` is updated in place) and every other knob on the host the budget
    constrains (`others`, e.g. gpu1's limit when only gpu0 is searched, or every limit when only
    locked clocks are): a board left over the budget would break it whatever the search keeps.
    Returns {knob: [before, after]} for what it changed, for the result to say. A policy that
    refuses it, or a budget under a board's lowest limit, is bad input (exit 2)."""
    from tuner.errors import OperationFailed

    def constrained(n: str) -> bool:  # a knob whose every value could break the budget
        return not obj.within_budget(n, float("inf"))

    extra = {n: k for n, k in (others or {}).items() if n not in knobs and constrained(n)}
    values = {**{n: k.read() for n, k in extra.items()}, **start}
    targets = {**extra, **knobs}
    changes = {}
    for n, v in values.items():
        if not obj.within_budget(n, v):
            grid = [g for g in targets[n].limits().search_values() if obj.within_budget(n, g)]
            if not grid:
                lowest = min(targets[n].limits().search_values(), default=None)
                raise BadInput(f"--power-budget {obj.power_budget_w:g}: below {n}'s lowest "
                               f"limit ({lowest} W); give a budget of at least that")
            changes[n] = max(grid)
    if not changes:
        return {}
    refused = guard.policy_check_for(targets)
    for n, v in changes.items():
        why = refused(n, values[n], v)
        if why:
            ok = [g for g in targets[n].limits().search_values() if not refused(n, values[n], g)]
            floor = (f"the lowest {n} the policy allows from here is {min(ok):g} W: pass "
                     f"--power-budget {min(ok):g} or more, or " if ok else "")
            raise BadInput(f"--power-budget {obj.power_budget_w:g}: the policy refuses {n}={v} "
                           f"({why}); {floor}allow lower limits in a policy of your own "
                           f"(--policy FILE, a copy of {guard.policy.source} with a lower "
                           "min_fraction_of_default)")
    if dry:
        return changes
    try:
        txn = guard.begin({n: targets[n] for n in changes}, changes, label="power budget",
                          candidate_key=None)
        txn.confirm()
    except OperationFailed as e:
        raise OperationFailed(f"--power-budget: could not bring the power limit within it: {e}") from None
    start.update({n: v for n, v in changes.items() if n in knobs})
    return {n: [values[n], v] for n, v in changes.items()}


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
    from tuner.search import objective as O

    obj = O.of(o)
    host = settings.host()
    all_knobs = registry.discover(host)
    chosen = registry.select(all_knobs, knobs or DEFAULT_KNOBS)
    chosen = {n: k for n, k in chosen.items() if k.limits().search_values()}
    boot = {n: k for n, k in chosen.items() if n.startswith(BOOT)}
    chosen = {n: k for n, k in chosen.items() if n not in boot}
    if not chosen and not (boot and o.reboots):
        raise BadInput("no searchable knob among --knobs on this host"
                       + (f" ({', '.join(sorted(boot))} take effect at boot: --reboots N)"
                          if boot else ""))
    guard = SafetyContext(host, settings.ensure_state_dir(), policy=o.policy,
                          measure_timeout_s=timeout_s)
    if not chosen:  # boot-time knobs only: each candidate is a trial boot
        try:
            return {**_no_runtime_run(), **boot_search(settings, host, guard, boot, o)}
        finally:
            guard.close()
    wl = make_workload(host, o.workload, o.metric_regex, timeout_s)
    try:
        run = search_knobs(
            chosen, wl, guard, proposer, budget, seed=seed, repeats=repeats, timeout_s=timeout_s,
            baseline_repeats=max(4, repeats * 2), on_trial=on_trial, within_policy=True,
            objective=obj, others=all_knobs, wait_for_policy=o.wait_for_policy,
            proposer_kw=host_context(host, guard.policy) if proposer == "llm" else None)
        booted = boot_search(settings, host, guard, boot, o) if boot else {}
    finally:
        guard.close()
    counts = Counter(t.verdict for t in run.trials)
    return {**booted,
        "run_id": run.run_id, "trials": len(run.trials), "kept": counts.get("kept", 0),
        "reverted": counts.get("reverted", 0), "rolled_back": counts.get("rolled_back", 0),
        "rejected": dict(Counter(t.reason for t in run.trials if t.verdict == "rejected")),
        "baseline": run.baseline.value, "start": run.start,
        "best_settings": dict(run.evaluator.incumbent), "seconds": run.seconds,
        **obj.describe(), "baseline_tok_per_j": _tpj(run.baseline),
        "summary": obj.summary([run.baseline], kept_side(run.trials) or [run.baseline]),
        "budget_clamped": run.clamped,
        "budget": budget, "policy_plan": run.plan, "stopped": run.stopped,
    }


def boot_search(settings: Any, host: Any, guard: Any, knobs: dict[str, Any],
                o: HostSearchOptions) -> dict[str, Any]:
    """The boot-time knobs: left out (said) without --reboots; else their candidates queued and
    the first armed, the reboot asked for; the gate after each boot arms the next
    (tuner.ops.boot.continue_search) until the reboot budget is spent."""
    from tuner.boot import queue
    from tuner.boot.trial import try_boot

    if not o.reboots:
        return {"left_out": {n: "takes effect at boot: `--reboots N` tries boot-time candidates, "
                                "one reboot each" for n in sorted(knobs)}}
    counted = guard.policy_check_for(knobs)
    cands = queue.plan(knobs, lambda n, before, v: counted(n, before, v) is None)
    if not cands:
        return {"left_out": {n: f"the policy allows no change ({guard.policy.source})"
                             for n in sorted(knobs)}}
    journal = guard.journal
    q = queue.start(settings.state_dir, cands, o.reboots, policy=o.policy, workload=o.workload,
                    repeats=max(3, o.repeats * 2))
    return {"boot_search": queue.arm_next(settings.state_dir, q, lambda cand: try_boot(
        host, journal, guard.policy, dict(cand), workload=o.workload,
        repeats=q["repeats"]), journal)}


def _no_runtime_run() -> dict[str, Any]:
    return {"run_id": None, "trials": 0, "kept": 0, "reverted": 0, "rolled_back": 0,
            "rejected": {}, "baseline": None, "start": {}, "best_settings": {}, "seconds": 0.0}


def _tpj(m: Any) -> Any:
    from tuner.search.objective import tok_per_j

    return tok_per_j(m)


def kept_side(trials: list[Trial]) -> list[Any]:
    """The measurements of the last kept candidate as its trial recorded them (the host
    evaluator's pooled `candidate`, the holistic gate's repeats); [] when nothing was kept."""
    from tuner.trial import Measurement

    for t in reversed(trials):
        if t.verdict != "kept":
            continue
        got = t.measurements.get("candidate") or (t.measurements.get("holistic") or {}).get("candidate")
        if isinstance(got, dict):
            got = [got]
        if isinstance(got, list) and got:
            return [Measurement.model_validate(m) for m in got]
    return []
