"""The keep rule under each objective (tuner.search.objective), on constructed measurements:
the energy floor, the power budget, the noise test and the vetoes, per size."""
from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from tuner.search import keep
from tuner.search import objective as O
from tuner.trial import REASONS, Candidate, Measurement, Trial

SIZES = ("decode@ctx4096,b8", "decode@ctx32768,b8")


def side(tok_s, watts, n=4, noise=0.005, seed=0):
    """n repeats of a two-size workload: tokens/s per size, the board's watts per size."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        per = {k: tok_s[k] * (1 + rng.gauss(0, noise)) for k in SIZES}
        out.append(Measurement(metric="tok/s", value=sum(per.values()) / 2,
                               samples=[keep.geomean(list(per.values()))], per_size=per,
                               per_size_tok_per_j={k: per[k] / watts[k] for k in SIZES},
                               per_size_watts=dict(watts), energy_source="sim_model"))
    return out


def same(v):
    return {k: v for k in SIZES}


ENERGY = O.Energy()


def test_energy_keeps_fewer_joules_at_nearly_the_same_speed():
    inc = side(same(1000.0), same(700.0), seed=1)
    cand = side(same(970.0), same(500.0), seed=2)  # -3% tok/s, +36% tok/J
    assert keep.decide_sizes(inc, cand)[1] in ("worse", "size_regressed")  # throughput says no
    verdict, reason, stats = ENERGY.decide_sizes(inc, cand)
    assert (verdict, reason) == ("kept", "improved")
    assert stats["gain"] == pytest.approx(1000 / 700 * 0.97 / (1000 / 700) * 700 / 500 - 1, abs=0.02)


def test_energy_refuses_a_candidate_whose_throughput_falls_below_the_floor_at_one_size():
    inc = side(same(1000.0), same(700.0), seed=1)
    cand = side({SIZES[0]: 990.0, SIZES[1]: 900.0}, same(450.0), seed=2)  # one size -10%
    verdict, reason, stats = ENERGY.decide_sizes(inc, cand)
    assert (verdict, reason) == ("reverted", "below_throughput_floor")
    assert stats["below_floor"] == [SIZES[1]]
    # the same candidate with a lower floor is kept
    assert O.Energy(throughput_floor=0.85).decide_sizes(inc, cand)[1] == "improved"


def test_energy_floor_holds_against_the_runs_start_not_only_the_incumbent():
    inc = side(same(1000.0), same(600.0), seed=1)
    cand = side(same(970.0), same(500.0), seed=2)  # -3% against this incumbent
    assert ENERGY.decide_sizes(inc, cand)[1] == "improved"
    # the incumbent is already 4% under the start: -3% more is 93% of the start
    _, reason, stats = ENERGY.decide_sizes(inc, cand, anchor=same(0.96))
    assert reason == "below_throughput_floor"
    assert stats["vs_start"][SIZES[0]] == pytest.approx(0.96 * 0.97, abs=0.01)


def test_energy_gain_inside_the_noise_is_not_kept():
    inc = side(same(1000.0), same(700.0), noise=0.05, n=3, seed=3)
    cand = side(same(1000.0), same(690.0), noise=0.05, n=3, seed=4)  # +1.4% tok/J, 5% noise
    assert ENERGY.decide_sizes(inc, cand)[:2] == ("reverted", "within_noise")


def test_energy_size_regressed_veto_applies_to_tokens_per_joule():
    inc = side(same(1000.0), same(700.0), seed=1)
    # one size far better per joule, the other 8% worse per joule (same speed, more watts)
    cand = side(same(1000.0), {SIZES[0]: 400.0, SIZES[1]: 760.0}, seed=2)
    assert ENERGY.decide_sizes(inc, cand)[:2] == ("reverted", "size_regressed")


def test_energy_without_energy_on_a_side_is_refused_with_its_own_code():
    inc = side(same(1000.0), same(700.0), seed=1)
    cand = [m.model_copy(update={"per_size_tok_per_j": {}, "per_size_watts": {}})
            for m in side(same(1000.0), same(500.0), seed=2)]
    assert ENERGY.decide_sizes(inc, cand)[:2] == ("reverted", "energy_unmeasured")


def test_power_capped_rejects_over_budget_and_keeps_the_fastest_within_it():
    cap = O.PowerCapped(power_budget_w=500)
    inc = side(same(900.0), same(480.0), seed=1)
    faster_over = side(same(1000.0), same(560.0), seed=2)
    _, reason, stats = cap.decide_sizes(inc, faster_over)
    assert reason == "over_power_budget" and set(stats["over_budget"]) == set(SIZES)
    faster_within = side(same(960.0), same(495.0), seed=3)
    assert cap.decide_sizes(inc, faster_within)[:2] == ("kept", "improved")
    # an incumbent over the budget: a slower candidate within it is kept
    hot = side(same(1000.0), same(650.0), seed=4)
    assert cap.decide_sizes(hot, side(same(800.0), same(480.0), seed=5))[:2] == \
        ("kept", "power_budget_met")


def test_throughput_objective_is_todays_rule():
    inc = side(same(1000.0), same(700.0), seed=1)
    for cand in (side(same(1050.0), same(800.0), seed=2), side(same(970.0), same(500.0), seed=3)):
        assert O.THROUGHPUT.decide_sizes(inc, cand) == keep.decide_sizes(inc, cand)


def test_host_rule_decide_applies_the_objective_to_sizeless_measurements():
    """The host evaluator's pairs rule (keep.decide) on a workload without sizes (the sim's)."""
    def sizeless(tok, w, seed):
        rng = random.Random(seed)
        return [Measurement(metric="throughput", value=v, samples=[v],
                            per_size_tok_per_j={"all": v / w}, per_size_watts={"all": w})
                for v in (tok * (1 + rng.gauss(0, 0.01)) for _ in range(4))]

    inc, cand = sizeless(2000, 600, 1), sizeless(1960, 420, 2)
    assert O.THROUGHPUT.decide(inc, cand).verdict == "reverted"
    d = ENERGY.decide(inc, cand)
    assert (d.verdict, d.reason) == ("kept", "improved") and d.gain == pytest.approx(0.4, abs=0.05)
    slow = sizeless(1700, 300, 3)
    assert ENERGY.decide(inc, slow).reason == "below_throughput_floor"


def test_gate_records_the_objective_on_the_trial():
    inc = side(same(1000.0), same(700.0), seed=1)
    cand = side(same(985.0), same(520.0), seed=2)
    t = Trial(candidate=Candidate(knobs={"gpu0.power_limit_w": 520}), verdict="rejected", reason="malformed")
    g = ENERGY.gate(inc, cand, trial=t)
    assert g.passed and t.verdict == "kept" and t.reason == "improved"
    assert t.objective == pytest.approx(985 / 520, rel=0.02)  # tokens/J: what proposers learn
    assert t.measurements["holistic"]["objective"] == "energy"


def test_budget_gate_refuses_before_anything_is_applied():
    cap = O.PowerCapped(power_budget_w=500)
    check = cap.budget_gate(lambda: {"gpu0.power_limit_w": 700, "gpu0.locked_clocks_mhz": None})
    assert check(Candidate(knobs={"gpu0.locked_clocks_mhz": [1500, 1500]})).code == "over_power_budget"
    assert check(Candidate(knobs={"gpu0.power_limit_w": 500})).passed
    assert ENERGY.budget_gate(lambda: {"gpu0.power_limit_w": 700})(Candidate()).passed


def test_objective_model_and_reason_codes():
    with pytest.raises(ValueError, match="--power-budget: required"):
        O.make("power-capped")
    with pytest.raises(ValueError, match="--objective: expected one of throughput, energy"):
        O.make("speed")
    with pytest.raises(ValueError, match="--throughput-floor"):
        O.make("energy", throughput_floor=1.5)
    with pytest.raises(ValueError, match="--power-budget: only with --objective power-capped"):
        O.make("goodput", power_budget_w=500)
    with pytest.raises(ValidationError):
        O.Energy(throughput_floor=float("nan"))
    assert set(O.OWN_REASONS) <= set(REASONS)


# -- goodput: the same rule on the goodput view ------------------------------------------------------

def served(goodput, tok_s=None, n=4, noise=0.01, seed=0):
    """n repeats of a two-size serving workload: goodput per size (req/s meeting the SLOs),
    its repeats in extra as the field contract says; tokens/s alike unless given."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        g = {k: [goodput[k] * (1 + rng.gauss(0, noise)) for _ in range(3)] for k in SIZES}
        per = {k: (tok_s or goodput)[k] * 100 for k in SIZES}
        out.append(Measurement(metric="tok/s", value=keep.geomean(list(per.values())),
                               samples=[keep.geomean(list(per.values()))], per_size=per,
                               per_size_goodput={k: sorted(v)[1] for k, v in g.items()},
                               extra={"per_size_goodput_samples": g}))
    return out


