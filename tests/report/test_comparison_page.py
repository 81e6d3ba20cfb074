"""`inloop-eval report RUN_A RUN_B`: the page comparing runs: curves of both, paired verdicts per step,
signal-to-noise; one run keeps its own page."""

from __future__ import annotations

import html
import importlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from inloop_eval.compare.pairing import compare_steps
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, read_step, step_path, write_step
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.report.command import main
from inloop_eval.report.comparison import write_comparison

STEPS = [100, 200, 300, 400, 500, 600]


def write_run(run: Path, level: float, seed: int, outcome_steps: list[int]) -> None:
    """A run logging piqa's acc (with stderr) at STEPS and per-document outcomes at `outcome_steps`."""
    rng = np.random.default_rng(seed)
    run.mkdir()
    rows = []
    for i, step in enumerate(STEPS):
        row = {"step": step, "eval/downstream/piqa/acc": level + i / 100 + (-1) ** i * 0.002}
        row["eval/downstream/piqa/acc_stderr"] = 0.015
        row["eval/downstream/hellaswag/acc"] = 0.3 + (-1) ** i * 0.02
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step in outcome_steps:
        task = DocumentOutcomes(
            doc_id=np.arange(400, dtype=np.int64),
            n_choices=np.full(400, 2, dtype=np.int64),
            values={"acc": (rng.random(400) < level).astype(np.float64)},
            binary=frozenset({"acc"}),
        )
        write_step(run / OUTCOMES_DIR, {"piqa": task}, step)


@pytest.fixture
def runs(tmp_path) -> tuple[Path, Path]:
    write_run(tmp_path / "seed0", 0.5, 0, [100, 200, 600])
    write_run(tmp_path / "seed1", 0.65, 1, [200, 600])
    return tmp_path / "seed0", tmp_path / "seed1"


def test_the_page_shows_both_runs_and_the_verdicts_of_the_steps_both_evaluated(runs, tmp_path):
    importlib.import_module("matplotlib")
    a, b = runs
    page = write_comparison([a, b], tmp_path / "out").read_text()
    images = re.findall(r"<img src='([^']+)'", page)
    assert images == ["runs_hellaswag.png", "runs_piqa.png"]
    assert all((tmp_path / "out" / name).stat().st_size > 1000 for name in images)
    card = re.search(r"id='task-piqa'>(.*?)</div>", page, re.S).group(1)
    header = re.findall(r"<th class='l'>(\d+)</th>", card)
    assert header == ["200", "600"]  # step 100 has outcomes in A only
    for step in (200, 600):
        expected = (
            compare_steps(
                read_step(step_path(a / OUTCOMES_DIR, step)), read_step(step_path(b / OUTCOMES_DIR, step))
            )
            .tasks["piqa"]
            .figures["acc"]
        )
        mark = {"B better": "B", "A better": "A"}.get(expected.verdict, "·")
        assert f"{expected.diff:+.3f} {mark}</td>" in card
        assert html.escape(f"{expected.verdict}: p {expected.p_value:.3g}, n 400") in card
    assert "B better" in card
    hellaswag = re.search(r"id='task-hellaswag'>(.*?)</div>", page, re.S).group(1)
    assert "no paired verdicts" in hellaswag


def test_signal_and_noise_flags_the_task_within_its_noise(runs, tmp_path):
    page = write_comparison(list(runs), tmp_path / "out").read_text()
    assert "<h2>Signal and noise</h2>" in page
    assert re.search(r"<tr class='noisy'><td class='l'>hellaswag</td><td class='l'>acc</td>", page)
    assert not re.search(r"<tr class='noisy'><td class='l'>piqa</td>", page)
    assert "noise exceeds signal on acc; log its bits-per-byte twin" in page


def test_runs_without_outcomes_have_curves_and_say_why_there_are_no_verdicts(tmp_path):
    write_run(tmp_path / "a", 0.5, 0, [])
    write_run(tmp_path / "b", 0.6, 1, [])
    page = write_comparison([tmp_path / "a", tmp_path / "b"], tmp_path / "out").read_text()
    assert "no paired verdicts" in page and "no per-document outcomes" in page


