"""`inloop-eval plan` on run directories of real tasks (synthetic outcomes, the real tokenizer and task data):
what it keeps and drops and why, the config it writes, which `InLoopEvaluator.from_yaml` loads and runs on
a tiny model unchanged, and its errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from plan_outcomes import Truth, run_values, write_run

from inloop_eval import InLoopEvaluator
from inloop_eval.cli.main import main
from inloop_eval.data.root import neox_tokenizer_path
from inloop_eval.keys import SECONDS_KEY, TOKENS_KEY
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.plan.output import planned_config
from inloop_eval.plan.planner import PlanRequest, make_plan
from inloop_eval.plan.runs import PlanError, measured_rates

STEPS = (0, 10, 20, 30, 40, 50)


def evaluation(data_root: Path) -> dict:
    return {
        "eval_interval": 10,
        "tokenizer": str(neox_tokenizer_path(data_root)),
        "data_root": str(data_root),
        "max_length": 512,
        "evaluators": [
            {"task": "piqa", "limit": 40},
            {"task": "arc_easy", "limit": 40},
            {"task": "copa", "limit": 40},
        ],
    }


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """piqa rises on bpb_gold (its acc is flat noise), arc_easy's outcomes are constant, copa has none."""
    rising = run_values(Truth(slope=0.004, doc_sd=0.2, level=1.5), 0, n_docs=40, steps=STEPS)
    flat_acc = run_values(Truth(doc_sd=1.0), 1, n_docs=40, steps=STEPS, binary=True)
    constant = run_values(Truth(doc_sd=0.0, spread=0.0, level=1.0), 2, n_docs=40, steps=STEPS, binary=True)
    tasks = {"piqa": {"bpb_gold": rising, "acc": flat_acc}, "arc_easy": {"acc": constant}}
    return write_run(tmp_path_factory.mktemp("run"), tasks, evaluation(data_root), seconds=2.0, tokens=8000)


@pytest.fixture(scope="module")
def planned(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`inloop-eval plan RUN --budget 0.5 --out DIR` run once; DIR."""
    out = tmp_path_factory.mktemp("plan")
    assert main(["plan", str(run_dir), "--budget", "0.5", "--out", str(out)]) == 0
    return out


def test_it_keeps_the_task_with_signal_on_its_better_figure_and_says_why_it_drops_the_others(planned):
    report = json.loads((planned / "plan.json").read_text())
    tasks = {t["label"]: t for t in report["tasks"]}
    assert tasks["piqa"]["kept"] and tasks["piqa"]["figure"] == "bpb_gold"
    assert tasks["piqa"]["documents"] >= 10 and tasks["piqa"]["seconds"] <= 0.5
    assert tasks["piqa"]["split_documents"] == 1838
    assert math.isfinite(tasks["piqa"]["stderr"]) and tasks["piqa"]["snr"] > 0
    assert not tasks["arc_easy"]["kept"] and tasks["arc_easy"]["reason"].startswith("constant")
    assert not tasks["copa"]["kept"] and tasks["copa"]["reason"].startswith("missing")
    assert report["seconds_per_token"] == pytest.approx(2.0 / 8000)
    assert report["planned_seconds"] <= report["budget_seconds"] == 0.5
    assert 0.5 <= report["objective"]["decision_accuracy"] <= 1.0


def test_the_written_config_runs_through_the_evaluator_unchanged(planned):
    out = planned
    config = yaml.safe_load((out / "plan.yaml").read_text())
    entries = {e["label"]: e for e in config["evaluators"]}
    assert set(entries) == {"piqa"} and entries["piqa"]["spread"] is True
    report = json.loads((out / "plan.json").read_text())
    assert entries["piqa"]["limit"] == report["tasks"][0]["documents"]
    evaluator = InLoopEvaluator.from_yaml(out / "plan.yaml")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50304, d_model=16, n_layers=1, n_heads=2, max_seq_len=512))
    metrics = evaluator.run(model, step=0)
    assert math.isfinite(metrics["eval/downstream/piqa/bpb_gold"])


def test_one_run_at_a_fraction_of_its_measured_seconds(run_dir, tmp_path):
    result = make_plan(PlanRequest(runs=(run_dir,), eval_fraction=0.25, pool=200))
    assert result.budget == pytest.approx(0.5)
    assert result.allocation.seconds <= 0.5


def test_runs_at_a_fraction_of_the_training_between_their_evaluations(tmp_path, data_root):
    """--budget-fraction F: F x the median over the runs of their eval/interval_seconds; runs that logged none
    (a watcher's, a calibration) are refused, naming them and the flags that do without."""
    def values(i: int) -> dict:
        return {"piqa": {"bpb_gold": run_values(Truth(slope=0.004, offset=0.5 * i), i, n_docs=40, steps=STEPS)}}

    runs = [write_run(tmp_path / f"run{i}", values(i), evaluation(data_root), interval=s) for i, s in enumerate((40, 60))]
    result = make_plan(PlanRequest(runs=tuple(runs), budget_fraction=0.05, pool=200))
    assert result.budget == pytest.approx(0.05 * 50)
    assert main(["plan", str(runs[0]), "--budget-fraction", "0.05", "--out", str(tmp_path / "plan")]) == 0
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["budget_seconds"] == pytest.approx(2.0)
    watched = write_run(tmp_path / "watched", values(0), evaluation(data_root))
    with pytest.raises(PlanError, match=r"--budget-fraction: expected the training seconds between evaluations"):
        make_plan(PlanRequest(runs=(watched,), budget_fraction=0.05, pool=200))


def test_runs_without_rates_need_seconds_per_token(tmp_path, data_root):
    values = {"piqa": {"bpb_gold": run_values(Truth(slope=0.004), 0, n_docs=40, steps=STEPS)}}
    run = write_run(tmp_path / "run", values, evaluation(data_root))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "train/loss": 1.0}) + "\n")
    with pytest.raises(PlanError, match="--seconds-per-token"):
        make_plan(PlanRequest(runs=(run,), budget=1.0, pool=200))
    result = make_plan(PlanRequest(runs=(run,), budget=1.0, seconds_per_token=1e-4, pool=200))
    assert result.seconds_per_token == 1e-4


