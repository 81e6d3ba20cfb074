"""`inloop-eval plan --calibrate CKPT ...` on tiny saved Hugging Face models: each checkpoint evaluated into a
calibration run filed under its step, the plan made from it as from any run, that plan run unchanged by
`inloop-eval watch --once` over the checkpoint folder with the planned figures and documents; its refusals
and a calibration of two checkpoints, whose tasks each say they need a third evaluation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import tiny_neox
from watch_support import eval_lines

from inloop_eval.cli.main import main
from inloop_eval.cli.plan import CALIBRATION_DIR, checkpoint_steps
from inloop_eval.data.root import neox_tokenizer_path
from inloop_eval.keys import DOWNSTREAM, SECONDS_KEY, split_key
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, list_steps, read_step, step_path
from inloop_eval.plan.noise import CHECKPOINT_UNSEEN
from inloop_eval.plan.planner import PlanRequest, make_plan
from inloop_eval.plan.runs import PLAN_FIGURES, measured_rates
from inloop_eval.report.runs import load_run

# Each checkpoint's output head scaled: its bits per byte rise with the step, a trend the plan reads.
HEAD_SCALES = {10: 1.0, 20: 3.0, 30: 6.0}
BUDGET = "1.0"


def save_checkpoints(folder: Path, data_root: Path) -> Path:
    """`folder/checkpoint-<N>` for each step of HEAD_SCALES: a tiny GPT-NeoX saved with `save_pretrained` and
    the NeoX tokenizer, as a Hugging Face trainer leaves them."""
    for step, scale in HEAD_SCALES.items():
        model = tiny_neox(seed=0)
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(scale)
        model.save_pretrained(folder / f"checkpoint-{step}")
        shutil.copy(neox_tokenizer_path(data_root), folder / f"checkpoint-{step}" / "tokenizer.json")
    return folder


def write_config(path: Path, data_root: Path, evaluators: list[dict]) -> Path:
    path.write_text(
        yaml.safe_dump({"data_root": str(data_root), "max_length": 256, "evaluators": evaluators})
    )
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, data_root) -> Path:
    return save_checkpoints(tmp_path_factory.mktemp("checkpoints"), data_root)


@pytest.fixture(scope="module")
def calibrated(checkpoints, data_root, tmp_path_factory) -> Path:
    """`plan --calibrate` of the three checkpoints on piqa and arc_easy (20 documents each) and copa (1
    document: too few to plan on), at a budget of 1 s; its --out."""
    work = tmp_path_factory.mktemp("calibrated")
    evaluators = [
        {"task": "piqa", "limit": 20},
        {"task": "arc_easy", "limit": 20},
        {"task": "copa", "limit": 1},
    ]
    config = write_config(work / "broad.yaml", data_root, evaluators)
    folders = [str(checkpoints / f"checkpoint-{step}") for step in HEAD_SCALES]
    argv = [
        "plan",
        "--calibrate",
        *folders,
        "--config",
        str(config),
        "--budget",
        BUDGET,
        "--out",
        str(work / "out"),
    ]
    assert main(argv) == 0
    return work / "out"


def test_each_checkpoint_is_evaluated_under_its_step_and_the_calibration_planned_from_as_a_run(calibrated):
    calibration = calibrated / CALIBRATION_DIR
    assert list(list_steps(calibration / OUTCOMES_DIR)) == list(HEAD_SCALES)
    for step in HEAD_SCALES:
        tasks = read_step(step_path(calibration / OUTCOMES_DIR, step)).tasks
        assert {label: len(t.doc_id) for label, t in tasks.items()} == {"piqa": 20, "arc_easy": 20, "copa": 1}
    history = load_run(calibration)
    assert [s for s, _ in history.series[SECONDS_KEY]] == list(HEAD_SCALES)
    assert [e["task"] for e in history.config["evaluators"]] == ["piqa", "arc_easy", "copa"]
    report = json.loads((calibrated / "plan.json").read_text())
    assert report["runs"] == [str(calibration)]
    assert report["seconds_per_token"] == pytest.approx(measured_rates(history.series)[0])
    tasks = {t["label"]: t for t in report["tasks"]}
    kept = [t for t in tasks.values() if t["kept"]]
    assert kept and all(t["figure"] in PLAN_FIGURES and t["documents"] >= 10 for t in kept)
    assert report["planned_seconds"] <= report["budget_seconds"] == float(BUDGET)
    assert not tasks["copa"]["kept"]
    assert "at 2 or more evaluations (found: 3 evaluations of 1 documents)" in tasks["copa"]["reason"]
    # The same plan as `inloop-eval plan CALIBRATION` makes of the calibration as a run directory.
    again = make_plan(PlanRequest(runs=(calibration,), budget=float(BUDGET)))
    assert {t.label: (t.documents, t.figure) for t in again.allocation.kept()} == {
        t["label"]: (t["documents"], t["figure"]) for t in kept
    }


def test_the_written_plan_runs_unchanged_through_the_watcher_with_the_planned_figures_and_documents(
    calibrated, checkpoints, tmp_path
):
    report = json.loads((calibrated / "plan.json").read_text())
    kept = {t["label"]: t for t in report["tasks"] if t["kept"]}
    run_dir = tmp_path / "run"
    argv = ["watch", str(checkpoints), "--config", str(calibrated / "plan.yaml"), "--run-dir", str(run_dir)]
    assert main([*argv, "--once", "--policy", "latest", "--settle", "0"]) == 0
    [line] = eval_lines(run_dir)
    assert line["step"] == max(HEAD_SCALES)
    figures = {split_key(key, DOWNSTREAM) for key in line} - {None}
    assert {label for label, _ in figures} == set(kept)
    assert all((label, task["figure"]) in figures for label, task in kept.items())
    outcomes = read_step(step_path(run_dir / OUTCOMES_DIR, max(HEAD_SCALES))).tasks
    for label, task in kept.items():
        doc_id = outcomes[label].doc_id
        assert len(doc_id) == task["documents"]
        # Spread over the split, not its first documents.
        assert doc_id.max() > task["documents"] - 1 and len(set(doc_id.tolist())) == len(doc_id)


def test_an_earlier_calibration_in_out_is_planned_from_not_evaluated_again(calibrated, capsys):
    argv = ["plan", "--calibrate", "a", "b", "--config", "c.yaml", "--budget", "1", "--out", str(calibrated)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--out {calibrated} holds an earlier calibration" in err
    assert f"`inloop-eval plan {calibrated / CALIBRATION_DIR} --budget SECONDS --out DIR`" in err


def test_fewer_than_two_checkpoints_are_refused_saying_what_a_plan_needs(checkpoints, tmp_path, capsys):
    argv = ["plan", "--calibrate", str(checkpoints / "checkpoint-10"), "--config", "c.yaml", "--budget", "1"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "plan --calibrate: expected 2 or more checkpoints (saved model folders), found 1" in err
    assert "its checkpoint noise from 3 or more" in err
    twice = [str(checkpoints / "checkpoint-10"), str(checkpoints / "checkpoint-10") + "/"]
    assert (
        main(
            [
                "plan",
                "--calibrate",
                *twice,
                "--config",
                "c.yaml",
                "--budget",
                "1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert "expected distinct checkpoints, found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_runs_and_checkpoints_together_or_neither_are_refused(checkpoints, tmp_path, capsys):
    two = [str(checkpoints / "checkpoint-10"), str(checkpoints / "checkpoint-20")]
    assert main(["plan", "runs/a", "--calibrate", *two, "--budget", "1", "--out", str(tmp_path)]) == 2
    assert "expected checkpoints only, found run directories too (runs/a)" in capsys.readouterr().err
    assert main(["plan", "--budget", "1", "--out", str(tmp_path)]) == 2
    assert "name the run directories to plan from (RUN_DIR ...)" in capsys.readouterr().err
    assert main(["plan", "--calibrate", *two, "--budget", "1", "--out", str(tmp_path)]) == 2
    assert "--config YAML" in capsys.readouterr().err


def test_a_folder_without_a_saved_model_is_named_before_any_checkpoint_is_evaluated(
    checkpoints, tmp_path, capsys
):
    (tmp_path / "empty").mkdir()
    argv = ["plan", "--calibrate", str(checkpoints / "checkpoint-10"), str(tmp_path / "empty"), "--config"]
    assert main([*argv, "c.yaml", "--budget", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"plan --calibrate: {str(tmp_path / 'empty')!r} holds no saved model" in err
    assert not (tmp_path / "out").exists()


def test_checkpoints_are_filed_under_the_steps_their_names_hold_else_in_their_order():
    assert checkpoint_steps(["run/checkpoint-200", "run/checkpoint-100/"]) == [200, 100]
    assert checkpoint_steps(["olmo/step1000", "titan/step-2000"]) == [1000, 2000]
    assert checkpoint_steps(["best", "run/checkpoint-100"]) == [0, 1]
    assert checkpoint_steps(["a/checkpoint-100", "b/checkpoint-100"]) == [0, 1]


def test_two_checkpoints_plan_on_their_change_with_checkpoint_noise_unseen_until_a_third_joins(
    checkpoints, data_root, tmp_path
):
    config = write_config(tmp_path / "one.yaml", data_root, [{"task": "piqa", "limit": 20}])
    folders = [str(checkpoints / f"checkpoint-{step}") for step in (10, 20)]
    out = tmp_path / "out"
    # Its timed evaluations of 20 documents are mostly overhead: a budget that fits their rate.
    argv = ["plan", "--calibrate", *folders, "--config", str(config), "--budget", "20", "--out", str(out)]
    assert main(argv) == 0
    piqa = json.loads((out / "plan.json").read_text())["tasks"][0]
    assert piqa["label"] == "piqa" and piqa["kept"]
    assert {f["source"] for f in piqa["figures"].values() if not f["problem"]} == {CHECKPOINT_UNSEEN}
    assert all(f["checkpoint_variance"] == 0.0 for f in piqa["figures"].values() if not f["problem"])
    calibration = out / CALIBRATION_DIR
    third = ["evaluate", "--model", str(checkpoints / "checkpoint-30"), "--config", str(config)]
    assert main([*third, "--outcomes", str(calibration), "--step", "30"]) == 0
    assert main(["plan", str(calibration), "--budget", "20", "--out", str(tmp_path / "plan")]) == 0
    piqa = json.loads((tmp_path / "plan" / "plan.json").read_text())["tasks"][0]
    assert piqa["label"] == "piqa" and piqa["kept"]
    assert {f["source"] for f in piqa["figures"].values() if not f["problem"]} == {"trend"}