"""Kernel search: the project's proposers over a kernel family's parameter space, one search per
shape bucket, every candidate judged by kernelsearch's harness (guard -> correctness -> timing,
in a child process), every trial in the trial store, the winners turned into a dispatch table.

Also the search-efficiency replay: the same proposers over timings measured once on the GPU
(benchmarks/bench_kernels.py), so Optuna, random and grid can be compared on identical data."""
from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

from tuner.errors import BadInput
from tuner.proposers import make
from tuner.proposers.base import Dim, Point, SearchSpace
from tuner.search import keep
from tuner.search.objective import THROUGHPUT
from tuner.trial import Candidate, GateResult, KernelChoice, Trial

Evaluate = Callable[[str, dict], dict]  # (variant, config) -> {"time_s"|None, "code", ...}


def kernel_space(family: str, shape: tuple, start: Optional[tuple[str, dict]] = None,
                 variants: Optional[list[str]] = None,
                 configs: Optional[list[tuple[str, dict]]] = None) -> SearchSpace:
    """One dimension for the variant plus the union of the variants' parameters. A point is valid
    when its variant's own parameters form a valid config for `shape`; parameters the variant
    does not use are "don't care" (several points are one config: the search measures it once
    and tells the proposer the same score for each, so samplers see a mostly valid space). The
    space's `branches` name each variant's own parameters, for samplers that model conditional
    spaces (Optuna). `configs`, when given, is the whole space instead: exactly these (variant,
    config) pairs are valid (a replayed grid, where nothing else was ever measured)."""
    from kernelsearch.families import get

    try:
        fam = get(family)
    except Exception:  # noqa: BLE001 - a replayed grid's family need not load any more
        if configs is None:
            raise
        fam = None
    in_grid = None if configs is None else {v for v, _ in configs}
    own: dict[str, dict[str, list]] = {}  # variant -> its parameters -> their values
    for n, var in (fam.variants.items() if fam else ()):
        if (var.kind == "library" or var.gpu_only) and in_grid is None \
                and not var.configs(shape):
            continue  # a library (or Gluon) kernel is a choice only where this host offers it
        if (variants is None or n in variants) and (in_grid is None or n in in_grid):
            own[n] = {k: sorted(vals) for k, vals in var.dims.items()}
    allowed: Optional[set[str]] = None
    if configs is not None:  # values the family no longer lists stay searchable
        for v, cfg in configs:
            d = own.setdefault(v, {})
            for k, x in cfg.items():
                d[k] = sorted(set(d.get(k, [])) | {x})
        allowed = {json.dumps([v, cfg], sort_keys=True) for v, cfg in configs}
    names = list(own)
    params: dict[str, list] = {}
    for d in own.values():
        for k, vals in d.items():
            params[k] = sorted(set(params.get(k, [])) | set(vals))
    dims = [Dim("variant", names)] + [Dim(k, vals) for k, vals in params.items()]
    bucket = "x".join(map(str, shape))

    def split(p: Point) -> tuple[str, dict]:
        return p["variant"], {k: p[k] for k in own[p["variant"]]}

    def valid(p: Point) -> bool:
        v, cfg = split(p)
        if any(cfg[k] not in own[v][k] for k in cfg):
            return False
        if allowed is not None:
            return json.dumps([v, cfg], sort_keys=True) in allowed
        assert fam is not None
        return fam.variants[v].valid(cfg, shape)

    def to_candidate(p: Point) -> Candidate:
        v, cfg = split(p)
        return Candidate(kernel=KernelChoice(family=family, variant=v, config=cfg,
                                             shape_bucket=bucket))

    def from_candidate(c: Candidate) -> Optional[Point]:
        if c.kernel is None or c.kernel.variant not in names:
            return None
        p: Point = {"variant": c.kernel.variant}
        for k, vals in params.items():
            p[k] = c.kernel.config.get(k, vals[0])
        return p

    st = None
    if start:
        st = from_candidate(Candidate(kernel=KernelChoice(family=family, variant=start[0],
                                                          config=start[1])))
    branches = ("variant", {v: [Dim(k, vals) for k, vals in d.items()] for v, d in own.items()})
    return SearchSpace(dims, to_candidate, from_candidate, valid=valid, start=st,
                       branches=branches)


