"""minilm.study.stats: t quantiles, confidence intervals, paired verdicts and the exact sign-flip test
against hand computations."""

import itertools
import math
import random

import pytest

from minilm.study import stats


@pytest.mark.parametrize(
    "df, expected",
    [
        (1, 12.706204736174703),
        (2, 4.302652729749464),
        (4, 2.776445105197799),
        (9, 2.262157162798205),
        (30, 2.042272456301238),
    ],
)
def test_t_quantile_matches_published_tables(df, expected):
    # two-sided 95% critical values of Student's t (any statistics table; df=1 is tan(0.475 pi))
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, rel=1e-9)


def test_t_distribution_closed_forms():
    assert stats.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-12)  # Cauchy
    p = 0.9  # df = 2: t = (2p - 1) / sqrt(2 p (1 - p))
    assert stats.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    assert stats.t_cdf(0.0, 5) == pytest.approx(0.5)
    assert stats.t_quantile(0.025, 3) == pytest.approx(-stats.t_quantile(0.975, 3))
    assert stats.t_quantile(0.975, 10**6) == pytest.approx(1.959964, abs=1e-5)  # the normal limit


def test_interval_against_a_hand_computation():
    # values 10, 12, 14: mean 12, sample sd 2, half-width 4.302653 * 2 / sqrt(3) = 4.968275
    ci = stats.interval([10.0, 12.0, 14.0])
    assert ci.mean == pytest.approx(12.0)
    assert ci.half_width == pytest.approx(4.302652729749464 * 2 / math.sqrt(3), rel=1e-9)
    assert (ci.low, ci.high) == pytest.approx((12 - 4.968275, 12 + 4.968275), abs=1e-6)
    assert ci.format() == "12.00 ± 4.97"
    one = stats.interval([5.0])
    assert one.half_width is None and one.format() == "5.00"
    assert stats.interval([3.0, 3.0]).half_width == 0.0
    with pytest.raises(ValueError):
        stats.interval([])


def test_paired_verdicts_on_synthetic_numbers():
    # per-seed ratios, e.g. ppl(rope at 4L) / ppl(rope at L)
    clearly_above = [1.20, 1.25, 1.22]
    assert stats.verdict(clearly_above, ">", 1.0) == "yes"
    assert stats.verdict(clearly_above, "<", 1.0) == "no"
    straddles = [0.95, 1.05, 1.01]
    assert stats.verdict(straddles, ">", 1.0) == "unresolved"
    assert stats.verdict(straddles, "<", 1.0) == "unresolved"
    # the same means with a large spread are unresolved: the interval, not the mean, decides
    assert stats.verdict([1.05, 1.45, 1.16], ">", 1.2) == "unresolved"
    assert stats.verdict([0.5, 0.6, 0.55], "<", 1.15) == "yes"
    assert stats.verdict([1.3], ">", 1.0) == "unresolved"  # one seed: no interval, no verdict
    with pytest.raises(ValueError):
        stats.verdict([1.0, 2.0], "=", 1.0)


def test_paired_beats_unpaired():
    # A is 2% better than B on every seed, while seeds differ by 20%: two means with their
    # own intervals overlap, the paired ratio is decided.
    b = [40.0, 48.0, 44.0]
    a = [x * 0.98 for x in b]
    assert stats.interval(a).high > stats.interval(b).low  # unpaired intervals overlap
    assert stats.verdict([x / y for x, y in zip(a, b)], "<", 1.0) == "yes"


# --------------------------------------------------------------------------- hypothesis tests

# Student's (1908) worked example: the extra hours of sleep of 10 patients under two hypnotics
# (Cushny and Peebles 1905), as paired differences; R's t.test(extra ~ group, data = sleep,
# paired = TRUE) prints t = -4.0621, df = 9, p-value = 0.002833 (two-sided).
SLEEP = [1.2, 2.4, 1.3, 1.3, 0.0, 1.0, 1.8, 0.8, 4.6, 1.4]


