"""`inloop-eval report RUN_A RUN_B ...`: one HTML page comparing runs (`write_comparison`).

The runs (each in its own colour on every plot), how their configs differ from run A's, and over all runs
signal-to-noise per task figure with the tasks whose noise exceeds their signal flagged (`report.signal`)
and how to read it beside the verdicts. Then the training loss of every run, and for every task each
figure's curves of every run with ±1 standard error bands and, per step that run A and another run both
evaluated (their per-document outcomes, `<run>/outcomes/step_<N>.npz`), the paired verdict of each figure
(`compare.pairing`, B - A on the documents both evaluated); and every perplexity domain's curves. Runs
without outcomes get curves and signal-to-noise, and the page says why they have no verdicts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from html import escape
from pathlib import Path, PurePath

from inloop_eval.compare.pairing import compare_steps
from inloop_eval.keys import TRAIN_LOSS_KEY
from inloop_eval.loggers.base import CURVE_METRICS
from inloop_eval.loggers.outcomes import OutcomesError, list_steps, outcomes_directory, read_step
from inloop_eval.metrics.paired import A_BETTER, B_BETTER, CANNOT_TELL, PairedResult
from inloop_eval.report.analysis import chance_levels
from inloop_eval.report.page import BAND_LEGEND, LOSS_PLOT, STYLE, draw, plot_file
from inloop_eval.report.planned import PlanAtCost, plan_at_cost, plan_cell, plan_paragraph
from inloop_eval.report.plots import plot_loss, plot_runs, run_colour
from inloop_eval.report.runs import LM_FIGURES, ReportError, RunHistory, Series, load_run
from inloop_eval.report.signal import BPB_TWIN, FigureSignal, bpb_suggestion, signal_to_noise

COMPARISON_DIR = "comparison"
# The figures whose verdicts the page shows per step (those a task logs), and the most recent steps shown.
VERDICT_FIGURES: tuple[str, ...] = (*CURVE_METRICS, BPB_TWIN, "centered_acc")
SHOWN_STEPS = 12
# Each verdict's class (its colour, STYLE) and the mark its cell shows beside the difference.
VERDICT_CLASSES = {B_BETTER: "b-better", A_BETTER: "a-better", CANNOT_TELL: "cannot-tell"}
VERDICT_MARKS = {B_BETTER: "B", A_BETTER: "A", CANNOT_TELL: "·"}
# What each mark means, in the legend above the verdict tables.
VERDICT_MEANINGS = {
    B_BETTER: "run B is better",
    A_BETTER: "run A is better",
    CANNOT_TELL: "the documents cannot tell them apart",
}
# A config value longer than this is cut in the table of differences.
MAX_CONFIG_CHARS = 120

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
    chances: dict[str, float] = {}
    for d in reversed(run_dirs):  # run A's figure wins where the runs' documents differ
        chances.update(chance_levels(d))
    plots, failures = {}, {}
    for label in labels:
        curves, stderr = task_curves(histories, label)
        if curves:
            name = plot_file("runs", label)
            plot = partial(plot_runs, label, curves, stderr, out / name, names, chances.get(label))
            failure = draw(f"task {label!r}", out / name, plot)
            plots[label], failures[label] = ("", failure) if failure else (name, "")
    domains = sorted(set.union(*(set(h.domains()) for h in histories.values())))
    for domain in domains:
        curves = domain_curves(histories, domain)
        if curves:
            name = plot_file("lm_runs", domain)
            plot = partial(plot_runs, domain, curves, {}, out / name, names)
            failure = draw(f"perplexity domain {domain!r}", out / name, plot)
            plots[f"lm:{domain}"], failures[f"lm:{domain}"] = ("", failure) if failure else (name, "")
    losses = {n: h.series[TRAIN_LOSS_KEY] for n, h in histories.items() if h.series.get(TRAIN_LOSS_KEY)}
    if losses:
        failure = draw("the training loss", out / LOSS_PLOT, partial(plot_loss, losses, out / LOSS_PLOT))
        plots["loss"], failures["loss"] = ("", failure) if failure else (LOSS_PLOT, "")
    verdicts = [
        pair_verdicts(Path(run_dirs[0]), Path(d), name)
        for name, d in zip(names[1:], run_dirs[1:], strict=True)
    ]
    signals = signal_to_noise(list(histories.values()))
    planned = plan_at_cost(run_dirs)
    path = out / "index.html"
    page = render_comparison(names, histories, labels, plots, failures, verdicts, signals, planned, domains)
    path.write_text(page)
    return path


def domain_curves(histories: Mapping[str, RunHistory], domain: str) -> dict[str, dict[str, Series]]:
    """figure -> run -> series of `domain`'s ppl and bpb (ce when neither is logged) across the runs."""
    curves: dict[str, dict[str, Series]] = {}
    for run, history in histories.items():
        for figure, points in history.domains().get(domain, {}).items():
            if figure in LM_FIGURES:
                curves.setdefault(figure, {})[run] = points
    shown = [f for f in ("ppl", "bpb") if f in curves] or [f for f in LM_FIGURES if f in curves]
    return {f: curves[f] for f in shown}


