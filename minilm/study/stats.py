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
model is the unit), read with the t-interval above, and tested by the sign-flip test below.

Hypothesis tests, for claims written down before a run (each gives a p-value, so that many
claims can be corrected together):

* ``t_test``: the one-sided one-sample t-test (Student 1908) of "the mean of the per-seed
  values is below (above) a threshold": t = (mean - threshold) / (s / sqrt(n)), n - 1
  degrees of freedom. Superiority claims ("A beats B": log(ppl_A / ppl_B) < 0 per seed).
  Values without any spread have no t statistic (s = 0): ``t_test`` refuses them, and the
  caller tests them with ``sign_flip_test`` (at five agreeing seeds the t-test's p would jump
  from 2^-5 to nearly 0 as soon as one seed moved by a probe).
* ``tost``: two one-sided tests for equivalence (Schuirmann 1987): "the mean lies inside
  (low, high)" holds when both "mean > low" and "mean < high" are rejected-against, i.e.
  p = max(p_low, p_high); at level alpha this is the same as the (1 - 2 alpha) t-interval
  lying inside the margins. "Flat" and "ties" claims, with their margin stated beforehand.
* ``sign_flip_test``: the exact one-sided paired sign-flip permutation test (Fisher 1935,
  section 21; Pitman 1937) of "the mean of the per-seed values is below (above) a threshold",
  for values whose distribution the t-test cannot assume normal: retrieval accuracies, bounded
  in [0, 1] and saturating at 0% or 100%, and differences of them or of log-probabilities. With
  d_i = value_i - threshold and the statistic S = sum d_i, under the null hypothesis each d_i is
  as likely to carry either sign (d_i symmetric about 0: for a paired difference, the two cells
  exchangeable within a seed), so each of the 2^n sign patterns e_i = +-1 gives an equally
  likely S(e) = sum e_i d_i; p is the share of patterns with S(e) at least as extreme as the
  observed S (the identity included, so p >= 2^-n; all d_i = 0 gives p = 1). The test is exact
  at any n and moves in steps of 2^-n as the values move: no spread gives 2^-n, as does one
  seed a probe below the others; its smallest p at five seeds is 1/32 = 0.031, at eight 0.0039.
  ``sign_flip_interval`` inverts it (Pitman 1937): the thresholds that neither one-sided test
  at level (1 - c) / 2 rejects, the interval the test decides on. ``sign_flip_tost`` is its
  equivalence version (two one-sided sign-flip tests, p the larger).
* ``holm``: Holm's step-down adjusted p-values (Holm 1979): sort p_(1) <= ... <= p_(m),
  adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)); a claim holds at family-wise
  error rate alpha when its adjusted p-value is below alpha.

The t quantile is computed here (no SciPy): the t CDF through the regularized incomplete
beta function (continued fraction, Numerical Recipes section 6.4), inverted by bisection.
"""

from __future__ import annotations

import bisect
import functools
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


@functools.lru_cache(maxsize=None)
def t_quantile(p: float, df: float) -> float:
    """The t value with P(T <= t) = p (0 < p < 1), by bisection on ``t_cdf`` to the last bit."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):  # the interval is one float wide: more halvings change nothing
            break
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
        if middle in (low, high):  # the interval is one float wide: more halvings change nothing
            break
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


def no_spread(values: Sequence[float]) -> bool:
    """Whether every value is the same (then the t statistic is undefined: s = 0)."""
    return max(values) == min(values)


def t_statistic(values: Sequence[float], threshold: float) -> tuple:
    """(t, degrees of freedom) of the one-sample t-test of ``values`` against ``threshold``; t is
    +-inf (0 at the threshold) for values without spread."""
    values = [float(v) for v in values]
    n = len(values)
    if n < 2:
        raise ValueError(f"a t-test needs at least 2 values, got {n}")
    mean = sum(values) / n
    if no_spread(values):
        return (math.copysign(math.inf, values[0] - threshold) if values[0] != threshold else 0.0), n - 1
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return (mean - threshold) / (sd / math.sqrt(n)), n - 1


def t_test(values: Sequence[float], threshold: float, expect: str) -> float:
    """p-value of the one-sided one-sample t-test of "mean ``expect`` threshold" (``expect``
    '<' or '>'; the null hypothesis is the other side, equality included). Values without any
    spread have no t statistic and are refused (ValueError): test them with ``sign_flip_test``."""
    _check_expect(expect)
    t, df = t_statistic(values, threshold)
    if no_spread(values):
        raise ValueError(f"a t-test needs values with some spread, got {len(values)} equal values: use sign_flip_test")
    return t_cdf(t, df) if expect == "<" else 1.0 - t_cdf(t, df)


