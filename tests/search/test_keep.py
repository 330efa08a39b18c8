import random

from tuner.search.keep import decide, pool, rel_noise
from tuner.trial import Measurement


def m(samples, per_size=None):
    return Measurement(metric="t", value=sorted(samples)[len(samples) // 2], samples=samples,
                       per_size=per_size or {})


def noisy(mean, n, sd, rng):
    return [rng.gauss(mean, sd * mean) for _ in range(n)]


def test_clear_gain_is_kept():
    rng = random.Random(0)
    d = decide(m(noisy(100, 4, 0.01, rng)), m(noisy(110, 4, 0.01, rng)), pooled_noise=0.01)
    assert d.verdict == "kept" and d.reason == "improved"
    assert 0.05 < d.gain < 0.15


def test_gain_inside_noise_is_reverted_not_kept():
    # a true 0.5% gain under 2% sample noise: keeping it would be chasing noise
    kept = 0
    for seed in range(200):
        rng = random.Random(seed)
        d = decide(m(noisy(100, 3, 0.02, rng)), m(noisy(100.5, 3, 0.02, rng)), pooled_noise=0.02)
        kept += d.verdict == "kept"
        assert d.reason in ("within_noise", "improved", "worse")
    assert kept < 200 * 0.1  # a false keep is rare


def test_no_change_false_keep_rate_is_low():
    kept = 0
    for seed in range(400):
        rng = random.Random(seed)
        d = decide(m(noisy(100, 3, 0.02, rng)), m(noisy(100, 3, 0.02, rng)), pooled_noise=0.02)
        kept += d.verdict == "kept"
    assert kept / 400 < 0.05


def test_clear_loss_is_worse():
    rng = random.Random(1)
    d = decide(m(noisy(100, 3, 0.01, rng)), m(noisy(80, 3, 0.01, rng)), pooled_noise=0.01)
    assert (d.verdict, d.reason) == ("reverted", "worse")


def test_pooled_noise_guards_against_lucky_tight_pairs():
    # three pairs that happen to agree closely, but the workload is known to be 5% noisy
    a, b = m([100.0, 100.1, 99.9]), m([103.0, 103.1, 102.9])
    assert decide(a, b, pooled_noise=0.0).verdict == "kept"
    assert decide(a, b, pooled_noise=0.05).reason == "within_noise"


def test_size_regression_blocks_a_headline_win():
    a = m([100, 100, 100], {"ctx4k": 50.0, "ctx128k": 10.0})
    b = m([110, 110, 110], {"ctx4k": 60.0, "ctx128k": 9.8})  # long context 2% slower
    d = decide(a, b, pooled_noise=0.005)
    assert (d.verdict, d.reason) == ("reverted", "size_regressed")
    assert d.stats["regressed_size"]["size"] == "ctx128k"
    b_ok = m([110, 110, 110], {"ctx4k": 60.0, "ctx128k": 9.95})  # within the 1% tolerance
    assert decide(a, b_ok, pooled_noise=0.005).verdict == "kept"


def test_pool_and_rel_noise():
    p = pool([m([1.0], {"s": 1.0}), m([3.0], {"s": 3.0}), m([2.0], {"s": 2.0})])
    assert p.samples == [1.0, 3.0, 2.0] and p.value == 2.0 and p.per_size == {"s": 2.0}
    assert rel_noise([10.0]) == 0.0
    assert abs(rel_noise([9.0, 11.0]) - (2 ** 0.5) / 10) < 1e-9
