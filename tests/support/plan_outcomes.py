"""Synthetic per-document outcomes with a known signal and noise, for the planner's tests.

x[k, d] = level + difficulty[d] + slope * step[k] + jitter[k] + noise[k, d]: difficulty ~ N(0, spread^2) is
each document's own (cancels between evaluations), jitter ~ N(0, checkpoint_sd^2) is each checkpoint's (no
number of documents removes it), noise ~ N(0, doc_sd^2) each document's at each checkpoint. A 0/1 figure is
x > 0 thresholded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inloop_eval.plan.noise import RunValues


@dataclass(frozen=True)
class Truth:
    """What a synthetic task figure is made of (module docstring)."""

    slope: float = 0.0
    doc_sd: float = 0.1
    checkpoint_sd: float = 0.0
    spread: float = 0.3
    level: float = 0.0
    offset: float = 0.0  # added to every value: a run's own quality when several runs are made


def run_values(
    truth: Truth,
    seed: int,
    n_docs: int = 200,
    steps: tuple[int, ...] = (0, 10, 20, 30, 40, 50),
    binary: bool = False,
    difficulty_seed: int = 1234,
) -> RunValues:
    """One run's values of a figure made of `truth` (the documents' difficulty shared across runs through
    `difficulty_seed`)."""
    rng = np.random.default_rng(seed)
    difficulty_D = np.random.default_rng(difficulty_seed).normal(0.0, truth.spread, n_docs)
    steps_K = np.asarray(steps, dtype=np.int64)
    jitter_K = (
        rng.normal(0.0, truth.checkpoint_sd, len(steps_K)) if truth.checkpoint_sd else np.zeros(len(steps_K))
    )
    noise_KD = rng.normal(0.0, truth.doc_sd, (len(steps_K), n_docs))
    values_KD = (
        truth.level
        + truth.offset
        + difficulty_D
        + truth.slope * steps_K[:, None]
        + jitter_K[:, None]
        + noise_KD
    )
    if binary:
        values_KD = (values_KD > 0).astype(np.float64)
    return RunValues(steps_K, np.arange(n_docs, dtype=np.int64), values_KD)