def harness_evaluator(family: str, shape: tuple, device: str, dtype: Optional[str] = None,
                      isolate: bool = True, timeout_s: float = 300.0,
                      store: Any = None) -> Evaluate:
    """Each evaluation: the full judge on the variant's source with this config, timed at the
    bucket's shape (A/B against the torch op included). A `src:<sha256>` variant is read from
    `store` (a kernelsearch.store.SourceStore, digest checked) and always judged in a child."""
    from kernelsearch.families import get
    from kernelsearch.harness import check, floor_for
    from kernelsearch.table import source_digest

    fam = get(family)
    dt = dtype or (fam.dtypes[0] if device == "cuda" else (
        "float16" if fam.bound == "compute" or family == "decode_attention" else "float32"))

    def source_of(variant: str) -> str:
        sha = source_digest(variant)
        if sha is None:
            return fam.variants[variant].file.read_text()
        if store is None:
            raise BadInput(f"{family} {variant}: a stored source, and no kernel store was given")
        return store.source(sha)

    def evaluate(variant: str, config: dict, incumbent: Optional[tuple[str, dict]] = None) -> dict:
        against = None
        if incumbent is not None:
            against = (source_of(incumbent[0]), incumbent[1])
        stored = source_digest(variant) is not None
        var = fam.variants.get(variant)
        lib = {"library": var.library} if var is not None and var.kind == "library" else {}
        v = check(family, source_of(variant), config, device=device, isolate=isolate or stored,
                  timeout_s=timeout_s, dtypes=[dt], shapes=[shape] + fam.tiny_shapes[:1]
                  if device == "cuda" else [shape], timing_shapes=[shape], seeds=1,
                  reps=30 if device == "cuda" else 3, against=against,
                  ceilings=floor_for(device), **lib)
        return verdict_record(v)

    evaluate.ab_incumbent = True  # type: ignore[attr-defined]
    return evaluate


def verdict_record(v: Any) -> dict:
    """A harness Verdict as the search and the mixed evaluator record it: the code and rule,
    the time (one timed shape: a bucket) and the speed-up over every timed shape (the geometric
    mean; `speedup_min` beside it, so one shape cannot hide a regression elsewhere), and the
    scope: the device and the shapes checked and timed."""
    t = next(iter(v.timings.values()), {}) if v.accepted else {}
    return {"time_s": t.get("median_us", 0) * 1e-6 if v.accepted else None,
            "code": v.code, "rule": v.rule, "stage": v.stage, "detail": v.detail,
            "speedup_vs_torch": v.summary.get("speedup_geomean", t.get("speedup_vs_torch")),
            "speedup_min": v.summary.get("speedup_min"), "timings": v.timings,
            "vs_incumbent": t.get("incumbent_spread"), "device": v.device,
            "checked_shapes": v.checked_shapes, "skipped_shapes": v.skipped_shapes,
            "timed_shapes": v.timed_shapes, "checks": v.checks, "seconds": v.seconds,
            # the second yardstick (the best installed library kernel at the shape) and what
            # kind of variant this was
            "speedup_vs_library": v.summary.get("speedup_vs_library_geomean",
                                                t.get("speedup_vs_library")),
            "library": t.get("library"), "kind": getattr(v, "kind", "triton"),
            # energy a call beside time (kernelsearch.harness.timing.energy_costs; CUDA only)
            **{k: t.get(k) for k in ("energy_j", "mean_w", "energy_source", "library_energy_j",
                                     "library_mean_w", "energy_vs_library") if k in t}}


def replay_evaluator(grid: list[dict]) -> Evaluate:
    """Evaluations looked up in timings measured once (a bench_kernels.py grid)."""
    table = {(g["variant"], json.dumps(g["config"], sort_keys=True)): g for g in grid}

    def evaluate(variant: str, config: dict) -> dict:
        g = table.get((variant, json.dumps(config, sort_keys=True)))
        if g is None or "time_s" not in g:
            return {"time_s": None, "code": "incorrect" if g else "measure_failed",
                    "detail": (g or {}).get("error", "not in the replayed grid")}
        return {"code": "accepted", **{k: g[k] for k in ("time_s", "energy_j", "mean_w") if k in g}}

    return evaluate


