"""The disk cost of per-document outcomes: one step's file for a suite of `--tasks` tasks of `--docs`
documents each, with the figures of an answer-text task (5 accuracies stored as 0/1, 4 continuous figures),
seeded random values, written by the logger's own writer.

    python -m benchmarks.outcomes_size [--tasks 40] [--docs 1000] [--evaluations 100]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/outcomes_size.py`: import `benchmarks` as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from inloop_eval.loggers.outcomes import write_step
from inloop_eval.metrics.formats import RC_METRICS
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.metrics.registry import METRICS


def suite_outcomes(n_tasks: int, n_docs: int, seed: int = 0) -> dict[str, DocumentOutcomes]:
    """Outcomes of `n_tasks` answer-text tasks of `n_docs` documents: 0/1 accuracies (60% correct) and
    gamma-distributed continuous figures."""
    rng = np.random.default_rng(seed)
    binary = frozenset(m for m in RC_METRICS if METRICS[m].binary)
    out = {}
    for t in range(n_tasks):
        values = {
            m: (rng.random(n_docs) < 0.6).astype(np.float64) if m in binary else rng.gamma(2.0, 0.5, n_docs)
            for m in RC_METRICS
        }
        out[f"task_{t:02d}"] = DocumentOutcomes(
            doc_id=np.arange(n_docs, dtype=np.int64),
            n_choices=rng.integers(2, 5, n_docs),
            values=values,
            binary=binary,
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--evaluations", type=int, default=100, help="evaluations of a run, for the total")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        size = write_step(Path(tmp), suite_outcomes(args.tasks, args.docs), step=1000).stat().st_size
    print(
        f"{args.tasks} tasks x {args.docs} documents x {len(RC_METRICS)} figures: {size / 1e6:.2f} MB per "
        f"step, {size * args.evaluations / 1e6:.0f} MB for {args.evaluations} evaluations"
    )


if __name__ == "__main__":
    main()
