"""The comparison page's signal-to-noise table says what `inloop-eval plan` keeps at the runs' own cost: per
task figure kept (its documents), kept on another figure, or dropped (why), and the plan in words; the same
plan `inloop-eval plan RUN_A RUN_B --eval-fraction 1` writes. Runs it cannot plan from say why."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from plan_outcomes import Truth, run_values, write_run

from inloop_eval.cli.main import main
from inloop_eval.data.root import neox_tokenizer_path
from inloop_eval.report.comparison import write_comparison

STEPS = (0, 10, 20, 30, 40, 50)
SECONDS = 2.0


def evaluation(data_root: Path) -> dict:
    return {
        "tokenizer": str(neox_tokenizer_path(data_root)),
        "data_root": str(data_root),
        "max_length": 512,
        "evaluators": [{"task": "piqa", "limit": 40}, {"task": "arc_easy", "limit": 40}],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_root) -> tuple[Path, Path]:
    """Two runs 0.3 apart on piqa's bpb_gold (its acc noise alike in both); arc_easy's outcomes constant."""
    folder = tmp_path_factory.mktemp("runs")
    out = []
    for i, offset in enumerate((0.0, 0.3)):
        bpb = run_values(Truth(slope=-0.002, doc_sd=0.2, level=1.5, offset=offset), i, n_docs=40, steps=STEPS)
        acc = run_values(Truth(doc_sd=1.0), 10 + i, n_docs=40, steps=STEPS, binary=True)
        constant = run_values(
            Truth(doc_sd=0.0, spread=0.0, level=1.0), 20 + i, n_docs=40, steps=STEPS, binary=True
        )
        tasks = {"piqa": {"bpb_gold": bpb, "acc": acc}, "arc_easy": {"acc": constant}}
        out.append(write_run(folder / f"lr{i}", tasks, evaluation(data_root), seconds=SECONDS, tokens=8000))
    return out[0], out[1]


def row(page: str, label: str, figure: str) -> str:
    """The signal-to-noise table's row of one task figure."""
    return re.search(
        rf"<tr[^>]*><td class='l'>{label}</td><td class='l'>{figure}</td>(.*?)</tr>", page
    ).group(1)


def test_each_task_figure_says_what_the_plan_at_the_runs_cost_keeps_as_the_plan_command_does(runs, tmp_path):
    a, b = runs
    page = write_comparison([a, b], tmp_path / "page").read_text()
    assert main(["plan", str(a), str(b), "--eval-fraction", "1", "--out", str(tmp_path / "plan")]) == 0
    plan = {t["label"]: t for t in json.loads((tmp_path / "plan" / "plan.json").read_text())["tasks"]}
    assert plan["piqa"]["kept"] and plan["piqa"]["figure"] == "bpb_gold" and not plan["arc_easy"]["kept"]
    assert "<th>plan at the runs' cost</th>" in page
    documents = plan["piqa"]["documents"]
    assert row(page, "piqa", "bpb_gold").endswith(
        f"<td class='l'><b>kept: {documents} of 1838 documents</b></td>"
    )
    assert row(page, "piqa", "acc").endswith("<td class='l'>kept on bpb_gold</td>")
    reason = html.escape(plan["arc_easy"]["reason"], quote=True)
    assert row(page, "arc_easy", "acc").endswith(f"<td class='l' title='{reason}'>dropped (constant)</td>")
    words = html.unescape(re.search(r"<p>Plan at the runs' cost .*?</p>", page).group(0))
    assert f"at the {SECONDS:.2f} s the runs' evaluations took" in words
    assert f"piqa on bpb_gold ({documents} documents, {plan['piqa']['seconds']:.2f} s)" in words
    assert f"drops arc_easy ({plan['arc_easy']['reason']})" in words


def test_runs_the_planner_cannot_plan_from_keep_their_table_and_say_why(runs, tmp_path):
    copies = []
    for run in runs:
        copy = tmp_path / run.name
        copy.mkdir()
        (copy / "outcomes").symlink_to(run / "outcomes")
        (copy / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text())
        copies.append(copy)
    page = write_comparison(copies, tmp_path / "page").read_text()
    assert re.search(r"<tr class='noisy'><td class='l'>piqa</td><td class='l'>acc</td>", page)
    assert "<td class='l' title='no run of " in row(page, "piqa", "bpb_gold")
    words = html.unescape(re.search(r"<p class='note'>Plan at the runs' cost .*?</p>", page).group(0))
    assert "none made: no run of" in words and "pass the config the runs used with --config YAML" in words