def test_t_test_reproduces_students_sleep_example():
    t, df = stats.t_statistic(SLEEP, 0.0)
    assert (t, df) == (pytest.approx(4.0621, abs=5e-5), 9)
    assert 2 * stats.t_test(SLEEP, 0.0, ">") == pytest.approx(0.002833, abs=5e-7)
    assert stats.t_test(SLEEP, 0.0, "<") == pytest.approx(1 - 0.002833 / 2, abs=5e-7)
    # the same test against another threshold is the test of the shifted values
    assert stats.t_test(SLEEP, 1.0, ">") == pytest.approx(stats.t_test([v - 1 for v in SLEEP], 0.0, ">"))
    # no spread: no t statistic, so no t-test (the sign-flip test takes such values; 0.1 x 3 has a mean
    # that rounds away from 0.1, which must not pass for a spread)
    for flat in ([2.0, 2.0, 2.0], [2.0, 2.0], [0.1, 0.1, 0.1]):
        with pytest.raises(ValueError, match="no spread|some spread"):
            stats.t_test(flat, 1.0, ">")
    assert stats.t_statistic([0.1, 0.1, 0.1], 0.0) == (math.inf, 2)
    with pytest.raises(ValueError):
        stats.t_test([1.0], 0.0, ">")
    with pytest.raises(ValueError):
        stats.t_test(SLEEP, 0.0, "=")


def test_tost_is_the_larger_one_sided_p_and_agrees_with_the_90_percent_interval():
    # sleep data, margins (-2, 2): mean 1.58, se 0.38893; upper test t = (1.58 - 2) / 0.38893 = -1.0799,
    # P(T_9 < -1.0799) = 0.15416; the lower test (t = 9.20) is far below it
    assert stats.tost(SLEEP, -2.0, 2.0) == pytest.approx(0.15416, abs=5e-5)
    assert stats.tost(SLEEP, -2.0, 2.0) == max(stats.t_test(SLEEP, -2.0, ">"), stats.t_test(SLEEP, 2.0, "<"))
    # Schuirmann: equivalent at 5% exactly when the 90% t-interval lies inside the margins
    ci = stats.interval(SLEEP, confidence=0.90)
    for low, high in [(-2, 2), (0.5, 2.5), (0.9, 2.3), (0.87, 2.29), (0.86, 2.30), (1.0, 3.0)]:
        assert (stats.tost(SLEEP, low, high) < 0.05) == (low < ci.low and ci.high < high), (low, high)
    with pytest.raises(ValueError):
        stats.tost(SLEEP, 1.0, 1.0)


def test_holm_on_the_textbook_example():
    # Holm's step-down procedure, the usual worked example: p = 0.01, 0.04, 0.03, 0.005 at alpha 0.05.
    # Sorted: 0.005 x 4 = 0.02 (reject), 0.01 x 3 = 0.03 (reject), 0.03 x 2 = 0.06 (stop): H1 and H4 rejected.
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [a < 0.05 for a in adjusted] == [True, False, False, True]
    # monotone in the sorted order, capped at 1, and Bonferroni for the smallest
    assert stats.holm([0.2, 0.5, 0.9]) == pytest.approx([0.6, 1.0, 1.0])
    assert stats.holm([]) == [] and stats.holm([0.04]) == [0.04]


# --------------------------------------------------------------------------- the sign-flip test


def brute_force(d, expect):
    """The sign-flip p-value by listing all 2^n sign patterns (exact rationals for integer d)."""
    observed = sum(d)
    sums = [sum(e * x for e, x in zip(signs, d)) for signs in itertools.product((1, -1), repeat=len(d))]
    extreme = [s for s in sums if (s >= observed if expect == ">" else s <= observed)]
    return len(extreme) / len(sums)


