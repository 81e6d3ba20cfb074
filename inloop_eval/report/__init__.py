"""`inloop-eval report RUN_DIR`: one HTML page of a run's evaluations over training steps.

For every task, acc, acc_norm and acc_pmi (those it reports) on one chart, with ±1 standard error bands
when logged; for every perplexity domain (`eval/lm/<domain>/...`), ppl and bits per byte. Flags:
- *diverging*: over the last `window` evaluations, the fitted trends of acc and acc_norm have opposite signs
  and each moves by at least `min_change` and by at least its standard error (when logged). Length
  normalisation then reorders the choices against the raw loglikelihood: a change in how the probability
  mass is spread over the continuation's tokens (output sharpness, a format effect), not in capability.
- *letter keys*: tasks whose choices all have the same length (`*_mc` letter keys, WinoGrande's shared
  continuation) have acc_norm identical to acc by construction; they do not report it, and the page says so.
  A task that reports acc_norm equal to acc at every evaluation is flagged too.

RUN_DIR holds `metrics.jsonl` (+ `config.json`) as `JSONLLogger` writes them, or a W&B run (a directory
with a `run-*.wandb` file, e.g. `wandb/offline-run-...` or `wandb/run-...`), read offline. A run may still be
writing, or may have been killed: lines the report cannot read (cut off, not JSON objects, without a step)
and a corrupt `config.json` are skipped, and the page and stderr say which. A step logged more than once (a
job resumed from an earlier checkpoint) shows its last value for each key.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inloop_eval.errors import InLoopEvalError
from inloop_eval.keys import DOWNSTREAM, PERPLEXITY, SECONDS_KEY, TOKENS_KEY, kind_prefix
from inloop_eval.loggers import CONFIG_FILE, CURVE_METRICS, METRICS_FILE
from inloop_eval.loggers.wandb_file import find_run_files, read_config, read_history
from inloop_eval.tasks import get_task

LM_FIGURES: tuple[str, ...] = ("ppl", "bpb", "ce")
STEP_KEYS: tuple[str, ...] = ("step", "trainer/step")
REPORT_DIR = "report"

Series = list[tuple[int, float]]
# Line numbers shown per reason a line was skipped; the rest are counted.
SHOWN_LINES = 10

log = logging.getLogger(__name__)


class ReportError(InLoopEvalError):
    """A run directory the report cannot read."""


@dataclass
class RunHistory:
    """Every logged key's values by trainer step, and the run's config (may be empty)."""

    series: dict[str, Series]
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    notes: list[str] = field(default_factory=list)
    """What reading skipped or replaced (cut-off lines, a corrupt config, steps logged twice)."""

    def tasks(self) -> dict[str, dict[str, Series]]:
        """label -> metric -> series, for `eval/downstream/<label>/<metric>` keys."""
        return group(self.series, kind_prefix(DOWNSTREAM))

    def domains(self) -> dict[str, dict[str, Series]]:
        """domain -> figure -> series, for `eval/lm/<domain>/<figure>` keys."""
        return group(self.series, kind_prefix(PERPLEXITY))


def group(series: Mapping[str, Series], prefix: str) -> dict[str, dict[str, Series]]:
    out: dict[str, dict[str, Series]] = {}
    for key, points in series.items():
        if key.startswith(prefix):
            name, _, metric = key[len(prefix) :].rpartition("/")
            if name:
                out.setdefault(name, {})[metric] = points
    return dict(sorted(out.items()))


def history_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, Series]:
    """Rows with a step (`step` or `trainer/step`) to sorted per-key series; a later value for the same step
    wins (a resumed run logging a step again). Rows without a step and non-numeric values are skipped."""
    return collect_rows(rows)[0]


def row_step(row: Mapping[str, Any]) -> int | None:
    """The row's trainer step: the first of STEP_KEYS holding a finite number; None if none does."""
    step = next((row[k] for k in STEP_KEYS if isinstance(row.get(k), (int, float))), None)
    if step is None or isinstance(step, bool) or not math.isfinite(step):
        return None
    return int(step)


