"""The loop for kernel sources: `metaltune search kernel --family F --proposer llm`.

propose (the LLM writes a whole candidate module) -> judge (guard, correctness at every shape
bucket of the family's workload plus the tiny and random shapes, timing at every bucket,
interleaved A/B against what the dispatch table runs there now) -> keep where it beats that
incumbent beyond the noise, the range carved between the measured buckets by
`kernelsearch.table.build`, merged into the table -> tell the proposer the verdict, the failing
rule and the timings. A source the judge accepts is stored content-addressed
(`kernelsearch.store`), whether or not it wins anywhere; the table names the winners as
`src:<sha256>`. Budgets: trials, tokens, dollars, and a stop after N trials in a row that keep
nothing.
"""
from __future__ import annotations

import inspect
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Optional

from tuner.search import gates as G
from tuner.errors import BadInput
from tuner.trial import Candidate, GateResult, Trial

ACTIVE = "active.json"  # STATE_DIR/kernels/ACTIVE: the table an applied profile installed
NOISE = 0.02  # a bucket is won when the A/B's p25 ratio is above 1 and its median above 1 + this
TORCH = "torch"


def sources_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "kernels" / "sources"


def store_in(state_dir: Path) -> Any:
    from kernelsearch.store import SourceStore

    return SourceStore(sources_dir(state_dir))


def _shape_key(shape: tuple) -> str:
    return "x".join(map(str, shape))


def checked_shapes(verdict: Any) -> list[list[int]]:
    """The shapes the correctness stage ran (the judge logs each check as '(r, c) dtype dist')."""
    own = getattr(verdict, "checked_shapes", None)
    if own:
        return [list(s) for s in own]
    out: list[list[int]] = []
    for c in verdict.checks:
        m = re.match(r"\(([\d, ]+)\)", c)
        if m:
            s = [int(x) for x in m.group(1).replace(" ", "").split(",") if x]
            if s not in out:
                out.append(s)
    return out


def timed_shapes(verdict: Any) -> list[list[int]]:
    own = getattr(verdict, "timed_shapes", None)
    if own:
        return [list(s) for s in own]
    return [[int(x) for x in k.split(":")[0].split("x")] for k in verdict.timings]


