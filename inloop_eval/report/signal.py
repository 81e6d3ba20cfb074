"""Signal-to-noise per task across runs, as AI2's "Signal and Noise" (Heineman et al., 2025) defines it.

With two or more runs (`inloop-eval report RUN_A RUN_B ...`), for each task figure that every run logs:
- signal: how far apart the runs end, relative to where they end: (max - min) / |mean| of the runs' final
  scores (the last finite value of each run);
- noise: how much one run's figure jumps between checkpoints, relative to its level: the standard deviation
  of its last `NOISE_EVALUATIONS` values around their straight-line trend (`analysis.trend_noise`) over
  |their mean|, averaged over the runs that have enough evaluations;
- SNR = signal / noise. Where noise exceeds signal (SNR < 1) the runs' order on that figure is not to be
  trusted from these checkpoints: the flag suggests the task's bits-per-byte twin (`bpb_gold`), which the
  study finds far less noisy at small scale, with its own SNR when it is logged.
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
    """One task figure across runs: `finals` (each run's last value, in the runs' order), `signal`, `noise`
    and `snr` (NaN where not defined: a level of 0, fewer than 3 evaluations in every run)."""

    label: str
    figure: str
    finals: tuple[float, ...]
    signal: float
    noise: float
    snr: float

    @property
    def noisy(self) -> bool:
        """Noise exceeds signal: the runs' final order on this figure is within checkpoint noise."""
        return self.noise > self.signal


def last_finite(points: Series) -> float:
    """The last finite value of a series; NaN when there is none."""
    return next((v for _, v in reversed(points) if math.isfinite(v)), math.nan)


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
    finals = tuple(last_finite(points) for points in runs)
    signal = relative_dispersion(finals)
    noises = [x for x in (relative_noise(points) for points in runs) if math.isfinite(x)]
    noise = float(np.mean(noises)) if noises else math.nan
    snr = signal / noise if noise > 0 else math.nan
    return FigureSignal(label, figure, finals, signal, noise, snr)


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
    """label -> a sentence for each task with an accuracy figure whose noise exceeds its signal, pointing to
    its bpb twin (with its SNR when logged)."""
    by_task: dict[str, dict[str, FigureSignal]] = {}
    for s in signals:
        by_task.setdefault(s.label, {})[s.figure] = s
    out = {}
    for label, figures in by_task.items():
        noisy = [name for name, s in figures.items() if name != BPB_TWIN and s.noisy]
        if not noisy:
            continue
        twin = figures.get(BPB_TWIN)
        if twin is not None and math.isfinite(twin.snr):
            instead = f"its {BPB_TWIN} has SNR {twin.snr:.2f}: compare runs on {BPB_TWIN}"
        else:
            instead = f"log its bits-per-byte twin (`metrics: [..., {BPB_TWIN}]`) and compare on that"
        out[label] = f"noise exceeds signal on {', '.join(noisy)}; {instead}"
    return out
