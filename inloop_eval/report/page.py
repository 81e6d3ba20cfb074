"""`write_report`: a run's HTML page (`index.html`) and its PNGs: the training loss (when logged), one per task
and one per perplexity domain. The page fits any window: its cards flow in as many columns of at least one
figure's width as fit, and a figure is drawn at the width of the narrowest card (`plots.WIDTH`).

Each label has its own PNG (`plot_file`: distinct labels never share a file name, whatever their characters
and on file systems that ignore case), and a plot that cannot be drawn costs only that plot: the page is
still written and says which plot is missing and why. Only a missing matplotlib stops the report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from functools import partial
from html import escape
from pathlib import Path

import numpy as np

from inloop_eval.keys import SECONDS_KEY, TOKENS_KEY, TRAIN_LOSS_KEY
from inloop_eval.loggers.base import CURVE_METRICS
from inloop_eval.report.analysis import (
    DIVERGING,
    NONFINITE,
    SUBSET,
    TaskView,
    chance_levels,
    nonfinite_steps,
    task_views,
)
from inloop_eval.report.plots import plot_domain, plot_loss, plot_task
from inloop_eval.report.runs import LM_FIGURES, ReportError, RunHistory, Series, load_run

REPORT_DIR = "report"
# A label used as it is in its file name: lower case (file systems that ignore case cannot tell two apart)
# and characters every file system and URL takes; any other label gets a hash of itself.
PLAIN_LABEL = re.compile(r"[a-z0-9_.-]{1,100}")
# A plot failure's message shown on the page, at most this long.
MAX_ERROR_CHARS = 300

log = logging.getLogger(__name__)


def safe_name(name: str) -> str:
    """`name` as a file name: every character but ASCII letters, digits and `-_.` replaced by `_`."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in name)


def plot_file(kind: str, label: str) -> str:
    """The PNG file name of `label`'s plot: `<kind>_<label>.png` for a PLAIN_LABEL, else
    `<kind>_<label sanitised>~<hash of label>.png` (`~` is never in a plain label), so two labels that
    sanitise alike (`olmo:piqa`, `olmo_piqa`) or differ only in case get two files."""
    if PLAIN_LABEL.fullmatch(label):
        return f"{kind}_{label}.png"
    digest = hashlib.sha256(label.encode("utf-8", errors="surrogatepass")).hexdigest()[:12]
    return f"{kind}_{safe_name(label)[:100]}~{digest}.png"


def draw(what: str, path: Path, plot: Callable[[], None]) -> str:
    """Call `plot()`, which writes the PNG `path`; "" when drawn, else what went wrong (warned, any
    half-written PNG removed). A missing matplotlib (`ReportError`) is raised: no plot could be drawn."""
    try:
        plot()
        return ""
    except ReportError:
        raise
    except Exception as exc:
        path.unlink(missing_ok=True)
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:MAX_ERROR_CHARS]
        message = f"plot of {what} not drawn ({reason})"
        log.warning("report: %s", message)
        return message


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
    loss = draw_loss(history, out)
    chances = chance_levels(run_dir)
    for view in views:
        if view.curves:
            name = plot_file("task", view.label)
            plot = partial(plot_task, view, out / name, chances.get(view.label))
            failure = draw(f"task {view.label!r}", out / name, plot)
            if failure:
                view.flags.append(failure)
            else:
                view.plot = name
    domain_plots: dict[str, str] = {}
    domain_failures: dict[str, str] = {}
    for domain, figures in history.domains().items():
        if any(f in figures for f in LM_FIGURES):
            name = plot_file("lm", domain)
            plot = partial(plot_domain, domain, figures, out / name)
            failure = draw(f"perplexity domain {domain!r}", out / name, plot)
            if failure:
                domain_failures[domain] = failure
            else:
                domain_plots[domain] = name
    path = out / "index.html"
    html = render_html(
        history, views, history.domains(), domain_plots, window, min_change, domain_failures, loss
    )
    path.write_text(html)
    return path


LOSS_PLOT = "train_loss.png"


def draw_loss(history: RunHistory, out: Path) -> tuple[str, str]:
    """(the loss PNG's file name, why it was not drawn) for a run that logs `train/loss`; ("", "") else."""
    points = history.series.get(TRAIN_LOSS_KEY)
    if not points:
        return "", ""
    name = Path(history.source).name or "run"
    failure = draw("the training loss", out / LOSS_PLOT, partial(plot_loss, {name: points}, out / LOSS_PLOT))
    return ("", failure) if failure else (LOSS_PLOT, "")


