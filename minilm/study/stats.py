"""Means over seeds with Student-t confidence intervals, and paired verdicts.

A study cell is the mean of n per-seed values x_1..x_n with the interval

    mean +- t_{(1+c)/2, n-1} * s / sqrt(n),   s the sample standard deviation (n - 1),

for confidence c (0.95 by default): the usual small-sample interval (Student 1908), which
assumes the per-seed values are roughly normal. With one seed there is no interval.

A comparison is *paired*: seed s trains every scheme on the same batches, so the statistic
is computed per seed (for example the ratio ppl_A / ppl_B of seed s) and the interval is
taken over those per-seed values. ``verdict`` then says whether the expectation
"statistic < threshold" (or ">") holds: ``yes`` when the whole interval is on the expected
side, ``no`` when it is wholly on the other side, ``unresolved`` when it contains the
threshold (or when there is only one seed).

The probes of *one* model are a count of successes k in n trials: a binomial proportion,
whose interval is ``wilson``'s (Wilson 1927), the score interval

    (p + z^2/2n +- z sqrt(p(1 - p)/n + z^2/4n^2)) / (1 + z^2/n),   p = k/n, z = the normal quantile,

which stays inside [0, 1] and is not empty at k = 0 or k = n (``longeval`` on one checkpoint).
Across seeds the study does not pool probes: each seed's accuracy is one value (the trained
model is the unit), read with the t-interval above, and seeds that agree exactly are tested by
the sign test (``t_test``).

Hypothesis tests, for claims written down before a run (each gives a p-value, so that many
claims can be corrected together):

* ``t_test``: the one-sided one-sample t-test (Student 1908) of "the mean of the per-seed
  values is below (above) a threshold": t = (mean - threshold) / (s / sqrt(n)), n - 1
  degrees of freedom. Superiority claims ("A beats B": log(ppl_A / ppl_B) < 0 per seed).
* ``tost``: two one-sided tests for equivalence (Schuirmann 1987): "the mean lies inside
  (low, high)" holds when both "mean > low" and "mean < high" are rejected-against, i.e.
  p = max(p_low, p_high); at level alpha this is the same as the (1 - 2 alpha) t-interval
  lying inside the margins. "Flat" and "ties" claims, with their margin stated beforehand.
  Retrieval claims take it too, on per-seed accuracies (against a threshold) or per-seed
  differences (paired): the seed, not the probe, is the unit.
* ``holm``: Holm's step-down adjusted p-values (Holm 1979): sort p_(1) <= ... <= p_(m),
  adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)); a claim holds at family-wise
  error rate alpha when its adjusted p-value is below alpha.

The t quantile is computed here (no SciPy): the t CDF through the regularized incomplete
beta function (continued fraction, Numerical Recipes section 6.4), inverted by bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

CONFIDENCE = 0.95
VERDICTS = ("yes", "no", "unresolved")


def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _incomplete_beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _incomplete_beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom: 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2 for t > 0."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value with P(T <= t) = p (0 < p < 1), by bisection on ``t_cdf``."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values and the half-width of its confidence interval (None for n < 2)."""

    mean: float
    half_width: Optional[float]
    n: int

    @property
    def low(self) -> Optional[float]:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> Optional[float]:
        return None if self.half_width is None else self.mean + self.half_width

    def format(self, digits: int = 2) -> str:
        """'43.57 ± 0.52', or the mean alone when there is no interval."""
        if not math.isfinite(self.mean):
            return f"{self.mean}"
        big = abs(self.mean) >= 1e4
        number = (lambda x: f"{x:.3g}") if big else (lambda x: f"{x:.{digits}f}")
        return number(self.mean) if self.half_width is None else f"{number(self.mean)} ± {number(self.half_width)}"


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean and t-interval of ``values`` (one per seed)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("interval of no values")
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, None, n)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(mean, t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n), n)


def normal_quantile(p: float) -> float:
    """z with P(Z <= z) = p for the standard normal, by bisection on erf."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"normal_quantile needs 0 < p < 1, got p={p}")
    low, high = -40.0, 40.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if 0.5 * (1.0 + math.erf(middle / math.sqrt(2.0))) < p else (low, middle)
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Proportion:
    """``successes`` of ``trials`` with its Wilson score interval [low, high]."""

    successes: int
    trials: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        return self.successes / self.trials

    def format(self) -> str:
        """'93% [88, 96]' (percent, the interval in brackets)."""
        return f"{100 * self.rate:.0f}% [{100 * self.low:.0f}, {100 * self.high:.0f}]"


def wilson(successes: int, trials: int, confidence: float = CONFIDENCE) -> Proportion:
    """The Wilson score interval of a binomial proportion (module docstring)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"wilson needs 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    z = normal_quantile(0.5 + confidence / 2.0)
    p, n = successes / trials, trials
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Proportion(successes, trials, max(0.0, centre - half), min(1.0, centre + half))


def verdict(paired: Sequence[float], expect: str, threshold: float, confidence: float = CONFIDENCE) -> str:
    """Does "statistic ``expect`` threshold" hold (``expect`` '<' or '>')? ``paired`` holds the
    statistic per seed. yes / no when the interval is wholly on one side, else unresolved."""
    if expect not in ("<", ">"):
        raise ValueError(f"expect={expect!r}: valid: '<', '>'")
    ci = interval(paired, confidence)
    if ci.half_width is None:
        return "unresolved"
    below, above = ci.high < threshold, ci.low > threshold
    if below or above:
        return "yes" if below == (expect == "<") else "no"
    return "unresolved"


# --------------------------------------------------------------------------- hypothesis tests


def _check_expect(expect: str) -> None:
    if expect not in ("<", ">"):
        raise ValueError(f"expect={expect!r}: valid: '<', '>'")


def t_statistic(values: Sequence[float], threshold: float) -> tuple:
    """(t, degrees of freedom) of the one-sample t-test of ``values`` against ``threshold``."""
    values = [float(v) for v in values]
    n = len(values)
    if n < 2:
        raise ValueError(f"a t-test needs at least 2 values, got {n}")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    if sd == 0.0:
        return (math.copysign(math.inf, mean - threshold) if mean != threshold else 0.0), n - 1
    return (mean - threshold) / (sd / math.sqrt(n)), n - 1


def t_test(values: Sequence[float], threshold: float, expect: str) -> float:
    """p-value of the one-sided one-sample t-test of "mean ``expect`` threshold" (``expect``
    '<' or '>'; the null hypothesis is the other side, equality included). Values without any
    spread (t = +-inf: seeds that agreed exactly, e.g. retrieval saturated at 0% or 100%) fall
    back to the exact sign test over the n values, 0.5^n when all lie on the expected side and
    1 otherwise: the t-test would give p = 0 from two agreeing seeds."""
    _check_expect(expect)
    t, df = t_statistic(values, threshold)
    if math.isinf(t):
        return 0.5 ** len(values) if (t < 0) == (expect == "<") else 1.0
    return t_cdf(t, df) if expect == "<" else 1.0 - t_cdf(t, df)


def tost(values: Sequence[float], low: float, high: float) -> float:
    """p-value of the two one-sided tests (Schuirmann 1987) of "low < mean < high": the larger
    of the p-values of "mean > low" and "mean < high"."""
    if not low < high:
        raise ValueError(f"tost needs low < high, got low={low}, high={high}")
    return max(t_test(values, low, ">"), t_test(values, high, "<"))


def holm(pvalues: Sequence[float]) -> list:
    """Holm's (1979) step-down adjusted p-values, in the order given (module docstring)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