def tost(values: Sequence[float], low: float, high: float) -> float:
    """p-value of the two one-sided tests (Schuirmann 1987) of "low < mean < high": the larger
    of the p-values of "mean > low" and "mean < high"."""
    if not low < high:
        raise ValueError(f"tost needs low < high, got low={low}, high={high}")
    return max(t_test(values, low, ">"), t_test(values, high, "<"))


SIGN_FLIP_MAX = 32  # values a sign-flip test counts exactly: two halves of 2^16 subset sums at most
TIE_TOLERANCE = 1e-9  # sign patterns whose sums differ by less than this share of sum |d_i| are tied


def sign_flip_test(values: Sequence[float], threshold: float, expect: str) -> float:
    """p-value of the exact one-sided paired sign-flip permutation test (Fisher 1935; Pitman 1937)
    of "mean ``expect`` threshold" (``expect`` '<' or '>'; the null hypothesis: each
    d_i = value_i - threshold symmetric about 0). Of the 2^n sign patterns e, the share whose
    S(e) = sum e_i d_i is >= sum d_i (for '>'; <= for '<'), the identity counted: p >= 2^-n, and
    p = 1 when every d_i is 0. Sums within ``TIE_TOLERANCE`` x sum |d_i| of the observed one count
    as tied (so as extreme), so float noise cannot flip a tie.

    Counted exactly, not sampled: flipping the signs of a set F changes S by -2 sum_F d_i, so for
    '>' the count is the number of subsets F with sum_F d_i <= the tolerance, found by splitting
    the values in two halves, listing each half's 2^(n/2) subset sums and counting the pairs by
    bisection (meet in the middle). At most ``SIGN_FLIP_MAX`` values (ValueError beyond)."""
    _check_expect(expect)
    d = [float(v) - threshold for v in values]
    if not d or len(d) > SIGN_FLIP_MAX or not all(math.isfinite(x) for x in d):
        raise ValueError(f"a sign-flip test needs 1 to {SIGN_FLIP_MAX} finite values, got {len(d)}: {list(values)}")
    if expect == "<":
        d = [-x for x in d]
    return _subsets_at_most(d, TIE_TOLERANCE * sum(abs(x) for x in d)) / 2 ** len(d)


def _subset_sums(values: Sequence[float]) -> list:
    """The 2^n sums of the subsets of ``values`` (the empty one included)."""
    sums = [0.0]
    for v in values:
        sums += [s + v for s in sums]
    return sums


def _subsets_at_most(values: Sequence[float], bound: float) -> int:
    """How many of the 2^n subsets of ``values`` sum to at most ``bound`` (meet in the middle)."""
    half = len(values) // 2
    left, right = _subset_sums(values[:half]), sorted(_subset_sums(values[half:]))
    return sum(bisect.bisect_right(right, bound - s) for s in left)


def sign_flip_tost(values: Sequence[float], low: float, high: float) -> float:
    """p-value of two one-sided sign-flip tests of "low < mean < high": the larger of the
    p-values of "mean > low" and "mean < high" (Schuirmann's procedure, the tests exact)."""
    if not low < high:
        raise ValueError(f"sign_flip_tost needs low < high, got low={low}, high={high}")
    return max(sign_flip_test(values, low, ">"), sign_flip_test(values, high, "<"))


def sign_flip_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple:
    """(low, high): the thresholds that neither one-sided sign-flip test at level (1 - c) / 2
    rejects (the test inverted, Pitman 1937), so "mean > t" is decided at that level exactly when
    t < low (to the tie tolerance). Inside [min, max] of the values ([min, max] itself at five
    values and 90%); (-inf, inf) when 2^-n > (1 - c) / 2 (no pattern count can reach the level:
    four values or fewer at 90%)."""
    values = [float(v) for v in values]
    level = (1.0 - confidence) / 2.0
    if not values or 0.5 ** len(values) > level:
        return -math.inf, math.inf
    return max(min(values), _boundary(values, level, ">")), min(max(values), _boundary(values, level, "<"))


def _boundary(values: list, level: float, expect: str) -> float:
    """Where the one-sided test of "mean ``expect`` t" stops rejecting as t moves towards the
    values (bisection: its p-value is monotone in t). Below the least value every d_i > 0 and
    '>' gets p = 2^-n <= level; at the largest, p = 1."""
    low, high = min(values), max(values)
    step = (high - low) or max(1.0, abs(low))
    rejected, kept = (low - step, high) if expect == ">" else (high + step, low)
    for _ in range(200):
        middle = 0.5 * (rejected + kept)
        if middle in (rejected, kept):
            break
        if sign_flip_test(values, middle, expect) <= level:
            rejected = middle
        else:
            kept = middle
    return kept


def holm(pvalues: Sequence[float]) -> list:
    """Holm's (1979) step-down adjusted p-values, in the order given (module docstring)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
