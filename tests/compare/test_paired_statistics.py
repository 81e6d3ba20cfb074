"""The paired statistics of `inloop-eval compare` against scipy, and their calibration on simulated outcomes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats  # a dev dependency (pyproject.toml), the reference only

from inloop_eval.metrics.paired import (
    A_BETTER,
    B_BETTER,
    CANNOT_TELL,
    MCNEMAR,
    PAIRED_T,
    exact_mcnemar_p,
    paired_difference,
)


@pytest.mark.parametrize("n", [1, 2, 7, 40, 301])
def test_the_exact_mcnemar_p_value_is_scipys_two_sided_binomial_test(n):
    for b_only in range(n + 1):
        expected = stats.binomtest(b_only, n, 0.5).pvalue
        assert exact_mcnemar_p(b_only, n - b_only) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def exact_p_values(n: int) -> list[float]:
    """The two-sided exact McNemar p-value of each b_only = 0..n of n discordant documents, from exact
    integers: the binomial coefficients' running sum, one correctly rounded division each."""
    tails, coefficient, total = [], 1, 0
    for i in range(n + 1):
        total += coefficient
        tails.append(total)
        coefficient = coefficient * (n - i) // (i + 1)
    return [min(1.0, 2 * tails[min(k, n - k)] / 2**n) for k in range(n + 1)]


@pytest.mark.parametrize("n", [*range(1, 60), 400, 1001, 2999])
def test_the_exact_mcnemar_p_value_equals_the_exact_binomial_sum(n):
    for b_only, expected in enumerate(exact_p_values(n)):
        assert exact_mcnemar_p(b_only, n - b_only) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def middle_steps(n: int) -> list[int]:
    """Discordant counts from the middle to where the p-value leaves the floats: 0 to 37 half-sds out."""
    return sorted({max(int(n / 2 - z * math.sqrt(n) / 2), 0) for z in (0, 0.5, 1, 2, 3, 5, 8, 12, 20, 30, 37)})


@pytest.mark.parametrize("n", [5_000, 14_000, 50_001, 200_000])
def test_the_exact_mcnemar_p_value_of_many_discordant_documents_is_scipys(n):
    for b_only in middle_steps(n):
        expected = stats.binomtest(b_only, n, 0.5).pvalue
        assert exact_mcnemar_p(b_only, n - b_only) == pytest.approx(expected, rel=1e-12, abs=1e-300)
        assert exact_mcnemar_p(n - b_only, b_only) == exact_mcnemar_p(b_only, n - b_only)


def test_the_exact_mcnemar_p_value_of_ten_million_discordant_documents():
    """Beyond what summing binomial coefficients could reach (hours); within 1e-10 of scipy, whose own
    rounding at this size is about 1e-11."""
    n = 10_000_000
    for b_only in middle_steps(n):
        expected = stats.binomtest(b_only, n, 0.5).pvalue
        assert exact_mcnemar_p(b_only, n - b_only) == pytest.approx(expected, rel=1e-10, abs=1e-300)


def test_the_paired_t_p_value_is_scipys_ttest_rel():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 30, 1000):
        for shift in (0.0, 0.02, 0.2):
            a = rng.normal(1.0, 1.0, n)
            b = a + rng.normal(shift, 0.3, n)
            result = paired_difference(a, b, binary=False)
            expected = stats.ttest_rel(b, a)
            assert result.test == PAIRED_T
            assert result.p_value == pytest.approx(expected.pvalue, rel=1e-10, abs=1e-300)
            assert result.diff / result.stderr == pytest.approx(expected.statistic, rel=1e-12)


def test_0_1_outcomes_use_mcnemar_on_the_discordant_documents():
    a = np.array([1, 1, 0, 0, 1, 0, 1, 0, 0, 0])
    b = np.array([1, 0, 1, 1, 1, 1, 1, 1, 0, 1])  # B alone right on 5, A alone on 1
    r = paired_difference(a, b, binary=True)
    d = b - a
    assert (r.n, r.a, r.b, r.diff, r.test) == (10, 0.4, 0.8, pytest.approx(0.4), MCNEMAR)
    assert r.stderr == pytest.approx(d.std(ddof=1) / math.sqrt(10), rel=1e-15)
    assert r.ci95 == pytest.approx((r.diff - 1.96 * r.stderr, r.diff + 1.96 * r.stderr))
    assert r.mdd80 == pytest.approx(2.8 * r.stderr)
    assert r.p_value == pytest.approx(stats.binomtest(5, 6, 0.5).pvalue, rel=1e-12)
    assert r.verdict == CANNOT_TELL  # p = 0.22


def test_the_verdict_names_the_better_side_by_the_figures_direction():
    rng = np.random.default_rng(1)
    a = rng.normal(2.0, 0.5, 500)
    lower = a - 0.1 + rng.normal(0, 0.05, 500)
    assert paired_difference(a, lower, binary=False).verdict == A_BETTER
    assert paired_difference(a, lower, binary=False, lower_is_better=True).verdict == B_BETTER


@pytest.mark.parametrize("binary", [True, False])
def test_an_evaluation_compared_with_itself_differs_by_nothing(binary):
    values = np.random.default_rng(2).integers(0, 2, 200).astype(float)
    r = paired_difference(values, values, binary=binary)
    assert (r.diff, r.stderr, r.ci95, r.p_value, r.verdict) == (0.0, 0.0, (0.0, 0.0), 1.0, CANNOT_TELL)


def test_no_documents_and_one_document_give_nan_not_an_error():
    assert math.isnan(paired_difference(np.zeros(0), np.zeros(0), binary=True).diff)
    one = paired_difference(np.array([0.0]), np.array([1.0]), binary=False)
    assert one.diff == 1.0 and math.isnan(one.stderr) and one.verdict == CANNOT_TELL


def test_the_95_percent_interval_covers_a_known_3_point_difference_95_percent_of_the_time():
    """Paired 0/1 outcomes at N = 1000: P(A right) = 0.485, P(B right) = 0.515 (3 points), correlated through
    the documents (both right 45%, both wrong 45%); 800 seeded repetitions."""
    rng = np.random.default_rng(19)
    n, repetitions, true_diff = 1000, 800, 0.03
    joint = {(1, 1): 0.45, (1, 0): 0.035, (0, 1): 0.065, (0, 0): 0.45}
    cells = np.array(list(joint))
    covered = rejected = 0
    for _ in range(repetitions):
        drawn = cells[rng.choice(len(cells), size=n, p=list(joint.values()))]
        r = paired_difference(drawn[:, 0], drawn[:, 1], binary=True)
        covered += r.ci95[0] <= true_diff <= r.ci95[1]
        rejected += r.verdict == B_BETTER
    assert 0.93 <= covered / repetitions <= 0.97
    # Paired, 3 points are found most of the time (se about 1 point); two unpaired 95% bars of +-3.1
    # points each would overlap.
    assert rejected / repetitions > 0.7


def test_the_interval_of_a_continuous_figure_is_calibrated_too():
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(600):
        a = rng.gamma(2.0, 1.0, 1000)
        b = a + 0.03 + rng.normal(0, 0.4, 1000)
        lo, hi = paired_difference(a, b, binary=False).ci95
        covered += lo <= 0.03 <= hi
    assert 0.93 <= covered / 600 <= 0.97