class StartFirst:
    """A proposer that first hands out one given candidate (the previous bucket's winner,
    measured first for every proposer alike), then asks the wrapped one."""

    def __init__(self, proposer: Any, first: Optional[Candidate]):
        self.proposer, self.first = proposer, first

    def ask(self) -> Candidate:
        if self.first is not None:
            c, self.first = self.first, None
            return c
        return self.proposer.ask()

    def __getattr__(self, name: str) -> Any:  # tell, trial_cost, ...
        return getattr(self.proposer, name)


class KernelEvaluator:
    """The loop's evaluator for one shape bucket: each distinct config measured once through
    `evaluate` (after the first, A/B-ed against the incumbent config when the evaluation can),
    judged by the keep rule for kernel timings (tuner.search.keep.decide_time). An invalid or
    repeated point is recorded as a rejected trial and costs no measurement; a repeat still
    carries its config's score, so samplers see the several points of one config alike."""

    def __init__(self, space: SearchSpace, evaluate: Evaluate, objective: Any = None):
        self.space, self.evaluate_config = space, evaluate
        self.objective = objective or THROUGHPUT  # what decides: its kernel_cost, lower is better
        self.seen: dict[str, dict] = {}  # config key -> its evaluation
        self.timed: list[tuple[str, dict, float]] = []  # (variant, config, time_s) measured
        self.best: Optional[dict] = None
        self.first: Optional[dict] = None  # the first config measured (the bucket's start)
        self.history: list[tuple[int, Optional[float]]] = []  # (configs measured, time_s) per ask

    def gates(self) -> list[Any]:
        return []  # domain and duplicates are decided in evaluate: a repeat keeps its score

    def _measure(self, cand: Candidate) -> dict:
        point = self.space.from_candidate(cand)
        key = json.dumps([cand.kernel.variant, cand.kernel.config], sort_keys=True)
        if not self.space.is_valid(point):
            return {"time_s": None, "code": "out_of_domain", "detail": "invalid for this shape"}
        if key in self.seen:
            return dict(self.seen[key], code="duplicate")
        if getattr(self.evaluate_config, "ab_incumbent", False) and self.best is not None:
            # interleaved A/B against the incumbent config on the same inputs
            res = self.evaluate_config(cand.kernel.variant, cand.kernel.config,
                                       incumbent=(self.best["variant"], self.best["config"]))
        else:
            res = self.evaluate_config(cand.kernel.variant, cand.kernel.config)
        self.seen[key] = res
        return res

    def evaluate(self, cand: Candidate, trial: Trial) -> Trial:
        t0 = time.time()
        res = self._measure(cand)
        if res["code"] not in ("out_of_domain", "duplicate") and res.get("time_s"):
            self.timed.append((cand.kernel.variant, cand.kernel.config, res["time_s"]))
        measured, obj, best = res.get("time_s"), self.objective, self.best
        cost = obj.kernel_cost(res) if measured is not None else None
        objective = 1.0 / cost if cost else None
        refused = obj.kernel_refusal(res) if measured is not None else None
        if measured is None:
            verdict, reason = "rejected", res["code"] if res["code"] != "accepted" else "measure_failed"
        elif res.get("code") == "duplicate":
            verdict, reason = "rejected", "duplicate"
        elif refused:  # e.g. over the power budget, or no energy read
            verdict, reason = "reverted", refused
        elif objective is None:  # a zero cost: nothing to compare
            verdict, reason = "reverted", "worse"
        else:  # vs_incumbent: [p25, p75] of incumbent/candidate time per A/B round (time only)
            verdict, reason = keep.decide_time(cost, best["cost"] if best else None,
                                               obj.kernel_band(res))
        gates = [GateResult(gate="domain", passed=res["code"] != "out_of_domain",
                            code=None if res["code"] != "out_of_domain" else "out_of_domain")]
        if res["code"] not in ("out_of_domain", "duplicate"):
            passed = res["code"] == "accepted"
            gates.append(GateResult(gate=res.get("stage") or "harness", passed=passed,
                                    code=None if passed else res["code"],
                                    detail=(res.get("rule", "") + ": " + res.get("detail", ""))[:500]
                                    if not passed else ", ".join(res.get("checks", []))[:500]))
        trial.gates = gates
        trial.measurements = {k: res.get(k) for k in ("time_s", "speedup_vs_torch", "timings",
                                                      "energy_j", "mean_w") if res.get(k) is not None}
        trial.verdict, trial.reason, trial.objective = verdict, reason, objective  # type: ignore[assignment]
        trial.incumbent = 1.0 / best["cost"] if best else None
        trial.gain = (best["cost"] / cost - 1) if best and cost else None
        trial.duration_s = time.time() - t0
        if self.first is None and measured is not None and res.get("code") == "accepted":
            self.first = res
        if verdict == "kept":
            self.best = {"variant": cand.kernel.variant, "config": cand.kernel.config,
                         "time_s": measured, "cost": cost, "energy_j": res.get("energy_j"),
                         "mean_w": res.get("mean_w"), "speedup_vs_torch": res.get("speedup_vs_torch"),
                         "speedup_vs_library": res.get("speedup_vs_library"),
                         "library": res.get("library"), "evaluations": len(self.seen)}
        self.history.append((len(self.seen), measured))
        return trial


