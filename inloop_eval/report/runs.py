"""A run directory read back as a `RunHistory`: every logged key's values by trainer step, and the config.

RUN_DIR holds `metrics.jsonl` (+ `config.json`) as `JSONLLogger` writes them, or a W&B run (a directory
with a `run-*.wandb` file, e.g. `wandb/offline-run-...` or `wandb/run-...`), read offline. A run may still be
writing, or may have been killed: lines that cannot be read (cut off, not JSON objects, without a step) and a
corrupt `config.json` are skipped, and `RunHistory.notes` says which. A step logged more than once (a job
resumed from an earlier checkpoint) keeps its last value for each key. A figure that was not a finite number
is NaN in the series: `null` as `JSONLLogger` writes it, or bare `NaN` / `Infinity` in older files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inloop_eval.errors import InLoopEvalError
from inloop_eval.keys import DOWNSTREAM, PERPLEXITY, kind_prefix
from inloop_eval.loggers.jsonl import CONFIG_FILE, METRICS_FILE
from inloop_eval.loggers.wandb_file import find_run_files, read_config, read_history

STEP_KEYS: tuple[str, ...] = ("step", "trainer/step")
# The perplexity figures the report shows per domain, in its table's order.
LM_FIGURES: tuple[str, ...] = ("ppl", "bpb", "ce")

Series = list[tuple[int, float]]
# Line numbers (and steps) shown per reason a line was skipped; the rest are counted.
SHOWN_LINES = 10


class ReportError(InLoopEvalError):
    """A run directory the report cannot read, or a report it cannot write (bad window, no matplotlib)."""


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
    """name -> figure -> series for the keys `<prefix><name>/<figure>`, sorted by name."""
    out: dict[str, dict[str, Series]] = {}
    for key, points in series.items():
        if key.startswith(prefix):
            name, _, metric = key[len(prefix) :].rpartition("/")
            if name:
                out.setdefault(name, {})[metric] = points
    return dict(sorted(out.items()))


def row_step(row: Mapping[str, Any]) -> int | None:
    """The row's trainer step: the first of STEP_KEYS holding a finite number; None if none does."""
    step = next((row[k] for k in STEP_KEYS if isinstance(row.get(k), (int, float))), None)
    if step is None or isinstance(step, bool) or not math.isfinite(step):
        return None
    return int(step)


def collect_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Series], list[int]]:
    """Rows with a step (`step` or `trainer/step`) as sorted per-key series, and the steps at which a later row
    replaced a different value of some key (a resumed run logging a step again: the later value wins). Rows
    without a step, `_`-prefixed keys and non-numeric values are skipped; `null` (how `JSONLLogger` writes NaN
    and infinities) is read as NaN, as is the bare NaN of older files."""
    by_key: dict[str, dict[int, float]] = {}
    replaced: set[int] = set()
    for row in rows:
        step = row_step(row)
        if step is None:
            continue
        for key, value in row.items():
            if key in STEP_KEYS or key.startswith("_") or isinstance(value, bool):
                continue
            if value is None:
                value = math.nan
            if isinstance(value, (int, float)):
                points = by_key.setdefault(key, {})
                if step in points and not same_value(points[step], float(value)):
                    replaced.add(step)
                points[step] = float(value)
    return {k: sorted(v.items()) for k, v in sorted(by_key.items())}, sorted(replaced)


def same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def shown_numbers(numbers: list[int]) -> str:
    """`7, 9, 12`, or the first SHOWN_LINES and how many more."""
    shown = ", ".join(str(n) for n in numbers[:SHOWN_LINES])
    more = f" and {len(numbers) - SHOWN_LINES} more" if len(numbers) > SHOWN_LINES else ""
    return shown + more


def line_list(numbers: list[int]) -> str:
    """`line 7`, `lines 7, 9, 12`, or the first SHOWN_LINES and how many more."""
    return f"line{'s' if len(numbers) > 1 else ''} {shown_numbers(numbers)}"


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


def read_logged_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """`config.json` as a dict; {} when absent, and {} with a note when it is corrupt or not an object.

    Not `config_fields.read_config_file`: that one reads a user's YAML evaluator config, keeps only its
    `evaluation:` section and raises on a bad file; this is the whole logged record, shown as logged, and a
    bad one must not stop the report."""
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
        config, config_notes = read_logged_config(run_dir / CONFIG_FILE)
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
        notes = [
            *notes,
            f"{source}: {len(replaced)} step(s) logged more than once with different values "
            f"(steps {shown_numbers(replaced)}; a job resumed from an earlier checkpoint re-runs steps): the "
            "page shows the last value logged",
        ]
    return RunHistory(series, config, source, notes)
