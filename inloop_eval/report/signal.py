"""Signal-to-noise per task across runs, as AI2's "Signal and Noise" (Heineman et al., 2025) defines it.

With two or more runs (`inloop-eval report RUN_A RUN_B ...`), for each task figure that every run logs:
- signal: how far apart the runs end, relative to where they end: (max - min) / |mean| of the runs' final
  scores, taken at the last step every run evaluated (finite in each), so that runs of different lengths
  are compared at one step; where they share none, each run's last finite value (`steps` says which);
- noise: how much one run's figure jumps between checkpoints, relative to its level: the standard deviation
  of its last `NOISE_EVALUATIONS` values around their straight-line trend (`analysis.trend_noise`) over
  |their mean|, averaged over the runs that have enough evaluations;
- SNR = signal / noise. Where noise exceeds signal (SNR < 1) the runs' order on that figure is not to be
  trusted from these checkpoints: the flag suggests the task's bits-per-byte twin (`bpb_gold`), which the
  study finds far less noisy at small scale, when it is not logged yet or its own SNR is higher than the
  flagged figure's (a twin no less noisy is no better a yardstick, and the flag says so).
Relative measures need a level away from zero, so figures centred on chance (suite averages) are left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inloop_eval.loggers.base import CURVE_METRICS
from inloop_eval.report.analysis import NOISE_EVALUATIONS, trend_noise
from inloop_eval.report.runs import RunHistory, Series

# The bits-per-byte figure the flag suggests in place of a noisy accuracy.
BPB_TWIN = "bpb_gold"
SNR_FIGURES: tuple[str, ...] = (*CURVE_METRICS, BPB_TWIN)


@dataclass(frozen=True)
class FigureSignal:
    """One task figure across runs: `finals` (each run's final value, in the runs' order) and `steps` (the
    step each was read at: one step for all where the runs share one), `signal`, `noise` and `snr` (NaN
    where not defined: a level of 0, fewer than 3 evaluations in every run)."""

    label: str
    figure: str
    finals: tuple[float, ...]
    signal: float
    noise: float
    snr: float
    steps: tuple[int | None, ...] = ()

    @property
    def noisy(self) -> bool:
        """Noise exceeds signal: the runs' final order on this figure is within checkpoint noise."""
        return self.noise > self.signal


def last_finite(points: Series) -> float:
    """The last finite value of a series; NaN when there is none."""
    return next((v for _, v in reversed(points) if math.isfinite(v)), math.nan)


def last_finite_step(points: Series) -> int | None:
    """The step of a series' last finite value; None when there is none."""
    return next((s for s, v in reversed(points) if math.isfinite(v)), None)


def finals_at_common_step(runs: Sequence[Series]) -> tuple[tuple[float, ...], tuple[int | None, ...]]:
    """Each run's value at the last step where every run has a finite value, and that step per run; where
    the runs share no such step, each run's last finite value and its own step."""
    finite = [{s: v for s, v in points if math.isfinite(v)} for points in runs]
    common = set.intersection(*(set(f) for f in finite)) if finite else set()
    if common:
        step = max(common)
        return tuple(f[step] for f in finite), tuple(step for _ in finite)
    return tuple(last_finite(p) for p in runs), tuple(last_finite_step(p) for p in runs)


def relative_noise(points: Series, n: int = NOISE_EVALUATIONS) -> float:
    """`trend_noise` of the last `n` values over |their mean|; NaN with fewer than 3 or a mean of 0."""
    noise = trend_noise(points, n)
    level = abs(float(np.mean([v for _, v in points if math.isfinite(v)][-n:]))) if noise is not None else 0.0
    return noise / level if noise is not None and level > 0 else math.nan


def relative_dispersion(finals: Sequence[float]) -> float:
    """(max - min) / |mean| of the runs' final scores; NaN when one is missing or the mean is 0."""
    values = np.asarray(finals, dtype=np.float64)
    mean = abs(float(values.mean()))
    return float(values.max() - values.min()) / mean if np.isfinite(values).all() and mean > 0 else math.nan


def figure_signal(label: str, figure: str, runs: Sequence[Series]) -> FigureSignal:
    """One figure's signal, noise and SNR over the series `runs` (one per run)."""
    finals, steps = finals_at_common_step(runs)
    signal = relative_dispersion(finals)
    noises = [x for x in (relative_noise(points) for points in runs) if math.isfinite(x)]
    noise = float(np.mean(noises)) if noises else math.nan
    snr = signal / noise if noise > 0 else math.nan
    return FigureSignal(label, figure, finals, signal, noise, snr, steps)


def signal_to_noise(histories: Sequence[RunHistory]) -> list[FigureSignal]:
    """Every task figure of SNR_FIGURES logged by every run, by task then figure; [] with fewer than 2 runs."""
    if len(histories) < 2:
        return []
    tasks = [history.tasks() for history in histories]
    shared = sorted(set.intersection(*(set(t) for t in tasks)))
    out = []
    for label in shared:
        for figure in SNR_FIGURES:
            if all(figure in t[label] for t in tasks):
                out.append(figure_signal(label, figure, [t[label][figure] for t in tasks]))
    return out


def bpb_suggestion(signals: Sequence[FigureSignal]) -> dict[str, str]:
    """label -> a sentence for each task with an accuracy figure whose noise exceeds its signal: compare on
    its bpb twin where the twin's SNR is higher than that figure's, log the twin where it is not logged, and
    where the twin is no better, say so (evaluate more documents instead)."""
    by_task: dict[str, dict[str, FigureSignal]] = {}
    for s in signals:
        by_task.setdefault(s.label, {})[s.figure] = s
    out = {}
    for label, figures in by_task.items():
        noisy = [name for name, s in figures.items() if name != BPB_TWIN and s.noisy]
        if not noisy:
            continue
        twin = figures.get(BPB_TWIN)
        if twin is None or not math.isfinite(twin.snr):
            instead = f"log its bits-per-byte twin (`metrics: [..., {BPB_TWIN}]`) and compare on that"
            out[label] = f"noise exceeds signal on {', '.join(noisy)}; {instead}"
            continue
        # The twin replaces only the figures it beats; a NaN SNR is beaten by any finite one.
        better = [name for name in noisy if not twin.snr <= figures[name].snr]
        worse = [name for name in noisy if name not in better]
        parts = [f"noise exceeds signal on {', '.join(noisy)}"]
        if better:
            snrs = ", ".join(f"{name} {figures[name].snr:.2f}" for name in better)
            parts.append(
                f"its {BPB_TWIN} has SNR {twin.snr:.2f} (against {snrs}): compare runs on {BPB_TWIN}"
            )
        if worse:
            snrs = ", ".join(f"{name} {figures[name].snr:.2f}" for name in worse)
            parts.append(
                f"its {BPB_TWIN} is no less noisy (SNR {twin.snr:.2f} against {snrs}): evaluate more "
                "documents or more checkpoints before trusting the order"
            )
        out[label] = "; ".join(parts)
    return out
