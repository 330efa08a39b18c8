"""Small statistics for benchmark samples: summaries, a bootstrap interval for the ratio of two
medians, and Welch's t-test. Standard library only (the child process may run where numpy is old
or missing, and these sizes are tiny)."""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass


def summary(samples: list[float]) -> dict[str, float]:
    """median, mean, stdev, relative spread (cv) and min/max of one metric's repeats."""
    xs = [float(x) for x in samples if x is not None and math.isfinite(float(x))]
    if not xs:
        return {"n": 0}
    med = statistics.median(xs)
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {
        "n": len(xs), "median": med, "mean": mean, "stdev": sd,
        "cv": (sd / abs(mean)) if mean else 0.0, "min": min(xs), "max": max(xs),
    }


@dataclass
class RatioCI:
    ratio: float          # median(b) / median(a)
    low: float            # bootstrap percentile interval of that ratio
    high: float
    confidence: float
    welch_p: float | None  # two-sided p of Welch's t-test on the means (None with < 2 samples)

    @property
    def within_noise(self) -> bool:
        """No difference is claimed unless the interval excludes ratio 1 AND Welch's test agrees
        at the same level: with a handful of repeats the percentile bootstrap of a median is
        overconfident (an unchanged metric came out "worse by 1.5%" under 1.5% noise)."""
        if self.low <= 1.0 <= self.high:
            return True
        return self.welch_p is not None and self.welch_p >= 1.0 - self.confidence

    def as_dict(self) -> dict[str, float | bool | None]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high,
                "confidence": self.confidence, "welch_p": self.welch_p,
                "within_noise": self.within_noise}


def ratio_ci(a: list[float], b: list[float], confidence: float = 0.95, resamples: int = 4000,
             seed: int = 0, min_rel: float = 0.0) -> RatioCI:
    """Percentile bootstrap of median(b)/median(a). `min_rel` widens the interval by a floor of
    relative noise (e.g. 0.01), so that a perfectly repeatable metric still has a sane band."""
    if not a or not b:
        raise ValueError("ratio_ci needs samples on both sides")
    ma, mb = statistics.median(a), statistics.median(b)
    if ma == 0:
        raise ValueError("baseline median is 0: no ratio")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        ra = statistics.median(rng.choices(a, k=len(a)))
        rb = statistics.median(rng.choices(b, k=len(b)))
        if ra != 0:
            ratios.append(rb / ra)
    ratios.sort()
    alpha = (1.0 - confidence) / 2.0
    lo = ratios[int(alpha * (len(ratios) - 1))]
    hi = ratios[int(math.ceil((1.0 - alpha) * (len(ratios) - 1)))]
    r = mb / ma
    lo, hi = min(lo, r * (1 - min_rel)), max(hi, r * (1 + min_rel))
    return RatioCI(r, lo, hi, confidence, welch_p(a, b))


def welch_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided p-value of Welch's unequal-variance t-test (t distribution via the regularised
    incomplete beta function)."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if va + vb == 0:
        return 1.0 if diff == 0 else 0.0
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t_two_sided_p(t, df)


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom."""
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (Numerical Recipes' continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log(1.0 - x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 3e-14:
            break
    return h