class SourceEvaluator:
    """Judges a proposed source at every bucket against the incumbent table; moves the table."""

    def __init__(self, family: str, buckets: list[tuple], device: str, table: Any, store: Any,
                 run_id: str = "", timeout_s: float = 300.0, mem_limit_mb: int = 6144,
                 seeds: int = 2, reps: Optional[int] = None, noise: float = NOISE):
        from kernelsearch.families import get

        self.family, self.fam = family, get(family)
        self.buckets = [tuple(b) for b in buckets]
        self.device = device
        self.table = table  # the incumbent: moves when a trial keeps something
        self.store = store
        self.run_id = run_id
        self.timeout_s, self.mem_limit_mb, self.seeds = timeout_s, mem_limit_mb, seeds
        self.reps = reps if reps is not None else (30 if device == "cuda" else 3)
        self.noise = noise
        self.dtype = self._timing_dtype()
        self.best: Optional[dict[str, Any]] = None  # the last kept source (sha, source, gain)
        self.seen: set[str] = set()

    def _timing_dtype(self) -> str:
        from kernelsearch.harness.judge import default_dtypes

        dts = default_dtypes(self.fam, self.device)
        return "bfloat16" if self.device == "cuda" and "bfloat16" in dts else dts[0]

    # -- gates ---------------------------------------------------------------------------------
    def gates(self) -> list[G.Gate]:
        return [self._is_source, self._new]

    def _is_source(self, c: Candidate) -> GateResult:
        k = c.kernel
        if k is None or not k.source:
            return GateResult(gate="known", passed=False, code="malformed",
                              detail="a kernel source search takes kernel candidates with source")
        if k.family != self.family:
            return GateResult(gate="known", passed=False, code="out_of_domain",
                              detail=f"this search is for {self.family}, not {k.family}")
        return GateResult(gate="known", passed=True)

    def _new(self, c: Candidate) -> GateResult:
        key = json.dumps([c.kernel.source, c.kernel.config], sort_keys=True)
        if key in self.seen:
            return GateResult(gate="duplicate", passed=False, code="duplicate",
                              detail="this source and config were judged before in this run")
        return GateResult(gate="duplicate", passed=True)

    # -- the incumbent ---------------------------------------------------------------------------
    def incumbent(self, shape: tuple) -> Optional[Any]:
        """The table entry that runs at this bucket now (None: torch)."""
        if self.table is None:
            return None
        return self.table.lookup(self.family, self.dtype, self.fam.dims_dict(shape))

    def _incumbent_source(self, e: Any) -> tuple[str, dict]:
        from kernelsearch.table import source_digest

        sha = source_digest(e.variant)
        src = self.store.source(sha) if sha else self.fam.variants[e.variant].file.read_text()
        return src, dict(e.config)

    def _groups(self) -> list[tuple[Optional[Any], list[tuple]]]:
        groups: dict[str, tuple[Optional[Any], list[tuple]]] = {}
        for b in self.buckets:
            e = self.incumbent(b)
            key = TORCH if e is None else json.dumps([e.variant, e.config], sort_keys=True)
            groups.setdefault(key, (e, []))[1].append(b)
        return list(groups.values())

    # -- one trial -------------------------------------------------------------------------------
    def evaluate(self, c: Candidate, trial: Trial) -> Trial:
        from kernelsearch.harness import check
        from kernelsearch.harness.timing import H200

        k = c.kernel
        self.seen.add(json.dumps([k.source, k.config], sort_keys=True))
        per_bucket: dict[str, dict[str, Any]] = {}
        verdicts = []
        for i, (inc, bks) in enumerate(self._groups()):
            # the first judgement checks every bucket (the largest included), the held-out (on
            # a GPU) or tiny shapes and random ones; later ones (another incumbent) time theirs
            extra = self.fam.heldout_shapes if self.device == "cuda" else self.fam.tiny_shapes
            shapes = (self.buckets + [tuple(s) for s in extra if tuple(s) not in self.buckets]
                      if i == 0 else bks)
            v = check(self.family, k.source, k.config, device=self.device,
                      timeout_s=self.timeout_s, mem_limit_mb=self.mem_limit_mb,
                      shapes=shapes, random_shapes=2 if i == 0 else 0, seeds=self.seeds,
                      timing_shapes=bks, timing_dtype=self.dtype, reps=self.reps,
                      against=self._incumbent_source(inc) if inc is not None else None,
                      ceilings=H200 if self.device == "cuda" else None)
            verdicts.append(v)
            trial.gates.append(GateResult(
                gate=v.stage, passed=v.accepted, code=None if v.accepted else v.code,
                seconds=v.seconds,
                detail=(f"{len(v.checks) - 1} checks passed" if v.accepted
                        else f"{v.rule}: {v.detail}")[:600]))
            if not v.accepted:
                trial.verdict, trial.reason = "rejected", v.code
                trial.measurements["judge"] = {"stage": v.stage, "code": v.code, "rule": v.rule}
                return trial
            for b in bks:
                per_bucket[_shape_key(b)] = self._bucket(b, inc, v)
        v0 = verdicts[0]
        trial.measurements["judge"] = {"stage": v0.stage, "code": v0.code, "rule": v0.rule,
                                       "checks": len(v0.checks)}
        rec = self.store.put(
            self.family, k.source, k.config, v0.to_dict(),
            checked=checked_shapes(v0), timed=[list(b) for b in self.buckets], device=self.device,
            origin={"run_id": self.run_id, "trial": trial.number, "proposer": c.proposer,
                    "rationale": c.rationale[:1000], "ideas": list(trial.ideas),
                    "timings": per_bucket})
        trial.measurements["source_sha256"] = rec.sha256
        trial.measurements["buckets"] = per_bucket
        wins = [b for b in self.buckets if per_bucket[_shape_key(b)]["wins"]]
        trial.measurements["won"] = [_shape_key(b) for b in wins]
        trial.measurements["summary"] = self._summary(per_bucket)
        speed = [per_bucket[_shape_key(b)]["speedup"] for b in self.buckets]
        trial.objective = math.exp(sum(math.log(max(s, 1e-12)) for s in speed) / len(speed))
        trial.incumbent = 1.0
        if wins:
            entries = self._carve(rec.sha256, k.config, per_bucket)
            from kernelsearch.table import DispatchTable, merge

            base = self.table if self.table is not None else DispatchTable(device=self.device)
            self.table = merge(base, entries, note=f"run {self.run_id} trial {trial.number}: "
                               f"src:{rec.sha256[:12]} at {', '.join(map(_shape_key, wins))}")
            won = [per_bucket[_shape_key(b)]["speedup"] for b in wins]
            trial.gain = math.exp(sum(math.log(s) for s in won) / len(won)) - 1.0
            trial.verdict, trial.reason = "kept", "improved"
            trial.measurements["entries"] = [e.__dict__ for e in entries]
            self.best = {"sha256": rec.sha256, "source": k.source, "config": dict(k.config),
                         "gain": trial.gain, "won": trial.measurements["won"]}
        else:
            faster = any(s["speedup"] > 1.0 for s in per_bucket.values())
            trial.verdict, trial.reason = "reverted", "within_noise" if faster else "worse"
            trial.gain = trial.objective - 1.0
        return trial

    def _bucket(self, shape: tuple, inc: Optional[Any], v: Any) -> dict[str, Any]:
        t = v.timings.get(f"{_shape_key(shape)}:{self.dtype}", {})
        if inc is None:
            sp, spread = t.get("speedup_vs_torch"), t.get("speedup_spread")
        else:
            sp, spread = t.get("speedup_vs_incumbent"), t.get("incumbent_spread")
        sp = float(sp or 0.0)
        spread = list(spread or [sp, sp])
        wins = spread[0] > 1.0 and sp > 1.0 + self.noise
        return {"incumbent": TORCH if inc is None else inc.variant,
                "incumbent_config": {} if inc is None else dict(inc.config),
                "median_us": t.get("median_us"), "speedup": sp, "spread": spread,
                "incumbent_us": (t.get("median_us") or 0.0) * sp, "wins": wins}

    def _carve(self, sha: str, config: dict, per_bucket: dict[str, dict]) -> list[Any]:
        """Entries where it wins: ranges run to the geometric midpoints between measured
        buckets (table.build), never into a bucket it lost."""
        from tuner.search.kernel import certified_entries

        rows = []
        for b in self.buckets:
            r = per_bucket[_shape_key(b)]
            t = (r["median_us"] or 0.0) * 1e-6
            rows.append({"shape": list(b), "dtype": self.dtype,
                         "variant": f"src:{sha}" if r["wins"] else None, "config": dict(config),
                         "time_s": t, "baseline_s": t * r["speedup"],
                         "checked": [list(b)]})  # the judge checked and timed every bucket
        # a range runs to the midpoint between buckets: checked there before the table covers it
        entries, _ = certified_entries(self.family, rows, self.device, isolate=True,
                                       source_of=lambda v: self.store.source(sha),
                                       margin=self.noise, table_device=self.device)
        return entries

    @staticmethod
    def _summary(per_bucket: dict[str, dict]) -> str:
        return "; ".join(f"{b}: {r['median_us'] or 0:.1f} us, x{r['speedup']:.2f} vs "
                         f"{r['incumbent']} [{r['spread'][0]:.2f}, {r['spread'][-1]:.2f}]"
                         + (" WON" if r["wins"] else "") for b, r in per_bucket.items())

    # -- what the proposer is told ---------------------------------------------------------------
    def task(self) -> str:
        """The kernel search's section of every prompt: the family, its reference and torch
        default, the buckets with the incumbent at each, the current best source."""
        fam = self.fam
        from kernelsearch.harness.timing import H200

        lines = [f"## Task: a faster `{self.family}` kernel", "",
                 f"Signature: `{fam.signature}`; dtypes {', '.join(fam.dtypes)} (judged on every "
                 f"one; timed in {self.dtype}). Shape dims {', '.join(fam.shape_dims)}: the "
                 f"dispatch table matches {', '.join(fam.exact_dims)} exactly and covers ranges of "
                 f"{', '.join(fam.range_dims)}. Extra keyword arguments of `forward` come from "
                 "`config`.", "", "The float64 reference the output is checked against:", "",
                 "```python", inspect.getsource(fam.reference).strip(), "```", "",
                 "The torch default (what runs where the table has no kernel):", "",
                 "```python", inspect.getsource(fam.torch_default).strip(), "```", "",
                 "Shape buckets of the workload (a kernel is kept where it beats the incumbent "
                 "there by more than the noise):", "",
                 "| bucket | incumbent | bytes moved | floor at H200 rates |", "|---|---|---|---|"]
        for b in self.buckets:
            e = self.incumbent(b)
            inc = TORCH if e is None else f"{e.variant} {json.dumps(e.config, sort_keys=True)}"
            nbytes = fam.bytes_moved(b, 2 if self.dtype != "float32" else 4)
            lines.append(f"| {_shape_key(b)} | {inc} | {nbytes / 1e6:.3g} MB | "
                         f"{H200.floor_s(nbytes, fam.flops(b)) * 1e6:.3g} us |")
        if self.best:
            lines += ["", f"Current best source (kept, {self.best['gain']:+.1%} where it won: "
                          f"{', '.join(self.best['won'])}; config "
                          f"{json.dumps(self.best['config'])}):", "", "```python",
                      self.best["source"].strip(), "```"]
        return "\n".join(lines) + "\n"


