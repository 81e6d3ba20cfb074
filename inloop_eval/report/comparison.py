"""`inloop-eval report RUN_A RUN_B ...`: one HTML page comparing runs (`write_comparison`).

For every task all runs log: each figure's curves of every run with ±1 standard error bands; per step that
run A and another run both evaluated (their per-document outcomes, `<run>/outcomes/step_<N>.npz`), the paired
verdict of each figure (`compare.pairing`, B - A on the documents both evaluated); and, over all runs,
signal-to-noise per task figure with the tasks whose noise exceeds their signal flagged (`report.signal`).
Runs without outcomes get curves and signal-to-noise, and the page says why they have no verdicts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from html import escape
from pathlib import Path

from inloop_eval.compare.pairing import compare_steps
from inloop_eval.loggers.base import CURVE_METRICS
from inloop_eval.loggers.outcomes import OutcomesError, list_steps, outcomes_directory, read_step
from inloop_eval.metrics.paired import A_BETTER, B_BETTER, PairedResult
from inloop_eval.report.page import STYLE, draw, plot_file
from inloop_eval.report.plots import plot_runs
from inloop_eval.report.runs import ReportError, RunHistory, Series, load_run
from inloop_eval.report.signal import BPB_TWIN, FigureSignal, bpb_suggestion, signal_to_noise

COMPARISON_DIR = "comparison"
# The figures whose verdicts the page shows per step (those a task logs), and the most recent steps shown.
VERDICT_FIGURES: tuple[str, ...] = (*CURVE_METRICS, BPB_TWIN, "centered_acc")
SHOWN_STEPS = 12
VERDICT_COLOURS = {B_BETTER: "#0a0", A_BETTER: "#b00"}

log = logging.getLogger(__name__)


@dataclass
class PairVerdicts:
    """Run A against run `b`: (label, figure) -> step -> `PairedResult`, why there are none if so, and the
    steps skipped because an outcomes file could not be read (each with the reason)."""

    b: str
    results: dict[tuple[str, str], dict[int, PairedResult]] = field(default_factory=dict)
    note: str = ""
    skipped: list[str] = field(default_factory=list)


def run_names(run_dirs: Sequence[str | Path]) -> list[str]:
    """A short distinct name per run: its directory's name, or its whole path where two names clash."""
    names = [Path(d).resolve().name or str(d) for d in run_dirs]
    return [name if names.count(name) == 1 else str(d) for name, d in zip(names, run_dirs, strict=True)]


def pair_verdicts(a_dir: Path, b_dir: Path, b_name: str) -> PairVerdicts:
    """The paired verdicts of A and B at every step whose outcomes both hold (the last SHOWN_STEPS)."""
    verdicts = PairVerdicts(b_name)
    try:
        steps_a, steps_b = list_steps(outcomes_directory(a_dir)), list_steps(outcomes_directory(b_dir))
    except OutcomesError as exc:
        verdicts.note = str(exc)
        return verdicts
    shared = sorted(set(steps_a) & set(steps_b))[-SHOWN_STEPS:]
    if not shared:
        verdicts.note = f"no step has outcomes in both runs (A: {len(steps_a)} steps, B: {len(steps_b)})"
    for step in shared:
        try:  # one damaged step file costs that step's verdicts, never the page
            comparison = compare_steps(read_step(steps_a[step]), read_step(steps_b[step]))
        except OutcomesError as exc:
            verdicts.skipped.append(f"step {step} skipped: {exc}")
            log.warning("report: B = %s: step %d skipped: %s", b_name, step, exc)
            continue
        for label, task in comparison.tasks.items():
            for figure, result in task.figures.items():
                if figure in VERDICT_FIGURES:
                    verdicts.results.setdefault((label, figure), {})[step] = result
    return verdicts


def task_curves(histories: Mapping[str, RunHistory], label: str) -> tuple[dict, dict]:
    """figure -> run -> series of `label`'s curve figures (and their standard errors) across the runs."""
    curves: dict[str, dict[str, Series]] = {}
    stderr: dict[str, dict[str, Series]] = {}
    for run, history in histories.items():
        figures = history.tasks().get(label, {})
        for figure in CURVE_METRICS:
            if figure in figures:
                curves.setdefault(figure, {})[run] = figures[figure]
                if f"{figure}_stderr" in figures:
                    stderr.setdefault(figure, {})[run] = figures[f"{figure}_stderr"]
    return curves, stderr


