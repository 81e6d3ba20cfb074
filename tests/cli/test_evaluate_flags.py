"""`inloop-eval evaluate`: it runs through `run_and_log`, the path a training loop takes, so its figures carry
the cost keys; `--spread` samples each task's limit over its split; a device this machine lacks is one error;
a misspelt task id and a model folder without a tokenizer are each one error naming the remedy, before the
model is loaded."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from inloop_eval.cli.evaluate import evaluate_config
from inloop_eval.cli.main import build_parser, main
from inloop_eval.errors import ConfigError
from inloop_eval.keys import SECONDS_KEY, TOKENS_KEY


@pytest.fixture(scope="module")
def spread_run(hf_model_dir, data_root, tmp_path_factory) -> tuple[Path, str]:
    """(the folder of its --output and --samples files, stdout) of piqa's 3 documents spread over its split."""
    out = tmp_path_factory.mktemp("evaluate")
    args = ["evaluate", "--model", str(hf_model_dir), "--tasks", "piqa", "--limit", "3", "--spread"]
    args += ["--data-root", str(data_root), "--output", str(out / "results.json"), "--samples", str(out / "s.jsonl")]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(args) == 0
    return out, printed.getvalue()


def test_evaluate_logs_the_seconds_and_tokens_forwarded(spread_run):
    out, printed = spread_run
    metrics = json.loads((out / "results.json").read_text())["metrics"]
    assert metrics[SECONDS_KEY] > 0 and metrics[TOKENS_KEY] > 0
    assert metrics[TOKENS_KEY] == int(metrics[TOKENS_KEY])
    assert re.search(rf"^ +{re.escape(TOKENS_KEY)} +[0-9,]+$", printed, re.M), printed
    assert re.search(rf"^ +{re.escape(SECONDS_KEY)} +[0-9.]+$", printed, re.M), printed


def test_spread_evaluates_documents_over_the_whole_split(spread_run):
    out, _ = spread_run
    records = [json.loads(line) for line in (out / "s.jsonl").read_text().splitlines()]
    doc_ids = sorted({r["doc_id"] for r in records})
    assert len(doc_ids) == 3 and doc_ids[-1] > 1000, doc_ids  # piqa's validation split: 1,838 documents


def test_spread_sets_each_tasks_spread_and_needs_a_limit(tmp_path):
    config = evaluate_config(build_parser().parse_args(["evaluate", "--model", "m", "--tasks", "piqa,copa", "--limit", "5", "--spread"]))
    assert [(e.limit, e.spread) for e in config.evaluators] == [(5, True), (5, True)]
    config = evaluate_config(build_parser().parse_args(["evaluate", "--model", "m", "--tasks", "piqa", "--limit", "5"]))
    assert config.evaluators[0].spread is False
    path = tmp_path / "eval.yaml"
    path.write_text("evaluators:\n  - {task: piqa, limit: 4}\n  - {task: copa}\n")
    args = build_parser().parse_args(["evaluate", "--model", "m", "--config", str(path), "--spread"])
    with pytest.raises(ConfigError, match=r"--spread: task 'copa' has no limit.*add --limit N"):
        evaluate_config(args)


def absent_device() -> str:
    """A GPU this machine does not have: any when torch has no CUDA, else the one past the last."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize("device", ["nosuch", absent_device(), "cuda:x"])
def test_a_device_this_machine_lacks_is_one_error_naming_the_flag(device, tmp_path, capsys):
    code = main(["evaluate", "--model", str(tmp_path), "--tasks", "piqa", "--device", device])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert f"inloop-eval: error: evaluate: --device {device!r} is not a device this machine has (" in err
    assert "expected one of: cpu" in err


def test_a_misspelt_task_is_named_before_the_model_is_loaded(tmp_path, capsys):
    """The task ids are checked first: --model names no model here, and the error is the task's."""
    code = main(["evaluate", "--model", str(tmp_path / "no-model"), "--tasks", "piqa,hellaswg"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "inloop-eval: error: unknown task 'hellaswg'; did you mean hellaswag" in err
    assert "--model" not in err


def test_a_model_folder_without_a_tokenizer_is_told_to_pass_tokenizer(hf_model_dir, data_root, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(hf_model_dir, model, ignore=shutil.ignore_patterns("tokenizer*"))
    code = main(["evaluate", "--model", str(model), "--tasks", "piqa", "--limit", "2", "--data-root", str(data_root)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"evaluate: --model {model} holds no tokenizer (no tokenizer.json there); name one with --tokenizer" in err
    assert "Traceback" not in err and "Loading weights" not in err
