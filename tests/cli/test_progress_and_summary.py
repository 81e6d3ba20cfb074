"""What `evaluate` shows while it runs (a bar per task with its total on a terminal, one line per task in a
log, nothing off rank 0) and the table it ends with."""

from __future__ import annotations

import io
import logging

from inloop_eval.cli.progress import EvaluationProgress
from inloop_eval.cli.summary import summary_table, table_rows


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_two_tasks(progress: EvaluationProgress) -> None:
    progress.start("task 'piqa'", 10)
    for n in (4, 6):
        progress(n)
    progress.start("lm coqa", 3)
    progress(3)
    progress.close()


def test_a_terminal_gets_a_bar_with_the_total_and_a_line_per_task():
    stream = Terminal()
    run_two_tasks(EvaluationProgress(2, stream=stream))
    text = stream.getvalue()
    assert "[1/2] task 'piqa':   0%" in text and "0/10" in text  # the bar: its total and percentage
    assert "[1/2] task 'piqa': 10 requests in" in text and "[2/2] lm coqa: 3 requests in" in text


def test_a_log_gets_one_plain_line_per_task_and_no_bar(caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="inloop_eval"):
        run_two_tasks(EvaluationProgress(2, stream=stream))
    assert stream.getvalue() == ""
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("[1/2] task 'piqa': 10 requests in")


def test_ranks_other_than_zero_show_nothing(caplog):
    stream = Terminal()
    with caplog.at_level(logging.INFO, logger="inloop_eval"):
        run_two_tasks(EvaluationProgress(2, enabled=False, stream=stream))
    assert stream.getvalue() == "" and caplog.records == []


def test_the_demo_gets_bars_without_lines():
    stream = Terminal()
    run_two_tasks(EvaluationProgress(2, lines=False, stream=stream))
    assert "/10" in stream.getvalue() and "requests in" not in stream.getvalue()


METRICS = {
    "eval/downstream/piqa/acc": 0.5,
    "eval/downstream/piqa/acc_stderr": 0.05,
    "eval/downstream/piqa/acc_norm": 0.625,
    "eval/downstream/piqa/n_docs": 80.0,
    "eval/downstream/copa/failed": 1.0,
    "eval/lm/coqa/ppl": 1868.637,
    "eval/lm/coqa/bpb": 2.71828,
    "eval/suite/core/centered_acc": 0.1,
    "eval/seconds": 3.0,
}


def test_the_table_has_a_row_per_task_and_figure_with_stderr_and_documents():
    rows = table_rows(METRICS)
    assert rows[0] == ("downstream", "piqa", "acc", "0.5000", "0.0500", "80")
    assert rows[1] == ("downstream", "piqa", "acc_norm", "0.6250", "", "80")
    assert rows[2] == ("downstream", "copa", "failed", "FAILED", "", "")
    assert rows[3] == ("lm", "coqa", "ppl", "1,869", "", "")
    assert rows[4][2:4] == ("bpb", "2.7183")
    assert rows[5][:3] == ("suite", "core", "centered_acc")
    assert rows[-1][2:4] == ("eval/seconds", "3.0000")


def test_the_table_names_a_label_once_and_aligns_its_columns():
    lines = summary_table(METRICS).splitlines()
    assert lines[0].split() == ["kind", "label", "figure", "value", "stderr", "docs"]
    assert lines[2].split() == ["downstream", "piqa", "acc", "0.5000", "0.0500", "80"]
    assert lines[3].split() == ["acc_norm", "0.6250", "80"]
    assert len({line.index("figure") for line in lines[:1]} | {lines[2].index("acc")}) == 1