def test_a_directory_without_outcomes_is_named(tmp_path, capsys):
    assert main(["plan", str(tmp_path), "--budget", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "outcomes" in err


def test_the_budget_is_required_and_positive(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["plan", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        main(["plan", str(tmp_path), "--budget", "-1", "--out", str(tmp_path / "o")])
    assert "expected a number above 0" in capsys.readouterr().err


def test_measured_rates_leave_out_the_first_evaluation():
    series = {
        SECONDS_KEY: [(0, 50.0), (10, 2.0), (20, 4.0)],
        TOKENS_KEY: [(0, 1000.0), (10, 1000.0), (20, 1000.0)],
    }
    rate, seconds, tokens = measured_rates(series)
    assert rate == pytest.approx(np.median([2.0 / 1000, 4.0 / 1000]))
    assert seconds == pytest.approx(3.0) and tokens == 1000.0


def test_perplexity_evaluators_are_kept_and_their_seconds_come_off_the_budget(tmp_path, data_root):
    """The runs' tokens less those the engine plans for their tasks are the perplexity evaluators'; at the
    measured rate their seconds are spent before any task's, and the entry is written back unchanged."""
    text = tmp_path / "held.jsonl"
    text.write_text(json.dumps({"text": "Some held-out text."}) + "\n")
    config = evaluation(data_root)
    config["evaluators"] = [
        {"task": "piqa", "limit": 40},
        {"type": "lm", "domains": [{"label": "held", "paths": [str(text)], "format": "jsonl"}]},
    ]
    values = {"piqa": {"bpb_gold": run_values(Truth(slope=0.004, doc_sd=0.2), 0, n_docs=40, steps=STEPS)}}
    run = write_run(tmp_path / "run", values, config, seconds=2.0, tokens=8000)
    result = make_plan(PlanRequest(runs=(run,), budget=2.0, pool=200))
    assert 0 < result.planned_tokens < 8000
    assert result.fixed_seconds == pytest.approx((8000 - result.planned_tokens) * 2.0 / 8000)
    assert result.allocation.seconds <= 2.0 - result.fixed_seconds
    written, _ = planned_config(result)
    assert [e["type"] for e in written["evaluators"]] == ["downstream", "lm"]
    assert written["evaluators"][1]["domains"][0]["paths"] == [str(text)]
    with pytest.raises(PlanError, match="perplexity evaluators"):
        make_plan(PlanRequest(runs=(run,), budget=0.5, pool=200))


def test_checkpoints_evaluated_with_outcomes_plan_with_the_config_and_a_rate(tmp_path, data_root):
    """Before a run has logged anything: checkpoints evaluated with `inloop-eval evaluate --outcomes DIR --step
    N` leave only DIR/outcomes; the config they used and the seconds per token make the plan."""
    values = {"piqa": {"bpb_gold": run_values(Truth(slope=0.004, doc_sd=0.2), 0, n_docs=40, steps=STEPS)}}
    outcomes_only = write_run(tmp_path / "checkpoints", values, evaluation(data_root))
    (outcomes_only / "config.json").unlink()
    (outcomes_only / "metrics.jsonl").unlink()
    config_file = tmp_path / "broad.yaml"
    config_file.write_text(yaml.safe_dump(evaluation(data_root)))
    out = tmp_path / "plan"
    argv = ["plan", str(outcomes_only), "--budget", "0.5", "--out", str(out), "--config", str(config_file)]
    assert main(argv) == 2  # no rate measured: it asks for one
    assert main([*argv, "--seconds-per-token", "2.5e-4"]) == 0
    report = json.loads((out / "plan.json").read_text())
    assert report["seconds_per_token"] == 2.5e-4 and report["tasks"][0]["label"] == "piqa"


def test_a_budget_no_task_fits_is_an_error_naming_each_tasks_reason(run_dir):
    with pytest.raises(
        PlanError, match=r"no task is kept within 0\.0001 s, .*piqa: budget: its first 10 documents"
    ):
        make_plan(PlanRequest(runs=(run_dir,), budget=1e-4, pool=200))
