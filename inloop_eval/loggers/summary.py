"""The table `evaluate` ends with: a row per task and figure (its value, standard error and documents),
then a row per perplexity domain and figure, per suite average, and any other key as it is."""

from __future__ import annotations

import math
from collections.abc import Mapping

from inloop_eval.keys import DOWNSTREAM, FAILED, PERPLEXITY, SUITE, TOKENS_KEY, split_key

# Figures shown in their own column of their task's rows, not as rows.
STDERR_SUFFIX = "_stderr"
DOCS = "n_docs"
HEADER = ("kind", "label", "figure", "value", "stderr", "docs")
# Figures that count something, shown whole like the `n_*` ones: the tokens forwarded (`run_and_log`'s key).
COUNTS = (TOKENS_KEY.rpartition("/")[2],)


def number(value: float | None, figure: str = "") -> str:
    """A figure as the table shows it: perplexities to 4 significant digits (1,869; 12.35), counts (`n_*`,
    tokens forwarded) whole, others to 4 decimals; `nan`/`inf` as they are, a dash for none."""
    if value is None:
        return "–"
    if not math.isfinite(value):
        return str(value)
    if figure.startswith("n_") or figure in COUNTS:
        return f"{value:,.0f}"
    if figure in ("ppl", "PPL"):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return f"{value:.4f}"


def table_rows(metrics: Mapping[str, float]) -> list[tuple[str, ...]]:
    """(kind, label, figure, value, stderr, docs) per figure of each task, domain and suite, in key order;
    a failed label's row says FAILED; keys of no kind are listed last, kind and label blank."""
    rows: list[tuple[str, ...]] = []
    others: list[tuple[str, ...]] = []
    for key, value in metrics.items():
        for kind in (DOWNSTREAM, PERPLEXITY, SUITE):
            parts = split_key(key, kind)
            if parts is not None:
                break
        if parts is None:
            others.append(("", "", key, number(value, key.rpartition("/")[2]), "", ""))
            continue
        label, figure = parts
        if figure.endswith(STDERR_SUFFIX) or figure == DOCS:
            continue
        if figure == FAILED:
            if value:
                rows.append((kind, label, FAILED, "FAILED", "", ""))
            continue
        stderr = metrics.get(key + STDERR_SUFFIX)
        docs = metrics.get(key.rpartition("/")[0] + "/" + DOCS) if kind == DOWNSTREAM else None
        rows.append(
            (
                kind,
                label,
                figure,
                number(value, figure),
                number(stderr) if stderr is not None else "",
                number(docs, DOCS) if docs is not None else "",
            )
        )
    return rows + others


def summary_table(metrics: Mapping[str, float]) -> str:
    """The aligned table of `table_rows`, a label shown on its first row only."""
    rows = table_rows(metrics)
    if not rows:
        return "no figures"
    shown = []
    previous = ("", "")
    for row in rows:
        same = row[:2] == previous and row[1]
        shown.append(("", "", *row[2:]) if same else row)
        previous = row[:2]
    widths = [max(len(r[i]) for r in [HEADER, *shown]) for i in range(len(HEADER))]
    numeric = {3, 4, 5}

    def line(row: tuple[str, ...]) -> str:
        cells = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return "\n".join([line(HEADER), "  ".join("-" * w for w in widths), *(line(r) for r in shown)])