def render_comparison(
    names: list[str],
    histories: Mapping[str, RunHistory],
    labels: list[str],
    plots: Mapping[str, str],
    failures: Mapping[str, str],
    verdicts: list[PairVerdicts],
    signals: list[FigureSignal],
    planned: PlanAtCost,
    domains: Sequence[str] = (),
) -> str:
    """The page: the runs and their config differences, signal-to-noise per task figure with what the plan
    keeps at the runs' cost, the training loss, then one card per task (plot and verdicts) and per perplexity
    domain.

    plots, failures: by task label, `lm:<domain>` and `loss`: the PNG's file name, or why it was not drawn.
    """
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>in-loop evaluation: runs compared</title>",
        f"{STYLE}</head><body><h1>Runs compared</h1><ul>",
        *(
            f"<li><span class='swatch' style='background:{run_colour(i)}'></span>{'A' if i == 0 else 'B'}: "
            f"<b>{escape(n)}</b> <code>{escape(histories[n].source)}</code></li>"
            for i, n in enumerate(names)
        ),
        "</ul>",
        *(f"<p class='flag'>Reading: {escape(note)}</p>" for h in histories.values() for note in h.notes),
        *(f"<p class='flag'>B = {escape(v.b)}: {escape(s)}</p>" for v in verdicts for s in v.skipped),
        *config_section(names, histories),
        *signal_section(names, signals, planned),
        "<h2>Curves and verdicts</h2>",
        f"<p>Each run is drawn in its colour above. {BAND_LEGEND} Verdicts: B - A "
        "of each figure on the documents both runs evaluated at that step (paired: exact McNemar for 0/1 "
        "figures, paired t otherwise): "
        + "; ".join(
            f"a cell marked <span class='{VERDICT_CLASSES[v]}'>{escape(VERDICT_MARKS[v])}</span> means "
            f"{escape(VERDICT_MEANINGS[v])}"
            for v in (B_BETTER, A_BETTER, CANNOT_TELL)
        )
        + " (better at p &lt; 0.05; a cell's tooltip has p and the documents paired).</p>",
        "<div class='grid'>",
        *plot_card("train-loss", "training loss", plots.get("loss", ""), failures.get("loss", "")),
    ]
    suggestions = bpb_suggestion(signals)
    for label in labels:
        parts.append(f"<div class='card' id='task-{escape(label)}'><h3>{escape(label)}</h3>")
        if plots.get(label):
            parts.append(f"<img src='{escape(plots[label])}' alt='{escape(label)} across runs'>")
        if failures.get(label):
            parts.append(f"<p class='flag'>{escape(failures[label])}</p>")
        if label in suggestions:
            parts.append(f"<p class='noisy'>{escape(suggestions[label])}</p>")
        for pair in verdicts:
            parts += verdict_table(label, pair)
        parts.append("</div>")
    for domain in domains:
        key = f"lm:{domain}"
        parts += plot_card(
            f"lm-{domain}", f"{domain} (perplexity)", plots.get(key, ""), failures.get(key, "")
        )
    parts.append("</div></body></html>")
    return "\n".join(parts)


