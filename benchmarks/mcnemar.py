"""The exact McNemar test of `inloop-eval compare` against the sum of exact binomial coefficients it
replaced, in one process on the same counts: seconds per p-value and the ratio, with the largest relative
difference of the p-values; then `compare_steps` on one task of `--docs` documents with five 0/1 figures.

Each count is half the discordant documents minus one standard deviation (p about 0.05, the case a
comparison decides on), so the sum runs over nearly half of the coefficients.

    python -m benchmarks.mcnemar [--sizes 5000,14000] [--docs 14042]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/mcnemar.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from inloop_eval.compare import compare_steps
from inloop_eval.loggers.outcomes import StepOutcomes
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.metrics.paired import exact_mcnemar_p

BINARY_FIGURES = ("acc", "acc_norm", "acc_bytes", "acc_per_token", "acc_pmi")


def binomial_sum_p(b_only: int, a_only: int) -> float:
    """The baseline: the exact integer sum of binomial coefficients over 2^n (the earlier implementation)."""
    n = b_only + a_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b_only, a_only) + 1))
    return min(1.0, 2 * tail / 2**n)


def seconds(call, *args: int) -> tuple[float, float]:  # noqa: ANN001
    """(seconds of one call, its value), best of three for calls under a second."""
    best, value = math.inf, math.nan
    for _ in range(3):
        start = time.perf_counter()
        value = call(*args)
        best = min(best, time.perf_counter() - start)
        if best > 1.0:
            break
    return best, value


def task(seed: int, n_docs: int) -> DocumentOutcomes:
    """One task's outcomes with five 0/1 figures, each right on about 60% of the documents."""
    rng = np.random.default_rng(seed)
    return DocumentOutcomes(
        doc_id=np.arange(n_docs, dtype=np.int64),
        n_choices=np.full(n_docs, 4, dtype=np.int64),
        values={name: (rng.random(n_docs) < 0.6).astype(np.float64) for name in BINARY_FIGURES},
        binary=frozenset(BINARY_FIGURES),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5000,14000", help="discordant documents, comma-separated")
    parser.add_argument("--docs", type=int, default=14042, help="documents of the compared task (MMLU: 14042)")
    args = parser.parse_args(argv)
    print(f"{'discordant':>10} {'sum s':>10} {'ours s':>10} {'ratio':>9} {'rel. diff':>10}")
    for n in (int(x) for x in args.sizes.split(",")):
        k = int(n / 2 - math.sqrt(n) / 2)
        old_s, old_p = seconds(binomial_sum_p, k, n - k)
        new_s, new_p = seconds(exact_mcnemar_p, k, n - k)
        print(f"{n:>10} {old_s:>10.4f} {new_s:>10.6f} {old_s / new_s:>8.0f}x {abs(new_p - old_p) / old_p:>10.1e}")
    a = StepOutcomes(0, {"mmlu": task(0, args.docs)}, "a")
    b = StepOutcomes(1, {"mmlu": task(1, args.docs)}, "b")
    start = time.perf_counter()
    comparison = compare_steps(a, b)
    took = time.perf_counter() - start
    p = {name: f"{r.p_value:.3g}" for name, r in comparison.tasks["mmlu"].figures.items()}
    print(f"compare_steps, one task of {args.docs} documents, five 0/1 figures: {took:.3f} s; p {p}")


if __name__ == "__main__":
    main()
