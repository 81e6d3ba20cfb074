"""The report's flags on constructed histories, and the page it writes from a run directory."""

from __future__ import annotations

import html
import importlib
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

import inloop_eval.report.page as page_module
from inloop_eval.report import ReportError, RunHistory, divergence, load_run, task_views, write_report
from inloop_eval.report.page import plot_file

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
    """Every readable line is rendered; the page and stderr name each skipped line and the
    config."""
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


def write_run(run: Path, curves: dict[str, list[float]], **extra: list[float | None]) -> None:
    """A run directory logging `eval/downstream/<label>/acc` for each label of `curves` and each further
    key of `extra` (`name=values`, `__` for `/`) at the last len(values) of STEPS."""
    run.mkdir()
    rows = {step: {"step": step} for step in STEPS}
    for label, values in curves.items():
        for step, value in series(values):
            rows[step][f"eval/downstream/{label}/acc"] = value
    for name, values in extra.items():
        for step, value in series(values):
            rows[step][name.replace("__", "/")] = value
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows.values()))


def cards(page: str) -> dict[str, str]:
    """label -> the HTML of its card on the page."""
    found = re.findall(r"<div class='card' id='task-([^']*)'>(.*?)</div>", page, re.S)
    return {html.unescape(label): body for label, body in found}


def test_labels_that_sanitise_alike_each_get_their_own_plot(tmp_path):
    """`olmo:piqa` and `olmo_piqa` (and `PIQA` beside `piqa`, one file on a file system that ignores case)
    each show their own curve."""
    importlib.import_module("matplotlib")
    labels = ["olmo:piqa", "olmo_piqa", "PIQA", "piqa"]
    write_run(tmp_path / "run", {label: [0.1 * (i + 1), 0.1 * (i + 2)] for i, label in enumerate(labels)})
    page = write_report(tmp_path / "run").read_text()
    images = {label: re.search(r"<img src='([^']+)'", card).group(1) for label, card in cards(page).items()}
    assert images["olmo_piqa"] == "task_olmo_piqa.png" and images["piqa"] == "task_piqa.png"
    assert len({name.lower() for name in images.values()}) == len(labels)
    pngs = {(tmp_path / "run" / "report" / name).read_bytes() for name in images.values()}
    assert len(pngs) == len(labels)  # four different curves drawn


def test_plot_file_names_are_distinct_and_short():
    labels = [
        "olmo:piqa",
        "olmo_piqa",
        "olmo piqa",
        "a/b",
        "a_b",
        "A_B",
        "$x$",
        "_x_",
        "..",
        "é",
        "e",
        "x" * 100,
    ]
    labels += ["x" * 101, "x" * 1000, "x" * 1001]
    names = [plot_file("task", label) for label in labels]
    assert len({name.lower() for name in names}) == len(labels)
    assert all(len(name.encode()) < 255 and "/" not in name and name.endswith(".png") for name in names)


MATH_LABELS = ["$\\nocommand$", "$x$", "a_b^c\\d", "cost $5 and $6", "50% {#&}"]


def test_labels_matplotlib_would_parse_are_drawn_verbatim(tmp_path, monkeypatch):
    """Titles and legends are never math text or LaTeX: a label with `$` no longer fails the report, and
    `$x$` shows as typed."""
    figure = importlib.import_module("matplotlib.figure")
    drawn = []
    savefig = figure.Figure.savefig

    def recording_savefig(fig, *args, **kwargs):
        drawn.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(figure.Figure, "savefig", recording_savefig)
    run = tmp_path / "run"
    write_run(run, {label: [0.3, 0.4] for label in MATH_LABELS}, **{"eval__lm__$\\bad$__ppl": [9.0, 8.0]})
    page = write_report(run).read_text()
    assert len(re.findall(r"<img src='([^']+)'", page)) == len(MATH_LABELS) + 1
    assert "not drawn" not in page
    texts = [ax.title for fig in drawn for ax in fig.axes]
    texts += [
        text for fig in drawn for ax in fig.axes if ax.get_legend() for text in ax.get_legend().get_texts()
    ]
    assert {t.get_text() for t in texts} >= {*MATH_LABELS, "$\\bad$: ppl", "acc"}
    assert not any(t.get_parse_math() or t.get_usetex() for t in texts)


