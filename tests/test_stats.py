"""minilm.study.stats: t quantiles, confidence intervals and paired verdicts against hand computations."""

import math

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
    # no spread: the sign test over the seeds (3 agreeing seeds can say no more than 1/8)
    assert stats.t_test([2.0, 2.0, 2.0], 1.0, ">") == 0.125 and stats.t_test([2.0, 2.0], 1.0, "<") == 1.0
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