class Budget:
    """The run's budgets beyond the trial count, as `loop.run(done=)`: tokens or dollars spent,
    or `stop_after` trials in a row that kept nothing (rejected or lost). `why` says which."""

    def __init__(self, proposer: Any, max_tokens: Optional[int] = None,
                 max_usd: Optional[float] = None, stop_after: Optional[int] = None):
        self.proposer = proposer
        self.max_tokens, self.max_usd, self.stop_after = max_tokens, max_usd, stop_after
        self.why = ""

    def __call__(self) -> bool:
        from tuner.proposers.llm.cost import TOKEN_FIELDS

        total = getattr(getattr(self.proposer, "ledger", None), "total", {}) or {}
        tokens = sum(total.get(f, 0.0) for f in TOKEN_FIELDS)
        if self.max_tokens is not None and tokens >= self.max_tokens:
            self.why = f"token budget spent: {tokens:.0f} of {self.max_tokens}"
        elif self.max_usd is not None and total.get("usd", 0.0) >= self.max_usd:
            self.why = f"dollar budget spent: ${total['usd']:.4f} of ${self.max_usd:g}"
        elif self.stop_after:
            streak = 0
            for t in reversed(getattr(self.proposer, "trials", [])):
                if t.verdict == "kept":
                    break
                streak += 1
            if streak >= self.stop_after:
                self.why = (f"{streak} trials in a row kept nothing "
                            f"(--stop-after {self.stop_after})")
        return bool(self.why)