def test_sign_flip_test_on_worked_examples():
    # d = 1, 2, 3: the 8 patterns sum to 6, 4, 2, 0, 0, -2, -4, -6; only the identity reaches 6
    assert stats.sign_flip_test([1, 2, 3], 0.0, ">") == 1 / 8
    assert stats.sign_flip_test([1, 2, 3], 0.0, "<") == 1.0  # every pattern is <= 6
    assert stats.sign_flip_test([2, 3, 4], 1.0, ">") == 1 / 8  # the test is of value - threshold
    # a zero and a tie: d = 0, 1, 1, -2, observed 0. The zero's sign changes nothing (each sum twice);
    # signs on (1, 1, -2) give 0, 4, -2, 2, -2, 2, -4, 0: five of eight >= 0 and five <= 0, the two
    # zeros (the observed value, tied) counted on both sides
    assert stats.sign_flip_test([0, 1, 1, -2], 0.0, ">") == 10 / 16
    assert stats.sign_flip_test([0, 1, 1, -2], 0.0, "<") == 10 / 16
    # the negative direction: d = -3, -1, 2, observed -2; the patterns give -2, -6, 0, -4, 4, 0, 6, 2:
    # three of eight are <= -2
    assert stats.sign_flip_test([-3, -1, 2], 0.0, "<") == 3 / 8
    assert stats.sign_flip_test([-3, -1, 2], 0.0, ">") == 6 / 8  # -2, 0, 4, 0, 6, 2
    assert stats.sign_flip_test([0.2, 0.1, 0.4, 0.3], 0.5, "<") == 1 / 16  # every seed below: the identity only
    assert stats.sign_flip_test([0.0, 0.0, 0.0], 0.0, ">") == 1.0  # every d_i = 0: every pattern ties
    assert stats.sign_flip_test([7.0], 5.0, ">") == 0.5  # one value: itself and its flip


def test_sign_flip_test_reproduces_fishers_darwin_example():
    # Fisher (1935), The Design of Experiments, section 21: Darwin's 15 pairs of Zea mays, cross- minus
    # self-fertilised heights in eighths of an inch; of the 2^15 = 32,768 sign patterns, 1,726 give a
    # total at least as large in either direction as the observed 314, so 863 in the observed one
    darwin = [49, -67, 8, 16, 6, 23, 28, 41, 14, 29, 56, 24, 75, 60, -48]
    assert stats.sign_flip_test(darwin, 0.0, ">") == 863 / 32768
    assert stats.sign_flip_test([-x for x in darwin], 0.0, "<") == 863 / 32768


@pytest.mark.parametrize("n", [1, 2, 5, 8, 11])
def test_sign_flip_test_is_its_exact_distribution(n):
    """Against every sign pattern listed, on integers (ties by construction) and on floats."""
    rng = random.Random(n)
    for _ in range(20):
        d = [rng.randint(-4, 4) for _ in range(n)]
        for expect in "<>":
            assert stats.sign_flip_test(d, 0.0, expect) == brute_force(d, expect), (d, expect)
        floats = [rng.gauss(0.2, 1.0) for _ in range(n)]
        assert stats.sign_flip_test(floats, 0.0, ">") == pytest.approx(brute_force(floats, ">"), abs=1e-12)


def test_float_noise_does_not_break_a_tie():
    # 0.1 + 0.2 - 0.3 is 5.6e-17, not 0: without the tolerance the two tied patterns of d = 1, 2, -3
    # (5/8 on each side) would fall on one side only
    assert stats.sign_flip_test([1, 2, -3], 0.0, ">") == stats.sign_flip_test([1, 2, -3], 0.0, "<") == 5 / 8
    assert stats.sign_flip_test([0.1, 0.2, -0.3], 0.0, ">") == 5 / 8
    assert stats.sign_flip_test([0.1, 0.2, -0.3], 0.0, "<") == 5 / 8


