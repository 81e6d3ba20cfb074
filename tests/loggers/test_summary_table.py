"""The table `evaluate` ends with: a row per task and figure with its standard error and documents."""

from __future__ import annotations

from inloop_eval.loggers.summary import summary_table, table_rows

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


def test_the_tokens_forwarded_are_a_whole_count():
    rows = table_rows({"eval/tokens_forwarded": 31177.0, "eval/seconds": 2.5})
    assert rows == [("", "", "eval/tokens_forwarded", "31,177", "", ""), ("", "", "eval/seconds", "2.5000", "", "")]
