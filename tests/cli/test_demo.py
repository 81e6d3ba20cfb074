"""The demo end to end: a few steps on two ranks (DDP on gloo, torchrun's environment), a small model and tiny
limits (tests/configs/demo_tiny.yaml), then the W&B offline run read back from disk and the report."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from workers.launch import REPO, launch, worker_env

from inloop_eval.demo.run import DemoConfig
from inloop_eval.loggers.wandb_file import find_run_files, is_finished, read_config, read_history

TINY = REPO / "tests" / "support" / "configs" / "demo_tiny.yaml"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, data_root) -> tuple[Path, str]:
    """The run's folder and what rank 0 printed."""
    out = tmp_path_factory.mktemp("demo") / "run"
    env = worker_env(INLOOP_EVAL_DATA=str(data_root))
    env.pop("WANDB_MODE", None)
    args = [str(REPO / "scripts" / "train_demo.py"), "--config", str(TINY), "--out", str(out)]
    return out, launch(2, args, timeout=300, env=env)[0].stdout


def wandb_history(out: Path) -> tuple[list[dict], dict]:
    runs = find_run_files(out / "wandb")
    assert len(runs) == 1, f"expected one W&B run (rank 0 only), found {runs}"
    deadline = time.monotonic() + 30
    while not is_finished(runs[0]):  # the W&B service may still be writing
        assert time.monotonic() < deadline, f"{runs[0]}: no exit record"
        time.sleep(0.1)
    assert "offline-run" in runs[0].parent.name
    return read_history(runs[0]), read_config(runs[0])


def test_wandb_history_holds_the_eval_keys_at_the_trainer_steps(demo_run):
    out, _ = demo_run
    config = DemoConfig.from_yaml(TINY)
    rows, run_config = wandb_history(out)
    evals = [r for r in rows if "eval/downstream/piqa/acc" in r]
    expected_steps = list(range(0, config.train.steps + 1, config.evaluation.eval_interval))
    assert [r["trainer/step"] for r in evals] == expected_steps
    jsonl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in jsonl if "eval/downstream/piqa/acc" in r}
    for row in evals:
        logged = by_step[row["trainer/step"]]
        for key in ("eval/downstream/piqa/acc", "eval/downstream/piqa/acc_norm", "eval/lm/coqa/ppl"):
            assert row[key] == pytest.approx(logged[key])
        assert row["eval/downstream/piqa/n_docs"] == 6  # each document once over both ranks
        assert row["eval/downstream/mmlu_mc/n_docs"] == 4
        assert "eval/downstream/mmlu_mc/acc_norm" not in row
        assert row["eval/seconds"] > 0 and row["eval/tokens_forwarded"] > 0
    train = [r for r in rows if "train/loss" in r]
    assert [r["trainer/step"] for r in train] == list(range(0, config.train.steps, config.train.log_every))
    assert run_config["world_size"] == 2
    assert run_config["evaluation"]["evaluators"][0]["task"] == "piqa"
    assert run_config["model"]["d_model"] == config.model.d_model


def test_report_references_every_task_and_domain_plot(demo_run):
    out, stdout = demo_run
    page_path = out / "report" / "index.html"
    assert f"report: {page_path}" in stdout
    page = page_path.read_text()
    images = re.findall(r"<img src='([^']+)'", page)
    assert images == ["train_loss.png", "task_mmlu_mc.png", "task_piqa.png", "lm_coqa.png"]
    assert stdout.startswith("demo: training the reference GPT (n_layers 1, d_model 32, seed 0) for 4 steps on 2 ")
    assert all((out / "report" / name).is_file() for name in images)
    assert "not reported" in page  # mmlu_mc's letter keys


def test_training_prints_the_step_of_the_total_with_the_time_left(demo_run):
    _, stdout = demo_run
    train = DemoConfig.from_yaml(TINY).train
    lines = [line for line in stdout.splitlines() if "train loss" in line]
    assert [line.split("/")[0] for line in lines] == [f"step {s}" for s in range(0, train.steps, train.log_every)]
    for i, line in enumerate(lines):  # the first line's one step carries one-off costs: no ETA yet
        eta = r"\?" if i == 0 else r"\d\d:\d\d"
        assert re.fullmatch(rf"step \d/{train.steps}  train loss \d+\.\d{{3}}  \(\d+\.\d steps/s, ETA {eta}\)", line), line
    evaluations = [line for line in stdout.splitlines() if "  eval  " in line]
    assert [line.split("  eval")[0] for line in evaluations] == [f"step {s}/{train.steps}" for s in (0, 2, 4)]
