"""`metaltune demo`: the whole loop on a fresh simulated host in a temporary folder.

Creates a simulated H200-like host, measures the baseline, runs the search (Optuna by default)
through the safety layer (policy, transactions with probation, rollback on instability), writes
the best settings as a host profile and returns a summary. The same seed gives the same result.
"""
from __future__ import annotations

import tempfile
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional

from tuner.trial import Trial

DEMO_KNOBS = ("power_limit_w", "locked_clocks_mhz", "locked_mem_clocks_mhz",
              "gpc_clock_offset_mhz", "mem_clock_offset_mhz")


def demo_policy_path() -> Path:
    return Path(str(resources.files("tuner") / "data" / "demo-policy.yaml"))


def run_demo(
    trials: int = 60,
    seed: int = 1,
    proposer: str = "optuna",
    sku: str = "h200",
    workdir: Optional[Path] = None,
    repeats: int = 3,
    on_trial: Optional[Callable[[Trial], None]] = None,
) -> dict[str, Any]:
    from tuner.host import open_host
    from tuner.knobs import gpu
    from tuner.search.host.run import search_knobs
    from tuner.search.safety_context import SafetyContext
    from tuner.sim import model
    from tuner.sim.hostinit import init_host
    from tuner.sim.state import SimState
    from tuner.sim.workload import SimWorkload

    workdir = Path(workdir or tempfile.mkdtemp(prefix="metaltune-demo-"))
    sim_root, state_dir = workdir / "host", workdir / "state"
    init_host(sim_root, sku, seed=seed)
    host = open_host("sim", sim_root)
    knobs = {k.name: k for k in gpu.discover(host)
             if k.name.split(".", 1)[1] in DEMO_KNOBS and k.limits().search_values()}
    guard = SafetyContext(host, state_dir, policy=demo_policy_path())
    try:
        run = search_knobs(
            knobs, SimWorkload(sim_root), guard, proposer, trials, seed=seed, repeats=repeats,
            timeout_s=1.0,  # the sim measures in ms: 1 s is a hang
            baseline_repeats=8, kind="demo", meta={"sku": sku, "seed": seed}, on_trial=on_trial)
        best_settings = dict(run.evaluator.incumbent)
        final = run.evaluator.measure_incumbent(repeats=8)  # the kept settings, like the baseline
    finally:
        guard.close()
    base, start = run.baseline, run.start

    state = SimState(sim_root).read()
    chip = state["gpus"][0]["chip"]
    opt = model.optimum(sku, chip=chip)
    profile_path = write_profile(workdir / "best-profile.yaml", sku, best_settings, start,
                                 base.value, final.value, seed, proposer, len(run.trials))
    counts = Counter(t.verdict for t in run.trials)
    rejected = Counter(t.reason for t in run.trials if t.verdict == "rejected")
    rolled = Counter(t.reason for t in run.trials if t.verdict == "rolled_back")
    reverted = Counter(t.reason for t in run.trials if t.verdict == "reverted")
    return {
        "sku": sku, "seed": seed, "proposer": proposer,
        "trials": len(run.trials),
        "kept": counts.get("kept", 0),
        "reverted": counts.get("reverted", 0),
        "rolled_back": counts.get("rolled_back", 0),
        "rejected": dict(sorted(rejected.items())),
        "reverted_by_reason": dict(sorted(reverted.items())),
        "rolled_back_by_reason": dict(sorted(rolled.items())),
        "baseline_throughput": round(base.value, 2),
        "best_throughput": round(final.value, 2),
        "gain": round(final.value / base.value - 1, 4),
        "true_baseline": round(model.baseline(sku, chip), 2),
        "true_best": round(model.true_throughput(state), 2),
        "true_optimum": round(opt["throughput"], 2),
        "optimum_settings": opt["settings"],
        "best_settings": best_settings,
        "profile_path": str(profile_path),
        "state_dir": str(state_dir),
        "sim_root": str(sim_root),
        "run_id": run.run_id,
        "seconds": run.seconds,
        "trials_detail": [
            {"n": t.number, "verdict": t.verdict, "reason": t.reason, "knobs": t.candidate.knobs,
             "gain": t.gain, "incident": (t.incident or {}).get("detail")}
            for t in run.trials
        ],
    }


def write_profile(path: Path, sku: str, settings: dict[str, Any], start: dict[str, Any],
                  base: float, best: float, seed: int, proposer: str, trials: int) -> Path:
    """The kept settings as a host profile (host_profiles schema): only values that changed."""
    import datetime

    import yaml

    knobs = {n: v for n, v in settings.items() if v != start.get(n)}
    doc = {
        "name": path.stem,
        "description": f"best settings found by `metaltune demo` ({proposer}, seed {seed})",
        "match": {"gpu_name": ["*H200*"] if sku == "h200" else ["*4090*"]},
        "knobs": knobs,
        "provenance": {
            "source": "measured",
            "measured_on": f"simulated {sku} host",
            "date": datetime.date.today().isoformat(),
            "workload": "sim (noise ~2%)",
            "gain_pct": round(100 * (best / base - 1), 2),
            "trials": trials,
            "tool": "metaltune demo",
        },
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
