"""Synthetic per-document outcomes with a known signal and noise, for the planner's tests.

x[k, d] = level + difficulty[d] + slope * step[k] + jitter[k] + noise[k, d]: difficulty ~ N(0, spread^2) is
each document's own (cancels between evaluations), jitter ~ N(0, checkpoint_sd^2) is each checkpoint's (no
number of documents removes it), noise ~ N(0, doc_sd^2) each document's at each checkpoint. A 0/1 figure is
x > 0 thresholded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inloop_eval.keys import DOWNSTREAM, INTERVAL_KEY, SECONDS_KEY, TOKENS_KEY, figure_key
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, write_step
from inloop_eval.metrics.icl import DocumentOutcomes
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


def write_run(
    run_dir: Path,
    tasks: dict[str, dict[str, RunValues]],
    evaluation: dict,
    seconds: float = 2.0,
    tokens: int = 10000,
    interval: float | None = None,
) -> Path:
    """A run directory as a demo run leaves it: `outcomes/step_<N>.npz` holding `tasks` (label -> figure ->
    values, 0/1 figures named `acc*`), `config.json` with `evaluation`, and `metrics.jsonl` with every step's
    figures (each the mean of its values), eval/seconds and eval/tokens_forwarded, and from the second step on
    eval/interval_seconds where `interval` is given (the training between evaluations)."""
    steps = sorted({int(s) for figures in tasks.values() for v in figures.values() for s in v.steps_K})
    for step in steps:
        outcomes = {}
        for label, figures in tasks.items():
            first = next(iter(figures.values()))
            k = int(np.flatnonzero(first.steps_K == step)[0])
            outcomes[label] = DocumentOutcomes(
                doc_id=first.doc_id_D,
                n_choices=np.full(len(first.doc_id_D), 2, dtype=np.int64),
                values={name: v.values_KD[k] for name, v in figures.items()},
                binary=frozenset(name for name in figures if name.startswith("acc")),
            )
        write_step(run_dir / OUTCOMES_DIR, outcomes, step)
    (run_dir / "config.json").write_text(json.dumps({"evaluation": evaluation}))
    rows = [{"step": s, SECONDS_KEY: seconds, TOKENS_KEY: tokens} for s in steps]
    for row in rows[1:] if interval is not None else []:
        row[INTERVAL_KEY] = interval
    for row in rows:
        for label, figures in tasks.items():
            for name, v in figures.items():
                k = np.flatnonzero(v.steps_K == row["step"])
                if len(k):
                    row[figure_key(DOWNSTREAM, label, name)] = float(v.values_KD[k[0]].mean())
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir
