"""The report's flags on constructed histories, and the page it writes from a run directory."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inloop_eval.report import ReportError, RunHistory, divergence, load_run, task_views, write_report

STEPS = [0, 100, 200, 300, 400, 500]


def series(values):
    return list(zip(STEPS[-len(values) :], values, strict=True))


def history(**tasks):
    """`task=(acc values, acc_norm values or None)` -> a RunHistory."""
    out = {}
    for label, (acc, acc_norm) in tasks.items():
        out[f"eval/downstream/{label}/acc"] = series(acc)
        if acc_norm is not None:
            out[f"eval/downstream/{label}/acc_norm"] = series(acc_norm)
    return RunHistory(out)


def flags(view_list, label):
    return next(v for v in view_list if v.label == label).flags


def test_divergence_fires_when_acc_and_acc_norm_part_ways():
    acc = series([0.25, 0.27, 0.30, 0.33, 0.36, 0.40])
    acc_norm = series([0.25, 0.28, 0.31, 0.30, 0.27, 0.24])  # rises, then falls over the last 4
    sentence = divergence(acc, acc_norm, window=4, min_change=0.02)
    assert sentence and "opposite directions" in sentence and "steps 200-500" in sentence
    views = task_views(history(hellaswag=([v for _, v in acc], [v for _, v in acc_norm])), 4, 0.02)
    assert any(f.startswith("diverging") for f in flags(views, "hellaswag"))


@pytest.mark.parametrize(
    "acc_norm",
    [
        [0.26, 0.28, 0.30, 0.33, 0.35, 0.38],  # both rise
        [0.25, 0.28, 0.31, 0.31, 0.31, 0.30],  # acc_norm flat within noise: below min_change
    ],
)
def test_divergence_is_quiet_on_consistent_curves(acc_norm):
    acc = [0.25, 0.27, 0.30, 0.33, 0.36, 0.40]
    assert divergence(series(acc), series(acc_norm), window=4, min_change=0.02) is None
    assert not any(
        f.startswith("diverging") for f in flags(task_views(history(piqa=(acc, acc_norm))), "piqa")
    )


def test_divergence_needs_two_evaluations():
    assert divergence(series([0.3]), series([0.2])) is None


def test_letter_key_tasks_are_explained_and_identical_curves_flagged():
    views = task_views(
        history(
            mmlu_mc=([0.25, 0.26], None),  # letter keys: no acc_norm by design
            arc_easy=([0.3, 0.32], [0.3, 0.32]),  # reports acc_norm equal to acc throughout
        )
    )
    assert any("not reported" in n for n in next(v for v in views if v.label == "mmlu_mc").notes)
    assert any(f.startswith("identical") for f in flags(views, "arc_easy"))


def test_report_from_a_jsonl_run_references_every_plot(tmp_path):
    importlib.import_module("matplotlib")
    rows = []
    for i, step in enumerate(STEPS):
        row = {"step": step, "eval/seconds": 2.0, "eval/tokens_forwarded": 1000.0}
        row["eval/downstream/piqa/acc"] = 0.5 + i / 100
        row["eval/downstream/piqa/acc_norm"] = 0.5 - i / 100
        row["eval/downstream/piqa/acc_pmi"] = 0.5
        row["eval/downstream/winogrande/acc"] = 0.5
        row["eval/lm/books/ppl"] = 100.0 - i
        row["eval/lm/books/bpb"] = 2.0 - i / 100
        rows.append(row)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.json").write_text(json.dumps({"evaluators": [{"task": "piqa"}, {"task": "winogrande"}]}))
    page = write_report(run).read_text()
    images = re.findall(r"<img src='([^']+)'", page)
    assert images == ["task_piqa.png", "task_winogrande.png", "lm_books.png"]
    assert all((run / "report" / name).stat().st_size > 1000 for name in images)
    assert "diverging" in page and "not reported" in page  # piqa flagged; winogrande's note
    assert load_run(run).tasks()["piqa"]["acc"][-1] == (500, pytest.approx(0.55))


def test_report_of_a_directory_without_a_run(tmp_path):
    with pytest.raises(ReportError, match="neither metrics.jsonl"):
        load_run(tmp_path)


def test_divergence_within_the_standard_error_is_not_flagged():
    acc = series([0.25, 0.27, 0.30, 0.33, 0.36, 0.40])
    acc_norm = series([0.25, 0.28, 0.31, 0.30, 0.27, 0.24])
    wide = series([0.08] * 6)  # about 40 documents: acc_norm's fall of 0.07 is within the noise
    assert divergence(acc, acc_norm, 4, 0.02, acc_stderr=wide, acc_norm_stderr=wide) is None
    narrow = series([0.005] * 6)  # 10,000 documents
    assert divergence(acc, acc_norm, 4, 0.02, acc_stderr=narrow, acc_norm_stderr=narrow)


def write_run_in_progress(run: Path, config_text: str) -> None:
    """Five good evaluations of piqa, then what a killed or still-writing run and a bad hand edit leave:
    a line that is a list (line 3), one without a step (line 5) and a cut-off last line (line 8)."""
    good = [
        json.dumps({"step": step, "eval/downstream/piqa/acc": 0.5 + step / 1000, "eval/lm/books/ppl": 90.0})
        for step in STEPS[:5]
    ]
    lines = [
        *good[:2],
        "[1, 2]",
        good[2],
        '{"eval/downstream/piqa/acc": 0.9}',
        *good[3:],
        '{"step": 500, "eval/do',
    ]
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join(lines))
    (run / "config.json").write_text(config_text)


@pytest.mark.parametrize(
    ("config_text", "config_note"),
    [
        ('{"evaluators": [{"task": "piqa"', "config.json: skipped, not readable as JSON"),
        ('["piqa"]', "config.json: skipped, expected a JSON object, found list"),
    ],
)
def test_report_of_a_run_in_progress_skips_what_it_cannot_read(tmp_path, config_text, config_note):
    """Every readable line is rendered; the page and stderr name each skipped line and the config."""
    importlib.import_module("matplotlib")
    run = tmp_path / "run"
    write_run_in_progress(run, config_text)
    history = load_run(run)
    assert [s for s, _ in history.tasks()["piqa"]["acc"]] == STEPS[:5]
    assert history.config == {}
    lines_note = (
        "skipped 3 of 8 lines: line 3 not a JSON object; line 5 without a step (step or trainer/step, a finite number); "
        "line 8 cut off (still being written, or the run was killed)"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "inloop_eval.cli", "report", str(run)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],  # `-m` imports this checkout's package
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (run / "report" / "index.html").read_text()
    for note in (lines_note, config_note):
        assert note in proc.stderr
        assert note in page
    assert re.findall(r"<img src='([^']+)'", page) == ["task_piqa.png", "lm_books.png"]
    assert "5 logged steps, 0 to 400" in page


def test_a_corrupt_line_in_the_middle_is_skipped_and_counted(tmp_path):
    """NUL bytes where a crash left a hole in the file, more lines than are listed one by one, and a step
    that is not a finite number."""
    run = tmp_path / "run"
    run.mkdir()
    bad = ["\x00" * 12] * 12
    good = [json.dumps({"step": s, "eval/downstream/piqa/acc": 0.5}) for s in (0, 100)]
    no_step = json.dumps({"step": float("nan"), "eval/downstream/piqa/acc": 0.1})
    (run / "metrics.jsonl").write_text("\n".join([good[0], *bad, no_step, good[1]]) + "\n")
    history = load_run(run)
    assert history.tasks()["piqa"]["acc"] == [(0, 0.5), (100, 0.5)]
    (note,) = history.notes
    assert "skipped 13 of 15 lines: lines 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 2 more not valid JSON; " in note
    assert "line 14 without a step" in note