def write_comparison(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None) -> Path:
    """Write `<out_dir>/index.html` (default `<RUN_A>/comparison/`) comparing the runs, with one PNG per task;
    returns the HTML path."""
    if len(run_dirs) < 2:
        raise ReportError(f"report: a comparison needs two or more runs, found {len(run_dirs)}")
    names = run_names(run_dirs)
    histories = {name: load_run(d) for name, d in zip(names, run_dirs, strict=True)}
    for history in histories.values():
        for note in history.notes:
            log.warning("report: %s", note)
    out = Path(out_dir) if out_dir is not None else Path(run_dirs[0]) / COMPARISON_DIR
    out.mkdir(parents=True, exist_ok=True)
    labels = sorted(set.union(*(set(h.tasks()) for h in histories.values())))
    plots, failures = {}, {}
    for label in labels:
        curves, stderr = task_curves(histories, label)
        if curves:
            name = plot_file("runs", label)
            failure = draw(
                f"task {label!r}", out / name, partial(plot_runs, label, curves, stderr, out / name)
            )
            plots[label], failures[label] = ("", failure) if failure else (name, "")
    verdicts = [
        pair_verdicts(Path(run_dirs[0]), Path(d), name)
        for name, d in zip(names[1:], run_dirs[1:], strict=True)
    ]
    signals = signal_to_noise(list(histories.values()))
    path = out / "index.html"
    path.write_text(render_comparison(names, histories, labels, plots, failures, verdicts, signals))
    return path


def render_comparison(
    names: list[str],
    histories: Mapping[str, RunHistory],
    labels: list[str],
    plots: Mapping[str, str],
    failures: Mapping[str, str],
    verdicts: list[PairVerdicts],
    signals: list[FigureSignal],
) -> str:
    """The page: the runs, signal-to-noise per task figure, then one card per task (plot and verdicts)."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>in-loop evaluation: runs compared</title>",
        f"{STYLE}</head><body><h1>Runs compared</h1><ul>",
        *(
            f"<li>{'A' if i == 0 else 'B'}: <b>{escape(n)}</b> <code>{escape(histories[n].source)}</code></li>"
            for i, n in enumerate(names)
        ),
        "</ul><p>Verdicts: B - A of each figure on the documents both runs evaluated at that step (paired: exact "
        "McNemar for 0/1 figures, paired t otherwise), B or A better at p &lt; 0.05, else cannot tell.</p>",
        *(f"<p class='flag'>Reading: {escape(note)}</p>" for h in histories.values() for note in h.notes),
        *(f"<p class='flag'>B = {escape(v.b)}: {escape(s)}</p>" for v in verdicts for s in v.skipped),
        *signal_section(names, signals),
        "<div class='grid'>",
    ]
    suggestions = bpb_suggestion(signals)
    for label in labels:
        parts.append(f"<div class='card' id='task-{escape(label)}'><h3>{escape(label)}</h3>")
        if plots.get(label):
            parts.append(f"<img src='{escape(plots[label])}' alt='{escape(label)} across runs' width='560'>")
        if failures.get(label):
            parts.append(f"<p class='flag'>{escape(failures[label])}</p>")
        if label in suggestions:
            parts.append(f"<p class='flag'>{escape(suggestions[label])}</p>")
        for pair in verdicts:
            parts += verdict_table(label, pair)
        parts.append("</div>")
    parts.append("</div></body></html>")
    return "\n".join(parts)


def signal_section(names: list[str], signals: list[FigureSignal]) -> list[str]:
    """The signal-to-noise table, noise over signal flagged."""
    if not signals:
        return []
    head = "".join(f"<th>{escape(n)}</th>" for n in names)
    parts = [
        "<h2>Signal and noise</h2><p>signal: (max - min) / mean of the runs' final scores; noise: sd of the last "
        "evaluations around their trend over their mean, averaged over the runs; SNR = signal / noise. Below 1, "
        "the runs' order is within checkpoint noise.</p>",
        f"<table><tr><th>task</th><th>figure</th>{head}<th>signal</th><th>noise</th><th>SNR</th></tr>",
    ]
    for s in signals:
        flag = " class='flag'" if s.noisy else ""
        parts.append(
            f"<tr{flag}><td class='l'>{escape(s.label)}</td><td class='l'>{escape(s.figure)}</td>"
            + "".join(f"<td>{v:.3f}</td>" for v in s.finals)
            + f"<td>{s.signal:.3f}</td><td>{s.noise:.3f}</td><td>{s.snr:.2f}</td></tr>"
        )
    parts.append("</table>")
    return parts


def verdict_table(label: str, pair: PairVerdicts) -> list[str]:
    """One task's verdicts against run `pair.b`: a row per figure, a column per step both evaluated."""
    rows = {figure: by_step for (task, figure), by_step in pair.results.items() if task == label}
    if not rows:
        return [f"<p class='note'>B = {escape(pair.b)}: no paired verdicts. {escape(pair.note)}</p>"]
    steps = sorted({step for by_step in rows.values() for step in by_step})
    parts = [
        f"<p>B = {escape(pair.b)}, B - A:</p><table><tr><th>figure</th>"
        + "".join(f"<th>{step}</th>" for step in steps)
        + "</tr>"
    ]
    for figure, by_step in rows.items():
        cells = []
        for step in steps:
            r = by_step.get(step)
            colour = VERDICT_COLOURS.get(r.verdict, "#555") if r else "#555"
            text = f"{r.diff:+.3f} ({r.verdict}, n {r.n})" if r else "–"
            cells.append(f"<td style='color:{colour}'>{escape(text)}</td>")
        parts.append(f"<tr><td class='l'>{escape(figure)}</td>{''.join(cells)}</tr>")
    parts.append("</table>")
    return parts