def search_bucket(family: str, shape: tuple, evaluate: Evaluate, proposer: str, budget: int,
                  seed: int = 0, store=None, run_id: str = "",
                  on_trial: Optional[Callable[[Trial], None]] = None,
                  start: Optional[tuple[str, dict]] = None,
                  variants: Optional[list[str]] = None,
                  prior: Optional[list[tuple[str, dict, float]]] = None,
                  configs: Optional[list[tuple[str, dict]]] = None,
                  objective: Any = None) -> dict:
    """The search loop (tuner.search.loop) until `budget` distinct configs were measured
    (invalid or duplicate asks are recorded but cost no measurement; at most 20 asks per
    measurement). `start` (the previous bucket's winner) is measured first, for every proposer
    alike; `prior` (the previous bucket's measured (variant, config, time_s)) goes to the
    proposer's warm start, which only model-based proposers use. `configs` limits the space to
    these configs (see `kernel_space`). Returns the best, the history and every measured config."""
    from tuner.search import loop

    space = kernel_space(family, shape, variants=variants, configs=configs)
    prop = make(proposer, space, seed=seed, budget=budget)

    def point_of(variant: str, config: dict) -> Optional[Point]:
        """The space's point for exactly this config, if it is one of the space's valid ones."""
        p = space.from_candidate(Candidate(kernel=KernelChoice(family=family, variant=variant,
                                                               config=config)))
        if p is None or not space.is_valid(p) or space.to_candidate(p).kernel.config != config:
            return None
        return p

    if prior:
        warm = [(p, 1.0 / t) for v, cfg, t in prior if t and (p := point_of(v, cfg)) is not None]
        if warm:
            prop.warm_start(warm)
    first = None
    if start and (sp := point_of(*start)) is not None:
        first = space.to_candidate(sp)
        first.proposer = "start"
    ev = KernelEvaluator(space, evaluate, objective)
    res = loop.run(StartFirst(prop, first), ev, store, run_id, budget * 20, on_trial=on_trial,
                   done=lambda: len(ev.seen) >= budget)
    return {"shape": list(shape), "best": ev.best, "evaluations": len(ev.seen),
            "asks": len(res.trials), "history": ev.history, "measured": ev.timed,
            "summary": ev.objective.kernel_summary(ev.first, ev.best)}