def collect_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Series], list[int]]:
    """`history_from_rows`, and the steps at which a later row replaced a different value of some key."""
    by_key: dict[str, dict[int, float]] = {}
    replaced: set[int] = set()
    for row in rows:
        step = row_step(row)
        if step is None:
            continue
        for key, value in row.items():
            if key in STEP_KEYS or key.startswith("_") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                points = by_key.setdefault(key, {})
                if step in points and not same_value(points[step], float(value)):
                    replaced.add(step)
                points[step] = float(value)
    return {k: sorted(v.items()) for k, v in sorted(by_key.items())}, sorted(replaced)


def same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def line_list(numbers: list[int]) -> str:
    """`line 7`, `lines 7, 9, 12`, or the first SHOWN_LINES and how many more."""
    shown = ", ".join(str(n) for n in numbers[:SHOWN_LINES])
    more = f" and {len(numbers) - SHOWN_LINES} more" if len(numbers) > SHOWN_LINES else ""
    return f"line{'s' if len(numbers) > 1 else ''} {shown}{more}"


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a `metrics.jsonl` that hold a JSON object with a step, and a note on the lines skipped:
    a cut-off last line (a run still writing, or killed), lines that are not JSON, not an object, or have no
    step. Blank lines are ignored."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    ends_open = not data.endswith(b"\n")
    if not ends_open:
        lines.pop()  # the empty string after the final newline
    rows: list[dict[str, Any]] = []
    skipped: dict[str, list[int]] = {}
    for number, raw in enumerate(lines, start=1):
        text = raw.decode("utf-8", errors="replace")
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except ValueError:
            cut_off = ends_open and number == len(lines)
            skipped.setdefault(
                "cut off (still being written, or the run was killed)" if cut_off else "not valid JSON", []
            ).append(number)
            continue
        if not isinstance(row, dict):
            skipped.setdefault("not a JSON object", []).append(number)
        elif row_step(row) is None:
            skipped.setdefault(f"without a step ({' or '.join(STEP_KEYS)}, a finite number)", []).append(
                number
            )
        else:
            rows.append(row)
    if not skipped:
        return rows, []
    count = sum(len(numbers) for numbers in skipped.values())
    reasons = "; ".join(f"{line_list(numbers)} {reason}" for reason, numbers in skipped.items())
    return rows, [f"{path}: skipped {count} of {len(lines)} lines: {reasons}"]


