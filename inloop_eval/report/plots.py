"""The report's PNGs, drawn with matplotlib's object API (no pyplot: no global state, no display needed).
matplotlib is optional (`pip install 'inloop_eval[report]'`), imported only when a plot is drawn.

Labels are user data: every text holding one (titles, legend entries) is drawn as it is, never parsed as
matplotlib math (`$...$`) or LaTeX, so a label such as `cost $x$`, `a_b^c` or `\\d` is shown verbatim and
cannot make drawing fail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inloop_eval.report.analysis import TaskView
from inloop_eval.report.runs import LM_FIGURES, ReportError, Series


def new_figure(**kwargs: Any) -> Any:
    """A matplotlib Figure (no pyplot: no global state, no display needed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError(
            "report: the plots need matplotlib; install it with `pip install 'inloop_eval[report]'`"
        ) from None
    return Figure(layout="constrained", **kwargs)


# The most step labels an x axis shows (more would overlap at the page's width).
MAX_STEP_TICKS = 10
# Text properties that draw a string verbatim: no math text, no LaTeX (whatever the user's matplotlibrc says).
VERBATIM: dict[str, Any] = {"parse_math": False, "usetex": False}


def verbatim_legend(ax: Any, **kwargs: Any) -> None:
    """The legend of `ax`, its entries drawn verbatim, right of the axes (never on the curves or their
    bands: inside, "best" still covers a band when the curves fill the panel)."""
    placement = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
    for text in ax.legend(**{**placement, **kwargs}).get_texts():
        text.update(VERBATIM)


def step_ticks(steps: Sequence[float]) -> list[float]:
    """Where the x axis's ticks go: at the steps a figure was logged (every one, or every k-th from the first
    when there are more than MAX_STEP_TICKS), never between them."""
    shown = sorted({float(s) for s in steps})  # float: a step past int64 (see `plotted`) too
    every = -(-len(shown) // MAX_STEP_TICKS)
    return shown[::every] if shown else []


def integer_steps(ax: Any, steps: Sequence[float]) -> None:
    """Label the x axis of `ax` with the steps drawn (`step_ticks`: the evaluated steps, not round numbers
    between them), and grid it. Every panel keeps its step numbers, also above another that shares its x
    axis (which would otherwise hide them)."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    ticks = step_ticks(steps)
    ax.xaxis.set_major_locator(FixedLocator(ticks) if ticks else MaxNLocator(integer=True))
    ax.tick_params(axis="x", labelbottom=True)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def chance_line(ax: Any, chance: float | None) -> None:
    """A dashed line at the task's chance accuracy (the mean of 1 / n_choices), where known."""
    if chance is not None and np.isfinite(chance):
        ax.axhline(chance, color="#888888", linestyle="--", linewidth=1, label=f"chance ({chance:.2f})")


# Every figure drawn at this width (in inches, at DPI): 560 px, inside the page's narrowest card (560 px of
# content), so a plot is never shown smaller than drawn and its 9-10 pt text stays readable.
WIDTH = 5.6
DPI = 100
# One colour per meaning, the same on every plot: a figure of one run, or a run among runs (in order).
FIGURE_COLOURS = {"acc": "#1f77b4", "acc_norm": "#d62728", "acc_pmi": "#2ca02c", "loss": "#444444"}
RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
# The y-axis label of each figure.
AXIS_LABELS = {
    "acc": "accuracy",
    "acc_norm": "accuracy",
    "acc_pmi": "accuracy",
    "ppl": "perplexity",
    "bpb": "bits per byte",
    "ce": "cross-entropy (nats)",
    "loss": "training loss",
}


def run_colour(index: int) -> str:
    """The colour of the `index`-th run of a comparison (A first)."""
    return RUN_COLOURS[index % len(RUN_COLOURS)]


def readable_values(ax: Any, points: Series, name: str) -> None:
    """The y axis of one figure: labelled, a log scale for a perplexity spanning over 10x, and plain tick
    labels with the decimals their spacing needs (no 1868.637, no 5.1e+04, no offset)."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    values = [v for _, v in points if np.isfinite(v) and v > 0]
    if name == "ppl" and values and max(values) / min(values) > 10:
        ax.set_yscale("log")
        # Labelled ticks at 1, 2 and 5 of each decade (a decade or two gets 3-7 labels, not one) and
        # unlabelled minor ticks at every other digit.
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_scientific(False)
    ax.yaxis.set_major_formatter(formatter)
    ax.set_ylabel(AXIS_LABELS.get(name, name))


def band(ax: Any, points: Series, stderr: Mapping[int, float], colour: str) -> None:
    """The ±1 standard error band around a curve, where logged."""
    if stderr:
        steps, values = plotted(points)
        e = np.array([stderr.get(s, 0.0) for s, _ in points], dtype=np.float64)
        ax.fill_between(steps, values - e, values + e, alpha=0.15, color=colour, linewidth=0)


def plotted(points: Series) -> tuple[np.ndarray, np.ndarray]:
    """A series' steps and values as float64 arrays: a step past int64 (a logger's bad step, or a counter
    of samples) would otherwise make an object array, which matplotlib's `fill_between` refuses."""
    steps = np.array([float(s) for s, _ in points], dtype=np.float64)
    return steps, np.array([v for _, v in points], dtype=np.float64)


def curve(
    ax: Any, points: Series, colour: str, label: str, stderr: Mapping[int, float] | None = None
) -> None:
    steps, values = plotted(points)
    ax.plot(steps, values, marker="o", markersize=3, color=colour, label=label)
    band(ax, points, stderr or {}, colour)


def plot_task(view: TaskView, path: Path, chance: float | None = None) -> Any:
    """One task's curves on one chart (±1 standard error bands where logged, its chance accuracy dashed
    where known), saved as the PNG `path`; returns the figure."""
    fig = new_figure(figsize=(WIDTH, 3.4))
    ax = fig.subplots()
    for metric, points in view.curves.items():
        colour = FIGURE_COLOURS.get(metric, "#7f7f7f")
        curve(ax, points, colour, metric, dict(view.stderr.get(metric, [])))
    chance_line(ax, chance)
    ax.set_title(view.label if view.label == view.task_id else f"{view.label} ({view.task_id})", **VERBATIM)
    ax.set_ylabel("accuracy")
    integer_steps(ax, [s for points in view.curves.values() for s, _ in points])
    verbatim_legend(ax, fontsize="small")
    fig.savefig(path, dpi=DPI)
    return fig


def plot_domain(domain: str, figures: Mapping[str, Series], path: Path) -> Any:
    """One perplexity domain's ppl and bpb, one panel above the other (ce when neither is logged), saved as
    the PNG `path`; returns the figure."""
    shown = [f for f in ("ppl", "bpb") if f in figures] or [f for f in LM_FIGURES if f in figures]
    fig = new_figure(figsize=(WIDTH, 2.3 * max(1, len(shown)) + 0.4))
    axes = np.atleast_1d(fig.subplots(max(1, len(shown)), 1, sharex=True))
    for ax, name in zip(axes, shown, strict=False):
        curve(ax, figures[name], "#1f77b4", name)
        ax.set_title(f"{domain}: {name}", **VERBATIM)
        readable_values(ax, figures[name], name)
        integer_steps(ax, [s for s, _ in figures[name]])
    fig.savefig(path, dpi=DPI)
    return fig


def plot_loss(runs: Mapping[str, Series], path: Path) -> Any:
    """The training loss (`train/loss`) of one run, or of each run of a comparison in its run colour, saved
    as the PNG `path`; returns the figure."""
    fig = new_figure(figsize=(WIDTH, 3.0))
    ax = fig.subplots()
    for i, (run, points) in enumerate(runs.items()):
        colour = FIGURE_COLOURS["loss"] if len(runs) == 1 else run_colour(i)
        curve(ax, points, colour, run)
    ax.set_title("training loss (train/loss)")
    readable_values(ax, next(iter(runs.values()), []), "loss")
    integer_steps(ax, [s for points in runs.values() for s, _ in points])
    if len(runs) > 1:
        verbatim_legend(ax, fontsize="small")
    fig.savefig(path, dpi=DPI)
    return fig


def plot_runs(
    label: str,
    curves: Mapping[str, Mapping[str, Series]],
    stderr: Mapping[str, Mapping[str, Series]],
    path: Path,
    runs: Sequence[str] = (),
    chance: float | None = None,
) -> Any:
    """One task's (or domain's) figures across runs, one panel per figure above the next, each run a line
    in its run colour with its ±1 standard error band where logged, saved as the PNG `path`; returns the
    figure.

    curves: figure -> run name -> series; stderr: figure -> run name -> its standard error series.
    runs: every run's name in order (A first), which fixes its colour; default: the order of `curves`.
    chance: the task's chance accuracy, dashed on its accuracy panels; None where not known.
    """
    order = list(runs) or list(dict.fromkeys(r for by_run in curves.values() for r in by_run))
    fig = new_figure(figsize=(WIDTH, 2.3 * max(1, len(curves)) + 0.4))
    axes = np.atleast_1d(fig.subplots(max(1, len(curves)), 1, sharex=True))
    for ax, (figure, by_run) in zip(axes, curves.items(), strict=False):
        for run, points in by_run.items():
            colour = run_colour(order.index(run) if run in order else len(order))
            curve(ax, points, colour, run, dict(stderr.get(figure, {}).get(run, [])))
        if AXIS_LABELS.get(figure) == "accuracy":
            chance_line(ax, chance)
        ax.set_title(f"{label}: {figure}", **VERBATIM)
        readable_values(ax, [p for points in by_run.values() for p in points], figure)
        integer_steps(ax, [s for points in by_run.values() for s, _ in points])
        verbatim_legend(ax, fontsize="small")
    fig.savefig(path, dpi=DPI)
    return fig