def test_the_command_writes_one_page_per_run_or_one_comparing_them(runs, capsys):
    a, b = runs
    assert main([str(a)]) == 0
    assert (a / "report" / "index.html").is_file()
    assert main([str(a), str(b)]) == 0
    assert (a / "comparison" / "index.html").is_file()
    assert "comparison/index.html" in capsys.readouterr().out


def test_the_page_lists_how_the_configs_differ_and_how_to_read_snr_beside_the_verdicts(runs, tmp_path):
    a, b = runs
    (a / "config.json").write_text(json.dumps({"train": {"seed": 0, "steps": 10}, "evaluators": [{"limit": 5}]}))
    (b / "config.json").write_text(json.dumps({"train": {"seed": 1, "steps": 10}, "evaluators": [{"limit": 6}]}))
    page = write_comparison([a, b], tmp_path / "out").read_text()
    section = page[page.index("<h2>Config differences</h2>") : page.index("<h2>Signal and noise</h2>")]
    assert re.findall(r"<tr><td class='l'>([^<]+)</td>", section) == ["evaluators[0].limit", "train.seed"]
    assert "SNR and the paired verdicts answer different questions" in page


def test_the_page_draws_the_loss_and_every_perplexity_domain_of_the_runs(runs, tmp_path):
    importlib.import_module("matplotlib")
    for i, run in enumerate(runs):
        rows = [{"step": s, "train/loss": 4.0 - s / 1000 - i / 10, "eval/lm/c4/ppl": 90.0 - s / 100} for s in STEPS]
        with (run / "metrics.jsonl").open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    page = write_comparison(list(runs), tmp_path / "out").read_text()
    images = re.findall(r"<img src='([^']+)'", page)
    assert images[0] == "train_loss.png" and images[-1] == "lm_runs_c4.png"
    assert "id='lm-c4'" in page


def test_config_paths_are_shown_relative_to_their_common_folder(runs, tmp_path):
    a, b = runs
    root = tmp_path / "data"
    (a / "config.json").write_text(json.dumps({"data": {"path": str(root / "seed0" / "c4.bin")}, "seed": 0}))
    (b / "config.json").write_text(json.dumps({"data": {"path": str(root / "seed1" / "c4.bin")}, "seed": 1}))
    page = write_comparison([a, b], tmp_path / "out").read_text()
    section = page[page.index("<h2>Config differences</h2>") : page.index("<h2>Signal and noise</h2>")]
    assert str(tmp_path) not in html.unescape(section.split("</p>", 1)[1])
    assert f"relative to <code>{html.escape(str(root))}</code>" in section
    cells = [html.unescape(c) for c in re.findall(r"<td class='l'>([^<]+)</td>", section)]
    assert cells[:3] == ["data.path", '"seed0/c4.bin"', '"seed1/c4.bin"']


def test_the_verdict_legend_says_what_each_mark_means(runs, tmp_path):
    page = html.unescape(re.sub(r"<[^>]+>", "", write_comparison(list(runs), tmp_path / "out").read_text()))
    assert "B B better" not in page and "A A better" not in page
    assert "a cell marked B means run B is better" in page
    assert "a cell marked A means run A is better" in page


def test_the_signal_table_names_each_run_s_step_when_the_runs_share_none(tmp_path):
    for name, steps, level in (("long", (100, 150), 0.6), ("short", (10, 50), 0.4)):
        rows = [{"step": s, "eval/downstream/piqa/acc": level + s / 1000} for s in steps]
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_comparison([tmp_path / "long", tmp_path / "short"], tmp_path / "out").read_text()
    table = page[page.index("<h2>Signal and noise</h2>") :]
    assert "different steps: long at 150, short at 50" in table


def test_the_signal_table_names_the_common_step_it_reads(runs, tmp_path):
    page = write_comparison(list(runs), tmp_path / "out").read_text()
    table = page[page.index("<h2>Signal and noise</h2>") :]
    assert "<th>step</th>" in table and "<td class='l'>acc</td><td>600</td>" in table