def run_kernel_search(state_dir: Path, family: str, budget: int = 20, proposer: str = "optuna",
                      seed: int = 0, device: Optional[str] = None, shapes: Optional[list] = None,
                      isolate: bool = True, table_out: Optional[Path] = None,
                      on_trial: Optional[Callable[[Trial], None]] = None,
                      timeout_s: float = 300.0, objective: Any = None) -> dict:
    """`metaltune search kernel`: a search per shape bucket, trials stored, dispatch table
    built from the buckets where the kernel beats the torch op (harness A/B). Each bucket
    starts from the previous bucket's winner, with its measurements as the proposer's prior.
    `objective` (default throughput) decides each bucket by its kernel cost; recorded with the
    run and its table; one the device cannot measure is refused up front."""
    from kernelsearch.families import NAMES, get

    if family not in NAMES:
        raise BadInput(f"--family: unknown kernel family {family!r}; expected one of "
                       f"{', '.join(NAMES)}")
    if budget < 1:
        raise BadInput(f"--budget: expected a positive number of trials, got {budget}")
    fam = get(family)
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if (why := (obj := objective or THROUGHPUT).kernel_ok(device)) is not None:
        raise BadInput(why)
    shapes = [tuple(s) for s in (shapes or (fam.search_shapes if device == "cuda"
                                            else fam.tiny_shapes[-1:]))]
    from tuner.search.store import TrialStore

    results = []
    with TrialStore.in_state_dir(state_dir) as store:
        run_id = store.new_run("kernel", {"family": family, "proposer": proposer,
                                          "budget": budget, "seed": seed, "device": device,
                                          "shapes": [list(s) for s in shapes],
                                          **obj.describe()})
        start, prior = None, None  # the previous bucket's winner and measurements
        for shape in shapes:
            ev = harness_evaluator(family, shape, device, isolate=isolate, timeout_s=timeout_s)
            r = search_bucket(family, shape, ev, proposer, budget, seed=seed, store=store,
                              run_id=run_id, on_trial=on_trial, start=start, prior=prior,
                              objective=obj)
            r.pop("history")
            prior = r.pop("measured") or prior
            if r["best"]:
                start = (r["best"]["variant"], r["best"]["config"])
            results.append(r)
    from kernelsearch.table import DispatchTable

    dt = fam.dtypes[0] if device == "cuda" else (
        "float16" if fam.bound == "compute" or family == "decode_attention" else "float32")
    rows = []
    for r in results:
        b = r["best"]
        if b and b.get("speedup_vs_torch"):
            row = {"shape": r["shape"], "dtype": dt, "variant": b["variant"],
                   "config": b["config"], "time_s": b["time_s"],
                   "baseline_s": b["time_s"] * b["speedup_vs_torch"],
                   "checked": [r["shape"]]}  # the judge checked and timed the bucket
            if b.get("speedup_vs_library") and b.get("library"):  # A/B-ed in the judge
                row.update(library_variant=b["library"],
                           library_s=b["time_s"] * b["speedup_vs_library"])
            row.update({k: b[k] for k in ("energy_j", "mean_w", "library_energy_j",
                                          "library_mean_w") if b.get(k)})
            rows.append(row)
    entries, range_checks = certified_entries(family, rows, device, isolate=isolate,
                                              objective=obj.name)
    table = DispatchTable(entries, device=device,
                          meta={"run_id": run_id, "proposer": proposer, "budget": budget,
                                "range_checks": range_checks, **obj.describe()})
    out = Path(table_out) if table_out else Path(state_dir) / "kernels" / f"{family}-{run_id}.json"
    table.save(out)
    return {"run_id": run_id, "family": family, "device": device, "proposer": proposer,
            "buckets": results, "table": str(out), "entries": len(table.entries),
            **obj.describe()}


def certified_entries(family: str, rows: list[dict], device: str, isolate: bool = True,
                      timeout_s: float = 300.0, source_of: Any = None, margin: float = 0.02,
                      table_device: str = "", objective: str = "throughput") -> tuple[list, list[dict]]:
    """The dispatch entries the rows imply, each certified at its largest point: a range runs
    to the midpoint between buckets, so the judge checks the kernel there (correctness in the
    table's dtype) before the table may cover it. A kernel that fails there loses its bucket
    (torch keeps the range). Returns (entries, the range checks made). `source_of(variant)`:
    the source of a variant that is no shipped file (a stored `src:<sha256>`)."""
    from kernelsearch.families import get
    from kernelsearch.harness import check
    from kernelsearch.table import build, evidence_of, plan, uncertified

    fam = get(family)
    checked: list[tuple] = []
    made: list[dict] = []
    rows = list(rows)
    while True:
        own = [(r["variant"], r["config"], r["dtype"], s) for r in rows for s in r["checked"]]
        todo = uncertified(plan(family, rows), evidence_of(checked + own))
        if not todo:
            return build(family, rows, margin=margin, device=table_device, checked=checked,
                         objective=objective), made
        for e, pt in todo:
            src = source_of(e.variant) if source_of is not None and e.variant not in fam.variants \
                else fam.variants[e.variant].file
            var = fam.variants.get(e.variant)
            lib = {"library": var.library} if var is not None and var.kind == "library" else {}
            v = check(family, src, e.config, device=device,
                      isolate=isolate, timeout_s=timeout_s, dtypes=[e.dtype], shapes=[pt],
                      seeds=1, random_shapes=0, timing=False,
                      ranges=[{"match": e.match, "ranges": e.ranges}],  # its interior too
                      **lib)
            made.append({"variant": e.variant, "config": e.config, "dtype": e.dtype,
                         "shape": list(pt), "code": v.code, "rule": v.rule})
            if v.accepted:
                checked.append((e.variant, e.config, e.dtype, pt))
            else:  # the kernel is wrong at a size its entry would route to it
                rows = [r for r in rows if not (r["variant"] == e.variant
                                                and r["config"] == e.config
                                                and fam.dims_dict(tuple(r["shape"]))
                                                and e.covers(fam.dims_dict(tuple(r["shape"]))))]


