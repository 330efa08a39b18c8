"""Evaluate a mixed candidate: host knob changes, kernel choices and runtime settings judged as
one change against one incumbent (host state + dispatch table + runtime).

Routing by content, cheapest first:
- host knobs: the host gates (known, domain, quarantine, duplicate, policy), then applied inside
  a safety transaction (monitors polled after every candidate sample; an incident rolls back and
  quarantines) exactly as `HostEvaluator` does, through its pieces;
- kernel choices: kernelsearch's judge (guard -> correctness -> timing) before anything is
  applied; a rejection is the trial's verdict with the harness's code. Accepted choices go into
  the workload's dispatch table only for the candidate's side of the A/B;
- runtime settings: validated as `RuntimeEvaluator` does, applied with `workload.configure`.
Then ONE interleaved A/B (ABBA) of the holistic workload, incumbent against candidate, and the
per-size keep rule (`tuner.search.keep.gate`; micro-benchmark gain: the runtime's isolated first-step
time or the kernels' harness speedup, so a micro win that loses end to end is `holistic_lost`).
Kept: the transaction is confirmed and the incumbent (host, table, runtime) moves. Anything else:
the transaction rolls the host back, and the table and runtime are restored.

Tables go where the model runs: a workload with `install_table` (a model process,
tuner.workloads.model_process) gets each side's table there, so no stored source is ever
imported by this process; a table is served by the process of its set of stored sources, so
the incumbent's side is never measured where a candidate's source was imported (`_use`
installs the incumbent before and after every candidate: the two processes kept alive are the
incumbent's and the candidate's); its failures (crash, timeout, refusal) are the trial's
reason. A workload in this process gets tables of shipped variants only (`dispatch.install`
here); a stored source is refused for it at the gate (`not_installable`).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from kernelsearch.table import behind_library
from tuner.errors import MetaltuneError, WorkloadFailed, WorkloadHang
from tuner.search import gates as G
from tuner.search import keep
from tuner.search.ab import AB
from tuner.search.host.evaluator import HostEvaluator
from tuner.search.mixed.space import TORCH, JointSpace, label
from tuner.search.runtime import RuntimeEvaluator
from tuner.trial import Candidate, GateResult, KernelChoice, Measurement, Trial
from tuner.workloads.base import Tunable
from tuner.workloads.model_process import ModelProcessFailed
from tuner.workloads.stats import geomean


MICRO_WIN = 0.1  # a first-step speed-up smaller than this is not called a micro-benchmark win


def first_step_gain(workload: Tunable, incumbent: dict[str, Any], candidate: dict[str, Any],
                    n: int = 5) -> Optional[float]:
    """The isolated micro-benchmark a runtime change could be judged by (time to the first decode
    step, setup included): best incumbent time / best candidate time - 1, counted only above
    MICRO_WIN (below it: 0, noise rather than a micro win). None without such a benchmark."""
    fn = workload.first_step_s
    if fn is None:
        return None
    try:
        workload.configure(candidate)
        t_c = [fn() for _ in range(n)]
    finally:
        workload.configure(incumbent)
    t_i = [fn() for _ in range(n)]
    gain = min(t_i) / min(t_c) - 1.0 if min(t_c) > 0 else 0.0
    return gain if gain > MICRO_WIN else 0.0


@contextmanager
def candidate_errors():
    """Any exception from a measurement that is not one of ours (a kernel raising on an input
    the judge never sent it: the model process's ValueError) is WorkloadFailed, so it ends as
    the trial's verdict (`measure_failed`) and the incumbent's as a failed search, never as a
    traceback out of the loop."""
    try:
        yield
    except MetaltuneError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the candidate raised
        raise WorkloadFailed(f"the measurement raised {type(e).__name__}: "
                             f"{str(e).strip()[:400]}") from None


def all_kernels(c: Candidate) -> list[KernelChoice]:
    return list(c.kernels) + ([c.kernel] if c.kernel is not None else [])


@dataclass
class MixedEvaluator:
    host: HostEvaluator  # knobs, safety context, host incumbent (= joint.incumbent.host)
    runtime: RuntimeEvaluator  # workload, runtime incumbent (= joint.incumbent.runtime), rounds, repeats
    joint: JointSpace
    device: str = "cpu"
    isolate: Optional[bool] = None  # judge in a child process; None: on a GPU and for sources
    judge_timeout_s: float = 300.0
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)  # judged once per choice
    store_dir: Optional[Path] = None  # kernelsearch store of the slots' src:<sha256> choices
    _table_key: Optional[str] = field(default=None, init=False, repr=False)  # installed table

    def __post_init__(self) -> None:
        inc = self.joint.incumbent
        assert self.host.incumbent is inc.host and self.runtime.incumbent is inc.runtime, \
            "the evaluators must share the joint incumbent's dicts"

    @property
    def workload(self) -> Tunable:
        return self.runtime.workload

    @property
    def remote(self) -> bool:
        """Whether tables are installed where the model runs (a model process), not here."""
        return self.workload.runs_stored_sources

    # -- gates ---------------------------------------------------------------------------------
    def gates(self) -> list[G.Gate]:
        return self.host.gates(also_known=[self._kernels_known, self._runtime_valid],
                               no_change=self._changes_something)

    def _kernels_known(self, c: Candidate) -> GateResult:
        from kernelsearch.families import NAMES, get

        for k in all_kernels(c):
            if k.family not in NAMES:
                return GateResult(gate="known", passed=False, code="out_of_domain",
                                  detail=f"unknown kernel family {k.family!r}")
            if k.source:
                continue  # judged from its source
            s = self.joint.by_bucket.get((k.family, k.shape_bucket or ""))
            if s is None:
                return GateResult(gate="known", passed=False, code="out_of_domain",
                                  detail=f"no kernel slot {k.family} {k.shape_bucket}; this "
                                         f"workload calls: {', '.join(x.name for x in self.joint.slots) or 'none'}")
            if k.variant is not None and k.variant.startswith("src:"):
                if not self.remote:
                    return GateResult(gate="known", passed=False, code="not_installable",
                                      detail=f"{k.family} {k.variant[:16]}...: a stored source "
                                             "runs only in a model process, and this workload "
                                             "runs in the search's process")
                if label(k.variant, k.config) not in s.choices:
                    return GateResult(gate="known", passed=False, code="out_of_domain",
                                      detail=f"{k.family} {k.variant[:16]}... is not a stored "
                                             f"source of slot {s.bucket}")
            elif k.variant is not None and s.variants is not None and k.variant not in s.variants:
                return GateResult(gate="known", passed=False, code="out_of_domain",
                                  detail=f"{k.family} {k.variant}: this workload's call path "
                                         f"runs only {', '.join(s.variants)} at {s.bucket}")
            elif k.variant is not None and (k.variant, k.config) not in get(k.family).space(s.shape):
                return GateResult(gate="known", passed=False, code="out_of_domain",
                                  detail=f"{k.family} {k.variant} {k.config} is not a valid "
                                         f"config at {s.bucket}")
        return GateResult(gate="known", passed=True)

    def _runtime_valid(self, c: Candidate) -> GateResult:
        """The merged runtime must be one the workload takes (RuntimeEvaluator's gate with the
        workload's validator: one with no runtime settings refuses any)."""
        return self.runtime.valid(c)

    def _changes(self, c: Candidate) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
        inc = self.joint.incumbent
        rt = {k: v for k, v in c.runtime.items() if inc.runtime.get(k) != v}
        shipped = Candidate(kernels=[k for k in all_kernels(c) if not k.source])
        return self.host.changes(c), rt, self.joint.kernel_changes(shipped)

    def _changes_something(self, c: Candidate) -> GateResult:
        if not any(self._changes(c)) and not any(k.source for k in all_kernels(c)):
            return GateResult(gate="duplicate", passed=False, code="duplicate",
                              detail="same host, runtime and kernels as the incumbent")
        return GateResult(gate="duplicate", passed=True)

    # -- the kernel judge ------------------------------------------------------------------------
    def judge(self, k: KernelChoice, shape: Optional[tuple[int, ...]], dtype: Optional[str]) -> dict[str, Any]:
        key = json.dumps([k.family, dtype, shape, k.variant, k.config, k.source], sort_keys=True)
        if key not in self.verdicts:
            iso = self.isolate if self.isolate is not None else self.device != "cpu"
            if k.source is None:
                from tuner.search.kernel import harness_evaluator

                assert shape is not None and k.variant is not None
                ev = harness_evaluator(k.family, shape, self.device, dtype=dtype,
                                       isolate=iso, timeout_s=self.judge_timeout_s,
                                       store=self._store())
                self.verdicts[key] = ev(k.variant, k.config)
            else:  # written by a proposer: always in a child process, judged as
                # `metaltune kernel check` judges it (boundary shapes, the sweep timed on a GPU)
                from kernelsearch.harness import check, floor_for
                from tuner.search.kernel import verdict_record

                v = check(k.family, k.source, k.config, device=self.device, isolate=True,
                          timeout_s=self.judge_timeout_s, ceilings=floor_for(self.device))
                self.verdicts[key] = verdict_record(v)
        return self.verdicts[key]

    def _judge_all(self, c: Candidate, kern: dict[str, str], trial: Trial) -> Optional[list[dict]]:
        """Judge every new kernel; None after a rejection (recorded on the trial)."""
        judged = []
        todo: list[tuple[str, KernelChoice, Any, Any]] = []
        for name, value in kern.items():
            if value != TORCH:
                s = self.joint.slot(name)
                todo.append((name, s.choice(value), s.shape, s.dtype))
        todo += [(f"source:{k.family}", k, None, None) for k in all_kernels(c) if k.source]
        for name, k, shape, dtype in todo:
            t0 = time.perf_counter()
            r = self.judge(k, shape, dtype)  # cached: a choice is judged once per run
            ok = r["code"] == "accepted"
            trial.gates.append(GateResult(
                gate=r.get("stage") or "harness", passed=ok, code=None if ok else r["code"],
                seconds=time.perf_counter() - t0,
                detail=f"{name} {k.variant}: " + (", ".join(r.get("checks", []))[:300] if ok else
                                                  f"{r.get('rule', '')}: {r.get('detail', '')}"[:500])))
            trial.measurements.setdefault("kernels", {})[name] = {
                k2: r.get(k2) for k2 in ("code", "rule", "speedup_vs_torch", "speedup_min",
                                         "speedup_vs_library", "library", "kind",
                                         "device", "timed_shapes", "seconds", "energy_j",
                                         "mean_w", "energy_vs_library")}
            if not ok:
                trial.reason = r["code"]
                return None
            behind = behind_library(r)  # the library runs where no entry covers the call
            if behind is not None:
                trial.reason = "slower_than_library"
                trial.gates.append(GateResult(gate="library", passed=False, code=trial.reason,
                                              detail=f"{name} {k.variant}: {behind}"))
                return None
            if k.source:  # accepted, but not for any slot: slots take stored sources
                trial.reason = "not_installable"
                trial.gates.append(GateResult(gate="install", passed=False, code="not_installable",
                                              detail=f"{name}: passed the judge; a mixed search's "
                                                     "slots take shipped variants and stored "
                                                     "sources (search kernel --proposer llm "
                                                     "stores them)"))
                return None
            judged.append(r)
        return judged

    def _store(self) -> Any:
        if self.store_dir is None:
            return None
        from kernelsearch.store import SourceStore

        return SourceStore(self.store_dir)

    # -- measurement -----------------------------------------------------------------------------
    def _use(self, table: Any) -> None:
        key = json.dumps(table.to_dict(), sort_keys=True, default=str)
        if key != self._table_key:
            # a model process loads it with its next measurement; a workload in this process
            # (maybe root) refuses one naming stored sources
            self.workload.install_table(table, self.store_dir)
            self.workload.dispatch_changed()
            self._table_key = key

    def _measure(self, runtime: dict[str, Any]) -> Measurement:
        with candidate_errors():
            self.workload.configure(runtime)
            return self.workload.measure(repeats=self.runtime.repeats,
                                         timeout_s=self.host.timeout_s)

    def incumbent_table(self) -> Any:
        return self.joint.incumbent.table(slots=self.joint.slots)

    def measure_incumbent(self) -> Measurement:
        self._use(self.incumbent_table())
        return self._measure(self.joint.incumbent.runtime)

    def _micro(self, rt: dict[str, Any], judged: list[dict]) -> Optional[float]:
        gains = []
        if rt and self.runtime.micro is not None:
            g = self.runtime.micro(Candidate(runtime=rt))
            if g is not None:
                gains.append(g)
        sp = [r["speedup_vs_torch"] for r in judged if r.get("speedup_vs_torch")]
        if sp:
            gains.append(geomean(sp) - 1.0)
        return max(gains) if gains else None

    # -- one trial -------------------------------------------------------------------------------
    def evaluate(self, c: Candidate, trial: Trial) -> Trial:
        h, inc = self.host, self.joint.incumbent
        h.seen.add(c.key())
        knobs, rt, kern = self._changes(c)
        sources = [k.family for k in all_kernels(c) if k.source]
        trial.measurements["changed"] = {
            "kinds": [kind for kind, v in (("host", knobs), ("runtime", rt),
                                           ("kernel", kern or sources)) if v],
            "host": knobs, "runtime": rt, "kernels": kern, "kernel_sources": sources}
        judged = self._judge_all(c, kern, trial)
        if judged is None:
            return trial  # rejected by the harness before anything was applied
        micro = self._micro(rt, judged)
        before = {n: inc.host[n] for n in knobs}
        txn = h.begin(knobs, trial, c.key())
        if txn is None:
            return trial
        side_a = (self.incumbent_table(), dict(inc.runtime))
        side_b = (inc.table({**inc.kernels, **kern}, self.joint.slots), {**inc.runtime, **rt})
        ab = AB()
        kept = False
        try:
            # `runtime.rounds` pairs; a clear loser (the keep rule already says holistic_lost,
            # size_regressed or worse: the two sides' repeats do not even overlap) stops after
            # any pair; the monitors are polled after every candidate sample
            ab.run(self._measure_side(knobs, before, side_a, side_b), min(1, self.runtime.rounds),
                   max_pairs=self.runtime.rounds, poll=txn.check,
                   decided=lambda a, b: self.host.objective.decide_sizes(
                       a, b, self.runtime.tolerance, micro)[1]
                   in ("holistic_lost", "size_regressed", "worse", "over_power_budget"))
            self.host.objective.gate(ab.a, ab.b, tolerance=self.runtime.tolerance,
                                     micro_gain=micro, trial=trial, anchor=self.host.floor_anchor)
            if trial.verdict == "kept":
                txn.confirm()  # polls the monitors once more: an incident now still rolls back
                kept = True
                self.host.objective.compound(self.host.floor_anchor, trial.measurements["holistic"])
            else:
                txn.rollback(trial.reason)
        except WorkloadHang as e:
            txn.rollback(f"hang: {e}")
            h.safety.quarantine(c.key(), "hang")
            h.rolled_back(trial, {"type": "hang", "reason": "instability_hang", "detail": str(e)}, ab.b)
        except ModelProcessFailed as e:  # it crashed, hung or was refused: a fresh one next
            txn.rollback(f"model process: {e}")
            if e.code == "model_timeout":
                h.safety.quarantine(c.key(), "hang")  # as a hang is: never tried again
            trial.verdict, trial.reason = "rejected", e.code
            trial.gates.append(GateResult(gate="model_process", passed=False, code=e.code,
                                          detail=str(e)[:500]))
        except WorkloadFailed as e:
            txn.rollback(f"measure failed: {e}")
            code = ("incorrect" if "differ from the plain torch path" in str(e)
                    else e.code or "measure_failed")
            trial.verdict, trial.reason = "rejected", code
            trial.gates.append(GateResult(gate="measure", passed=False, code=code, detail=str(e)[:500]))
        except h.safety.Instability as e:  # the transaction already rolled the host back
            h.rolled_back(trial, h.safety.incident_dict(e), ab.b)
        except h.safety.ProbationExpired as e:  # the watchdog got there first
            h.rolled_back(trial, {"type": "deadline", "reason": "probation_expired",
                                  "detail": str(e)}, ab.b)
        finally:
            if kept:
                inc.host.update(knobs)
                inc.runtime.update(rt)
                inc.kernels.update(kern)
            elif txn.state == "probation":  # left by an unexpected error
                txn.rollback("left without a verdict")
            self._use(self.incumbent_table())  # the kept candidate's, or the old incumbent's
            self.workload.configure(inc.runtime)
        return trial

    def _measure_side(self, host_b: dict[str, Any], host_a: dict[str, Any],
                      side_a: tuple[Any, dict[str, Any]],
                      side_b: tuple[Any, dict[str, Any]]) -> Callable[[str], Measurement]:
        """One side's whole state (host knobs, dispatch table, runtime), then one measurement."""

        def measure(side: str) -> Measurement:
            self.host.set_values(host_b if side == "b" else host_a)
            table, rt = side_b if side == "b" else side_a
            self._use(table)
            return self._measure(rt)

        return measure
