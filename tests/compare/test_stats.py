"""Statistics behind "ratio with a confidence interval, or within noise"."""
import random

import pytest

from tuner.compare.stats import ratio_ci, summary, t_two_sided_p, welch_p


@pytest.mark.parametrize("t,df,p", [(12.706, 1, 0.05), (2.228, 10, 0.05), (3.169, 10, 0.01),
                                    (1.960, 1e6, 0.05), (0.0, 5, 1.0)])
def test_t_distribution_matches_tables(t, df, p):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=5e-4)


def test_welch_on_clearly_different_and_equal_samples():
    rng = random.Random(1)
    a = [rng.gauss(100, 2) for _ in range(10)]
    b = [rng.gauss(120, 2) for _ in range(10)]
    assert welch_p(a, b) < 1e-6
    assert welch_p(a, a) == pytest.approx(1.0)
    assert welch_p([1.0], b) is None


def test_ratio_interval_covers_the_true_ratio_and_excludes_one():
    rng = random.Random(2)
    a = [rng.gauss(10.0, 0.2) for _ in range(9)]
    b = [rng.gauss(13.0, 0.26) for _ in range(9)]
    ci = ratio_ci(a, b)
    assert ci.low < 1.3 < ci.high
    assert ci.low > 1.2 and not ci.within_noise


def test_same_distribution_is_within_noise_most_of_the_time():
    """A 95% interval: over many independent pairs, ~5% may exclude 1 by chance, not more."""
    rng = random.Random(3)
    misses = 0
    for i in range(60):
        a = [rng.gauss(50, 1) for _ in range(7)]
        b = [rng.gauss(50, 1) for _ in range(7)]
        misses += not ratio_ci(a, b, resamples=600, seed=i).within_noise
    assert misses <= 9


def test_noise_floor_hides_tiny_but_consistent_differences():
    a = [100.0, 100.1, 99.9, 100.0, 100.05]
    b = [x * 1.004 for x in a]
    assert not ratio_ci(a, b).within_noise
    assert ratio_ci(a, b, min_rel=0.01).within_noise


def test_summary_spread():
    s = summary([1.0, 2.0, 3.0, float("nan")])
    assert s["n"] == 3 and s["median"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0
    assert s["cv"] == pytest.approx(0.5)
    assert summary([])["n"] == 0


def test_an_unchanged_metric_is_rarely_called_different():
    # same distribution on both sides, 5 repeats of 1.5% noise, as the sim's pinned H2D copy
    import random

    from tuner.compare.stats import ratio_ci

    false = 0
    for seed in range(200):
        rng = random.Random(seed)
        a = [rng.gauss(55.0, 0.825) for _ in range(5)]
        b = [rng.gauss(55.0, 0.825) for _ in range(5)]
        false += not ratio_ci(a, b, seed=seed, min_rel=0.01).within_noise
    assert false / 200 <= 0.08  # near the nominal 5% of a 95% interval (5.5% on these seeds)