def default_buckets(family: str, device: str) -> list[tuple]:
    """Every shape bucket the family's workload uses: on a GPU its search shapes (model sizes;
    decode attention up to 128k contexts); on the CPU interpreter the tiny ones. The held-out
    shapes are never buckets (the proposer never sees them): correctness only."""
    from kernelsearch.families import get

    fam = get(family)
    return [tuple(s) for s in (fam.search_shapes if device == "cuda" else fam.tiny_shapes)]


def run_source_search(state_dir: Path, family: str, budget: int = 10,
                      device: Optional[str] = None, shapes: Optional[list] = None,
                      incumbent_table: Optional[Path] = None, table_out: Optional[Path] = None,
                      ideas: Optional[list[str]] = None, max_tokens: Optional[int] = None,
                      max_usd: Optional[float] = None, stop_after: Optional[int] = None,
                      gpu: Optional[str] = None, models: tuple[str, ...] = ("llama-gqa",),
                      diagnosis: Optional[Any] = None,
                      timeout_s: float = 300.0, mem_limit_mb: int = 6144, seeds: int = 2,
                      reps: Optional[int] = None,
                      on_trial: Optional[Callable[[Trial], None]] = None,
                      **proposer_kw: Any) -> dict[str, Any]:
    """Run the loop (see the module docstring); write the resulting table (the incumbent with
    every kept source merged in) to `table_out` or STATE_DIR/kernels/<family>-<run>.json.
    `diagnosis`: where the model's time goes (`metaltune diagnose --json`, or text), in every
    prompt; `proposer_kw` go to the LLM proposer (model, api_key, base_url, ...)."""
    from kernelsearch.families import NAMES
    from kernelsearch.table import DispatchTable, TableError

    if family not in NAMES:
        raise BadInput(f"--family: unknown kernel family {family!r}; expected one of "
                       f"{', '.join(NAMES)}")
    if budget < 1:
        raise BadInput(f"--budget: expected a positive number of trials, got {budget}")
    for opt, v in (("--max-tokens", max_tokens), ("--max-usd", max_usd),
                   ("--stop-after", stop_after)):
        if v is not None and v <= 0:
            raise BadInput(f"{opt}: expected a positive number, got {v}")
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    table = None
    if incumbent_table is None:  # what this host runs now (an applied profile's kernels)
        active = Path(state_dir) / "kernels" / ACTIVE
        incumbent_table = active if active.is_file() else None
    if incumbent_table is not None:
        try:
            table = DispatchTable.load(incumbent_table)
        except TableError as e:
            raise BadInput(f"--incumbent: {e}") from None
    buckets = [tuple(s) for s in shapes] if shapes else default_buckets(family, device)
    if gpu is None and device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(0)
    from tuner.search.loop import run as run_loop
    from tuner.proposers import make
    from tuner.proposers.base import SearchSpace
    from tuner.search.store import TrialStore

    store = store_in(state_dir)
    with TrialStore.in_state_dir(state_dir) as trials:
        run_id = trials.new_run("kernel_source", {
            "family": family, "proposer": "llm", "budget": budget, "device": device,
            "shapes": [list(b) for b in buckets], "ideas": list(ideas or []),
            "incumbent": str(incumbent_table) if incumbent_table else None,
            "max_tokens": max_tokens, "max_usd": max_usd, "stop_after": stop_after})
        ev = SourceEvaluator(family, buckets, device, table, store, run_id=run_id,
                             timeout_s=timeout_s, mem_limit_mb=mem_limit_mb, seeds=seeds, reps=reps)
        prop = make("llm", SearchSpace([]), budget=budget, kinds=("kernel",),
                    kernel_families={family: ev.fam.signature}, gpu=gpu, models=models,
                    ideas=list(ideas or []), task=ev.task, diagnosis=diagnosis, **proposer_kw)
        spent = Budget(prop, max_tokens, max_usd, stop_after)
        res = run_loop(prop, ev, trials, run_id, budget, on_trial=on_trial, done=spent)
    out = Path(table_out) if table_out else Path(state_dir) / "kernels" / f"{family}-{run_id}.json"
    final = ev.table if ev.table is not None else DispatchTable(device=device)
    final.meta = dict(final.meta, run_id=run_id, proposer="llm")
    final.save(out)
    kept = [t for t in res.trials if t.verdict == "kept"]
    return {"run_id": run_id, "family": family, "device": device, "proposer": "llm",
            "trials": len(res.trials), "kept": len(kept), "stopped": spent.why,
            "by_reason": _count(res.trials), "table": str(out),
            "entries": len(final.entries), "sources": final.sources(),
            "cost": dict(prop.ledger.total)}


def _count(trials: list[Trial]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in trials:
        k = f"{t.verdict}:{t.reason}"
        out[k] = out.get(k, 0) + 1
    return out