def read_config_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """`config.json` as a dict; {} when absent, and {} with a note when it is corrupt or not an object."""
    if not path.is_file():
        return {}, []
    try:
        config = json.loads(path.read_bytes().decode("utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        return {}, [f"{path}: skipped, not readable as JSON ({exc}); the page shows no config"]
    if not isinstance(config, dict):
        found = type(config).__name__
        return {}, [f"{path}: skipped, expected a JSON object, found {found}; the page shows no config"]
    return config, []


def load_run(run_dir: str | Path) -> RunHistory:
    """The history of a run directory: `metrics.jsonl` if present, else the W&B run file found in it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"report: {run_dir} is not a directory; pass the run directory of a training run")
    jsonl = run_dir / METRICS_FILE
    if jsonl.is_file():
        rows, notes = read_jsonl(jsonl)
        config, config_notes = read_config_file(run_dir / CONFIG_FILE)
        return run_history(rows, config, str(jsonl), notes + config_notes)
    files = find_run_files(run_dir)
    if not files:
        raise ReportError(
            f"report: {run_dir} holds neither {METRICS_FILE} (JSONLLogger) nor a W&B run file "
            "(run-*.wandb); pass the directory a JSONLLogger or WandbLogger wrote to"
        )
    if len(files) > 1:
        raise ReportError(
            f"report: {run_dir} holds {len(files)} W&B runs ({', '.join(str(f.parent.name) for f in files)}); "
            "pass one run's directory"
        )
    return run_history(read_history(files[0]), read_config(files[0]), str(files[0]), [])


def run_history(
    rows: list[dict[str, Any]], config: dict[str, Any], source: str, notes: list[str]
) -> RunHistory:
    """The history of `rows`, with a note added when a step was logged again with different values."""
    series, replaced = collect_rows(rows)
    if replaced:
        steps = ", ".join(str(s) for s in replaced[:SHOWN_LINES])
        more = f" and {len(replaced) - SHOWN_LINES} more" if len(replaced) > SHOWN_LINES else ""
        notes = [
            *notes,
            f"{source}: {len(replaced)} step(s) logged more than once with different values (steps {steps}{more}; "
            "a job resumed from an earlier checkpoint re-runs steps): the page shows the last value logged",
        ]
    return RunHistory(series, config, source, notes)


def fitted_change(points: Series) -> float:
    """The least-squares trend of `points` times their step span: how much the line moves over them."""
    if len(points) < 2:
        return 0.0
    steps = np.array([s for s, _ in points], dtype=np.float64)
    values = np.array([v for _, v in points], dtype=np.float64)
    span = steps[-1] - steps[0]
    if span <= 0 or not np.isfinite(values).all():
        return 0.0
    slope = np.polyfit(steps, values, 1)[0]
    return float(slope * span)


def divergence(
    acc: Series,
    acc_norm: Series,
    window: int = 4,
    min_change: float = 0.01,
    acc_stderr: Series | None = None,
    acc_norm_stderr: Series | None = None,
) -> str | None:
    """A sentence when, over the last `window` evaluations both report, acc and acc_norm trend in opposite
    directions, each by at least `min_change` and by at least its standard error at the last of them (when
    logged: with few documents, a move within the noise is not a signal); None otherwise."""
    common = sorted(set(dict(acc)) & set(dict(acc_norm)))[-window:]
    if len(common) < 2:
        return None
    a, n = dict(acc), dict(acc_norm)
    d_acc = fitted_change([(s, a[s]) for s in common])
    d_norm = fitted_change([(s, n[s]) for s in common])
    need_acc = max(min_change, dict(acc_stderr or []).get(common[-1], 0.0))
    need_norm = max(min_change, dict(acc_norm_stderr or []).get(common[-1], 0.0))
    if d_acc * d_norm >= 0 or abs(d_acc) < need_acc or abs(d_norm) < need_norm:
        return None
    return (
        f"acc and acc_norm move in opposite directions over the last {len(common)} evaluations "
        f"(steps {common[0]}-{common[-1]}: acc {d_acc:+.3f}, acc_norm {d_norm:+.3f}): a change in output "
        "sharpness or format rather than capability"
    )


def identical(acc: Series, acc_norm: Series) -> bool:
    """acc_norm equals acc at every evaluation both report (at least one)."""
    a, n = dict(acc), dict(acc_norm)
    common = set(a) & set(n)
    return bool(common) and all(a[s] == n[s] for s in common)


@dataclass
class TaskView:
    """What the page shows for one task."""

    label: str
    task_id: str
    curves: dict[str, Series]
    stderr: dict[str, Series]
    flags: list[str]
    notes: list[str]
    plot: str = ""


def task_ids(config: Mapping[str, Any]) -> dict[str, str]:
    """label -> task id, from an evaluator config (top level or under `evaluation`)."""
    evaluation = config.get("evaluation", config)
    entries = evaluation.get("evaluators", []) if isinstance(evaluation, Mapping) else []
    out = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping) and entry.get("task"):
            out[str(entry.get("label") or entry["task"])] = str(entry["task"])
    return out


def length_norm_is_noop(task_id: str) -> bool | None:
    """What the registry says of `task_id`; None for a task it does not know."""
    try:
        return bool(get_task(task_id).length_norm_is_noop)
    except InLoopEvalError:
        return None


def task_views(history: RunHistory, window: int = 4, min_change: float = 0.01) -> list[TaskView]:
    """Curves, flags and notes for every task in the history."""
    ids = task_ids(history.config)
    views = []
    for label, metrics in history.tasks().items():
        task_id = ids.get(label, label)
        curves = {m: metrics[m] for m in CURVE_METRICS if m in metrics}
        stderr = {m: metrics[f"{m}_stderr"] for m in curves if f"{m}_stderr" in metrics}
        flags: list[str] = []
        notes: list[str] = []
        if "failed" in metrics and any(v > 0 for _, v in metrics["failed"]):
            failed_at = [s for s, v in metrics["failed"] if v > 0]
            flags.append(f"failed at {len(failed_at)} evaluation(s), first at step {failed_at[0]}")
        noop = length_norm_is_noop(task_id)
        if "acc" in curves and "acc_norm" in curves:
            sentence = divergence(
                curves["acc"],
                curves["acc_norm"],
                window,
                min_change,
                stderr.get("acc"),
                stderr.get("acc_norm"),
            )
            if sentence:
                flags.append("diverging: " + sentence)
            if identical(curves["acc"], curves["acc_norm"]):
                why = " by construction (letter keys / shared continuation)" if noop else ""
                flags.append(f"identical: acc_norm equals acc at every evaluation{why}")
        elif "acc" in curves and noop:
            notes.append(
                "letter keys / shared continuation: every choice has the same length, so acc_norm would equal "
                "acc by construction; it is not reported"
            )
        views.append(TaskView(label, task_id, curves, stderr, flags, notes))
    return views


def new_figure(**kwargs: Any) -> Any:
    """A matplotlib Figure (no pyplot: no global state, no display needed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError(
            "report: the plots need matplotlib; install it with `pip install 'inloop_eval[report]'`"
        ) from None
    return Figure(layout="constrained", **kwargs)


def integer_steps(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def plot_task(view: TaskView, path: Path) -> None:
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
    ax.set_title(view.label if view.label == view.task_id else f"{view.label} ({view.task_id})")
    ax.set_ylabel("accuracy")
    integer_steps(ax)
    ax.legend(loc="best", fontsize="small")
    fig.savefig(path, dpi=100)


def plot_domain(domain: str, figures: Mapping[str, Series], path: Path) -> None:
    shown = [f for f in ("ppl", "bpb") if f in figures] or [f for f in LM_FIGURES if f in figures]
    fig = new_figure(figsize=(3.2 * max(1, len(shown)), 3.2))
    axes = np.atleast_1d(fig.subplots(1, max(1, len(shown))))
    for ax, name in zip(axes, shown, strict=False):
        points = figures[name]
        ax.plot([s for s, _ in points], [v for _, v in points], marker="o", markersize=3)
        if name == "ppl":
            ax.set_yscale("log")
        ax.set_title(f"{domain}: {name}")
        integer_steps(ax)
    fig.savefig(path, dpi=100)


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def write_report(
    run_dir: str | Path, out_dir: str | Path | None = None, *, window: int = 4, min_change: float = 0.01
) -> Path:
    """Write `<out_dir>/index.html` (default `<run_dir>/report/`) with one PNG per task and per domain;
    returns the HTML path."""
    if window < 2:
        raise ReportError(f"report: window must be >= 2 evaluations, found {window}")
    history = load_run(run_dir)
    for note in history.notes:
        log.warning("report: %s", note)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    views = task_views(history, window, min_change)
    for view in views:
        if view.curves:
            view.plot = f"task_{safe_name(view.label)}.png"
            plot_task(view, out / view.plot)
    domain_plots = {}
    for domain, figures in history.domains().items():
        if any(f in figures for f in LM_FIGURES):
            domain_plots[domain] = f"lm_{safe_name(domain)}.png"
            plot_domain(domain, figures, out / domain_plots[domain])
    path = out / "index.html"
    path.write_text(render_html(history, views, history.domains(), domain_plots, window, min_change))
    return path


def last(points: Series | None) -> str:
    return f"{points[-1][1]:.3f}" if points else "–"


def render_html(
    history: RunHistory,
    views: list[TaskView],
    domains: Mapping[str, Mapping[str, Series]],
    domain_plots: Mapping[str, str],
    window: int,
    min_change: float,
) -> str:
    e = html.escape
    steps = sorted({s for points in history.series.values() for s, _ in points})
    flagged = [v for v in views if any(f.startswith("diverging") for f in v.flags)]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>in-loop evaluation report</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "th{background:#f3f3f3}td.l{text-align:left}.flag{color:#b00}.note{color:#555}"
        ".grid{display:flex;flex-wrap:wrap;gap:16px}.card{border:1px solid #ddd;padding:8px;width:570px}"
        "</style></head><body>",
        "<h1>In-loop evaluation report</h1>",
        f"<p>Source: <code>{e(history.source)}</code>. {len(steps)} logged steps"
        + (f", {steps[0]} to {steps[-1]}" if steps else "")
        + f". {len(views)} tasks, {len(domains)} perplexity domains.</p>",
        *(f"<p class='flag'>Reading: {e(note)}</p>" for note in history.notes),
        f"<p>Divergence flag: over the last {window} evaluations the fitted trends of acc and acc_norm have "
        f"opposite signs and each moves by at least {min_change:g} and by at least its standard error. "
        f"{len(flagged)} task(s) flagged{': ' + e(', '.join(v.label for v in flagged)) if flagged else ''}.</p>",
    ]
    parts.append(cost_paragraph(history.series))
    if views:
        parts.append(
            "<h2>Tasks</h2><table><tr><th>task</th><th>acc</th><th>acc_norm</th><th>acc_pmi</th>"
            "<th class='l'>flags and notes</th></tr>"
        )
        for v in views:
            remarks = [f"<span class='flag'>{e(f)}</span>" for f in v.flags]
            remarks += [f"<span class='note'>{e(n)}</span>" for n in v.notes]
            parts.append(
                f"<tr><td class='l'><a href='#task-{e(v.label)}'>{e(v.label)}</a></td>"
                + "".join(f"<td>{last(v.curves.get(m))}</td>" for m in CURVE_METRICS)
                + f"<td class='l'>{'<br>'.join(remarks)}</td></tr>"
            )
        parts.append("</table><div class='grid'>")
        for v in views:
            parts.append(f"<div class='card' id='task-{e(v.label)}'><h3>{e(v.label)}</h3>")
            if v.plot:
                parts.append(
                    f"<img src='{e(v.plot)}' alt='{e(v.label)}: {e(', '.join(v.curves))}' width='560'>"
                )
            parts += [f"<p class='flag'>{e(f)}</p>" for f in v.flags]
            parts += [f"<p class='note'>{e(n)}</p>" for n in v.notes]
            parts.append("</div>")
        parts.append("</div>")
    if domains:
        parts.append("<h2>Perplexity</h2><table><tr><th>domain</th><th>ppl</th><th>bpb</th><th>ce</th></tr>")
        for domain, figures in domains.items():
            parts.append(
                f"<tr><td class='l'>{e(domain)}</td>"
                + "".join(f"<td>{last(figures.get(f))}</td>" for f in LM_FIGURES)
                + "</tr>"
            )
        parts.append("</table><div class='grid'>")
        for domain, plot in domain_plots.items():
            parts.append(f"<div class='card'><img src='{e(plot)}' alt='{e(domain)} perplexity'></div>")
        parts.append("</div>")
    if history.config:
        config = json.dumps(history.config, indent=2, sort_keys=True, default=str)
        parts.append(f"<h2>Config</h2><details><summary>as logged</summary><pre>{e(config)}</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def cost_paragraph(series: Mapping[str, Series]) -> str:
    seconds = [v for _, v in series.get(SECONDS_KEY, [])]
    tokens = [v for _, v in series.get(TOKENS_KEY, [])]
    if not seconds:
        return ""
    text = f"Evaluation cost: {np.mean(seconds):.1f} s per evaluation (mean of {len(seconds)})"
    if tokens and all(math.isfinite(t) for t in tokens):
        text += f", {np.mean(tokens):,.0f} tokens forwarded per evaluation"
    return f"<p>{text}.</p>"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inloop-eval report", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: Any) -> None:
    parser.add_argument("run_dir", help="a run directory: metrics.jsonl (+ config.json), or a W&B run")
    parser.add_argument("--out", help="where to write index.html and the PNGs (default RUN_DIR/report)")
    parser.add_argument("--window", type=int, default=4, help="evaluations the divergence flag looks at")
    parser.add_argument(
        "--min-change", type=float, default=0.01, help="least move of acc and of acc_norm for the flag"
    )


def run(args: Any) -> int:
    path = write_report(args.run_dir, args.out, window=args.window, min_change=args.min_change)
    print(f"report: {path}")
    return 0