def replay_efficiency(res: dict, seeds: int = 10, budget_frac: float = 0.2,
                      proposers: tuple[str, ...] = ("optuna", "random", "grid")) -> list[dict]:
    """Per family, over the shapes whose grid was measured completely in a bench_kernels.py
    result, in sweep order: each proposer searches each shape with a budget of `budget_frac` of
    that shape's valid grid, starting from its own winner on the previous shape (as a per-bucket
    search does; model-based proposers also get its measured configs as a prior). The space
    searched is exactly the configs the grid measured: a config the replay has no timing for
    could not be judged, and the family's space may have changed since the grid was recorded.
    Reports how far each best is from the grid optimum: per shape, and pooled."""
    out = []
    for fr in res["families"]:
        rows = [r for r in fr["rows"] if not r.get("grid_truncated")
                and any("time_s" in g for g in r.get("grid", []))]
        if not rows:
            continue
        per_shape = []
        for row in rows:
            grid = row["grid"]
            ts = [g["time_s"] for g in grid if "time_s" in g]
            optimum = min(ts)
            per_shape.append({"shape": "x".join(map(str, row["shape"])), "grid_size": len(grid),
                              "budget": max(1, math.floor(budget_frac * len(grid))),
                              "optimum_us": optimum * 1e6,
                              "within_2pct_share": sum(1 for t in ts if t <= optimum * 1.02) / len(grid),
                              "median_over_best": statistics.median(ts) / optimum})
        rec = {"family": fr["family"], "shapes": per_shape, "seeds": seeds}
        for p in proposers:
            pcts: list[list[float]] = [[] for _ in rows]
            for s in range(seeds):
                start, prior = None, None
                for i, row in enumerate(rows):
                    ev = replay_evaluator(row["grid"])
                    r = search_bucket(fr["family"], tuple(row["shape"]), ev, p,
                                      per_shape[i]["budget"], seed=s * 1000 + i, start=start,
                                      prior=prior, configs=[(g["variant"], g["config"])
                                                            for g in row["grid"]])
                    best = r["best"]["time_s"] if r["best"] else float("inf")
                    pcts[i].append(100.0 * (best / (per_shape[i]["optimum_us"] * 1e-6) - 1))
                    if r["best"]:
                        start = (r["best"]["variant"], r["best"]["config"])
                    prior = r["measured"] or prior
            for i, ps in enumerate(pcts):
                per_shape[i][f"{p}_pct"] = statistics.median(ps)
                per_shape[i][f"{p}_hits"] = sum(1 for x in ps if x <= 2.0)
            flat = [x for ps in pcts for x in ps]
            rec[f"{p}_pct"] = statistics.median(flat)
            rec[f"{p}_hits"] = sum(1 for x in flat if x <= 2.0)
            rec[f"{p}_runs"] = len(flat)
        out.append(rec)
    return out


def summary(res: dict) -> dict[str, Any]:
    """The run in a few fields, with both yardsticks per bucket: the best config's speed-up
    over torch and over the best installed library kernel (None where none is offered)."""
    out = {k: res[k] for k in ("run_id", "family", "device", "proposer", "table", "entries")}
    out["buckets"] = [{"shape": b["shape"], "variant": (b.get("best") or {}).get("variant"),
                       "speedup_vs_torch": (b.get("best") or {}).get("speedup_vs_torch"),
                       "speedup_vs_library": (b.get("best") or {}).get("speedup_vs_library"),
                       "library": (b.get("best") or {}).get("library")}
                      for b in res.get("buckets", [])]
    return out
