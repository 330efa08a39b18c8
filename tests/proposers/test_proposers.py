import math

import pytest

from tuner.errors import BadInput
from tuner.proposers import Dim, SearchSpace, make
from tuner.proposers.classic import grid_levels
from tuner.trial import Candidate, Trial


def space():
    return SearchSpace([Dim("x", list(range(0, 101, 5))), Dim("y", list(range(0, 51, 5)))])


def f(p):  # smooth, single interior optimum at (65, 20)
    return 100.0 - ((p["x"] - 65) / 10) ** 2 - ((p["y"] - 20) / 5) ** 2


def drive(prop, budget):
    best = -math.inf
    for i in range(budget):
        c = prop.ask()
        p = c.knobs
        score = f(p)
        best = max(best, score)
        verdict = "kept" if score >= best else "reverted"
        prop.tell(Trial(candidate=c, verdict=verdict, reason="improved", objective=score, number=i))
    return best


@pytest.mark.parametrize("name", ["random", "grid", "coordinate", "optuna"])
def test_each_proposer_stays_in_the_space_and_is_deterministic(name):
    s = space()
    a = [make(name, s, seed=3, budget=20).ask().knobs for _ in range(1)]
    p1, p2 = make(name, s, seed=3, budget=20), make(name, s, seed=3, budget=20)
    seq1 = [p1.ask().knobs for _ in range(10)]
    seq2 = [p2.ask().knobs for _ in range(10)]
    assert seq1 == seq2
    for p in seq1 + a:
        assert p["x"] in s.dims[0].values and p["y"] in s.dims[1].values


def test_optuna_finds_the_optimum_better_than_random_on_average():
    opt, rnd = [], []
    for seed in range(3):
        opt.append(drive(make("optuna", space(), seed=seed, budget=40), 40))
        rnd.append(drive(make("random", space(), seed=seed, budget=40), 40))
    assert min(opt) >= 99.0  # within 1 point of the true optimum 100
    assert sum(opt) >= sum(rnd)


def test_coordinate_converges_on_separable_function():
    s = space()
    s.start = {"x": 0, "y": 50}
    assert drive(make("coordinate", s, seed=0), 40) >= 99.0


def test_grid_levels_fit_budget_and_cover_space():
    lv = grid_levels([110, 2, 501], 60)
    assert math.prod(lv) <= 60 and lv[1] == 2 and min(lv) >= 2
    assert grid_levels([3, 4], None) == [3, 4]
    g = make("grid", space(), budget=None)
    assert len(g.points) == 21 * 11


def test_unknown_proposer_is_bad_input():
    with pytest.raises(BadInput, match="unknown proposer"):
        make("annealing", space())


def test_invalid_points_are_never_proposed():
    s = space()
    s.valid = lambda p: p["x"] + p["y"] <= 60
    for name in ("random", "grid", "optuna"):
        prop = make(name, s, seed=1, budget=30)
        for _ in range(15):
            c = prop.ask()
            assert c.knobs["x"] + c.knobs["y"] <= 60
            prop.tell(Trial(candidate=c, verdict="reverted", reason="worse", objective=f(c.knobs)))


def test_unstable_trials_score_zero_and_policy_refusals_teach_nothing():
    from tuner.proposers.base import score_of

    c = Candidate(knobs={"x": 5, "y": 5})
    assert score_of(Trial(candidate=c, verdict="rolled_back", reason="instability_xid", objective=120.0)) == 0.0
    assert score_of(Trial(candidate=c, verdict="rejected", reason="policy_denied")) is None


def test_grid_on_a_constrained_space_strides_through_valid_points():
    # like a kernel space: most combinations are invalid (a variant uses only some parameters)
    s = SearchSpace([Dim("variant", ["a", "b"]), Dim("x", list(range(16))), Dim("y", list(range(16)))])
    s.valid = lambda p: (p["variant"] == "a" and p["y"] == 0) or (p["variant"] == "b" and p["x"] == p["y"])
    g = make("grid", s, seed=0, budget=8)
    pts = [g.ask().knobs for _ in range(8)]
    assert all(s.is_valid(p) for p in pts)
    assert len({(p["variant"], p["x"], p["y"]) for p in pts}) == 8
    assert {p["variant"] for p in pts} == {"a", "b"}
    r = make("random", s, seed=0, budget=8)
    assert [r.ask().knobs for _ in range(8)] != pts