def test_sign_flip_test_is_continuous_where_the_t_test_jumped():
    """The issue's pair: five seeds at 100% against four at 100% and one at 31/32, tested for
    "accuracy > 50%". The t-test gave 2^-5 (the old sign-test fallback) and 7.7e-8; the sign-flip
    test gives 2^-5 to both, and moves in steps of 2^-5 as one seed falls."""
    saturated, one_probe_less = [1.0] * 5, [1.0] * 4 + [31 / 32]
    assert stats.sign_flip_test(saturated, 0.5, ">") == stats.sign_flip_test(one_probe_less, 0.5, ">") == 1 / 32
    assert stats.t_test(one_probe_less, 0.5, ">") == pytest.approx(7.7e-8, rel=0.05)
    with pytest.raises(ValueError):
        stats.t_test(saturated, 0.5, ">")
    falling = [stats.sign_flip_test([1.0] * 4 + [k / 32], 0.5, ">") for k in range(32, -1, -1)]
    # the seed at 0%: d = .5, .5, .5, .5, -.5; F = {}, {-.5} and the four {-.5, .5} (sum 0, tied) flip to >= 1.5
    assert falling == sorted(falling) and falling[-1] == 6 / 32
    assert all(round(p * 32) == p * 32 for p in falling)


def test_sign_flip_test_refuses_what_it_cannot_count():
    with pytest.raises(ValueError, match="1 to 32 finite values"):
        stats.sign_flip_test([], 0.0, ">")
    with pytest.raises(ValueError, match="1 to 32 finite values"):
        stats.sign_flip_test([1.0] * 33, 0.0, ">")
    with pytest.raises(ValueError, match="finite"):
        stats.sign_flip_test([1.0, math.nan], 0.0, ">")
    with pytest.raises(ValueError, match="expect"):
        stats.sign_flip_test([1.0, 2.0], 0.0, "=")
    assert stats.sign_flip_test(list(range(1, 33)), 0.0, ">") == 2.0**-32  # 32 values, counted exactly


def test_sign_flip_interval_is_the_test_inverted():
    # five values at 90%: each one-sided test at 5% rejects only when every seed lies beyond the
    # threshold (2^-5 = 0.031; two patterns, 0.0625, is too many), so the interval is [min, max]
    values = [0.94, 1.0, 0.94, 0.09, 0.09]
    low, high = stats.sign_flip_interval(values, 0.90)
    assert (low, high) == (0.09, 1.0)
    for t in (0.0, 0.08, 0.1, 0.5, 0.99, 1.01):
        assert (stats.sign_flip_test(values, t, ">") <= 0.05) == (t < low), t
        assert (stats.sign_flip_test(values, t, "<") <= 0.05) == (t > high), t
    assert stats.sign_flip_interval([1.0] * 5, 0.90) == (1.0, 1.0)  # no spread: the one value
    assert stats.sign_flip_interval([1.0, 2.0, 3.0], 0.90) == (-math.inf, math.inf)  # 2^-3 > 0.05: no bound
    # eight values at 90%: the 5% bound is where the count of patterns reaches 0.05 x 256 = 12.8
    eight = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    low, _ = stats.sign_flip_interval(eight, 0.90)
    assert 1.0 < low < 4.5 and stats.sign_flip_test(eight, low - 1e-6, ">") <= 0.05 < stats.sign_flip_test(
        eight, low + 1e-6, ">"
    )


def test_sign_flip_tost_is_the_larger_one_sided_p():
    logs = [0.01, -0.02, 0.015, 0.0, 0.005]
    assert stats.sign_flip_tost(logs, -0.1, 0.1) == 1 / 32  # every value inside both margins
    assert stats.sign_flip_tost(logs, -0.1, 0.1) == max(
        stats.sign_flip_test(logs, -0.1, ">"), stats.sign_flip_test(logs, 0.1, "<")
    )
    assert stats.sign_flip_tost(logs, 0.0, 0.1) > 0.05  # two seeds at or below the lower margin
    with pytest.raises(ValueError):
        stats.sign_flip_tost(logs, 0.1, 0.1)
