"""The lower tail of the fair-coin binomial, P(X <= k) for X ~ Binomial(n, 1/2), in O(k) floating-point
operations and to about 1e-14 relative: what the exact McNemar test of `metrics.paired` sums.

The largest term, P(X = k), comes from Loader's saddle-point expansion ("Fast and accurate computation of
binomial probabilities", 2000; R's `dbinom`): log P(X = k) is a sum of small, accurately computed parts
(Stirling's remainders and the deviance terms `bd0`) instead of a difference of huge log-factorials, whose
rounding (about 1e-16 of log n!, 5e-11 at n = 50,000) would swamp the 1e-12 the test is checked to. The other
terms follow from it by the ratio P(X = i - 1) / P(X = i) = i / (n - i + 1), each ratio within an ulp.
"""

from __future__ import annotations

import math

import numpy as np

_LN_2PI = math.log(2.0 * math.pi)
# Stirling's series for the remainder, 1/12, 1/360, 1/1260, 1/1680, 1/1188.
_S0, _S1, _S2, _S3, _S4 = 1 / 12, 1 / 360, 1 / 1260, 1 / 1680, 1 / 1188
# Ratios multiplied per NumPy call in the tail sum.
_BLOCK = 4096


def stirling_remainder(n: int) -> float:
    """log(n!) - log(sqrt(2 pi n) (n / e)^n), for n >= 1."""
    if n <= 15:  # the series is asymptotic; here the exact difference loses no more than 1e-14
        return math.log(math.factorial(n)) - (n + 0.5) * math.log(n) + n - 0.5 * _LN_2PI
    nn = float(n) * n
    if n > 500:
        return (_S0 - _S1 / nn) / n
    if n > 80:
        return (_S0 - (_S1 - _S2 / nn) / nn) / n
    if n > 35:
        return (_S0 - (_S1 - (_S2 - _S3 / nn) / nn) / nn) / n
    return (_S0 - (_S1 - (_S2 - (_S3 - _S4 / nn) / nn) / nn) / nn) / n


def deviance_term(x: float, mean: float) -> float:
    """x log(x / mean) + mean - x, without the cancellation of its three terms when x is near `mean`."""
    if abs(x - mean) < 0.1 * (x + mean):
        v = (x - mean) / (x + mean)
        total = (x - mean) * v
        term = 2.0 * x * v
        v2 = v * v
        for j in range(1, 1000):
            term *= v2
            grown = total + term / (2 * j + 1)
            if grown == total:
                break
            total = grown
        return total
    return x * math.log(x / mean) + mean - x


def log_half_pmf(k: int, n: int) -> float:
    """log P(X = k) for X ~ Binomial(n, 1/2), 0 < k < n (Loader's expansion)."""
    half = n / 2.0
    exponent = (
        stirling_remainder(n)
        - stirling_remainder(k)
        - stirling_remainder(n - k)
        - deviance_term(k, half)
        - deviance_term(n - k, half)
    )
    return exponent - 0.5 * (_LN_2PI + math.log(k) + math.log1p(-k / n))


def log_half_cdf(k: int, n: int) -> float:
    """log P(X <= k) for X ~ Binomial(n, 1/2) and 0 <= k <= n / 2 (the tail below the middle); -inf only
    where it is below the smallest float's log."""
    if k == 0:
        return -n * math.log(2.0)
    if 2 * k > n:
        raise ValueError(f"log_half_cdf: k = {k} is above n / 2 = {n / 2}; use the other tail")
    # P(X = i - 1) / P(X = k) for i = k, k - 1, ..., 1: products of ratios below 1 that shrink down the
    # tail, taken a block at a time until what is left (each term below the last) cannot change the sum.
    total, carry, top = 0.0, 1.0, k
    while top > 0 and carry * top >= 1e-17 * (1.0 + total):
        i_J = np.arange(top, max(top - _BLOCK, 0), -1, dtype=np.float64)
        relative_J = carry * np.cumprod(i_J / (n - i_J + 1.0))
        total += float(relative_J.sum())
        carry, top = float(relative_J[-1]), top - len(i_J)
    return log_half_pmf(k, n) + math.log1p(total)
