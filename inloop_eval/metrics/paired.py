"""Paired comparison of two evaluations on the same documents: is the difference real?

Pure functions over per-document values (`DocumentOutcomes.values`), for `inloop-eval compare`. Pairing on
documents cancels their difficulty, so the paired standard error is far smaller than two separate ones.
- difference B - A of the means, its standard error: the n - 1 standard deviation of the per-document
  differences over sqrt(n), the 95% interval diff +- 1.96 se (normal approximation), and the smallest
  difference these documents detect at 80% power in a two-sided 5% test, (1.96 + 0.84) se;
- p-value: for 0/1 figures the exact McNemar test (a two-sided sign test on the discordant documents: twice
  the fair-coin binomial tail, `metrics.binomial`, O(n) and within 1e-12 of the exact sum); for continuous
  figures the paired t test (Student's t with n - 1 degrees of freedom, its tail from the regularized
  incomplete beta function);
- verdict: A or B better when p < 0.05 (the better side by the figure's direction), else cannot tell.
Legend: N paired documents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from inloop_eval.metrics.binomial import log_half_cdf

# The normal quantiles as the design states them: 95% two-sided, and 80% power.
Z95 = 1.96
Z80_POWER = 0.84
ALPHA = 0.05
A_BETTER, B_BETTER, CANNOT_TELL = "A better", "B better", "cannot tell"
MCNEMAR, PAIRED_T = "exact McNemar", "paired t"


@dataclass(frozen=True)
class PairedResult:
    """One figure compared on `n` paired documents.

    a, b: the two means. diff: b - a. stderr: of diff. ci95: diff -+ 1.96 stderr. p_value: of `test`
    (`exact McNemar` or `paired t`). mdd80: smallest difference detectable at 80% power. verdict: see the
    module docstring. NaN where n is too small (no documents; one document for stderr and the t test).
    """

    n: int
    a: float
    b: float
    diff: float
    stderr: float
    ci95: tuple[float, float]
    p_value: float
    test: str
    mdd80: float
    verdict: str


def exact_mcnemar_p(b_only: int, a_only: int) -> float:
    """Two-sided exact McNemar p-value: under no difference each of the `b_only + a_only` discordant
    documents (B right and A wrong, or the reverse) goes either way with probability 1/2; 1.0 when none."""
    n, k = b_only + a_only, min(b_only, a_only)
    if n == 0:
        return 1.0
    if k == 0:
        return min(1.0, math.ldexp(1.0, 1 - n))  # 2 / 2^n, exactly
    return min(1.0, math.exp(math.log(2.0) + log_half_cdf(k, n)))


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) (continued fraction, Numerical Recipes' `betacf`)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast only below this point: use symmetry
        return 1.0 - betainc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return math.exp(log_front) * result / a


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def paired_difference(
    a_N: np.ndarray, b_N: np.ndarray, *, binary: bool, lower_is_better: bool = False
) -> PairedResult:
    """Compare the per-document values of A and B on the same N documents (position i is one document).

    binary: the values are 0/1 (exact McNemar) rather than continuous (paired t).
    lower_is_better: the figure improves downwards (a loss), which decides the verdict's side.
    """
    a_N, b_N = np.asarray(a_N, dtype=np.float64), np.asarray(b_N, dtype=np.float64)
    n = len(a_N)
    test = MCNEMAR if binary else PAIRED_T
    nan = math.nan
    if n == 0:
        return PairedResult(0, nan, nan, nan, nan, (nan, nan), nan, test, nan, CANNOT_TELL)
    d_N = b_N - a_N
    a, b = float(a_N.mean()), float(b_N.mean())
    diff = float(d_N.mean())
    stderr = float(d_N.std(ddof=1) / math.sqrt(n)) if n > 1 else nan
    if binary:
        p_value = exact_mcnemar_p(int(np.sum(d_N > 0)), int(np.sum(d_N < 0)))
    elif n < 2:
        p_value = nan
    elif stderr == 0.0:
        p_value = 1.0 if diff == 0.0 else 0.0  # every document moved by the same amount
    else:
        p_value = student_t_two_sided_p(diff / stderr, n - 1)
    verdict = CANNOT_TELL
    if p_value < ALPHA and diff != 0.0:
        verdict = B_BETTER if (diff > 0) != lower_is_better else A_BETTER
    ci95 = (diff - Z95 * stderr, diff + Z95 * stderr)
    return PairedResult(n, a, b, diff, stderr, ci95, p_value, test, (Z95 + Z80_POWER) * stderr, verdict)