def test_a_plot_that_cannot_be_drawn_costs_only_that_plot(tmp_path, monkeypatch, caplog):
    """One task's and one domain's plot raise (after writing part of their PNG): the page is written with
    every other plot and says which plot is missing and why."""
    importlib.import_module("matplotlib")
    real_task, real_domain = page_module.plot_task, page_module.plot_domain

    def plot_task(view, path, chance=None):
        if view.label != "broken":
            return real_task(view, path, chance)
        path.write_bytes(b"\x89PNG half")
        raise RuntimeError("renderer\nfailed")

    def plot_domain(domain, figures, path):
        if domain != "books":
            return real_domain(domain, figures, path)
        raise MemoryError("out of memory")

    monkeypatch.setattr(page_module, "plot_task", plot_task)
    monkeypatch.setattr(page_module, "plot_domain", plot_domain)
    run = tmp_path / "run"
    write_run(
        run, {"piqa": [0.3, 0.4], "broken": [0.5, 0.6]}, eval__lm__books__ppl=[9.0], eval__lm__c4__ppl=[7.0]
    )
    page = write_report(run).read_text()
    assert re.findall(r"<img src='([^']+)'", page) == ["task_piqa.png", "lm_c4.png"]
    assert not (run / "report" / "task_broken.png").exists()
    assert (
        "plot of task &#x27;broken&#x27; not drawn (RuntimeError: renderer failed)" in cards(page)["broken"]
    )
    assert "plot of perplexity domain &#x27;books&#x27; not drawn (MemoryError: out of memory)" in page
    assert len(warnings_of(caplog, "not drawn")) == 2


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


@pytest.mark.parametrize("nan", ["null", "NaN"])  # as JSONLLogger writes it now, and as older files hold it
def test_figures_that_are_not_finite_and_tasks_over_a_subset_are_flagged(tmp_path, nan):
    importlib.import_module("matplotlib")
    run = tmp_path / "run"
    write_run(
        run,
        {"piqa": [0.5, 0.6, 0.7], "hellaswag": [0.3, 0.3, 0.4]},
        eval__downstream__piqa__n_nonfinite_docs=[0.0, 3.0, 0.0],
        eval__downstream__piqa__n_docs=[40.0, 37.0, 40.0],
        eval__downstream__hellaswag__n_nonfinite_docs=[0.0, 0.0, 0.0],
        eval__lm__c4__ppl=[12.0, 11.0],
    )
    text = (run / "metrics.jsonl").read_text()
    text = text.replace('"eval/downstream/piqa/acc": 0.6', f'"eval/downstream/piqa/acc": {nan}')
    text = text.replace('"eval/lm/c4/ppl": 11.0', f'"eval/lm/c4/ppl": {nan}')
    (run / "metrics.jsonl").write_text(text)
    history = load_run(run)
    assert history.notes == []
    views = task_views(history)
    assert flags(views, "hellaswag") == []
    nonfinite, subset = flags(views, "piqa")
    assert nonfinite == "not a finite number (NaN or infinite, logged as null): acc at step 400"
    assert subset == (
        "subset: at step 400 3 document(s) whose scores were not finite (NaN logits) were left out, and the "
        "figures are over the other 37 only"
    )
    page = write_report(run).read_text()
    assert html.escape(nonfinite) in cards(page)["piqa"] and html.escape(subset) in cards(page)["piqa"]
    assert "cover only the documents whose scores were finite: piqa, c4 (perplexity)." in page
    assert re.findall(r"<img src='([^']+)'", page) == ["task_hellaswag.png", "task_piqa.png", "lm_c4.png"]