def plot_card(card_id: str, title: str, plot: str, failure: str) -> list[str]:
    """A card holding one plot (or why it was not drawn); nothing when there is neither."""
    if not plot and not failure:
        return []
    body = (
        f"<img src='{escape(plot)}' alt='{escape(title)}'>"
        if plot
        else f"<p class='flag'>{escape(failure)}</p>"
    )
    return [f"<div class='card' id='{escape(card_id)}'><h3>{escape(title)}</h3>{body}</div>"]


def flat_config(config: object, prefix: str = "") -> dict[str, str]:
    """A config as dotted keys (`train.seed`, `evaluation.evaluators[4].domains[0].paths[0]`) to their values
    as JSON text, so that two configs differ only where a value does."""
    if isinstance(config, Mapping):
        items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in config.items()]
    elif isinstance(config, list) and config:
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(config)]
    else:
        return {prefix: json.dumps(config, sort_keys=True, default=str)}
    out: dict[str, str] = {}
    for key, value in items:
        out.update(flat_config(value, key))
    return out


def config_differences(a: Mapping[str, object], b: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """(key, A's value, B's value) of every config value that differs, "–" for one a config lacks."""
    flat_a, flat_b = flat_config(a), flat_config(b)
    keys = sorted(set(flat_a) | set(flat_b))
    return [(k, flat_a.get(k, "–"), flat_b.get(k, "–")) for k in keys if flat_a.get(k) != flat_b.get(k)]


def absolute_path(value: str) -> str | None:
    """The path a config value (JSON text) holds when it is an absolute path string, else None."""
    try:
        text = json.loads(value)
    except ValueError:
        return None
    return text if isinstance(text, str) and PurePath(text).is_absolute() else None


def relative_paths(rows: list[tuple[str, str, str]]) -> tuple[list[tuple[str, str, str]], str]:
    """The rows with every absolute path shown relative to the paths' common folder (a lone path: its
    basename), and that folder ("" when no value is an absolute path): absolute paths of temporary or home
    folders outrun the table and hide the part that differs."""
    paths = [p for _, *values in rows for p in map(absolute_path, values) if p is not None]
    if not paths:
        return rows, ""
    try:
        root = os.path.commonpath(paths)
    except ValueError:  # paths on different drives share no folder
        return rows, ""
    if root in paths:  # one path is the common folder itself (or the only one): its parent
        root = str(PurePath(root).parent)

    def shown(value: str) -> str:
        path = absolute_path(value)
        return value if path is None else json.dumps(os.path.relpath(path, root))

    return [(key, shown(va), shown(vb)) for key, va, vb in rows], root


def config_section(names: list[str], histories: Mapping[str, RunHistory]) -> list[str]:
    """How each run's logged config differs from run A's."""
    parts = ["<h2>Config differences</h2>"]
    a = histories[names[0]].config
    for name in names[1:]:
        b = histories[name].config
        if not a or not b:
            missing = names[0] if not a else name
            parts.append(f"<p class='note'>{escape(missing)} logged no config: nothing to compare.</p>")
            continue
        rows = config_differences(a, b)
        if not rows:
            parts.append(f"<p>{escape(name)} has the same config as {escape(names[0])}.</p>")
            continue
        rows, root = relative_paths(rows)
        if root:
            parts.append(f"<p class='note'>Paths below are relative to <code>{escape(root)}</code>.</p>")
        parts.append(
            f"<table class='config'><tr><th class='l'>key</th><th class='l'>A: {escape(names[0])}</th>"
            f"<th class='l'>B: {escape(name)}</th></tr>"
        )
        for key, va, vb in rows:
            cut = [v if len(v) <= MAX_CONFIG_CHARS else v[:MAX_CONFIG_CHARS] + "…" for v in (va, vb)]
            parts.append(
                f"<tr><td class='l'>{escape(key)}</td><td class='l'>{escape(cut[0])}</td>"
                f"<td class='l'>{escape(cut[1])}</td></tr>"
            )
        parts.append("</table>")
    return parts


def signal_section(names: list[str], signals: list[FigureSignal], planned: PlanAtCost) -> list[str]:
    """The signal-to-noise table, noise over signal flagged, each row with what `inloop-eval plan` does with
    that task figure at the runs' cost (`report.planned`), and the plan in words below it."""
    if not signals:
        return []
    head = "".join(f"<th>{escape(n)}</th>" for n in names)
    parts = [
        "<h2>Signal and noise</h2><p>signal: (max - min) / mean of the runs' final scores, read at the last "
        "step every run evaluated (the step column; where the runs share none, each run's last step, named per "
        "run and flagged: runs at different steps differ by training too); noise: sd of the last "
        "evaluations around their trend over their mean, averaged over the runs; SNR = signal / noise. Below 1, "
        "the runs' order is within checkpoint noise (highlighted).</p>"
        "<p>SNR and the paired verdicts answer different questions. SNR compares the runs' final scores with "
        "how much each curve jumps from one checkpoint to the next; a verdict asks whether, at one step, B's "
        "per-document outcomes differ from A's by more than the documents evaluated can resolve. A high SNR "
        "with verdicts that cannot tell means the runs keep their order across checkpoints but the gap is "
        "smaller than one step's documents can detect (the detectable difference that "
        "<code>inloop-eval compare</code> gives says how much is); evaluate more documents before calling it.</p>",
        f"<table><tr><th>task</th><th>figure</th><th>step</th>{head}<th>signal</th><th>noise</th><th>SNR</th>"
        "<th>plan at the runs' cost</th></tr>",
    ]
    for s in signals:
        flag = " class='noisy'" if s.noisy else ""
        parts.append(
            f"<tr{flag}><td class='l'>{escape(s.label)}</td><td class='l'>{escape(s.figure)}</td>"
            + signal_steps_cell(names, s.steps)
            + "".join(f"<td>{v:.3f}</td>" for v in s.finals)
            + f"<td>{s.signal:.3f}</td><td>{s.noise:.3f}</td><td>{s.snr:.2f}</td>"
            + plan_cell(planned, s.label, s.figure)
            + "</tr>"
        )
    parts += ["</table>", plan_paragraph(planned)]
    return parts


def signal_steps_cell(names: list[str], steps: Sequence[int | None]) -> str:
    """The step the finals were read at: one number where the runs share it, else each run's, flagged."""
    if len(set(steps)) == 1:
        return f"<td>{steps[0] if steps[0] is not None else '–'}</td>"
    each = ", ".join(
        f"{name} at {'–' if step is None else step}" for name, step in zip(names, steps, strict=False)
    )
    return f"<td class='l flag' title='no step evaluated by every run'>different steps: {escape(each)}</td>"


def verdict_table(label: str, pair: PairVerdicts) -> list[str]:
    """One task's verdicts against run `pair.b`: a row per step both evaluated, a column per figure; each
    cell the difference and its verdict's mark, in its colour, with p and n in its tooltip."""
    rows = {figure: by_step for (task, figure), by_step in pair.results.items() if task == label}
    if not rows:
        return [f"<p class='note'>B = {escape(pair.b)}: no paired verdicts. {escape(pair.note)}</p>"]
    steps = sorted({step for by_step in rows.values() for step in by_step})
    parts = [
        f"<p>B = {escape(pair.b)}, B - A:</p><table><tr><th class='l'>step</th>"
        + "".join(f"<th>{escape(figure)}</th>" for figure in rows)
        + "</tr>"
    ]
    for step in steps:
        cells = []
        for by_step in rows.values():
            r = by_step.get(step)
            if r is None:
                cells.append("<td>–</td>")
                continue
            tip = f"{r.verdict}: p {r.p_value:.3g}, n {r.n} ({r.test})"
            cells.append(
                f"<td class='v {VERDICT_CLASSES.get(r.verdict, 'cannot-tell')}' title='{escape(tip)}'>"
                f"{r.diff:+.3f} {escape(VERDICT_MARKS.get(r.verdict, '·'))}</td>"
            )
        parts.append(f"<tr><th class='l'>{step}</th>{''.join(cells)}</tr>")
    parts.append("</table>")
    return parts
