"""The report's charts read without guessing: labelled log ticks over a wide perplexity range, step numbers
under every panel, legends beside the axes (never over curves or bands), and the chance accuracy dashed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inloop_eval.loggers.outcomes import OUTCOMES_DIR, write_step
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.report.analysis import TaskView, chance_levels
from inloop_eval.report.plots import plot_domain, plot_runs, plot_task

pytest.importorskip("matplotlib")

STEPS = [0, 50, 100, 150]
PPL = [(0, 52_000.0), (50, 9_000.0), (100, 3_100.0), (150, 1_870.0)]
ACC = [(s, 0.3 + s / 1000) for s in STEPS]


def drawn(fig):
    """The figure drawn on an Agg canvas, so that its texts have their final places and sizes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig


def shown_labels(axis) -> list[str]:
    """The text of the tick labels an axis shows inside its view."""
    low, high = sorted(axis.get_view_interval())
    return [
        t.get_text()
        for t in axis.get_ticklabels()
        if t.get_visible() and t.get_text() and low <= t.get_position()[axis.axis_name == "y"] <= high
    ]


def test_a_wide_log_perplexity_axis_has_several_labelled_ticks(tmp_path):
    fig = plot_domain("c4", {"ppl": PPL}, tmp_path / "c4.png")
    drawn(fig)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = shown_labels(ax.yaxis)
    assert len(labels) >= 3, labels
    assert "5000" in labels and "20000" in labels
    assert len(ax.yaxis.get_minorticklocs()) > 0


def test_every_stacked_panel_shows_its_step_numbers(tmp_path):
    fig = plot_domain("c4", {"ppl": PPL, "bpb": [(s, 2.0 - s / 100) for s in STEPS]}, tmp_path / "c4.png")
    drawn(fig)
    for ax in fig.axes:
        assert shown_labels(ax.xaxis), ax.get_title()


def overlaps(fig, legend, ax) -> bool:
    renderer = fig.canvas.get_renderer()
    a, b = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_legends_sit_beside_the_axes_inside_the_picture(tmp_path):
    # Curves and bands filling the whole panel: no spot inside is free.
    wide = {
        "acc": {r: [(s, 0.5 + 0.2 * np.sin(s + i)) for s in range(0, 200, 5)] for i, r in enumerate("AB")}
    }
    stderr = {"acc": {r: [(s, 0.25) for s in range(0, 200, 5)] for r in "AB"}}
    fig = plot_runs("piqa", wide, stderr, tmp_path / "piqa.png", ["A", "B"])
    drawn(fig)
    width, height = fig.canvas.get_width_height()
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None and not overlaps(fig, legend, ax)
        box = legend.get_window_extent(fig.canvas.get_renderer())
        assert box.x0 >= 0 and box.x1 <= width and box.y0 >= 0 and box.y1 <= height


def chance_lines(ax) -> list[float]:
    return [
        float(line.get_ydata()[0]) for line in ax.get_lines() if str(line.get_label()).startswith("chance")
    ]


def test_accuracy_panels_draw_the_chance_level_and_others_do_not(tmp_path):
    curves = {"acc": {"A": ACC, "B": ACC}, "bpb_gold": {"A": [(s, 1.0) for s in STEPS]}}
    fig = plot_runs("arc_easy", curves, {}, tmp_path / "arc.png", ["A", "B"], chance=0.25)
    assert chance_lines(fig.axes[0]) == [0.25] and chance_lines(fig.axes[1]) == []
    view = TaskView("arc_easy", "arc_easy", {"acc": ACC}, {}, [], [])
    assert chance_lines(plot_task(view, tmp_path / "one.png", 0.25).axes[0]) == [0.25]
    assert chance_lines(plot_task(view, tmp_path / "none.png").axes[0]) == []


def test_the_chance_level_is_the_mean_of_one_over_the_choices(tmp_path: Path):
    outcomes = DocumentOutcomes(
        doc_id=np.arange(4, dtype=np.int64),
        n_choices=np.array([4, 4, 2, 2], dtype=np.int64),
        values={"acc": np.zeros(4)},
        binary=frozenset({"acc"}),
    )
    write_step(tmp_path / OUTCOMES_DIR, {"mix": outcomes}, 10)
    assert chance_levels(tmp_path) == {"mix": pytest.approx(0.375)}
    assert chance_levels(tmp_path / "nowhere") == {}