def test_the_page_draws_the_training_loss_and_shows_each_note_once(tmp_path):
    run = tmp_path / "run"
    write_run(run, {"piqa": [0.3, 0.35, 0.31, 0.36]}, train__loss=[4.0, 3.5, 3.2, 3.0], eval__lm__c4__ppl=[1868.637])
    page = write_report(run).read_text()
    assert re.findall(r"<img src='([^']+)'", page)[0] == "train_loss.png"
    assert (run / "report" / "train_loss.png").stat().st_size > 1000
    assert page.count("noise: sd of the last 4 evaluations") == 1
    assert "<td>1,869</td>" in page  # a perplexity to 4 significant digits, not 1868.637


def test_the_perplexity_axes_are_labelled_with_plain_numbers(tmp_path, monkeypatch):
    figure = importlib.import_module("matplotlib.figure")
    drawn = []
    savefig = figure.Figure.savefig
    monkeypatch.setattr(figure.Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), savefig(fig, *a, **k)))
    run = tmp_path / "run"
    write_run(run, {}, eval__lm__c4__ppl=[1900.0, 1868.637, 1850.0], eval__lm__c4__bpb=[1.2, 1.1, 1.05])
    write_report(run)
    axes = drawn[0].axes
    assert [ax.get_ylabel() for ax in axes] == ["perplexity", "bits per byte"]
    labels = [t.get_text() for t in axes[0].get_yticklabels() if t.get_text()]
    assert labels and all(re.fullmatch(r"\d+(\.\d)?", text) for text in labels), labels


@pytest.mark.parametrize("step", [2**64 + 5, 2**70, -(2**63) - 1], ids=["past-uint64", "2^70", "below-int64"])
def test_a_step_past_int64_is_plotted_with_its_band(tmp_path, step, caplog):
    """A step that no 64-bit integer holds (a logger's bad step) still draws every curve and band."""
    importlib.import_module("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": s, "eval/downstream/piqa/acc": 0.5 + i / 100, "eval/downstream/piqa/acc_stderr": 0.01}
        | {"eval/lm/books/ppl": 100.0 - i, "train/loss": 3.0 - i / 10}
        for i, s in enumerate([10, 20, step])
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report(run).read_text()
    assert re.findall(r"<img src='([^']+)'", page) == ["train_loss.png", "task_piqa.png", "lm_books.png"]
    assert "not drawn" not in page and not warnings_of(caplog, "not drawn")


def test_the_page_explains_its_bands_ticks_the_evaluated_steps_and_counts_the_evaluations_it_has(
    tmp_path, monkeypatch
):
    """A run with three evaluations (steps 9, 21 and 50) and stderr logged: the page says what the shaded band
    is, the divergence flag's sentence says 3 evaluations (its window is 4), and each chart's step labels
    are the evaluated steps, not round numbers between them."""
    figure = importlib.import_module("matplotlib.figure")
    drawn = []
    savefig = figure.Figure.savefig
    monkeypatch.setattr(figure.Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), savefig(fig, *a, **k)))
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": step, "eval/downstream/piqa/acc": 0.5 + i / 50, "eval/downstream/piqa/acc_stderr": 0.03}
        | {"eval/downstream/piqa/acc_norm": 0.5 - i / 50, "eval/lm/books/ppl": 100.0 - i}
        for i, step in enumerate([9, 21, 50])
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = " ".join(write_report(run).read_text().split())
    assert "The shaded band around a curve is ±1 standard error of that figure" in html.unescape(page)
    assert "over the last 3 evaluations the fitted trends" in page and "last 4" not in page
    assert len(drawn) == 2  # piqa's chart and books' chart
    for fig in drawn:
        fig.canvas.draw()
        for ax in fig.axes:
            assert [t.get_text() for t in ax.get_xticklabels()] == ["9", "21", "50"], ax.get_title()


def test_a_long_run_ticks_every_kth_evaluated_step():
    from inloop_eval.report.plots import MAX_STEP_TICKS, step_ticks

    steps = list(range(0, 5001, 50))  # 101 evaluations
    ticks = step_ticks(steps)
    assert len(ticks) <= MAX_STEP_TICKS and ticks[0] == 0 and set(ticks) <= set(steps)
    assert step_ticks([30, 10, 20, 10]) == [10, 20, 30]