def branched_space() -> SearchSpace:
    """Like a kernel family: a variant, each variant with parameters of its own (x is shared by
    name, y and z are not), and a constraint across parameters."""
    a = [Dim("x", list(range(8))), Dim("y", list(range(8)))]
    b = [Dim("x", list(range(8))), Dim("z", [1, 2, 4, 8, 16])]
    s = SearchSpace([Dim("variant", ["a", "b"]), Dim("x", list(range(8))),
                     Dim("y", list(range(8))), Dim("z", [1, 2, 4, 8, 16])])
    s.branches = ("variant", {"a": a, "b": b})
    s.valid = lambda p: p["x"] + p["y"] <= 10 if p["variant"] == "a" else p["x"] * p["z"] <= 64
    return s


def config_of(p):
    return (p["variant"], p["x"], p["y"] if p["variant"] == "a" else p["z"])


def kernel_time(p, shift=0, scale=1.0):
    """A smooth landscape (lower is better); `shift` moves variant a's optimum one step in y."""
    if p["variant"] == "a":
        return scale * (10 + (p["x"] - 5) ** 2 + (p["y"] - 2 - shift) ** 2)
    return scale * (14 + (p["x"] - 3) ** 2 + 2 * abs(math.log2(p["z"]) - 2))


def tell(prop, p, t, i):
    c = prop.space.to_candidate(p)
    prop.tell(Trial(candidate=c, verdict="reverted", reason="worse", objective=1.0 / t, number=i))


def test_optuna_on_a_conditional_space_asks_each_valid_config_once():
    s = branched_space()
    prop = make("optuna", s, seed=2, budget=40)
    seen = []
    for i in range(40):
        p = prop.ask().knobs
        assert s.is_valid(p)
        # parameters the variant does not use stay at their first value: one point per config
        assert (p["z"] == 1) if p["variant"] == "a" else (p["y"] == 0)
        seen.append(config_of(p))
        tell(prop, p, kernel_time(p), i)
    assert len(set(seen)) == len(seen)
    assert {v for v, *_ in seen} == {"a", "b"}


def evals_to_optimum(prop, start, limit=40):
    """Evaluations until the optimum of the shifted landscape is measured (the neighbour's
    winner `start` measured first, as a kernel search does)."""
    best = min(kernel_time(p, shift=1, scale=3.0) for p in valid_points(prop.space))
    tell(prop, start, kernel_time(start, shift=1, scale=3.0), 0)
    for i in range(1, limit):
        p = prop.ask().knobs
        t = kernel_time(p, shift=1, scale=3.0)
        tell(prop, p, t, i)
        if t <= best:
            return i + 1
    return limit


def valid_points(s):
    import itertools

    return [p for p in (dict(zip(s.names, c)) for c in itertools.product(*(d.values for d in s.dims)))
            if s.is_valid(p)]


def test_optuna_warm_started_from_a_neighbour_finds_the_optimum_sooner():
    """The previous shape's measurements (another scale, optimum one step away) as a prior:
    the search reaches this shape's optimum in fewer evaluations than from scratch."""
    import random

    s = branched_space()
    pts = valid_points(s)
    warm, cold = [], []
    for seed in range(4):
        rng = random.Random(seed)
        neighbour = rng.sample(pts, 14)  # what a 14-evaluation search measured there
        neighbour.append(min(pts, key=kernel_time))
        start = min(neighbour, key=kernel_time)
        w = make("optuna", s, seed=seed, budget=14, use_prior=True)
        w.warm_start([(p, 1.0 / kernel_time(p)) for p in neighbour])
        warm.append(evals_to_optimum(w, start))
        cold.append(evals_to_optimum(make("optuna", s, seed=seed, budget=14), start))
    assert sum(warm) < sum(cold)
