"""The report's PNGs, drawn with matplotlib's object API (no pyplot: no global state, no display needed).
matplotlib is optional (`pip install 'inloop_eval[report]'`), imported only when a plot is drawn.

Labels are user data: every text holding one (titles, legend entries) is drawn as it is, never parsed as
matplotlib math (`$...$`) or LaTeX, so a label such as `cost $x$`, `a_b^c` or `\\d` is shown verbatim and
cannot make drawing fail.
"""

from __future__ import annotations

from collections.abc import Mapping
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


# Text properties that draw a string verbatim: no math text, no LaTeX (whatever the user's matplotlibrc says).
VERBATIM: dict[str, Any] = {"parse_math": False, "usetex": False}


def verbatim_legend(ax: Any, **kwargs: Any) -> None:
    """The legend of `ax`, its entries drawn verbatim."""
    for text in ax.legend(**kwargs).get_texts():
        text.update(VERBATIM)


def integer_steps(ax: Any) -> None:
    """Label the x axis of `ax` with whole trainer steps, and grid it."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def plot_task(view: TaskView, path: Path) -> None:
    """One task's curves on one chart (±1 standard error bands where logged), saved as the PNG `path`."""
    fig = new_figure(figsize=(5.6, 3.4))
    ax = fig.subplots()
    for metric, points in view.curves.items():
        steps = np.array([s for s, _ in points])
        values = np.array([v for _, v in points])
        (line,) = ax.plot(steps, values, marker="o", markersize=3, label=metric)
        if metric in view.stderr:
            err = dict(view.stderr[metric])
            e = np.array([err.get(int(s), 0.0) for s in steps])
            ax.fill_between(steps, values - e, values + e, alpha=0.15, color=line.get_color())
    ax.set_title(view.label if view.label == view.task_id else f"{view.label} ({view.task_id})", **VERBATIM)
    ax.set_ylabel("accuracy")
    integer_steps(ax)
    verbatim_legend(ax, loc="best", fontsize="small")
    fig.savefig(path, dpi=100)


def plot_domain(domain: str, figures: Mapping[str, Series], path: Path) -> None:
    """One perplexity domain's ppl and bpb side by side (ce when neither is logged), saved as the PNG `path`."""
    shown = [f for f in ("ppl", "bpb") if f in figures] or [f for f in LM_FIGURES if f in figures]
    fig = new_figure(figsize=(3.2 * max(1, len(shown)), 3.2))
    axes = np.atleast_1d(fig.subplots(1, max(1, len(shown))))
    for ax, name in zip(axes, shown, strict=False):
        points = figures[name]
        ax.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=3)
        if name == "ppl":
            ax.set_yscale("log")
        ax.set_title(f"{domain}: {name}", **VERBATIM)
        integer_steps(ax)
    fig.savefig(path, dpi=100)


def plot_runs(
    label: str,
    curves: Mapping[str, Mapping[str, Series]],
    stderr: Mapping[str, Mapping[str, Series]],
    path: Path,
) -> None:
    """One task's figures across runs, one panel per figure, each run a line with its ±1 standard error band
    where logged, saved as the PNG `path`.

    curves: figure -> run name -> series; stderr: figure -> run name -> its standard error series.
    """
    fig = new_figure(figsize=(3.6 * max(1, len(curves)), 3.4))
    axes = np.atleast_1d(fig.subplots(1, max(1, len(curves))))
    for ax, (figure, runs) in zip(axes, curves.items(), strict=False):
        for run, points in runs.items():
            steps = np.array([s for s, _ in points])
            values = np.array([v for _, v in points])
            (line,) = ax.plot(steps, values, marker="o", markersize=3, label=run)
            err = dict(stderr.get(figure, {}).get(run, []))
            if err:
                e = np.array([err.get(int(s), 0.0) for s in steps])
                ax.fill_between(steps, values - e, values + e, alpha=0.15, color=line.get_color())
        ax.set_title(f"{label}: {figure}", **VERBATIM)
        integer_steps(ax)
        verbatim_legend(ax, loc="best", fontsize="small")
    fig.savefig(path, dpi=100)
