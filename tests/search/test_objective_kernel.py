"""`search kernel --objective` decides each bucket by the objective (tuner.search.kernel's
KernelEvaluator with tuner.search.objective's kernel cost), on a replayed grid with times,
joules and watts a call: energy keeps the config that uses the least energy, not the fastest;
power-capped keeps the fastest within the budget; throughput the fastest."""
from __future__ import annotations

import pytest

from tuner.search import objective as O
from tuner.search.kernel import replay_evaluator, search_bucket




def grid():
    from kernelsearch.families import get

    fam = get("swiglu")
    out = []
    for name, var in fam.variants.items():
        if var.kind == "library" or var.gpu_only:
            continue
        for cfg in var.configs((3, 17)):
            i = len(out)
            t = 10e-6 + i * 1e-6  # later configs slower ...
            w = 700.0 - i * 400.0 / (i + 4)  # ... and cooler
            out.append({"variant": name, "config": cfg, "time_s": t, "mean_w": w,
                        "energy_j": t * w})
    return out


@pytest.mark.parametrize("obj, best", [
    (O.THROUGHPUT, lambda g: min(g, key=lambda r: r["time_s"])),
    (O.Energy(), lambda g: min(g, key=lambda r: r["energy_j"])),
    (O.PowerCapped(power_budget_w=500), lambda g: min((r for r in g if r["mean_w"] <= 500),
                                                      key=lambda r: r["time_s"])),
])
def test_each_objective_keeps_its_own_best_config(obj, best):
    g = grid()
    assert len(g) >= 4, g
    # three different winners: the test tells the objectives apart
    assert len({best(g)["time_s"] for best in (lambda g: min(g, key=lambda r: r["time_s"]),
                                                lambda g: min(g, key=lambda r: r["energy_j"]))}) == 2
    configs = [(r["variant"], r["config"]) for r in g]
    res = search_bucket("swiglu", (3, 17), replay_evaluator(g), "grid", len(g), configs=configs,
                        objective=obj)
    want = best(g)
    assert (res["best"]["variant"], res["best"]["config"]) == (want["variant"], want["config"])


def test_power_capped_refuses_a_config_over_the_budget_or_unmeasured():
    cap = O.PowerCapped(power_budget_w=500)
    assert cap.kernel_refusal({"time_s": 1e-5, "mean_w": 600.0}) == "over_power_budget"
    assert cap.kernel_refusal({"time_s": 1e-5, "mean_w": float("nan")}) == "energy_unmeasured"
    assert cap.kernel_refusal({"time_s": 1e-5}) == "energy_unmeasured"
    assert cap.kernel_refusal({"time_s": 1e-5, "mean_w": 450.0}) is None


def test_the_bucket_summary_is_in_the_objectives_kernel_cost():
    g = grid()
    configs = [(r["variant"], r["config"]) for r in g]
    res = search_bucket("swiglu", (3, 17), replay_evaluator(g), "grid", len(g), configs=configs,
                        objective=O.Energy())
    s = res["summary"]
    assert (s["objective"], s["metric"], s["unit"]) == ("energy", "energy a call", "uJ")
    assert s["kept"] == pytest.approx(min(r["energy_j"] for r in g) * 1e6)
    assert s["start"] >= s["kept"] and s["time_us"]["kept"] > 0


@pytest.mark.usefixtures("cli_env")
def test_the_llm_proposer_refuses_an_objective_it_cannot_decide_by(capsys):
    from tests.simhelpers import run_cli

    rc, out, err = run_cli(capsys, "search", "kernel", "--family", "softmax", "--budget", "1",
                           "--device", "cpu", "--proposer", "llm", "--objective", "energy")
    assert rc == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "--objective energy: --proposer llm" in lines[0], err