def loss_section(loss: tuple[str, str]) -> list[str]:
    """The training loss card (its plot, or why it is missing); nothing when the run logs no loss."""
    plot, failure = loss
    if not plot and not failure:
        return []
    body = f"<img src='{plot}' alt='training loss'>" if plot else f"<p class='flag'>{escape(failure)}</p>"
    return [f"<h2>Training loss</h2><div class='grid'><div class='card' id='train-loss'>{body}</div></div>"]


# Cards are at least a figure wide (560 px + padding + border) and share the row's width; an image never
# grows past its drawn size nor overflows its card; text wraps inside cards.
STYLE = (
    "<style>body{font-family:sans-serif;max-width:1240px;margin:1.5em auto;padding:0 12px;color:#222;"
    "line-height:1.35}table{border-collapse:collapse;margin:.4em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
    "td.l,th.l{text-align:left}.flag{color:#b00}.note{color:#555}.noisy{background:#fff3cd}"
    ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,578px),1fr));gap:16px}"
    ".card{border:1px solid #ddd;padding:8px;min-width:0;overflow-wrap:anywhere}"
    ".card img{display:block;max-width:100%;height:auto}pre{white-space:pre-wrap;overflow-wrap:anywhere}"
    "table.config{table-layout:fixed;width:100%}table.config td{overflow-wrap:anywhere}"
    "td.v{white-space:nowrap}.b-better{color:#1a7f37;font-weight:bold}.a-better{color:#cf222e;font-weight:bold}"
    ".cannot-tell{color:#57606a}.swatch{display:inline-block;width:.9em;height:.9em;vertical-align:middle;"
    "margin:0 .3em 0 .8em;border-radius:2px}"
    "</style>"
)


def value_text(value: float, figure: str = "") -> str:
    """A figure for a table cell: a perplexity to 4 significant digits (1,869; 45.23), others to 3 decimals."""
    if not math.isfinite(value):
        return str(value)
    if figure == "ppl":
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return f"{value:.3f}"


def last(points: Series | None, figure: str = "") -> str:
    """The last value of a series, for a table cell; a dash when there is none."""
    return value_text(points[-1][1], figure) if points else "–"


