"""A task figure's noise as a function of the documents evaluated, and its signal: pure NumPy.

A figure is the mean over n documents of per-document values x[k, d] (evaluation k, document d). Two
evaluations a decision compares (two checkpoints one evaluation apart in one run, or two runs at one step) are
taken on the same documents, so what each document is worth on its own (its difficulty) cancels; what does not
cancel is, per evaluation,

    var(n) = doc_variance / n + max(checkpoint_variance, checkpoint_floor)

- `doc_variance` (the part more documents shrink): how much one document's value moves from one evaluation to
  the other beyond what every document shares. In one run: the residual variance of x[k, d] after the
  evaluation's mean and the document's mean are taken out (the interaction of a two-way table, (K-1)(D-1)
  degrees of freedom). With several runs: half the variance over documents of x_a[d] - x_b[d] between two runs
  at their last common step, averaged over the pairs of runs (paired on the documents both evaluated).
- `checkpoint_variance` (the part no number of documents removes): the variance of the figure around its
  trend over the last `WINDOW` evaluations (a straight line in the step or in its logarithm, whichever fits
  closer: `closer_trend`), less what `doc_variance / D` explains of it (never below 0; with several runs,
  the median of the runs', so that one run's loss spike is not every run's noise): a model's state jitters
  from checkpoint to checkpoint whatever the documents. A plan counts it as
  at least `checkpoint_floor`, what K evaluations cannot tell from 0 (the residual variance's own standard
  error, sqrt(2 / (K - 2)) x the residual): so it never counts on more documents removing noise the runs
  could not have seen, and z^2 levels off within a few times the documents the runs evaluated. A run of two
  evaluations (a calibration from two checkpoints) has no residual: its checkpoint noise is counted as 0 and
  its signal's source says so (`CHECKPOINT_UNSEEN`), so a plan from it may spend more documents than noise
  it cannot see warrants.

The signal `signal` (in the figure's units) is the difference the decision looks for: with one run, the trend's
change from one evaluation to the next (|slope| x the median distance between evaluations on the line's
abscissa, fitted on the same window, its square less the slope's own sampling variance); with several, the runs' root-mean-square pairwise
difference at their last common step (on the documents both scored), less the part that two evaluations' own
noise at the documents they used accounts for (never below 0).

A decision between two evaluations on n documents then has z = signal / sqrt(2 var(n)) (`z2` is its square);
independent tasks' evidence adds as z^2. The level's standard error (what fresh samples of n documents of the
split would scatter by, at one checkpoint) is sqrt(level_variance / n x (N - n) / N) for a split of N.

Legend: K evaluations, D documents, R runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

# The source of a signal read from runs of two evaluations each, where no checkpoint noise could be seen.
CHECKPOINT_UNSEEN = "2 evaluations: checkpoint noise unseen, counted as 0"
# Evaluations the trend and its residual are fitted on: the last ones, as the report's noise is
# (`report.analysis.NOISE_EVALUATIONS`).
WINDOW = 6
# Evaluations a run needs: 2 give the change and the per-document noise (`two_evaluations_noise`).
MIN_EVALUATIONS = 2
# Evaluations a trend needs to show its residual, the checkpoint noise (2 for the line, 1 for the residual).
TREND_EVALUATIONS = 3


@dataclass(frozen=True)
class RunValues:
    """One run's per-document values of one task figure: `values_KD` at `steps_K` (ascending), on the
    documents `doc_id_D` every one of those evaluations scored (values finite)."""

    steps_K: np.ndarray
    doc_id_D: np.ndarray
    values_KD: np.ndarray


@dataclass(frozen=True)
class FigureNoise:
    """One task figure's noise and signal (module docstring); `problem` says why it cannot be planned on ('' when
    it can: a finite, positive noise)."""

    label: str
    figure: str
    n_docs: int
    doc_variance: float
    checkpoint_variance: float
    level_variance: float
    signal: float
    source: str
    problem: str = ""
    checkpoint_floor: float = 0.0

    def variance(self, n: int) -> float:
        """The noise variance of one evaluation of n documents, as a decision between two sees it."""
        return self.doc_variance / n + max(self.checkpoint_variance, self.checkpoint_floor)

    def z2(self, n: int) -> float:
        """The squared z of a decision between two evaluations on n documents each: signal^2 / (2 var(n))."""
        return self.signal**2 / (2.0 * self.variance(n)) if n > 0 and not self.problem else 0.0

    def stderr(self, n: int, n_split: int) -> float:
        """The level's standard error over samples of n of the split's n_split documents (finite population)."""
        if n <= 0:
            return math.nan
        # level_variance estimates the split's S^2 (its variance over N - 1): the mean of n documents drawn
        # without replacement varies by S^2 / n x (N - n) / N.
        correction = (n_split - n) / n_split if n_split > 0 else 0.0
        return math.sqrt(max(self.level_variance / n * max(correction, 0.0), 0.0))


def interaction_variance(values_KD: np.ndarray) -> float:
    """The residual variance of a two-way table after its row and column means: (K-1)(D-1) degrees of
    freedom; NaN with fewer than 2 rows or columns."""
    k, d = values_KD.shape
    if k < 2 or d < 2:
        return math.nan
    residual_KD = (
        values_KD - values_KD.mean(1, keepdims=True) - values_KD.mean(0, keepdims=True) + values_KD.mean()
    )
    return float((residual_KD**2).sum() / ((k - 1) * (d - 1)))


def trend(steps_K: np.ndarray, means_K: np.ndarray) -> tuple[float, float, float]:
    """(slope per step, its sampling variance, residual variance with K - 2 degrees of freedom) of a
    least-squares line."""
    x = steps_K.astype(np.float64)
    slope, intercept = np.polyfit(x, means_K, 1)
    residual_K = means_K - (slope * x + intercept)
    residual = float((residual_K**2).sum() / (len(x) - 2))
    return float(slope), residual / float(((x - x.mean()) ** 2).sum()), residual


def closer_trend(steps_K: np.ndarray, means_K: np.ndarray) -> tuple[np.ndarray, tuple[float, float, float]]:
    """(the abscissa, `trend`) of the straight line in the step or in log(1 + step), whichever leaves the
    smaller residual: early in training a figure bends like a power law of the step, and a line in the step
    would count the bend as checkpoint noise."""
    fits = [
        (x_K, trend(x_K, means_K))
        for x_K in (steps_K.astype(np.float64), np.log1p(steps_K.astype(np.float64)))
    ]
    return min(fits, key=lambda fit: fit[1][2])


def run_noise(run: RunValues) -> tuple[float, float, float, float, float]:
    """(doc_variance, checkpoint_variance, squared trend change per evaluation, level_variance,
    checkpoint_floor) of one run over its last WINDOW evaluations; the run must have at least
    MIN_EVALUATIONS. The squared change is the slope's square less its own sampling variance (never below 0),
    so that a flat, noisy curve shows none."""
    if len(run.steps_K) < TREND_EVALUATIONS:
        return two_evaluations_noise(run.values_KD)
    steps_K, values_KD = run.steps_K[-WINDOW:], run.values_KD[-WINDOW:]
    doc_variance = interaction_variance(values_KD)
    x_K, (slope, slope_variance, residual) = closer_trend(steps_K, values_KD.mean(1))
    checkpoint_variance = max(residual - doc_variance / values_KD.shape[1], 0.0)
    change2 = max(slope**2 - slope_variance, 0.0) * float(np.median(np.diff(x_K))) ** 2
    level_variance = float(values_KD[-1].var(ddof=1))
    floor = math.sqrt(2.0 / (len(steps_K) - 2)) * residual
    return doc_variance, checkpoint_variance, change2, level_variance, floor


def two_evaluations_noise(values_KD: np.ndarray) -> tuple[float, float, float, float, float]:
    """`run_noise` of a run of two evaluations, where no trend has a residual: the change is the difference of
    the two means (its square less its sampling variance, 2 doc_variance / D: the same documents at both), and
    the checkpoint noise, which only a residual shows, is counted as 0 (`CHECKPOINT_UNSEEN`)."""
    doc_variance = interaction_variance(values_KD)
    change2 = max(float(values_KD[1].mean() - values_KD[0].mean()) ** 2 - 2.0 * doc_variance / values_KD.shape[1], 0.0)
    return doc_variance, 0.0, change2, float(values_KD[-1].var(ddof=1)), 0.0


def pairwise(runs: Sequence[RunValues]) -> tuple[float, float]:
    """(the mean over pairs of runs of their squared difference, the mean over pairs of var_d(x_a - x_b) / 2),
    each pair compared at the last step all runs evaluated (their last evaluations where they share none) on
    the documents both scored there; where a pair shares fewer than 2 documents, its difference is of their
    own documents' means and it adds no variance (NaN when no pair does)."""
    common = set.intersection(*(set(run.steps_K.tolist()) for run in runs))
    rows = [int(np.flatnonzero(run.steps_K == max(common))[0]) if common else -1 for run in runs]
    squares, halves = [], []
    for a, b in combinations(range(len(runs)), 2):
        x_a, x_b = runs[a].values_KD[rows[a]], runs[b].values_KD[rows[b]]
        _, ia, ib = np.intersect1d(runs[a].doc_id_D, runs[b].doc_id_D, return_indices=True)
        if len(ia) < 2:
            squares.append(float(x_a.mean() - x_b.mean()) ** 2)
            continue
        diff_N = x_a[ia] - x_b[ib]
        squares.append(float(diff_N.mean()) ** 2)
        halves.append(float(diff_N.var(ddof=1)) / 2.0)
    return float(np.mean(squares)), float(np.mean(halves)) if halves else math.nan