GOODPUT = O.Goodput()


def test_goodput_keeps_more_requests_meeting_the_slos_even_at_fewer_tokens_per_second():
    inc = served(same(10.0), seed=1)
    cand = served(same(12.0), tok_s=same(9.0), seed=2)  # +20% goodput at -10% tok/s
    assert keep.decide_sizes(inc, cand)[0] == "reverted"  # throughput says no
    verdict, reason, stats = GOODPUT.decide_sizes(inc, cand)
    assert (verdict, reason) == ("kept", "improved")
    assert stats["gain"] == pytest.approx(0.2, abs=0.03)
    t = Trial(candidate=Candidate(knobs={"x": 1}), verdict="rejected", reason="malformed")
    assert GOODPUT.gate(inc, cand, trial=t).passed and t.objective == pytest.approx(12.0, rel=0.03)


def test_goodput_vetoes_a_size_that_lost_goodput_and_a_gain_inside_the_noise():
    inc = served(same(10.0), seed=1)
    cand = served({SIZES[0]: 14.0, SIZES[1]: 9.0}, seed=2)  # one size -10%
    assert GOODPUT.decide_sizes(inc, cand)[:2] == ("reverted", "size_regressed")
    noisy = served(same(10.2), noise=0.08, seed=3)
    assert GOODPUT.decide_sizes(served(same(10.0), noise=0.08, seed=4), noisy)[:2] == \
        ("reverted", "within_noise")