def render_html(
    history: RunHistory,
    views: list[TaskView],
    domains: Mapping[str, Mapping[str, Series]],
    domain_plots: Mapping[str, str],
    window: int,
    min_change: float,
    domain_failures: Mapping[str, str] | None = None,
    loss: tuple[str, str] = ("", ""),
) -> str:
    """The page: a summary, the training loss, the tasks' table and cards, the perplexity domains' table
    and plots, the config.

    views: from `task_views`, with `plot` set to each PNG's file name ("" for none).
    domains: domain -> figure -> series (`RunHistory.domains`); domain_plots: domain -> PNG file name.
    window, min_change: the divergence flag's settings, stated on the page.
    domain_failures: domain -> why its plot was not drawn.
    loss: the training loss PNG's file name and why it was not drawn (`draw_loss`).
    """
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>in-loop evaluation report</title>",
        f"{STYLE}</head><body>",
        *summary_section(history, views, domains, window, min_change),
        *loss_section(loss),
    ]
    if views:
        parts += task_section(views)
    if domains:
        parts += perplexity_section(domains, domain_plots, domain_failures or {})
    if history.config:
        config = json.dumps(history.config, indent=2, sort_keys=True, default=str)
        parts.append(
            f"<h2>Config</h2><details><summary>as logged</summary><pre>{escape(config)}</pre></details>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


# What the shaded band around each task curve is, said once on each page that draws one.
BAND_LEGEND = (
    "The shaded band around a curve is ±1 standard error of that figure (its <code>_stderr</code>: the spread "
    "of the mean over the task's documents, how far the figure could move on other documents like them); a "
    "curve whose standard error was not logged has none."
)


def summary_section(
    history: RunHistory,
    views: list[TaskView],
    domains: Mapping[str, Mapping[str, Series]],
    window: int,
    min_change: float,
) -> list[str]:
    """The title, what was read (and skipped), the tasks flagged as diverging, the tasks and domains with
    figures that are not finite or cover a subset of their documents, the evaluation cost."""
    steps = sorted({s for points in history.series.values() for s, _ in points})
    evaluated = {s for v in views for points in v.curves.values() for s, _ in points}
    checked = min(window, len(evaluated)) if evaluated else window  # the flag's window, or all there are
    flagged = [v.label for v in views if any(f.startswith(DIVERGING) for f in v.flags)]
    unsound = [v.label for v in views if any(f.startswith((NONFINITE, SUBSET)) for f in v.flags)]
    unsound += [f"{domain} (perplexity)" for domain, figures in domains.items() if nonfinite_steps(figures)]
    return [
        "<h1>In-loop evaluation report</h1>",
        f"<p>Source: <code>{escape(history.source)}</code>. {len(steps)} logged steps"
        + (f", {steps[0]} to {steps[-1]}" if steps else "")
        + f". {len(views)} tasks, {len(domains)} perplexity domains.</p>",
        *(f"<p class='flag'>Reading: {escape(note)}</p>" for note in history.notes),
        f"<p>Divergence flag: over the last {checked} evaluation{'s' if checked != 1 else ''} the fitted trends "
        f"of acc and acc_norm have opposite signs and each moves by at least {min_change:g} and by at least its standard error. "
        f"{len(flagged)} task(s) flagged{': ' + escape(', '.join(flagged)) if flagged else ''}.</p>",
        *(
            [
                f"<p class='flag'>Figures that were not finite numbers (NaN, infinite) or cover only the documents "
                f"whose scores were finite: {escape(', '.join(unsound))}.</p>"
            ]
            if unsound
            else []
        ),
        cost_paragraph(history.series),
    ]


def task_section(views: list[TaskView]) -> list[str]:
    """A table of each task's last acc, acc_norm and acc_pmi with its flags, then one card per task (its
    plot, flags and notes: each note is shown there only)."""
    parts = [
        f"<h2>Tasks</h2><p>{BAND_LEGEND}</p><table><tr><th>task</th><th>acc</th><th>acc_norm</th><th>acc_pmi</th>"
        "<th class='l'>flags</th></tr>"
    ]
    for v in views:
        remarks = [f"<span class='flag'>{escape(f)}</span>" for f in v.flags]
        parts.append(
            f"<tr><td class='l'><a href='#task-{escape(v.label)}'>{escape(v.label)}</a></td>"
            + "".join(f"<td>{last(v.curves.get(m))}</td>" for m in CURVE_METRICS)
            + f"<td class='l'>{'<br>'.join(remarks)}</td></tr>"
        )
    parts.append("</table><div class='grid'>")
    for v in views:
        parts.append(f"<div class='card' id='task-{escape(v.label)}'><h3>{escape(v.label)}</h3>")
        if v.plot:
            parts.append(f"<img src='{escape(v.plot)}' alt='{escape(v.label)}: {escape(', '.join(v.curves))}'>")
        parts += [f"<p class='flag'>{escape(f)}</p>" for f in v.flags]
        parts += [f"<p class='note'>{escape(n)}</p>" for n in v.notes]
        parts.append("</div>")
    parts.append("</div>")
    return parts


def perplexity_section(
    domains: Mapping[str, Mapping[str, Series]],
    domain_plots: Mapping[str, str],
    domain_failures: Mapping[str, str],
) -> list[str]:
    """A table of each domain's last ppl, bpb and ce, then its plots (or why one was not drawn)."""
    parts = ["<h2>Perplexity</h2><table><tr><th>domain</th><th>ppl</th><th>bpb</th><th>ce</th></tr>"]
    for domain, figures in domains.items():
        parts.append(
            f"<tr><td class='l'>{escape(domain)}</td>"
            + "".join(f"<td>{last(figures.get(f), f)}</td>" for f in LM_FIGURES)
            + "</tr>"
        )
    parts.append("</table><div class='grid'>")
    for domain in domains:
        if domain in domain_plots:
            image = escape(domain_plots[domain])
            parts.append(
                f"<div class='card' id='lm-{escape(domain)}'><img src='{image}' alt='{escape(domain)} perplexity'></div>"
            )
        elif domain in domain_failures:
            parts.append(
                f"<div class='card' id='lm-{escape(domain)}'><p class='flag'>{escape(domain_failures[domain])}</p></div>"
            )
    parts.append("</div>")
    return parts


def cost_paragraph(series: Mapping[str, Series]) -> str:
    """Seconds and tokens forwarded per evaluation, averaged over the run; "" when not logged."""
    seconds = [v for _, v in series.get(SECONDS_KEY, [])]
    tokens = [v for _, v in series.get(TOKENS_KEY, [])]
    if not seconds:
        return ""
    text = f"Evaluation cost: {np.mean(seconds):.1f} s per evaluation (mean of {len(seconds)})"
    if tokens and all(math.isfinite(t) for t in tokens):
        text += f", {np.mean(tokens):,.0f} tokens forwarded per evaluation"
    return f"<p>{text}.</p>"