def between_runs_signal(mean_square: float, noise_variance: float) -> float:
    """The runs' root-mean-square pairwise difference (`mean_square` its square), less two evaluations'
    noise (`noise_variance` each), never below 0."""
    return math.sqrt(max(mean_square - 2.0 * noise_variance, 0.0))


def figure_noise(label: str, figure: str, runs: Sequence[RunValues]) -> FigureNoise:
    """The noise and signal of one task figure over `runs` (module docstring); `problem` set where the runs
    have too few evaluations, the values never vary, or no signal stands out of the noise."""
    usable = [run for run in runs if len(run.steps_K) >= MIN_EVALUATIONS and run.values_KD.shape[1] >= 2]
    n_docs = min((run.values_KD.shape[1] for run in usable), default=0)

    def problem(reason: str) -> FigureNoise:
        return FigureNoise(label, figure, n_docs, math.nan, math.nan, math.nan, math.nan, "", reason)

    if not usable:
        most = max(runs, key=lambda run: len(run.steps_K), default=None)
        found = f"{len(most.steps_K)} evaluations of {most.values_KD.shape[1]} documents" if most else "none"
        return problem(
            f"missing: no run has per-document values of {figure!r} on 2 or more documents at "
            f"{MIN_EVALUATIONS} or more evaluations (found: {found})"
        )
    if all(np.ptp(run.values_KD) == 0 for run in usable):
        return problem(f"constant: every document scored the same {figure!r} at every evaluation")
    per_run = np.array([run_noise(run) for run in usable])  # [R, 5]
    # The median over runs: one run's loss spike is that run's, not every run's checkpoint noise.
    doc_variance, checkpoint_variance, change2, level_variance, floor = np.nanmedian(per_run, axis=0)
    source = "trend" if any(len(run.steps_K) >= TREND_EVALUATIONS for run in usable) else CHECKPOINT_UNSEEN
    if len(usable) >= 2:
        mean_square, paired = pairwise(usable)
        doc_variance = paired if math.isfinite(paired) else doc_variance
        signal = between_runs_signal(mean_square, doc_variance / n_docs + checkpoint_variance)
        source = f"{len(usable)} runs" + ("" if source == "trend" else f", {CHECKPOINT_UNSEEN}")
    else:
        signal = math.sqrt(float(change2))
    noise = FigureNoise(
        label,
        figure,
        n_docs,
        float(doc_variance),
        float(checkpoint_variance),
        float(level_variance),
        signal,
        source,
        checkpoint_floor=float(floor),
    )
    if not noise.variance(n_docs) > 0:
        return problem(f"constant: {figure!r} moved by no more than its trend between evaluations")
    if signal <= 0:
        return FigureNoise(**{**noise.__dict__, "problem": f"no signal: {figure!r} {signal_words(source)}"})
    return noise


def signal_words(source: str) -> str:
    """Why a signal of 0, in words."""
    if source in ("trend", CHECKPOINT_UNSEEN):
        return "shows no trend over the run's last evaluations"
    return "differs between the runs by no more than two evaluations' noise"