def test_goodput_unmeasured_side_has_its_own_code_and_zero_goodput_counts():
    inc = served(same(10.0), seed=1)
    bare = [m.model_copy(update={"per_size_goodput": {}, "extra": {}}) for m in served(same(10.0))]
    assert GOODPUT.decide_sizes(inc, bare)[:2] == ("reverted", "goodput_unmeasured")
    assert GOODPUT.decide(inc, bare).reason == "goodput_unmeasured"
    zero = served(same(0.0), tok_s=same(10.0), seed=5)  # no request met the SLOs: measured, worse
    verdict, reason, _ = GOODPUT.decide_sizes(inc, zero)
    assert verdict == "reverted" and reason in ("worse", "size_regressed")
    with pytest.raises(ValueError, match="--objective goodput: workload w measures no goodput"):
        GOODPUT.require(bare[0], "w")
    GOODPUT.require(inc[0], "w")


# -- power-capped: within the budget is not enough ----------------------------------------------------

def test_power_budget_met_refuses_a_much_slower_candidate_and_never_counts_nan_as_within():
    cap = O.PowerCapped(power_budget_w=600)
    hot = side(same(1000.0), same(700.0), seed=1)
    honest = side(same(930.0), same(598.0), seed=2)  # what a 600 W limit costs
    assert cap.decide_sizes(hot, honest)[:2] == ("kept", "power_budget_met")
    slow = side(same(33.0), same(100.0), seed=3)  # ~30x slower, well within the budget
    verdict, reason, stats = cap.decide_sizes(hot, slow)
    assert (verdict, reason) == ("reverted", "below_throughput_floor")
    assert "needed" in cap.explain(reason, stats)
    for bad in (float("nan"), -5.0, float("inf")):
        cand = side(same(930.0), same(bad), seed=2)
        assert cap.decide_sizes(hot, cand)[:2] == ("reverted", "over_power_budget"), bad
        assert cap.decide(hot, cand).reason == "over_power_budget", bad


def test_power_capped_reads_the_hottest_board_not_the_mean():
    cap = O.PowerCapped(power_budget_w=600)
    inc = side(same(900.0), same(560.0), seed=1)
    cand = side(same(1000.0), same(550.0), seed=2)  # the mean of a 700 W and a 400 W board
    for m in cand:
        m.extra["per_board_watts"] = {"gpu0": 700.0, "gpu1": 400.0}
    _, reason, stats = cap.decide_sizes(inc, cand)
    assert reason == "over_power_budget" and max(stats["over_budget"].values()) == 700.0
