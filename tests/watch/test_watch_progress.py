"""What the watcher says and where it stops: the run directory and each step's headline figures, progress
logged without `--once`, an incomplete checkpoint named with what it lacks, a second `--once` saying the
steps were done before, `--until-step` evaluating nothing past it, and a device this torch cannot use
refused at the start."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from watch_support import eval_lines, single_file_checkpoints, watch_cli

from inloop_eval.cli.main import main
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.watch import WatchConfig, Watcher


def eval_config(data_root: Path) -> dict:
    return {"evaluators": [{"task": "piqa", "limit": 3}], "data_root": str(data_root), "max_length": 128}


@pytest.fixture(scope="module")
def saved(data_root, tmp_path_factory) -> Path:
    return single_file_checkpoints(tmp_path_factory.mktemp("hf"), data_root, [10, 20, 30])


def copy_steps(saved: Path, to: Path, steps: list[int]) -> Path:
    for step in steps:
        shutil.copytree(saved / f"checkpoint-{step}", to / f"checkpoint-{step}")
    return to


def test_until_step_evaluates_nothing_past_it(saved, data_root, tmp_path, caplog):
    """Checkpoints 10, 20 and 30 there, `until_step=20`: 10 and 20 evaluated, 30 left (and said so)."""
    config = WatchConfig(
        checkpoint_dir=str(saved), run_dir=str(tmp_path / "run"), settle_s=0, poll_s=0.1, until_step=20
    )
    with caplog.at_level(logging.INFO, logger="inloop_eval.watch"):
        assert Watcher(config, EvaluatorConfig.from_dict(eval_config(data_root))).run() == [10, 20]
    assert "step 30 is past --until-step 20: not evaluated" in caplog.text
    assert [line["step"] for line in eval_lines(tmp_path / "run")] == [10, 20]


def test_progress_is_logged_without_once(saved, data_root, tmp_path, caplog):
    """Watching (not `--once`): step 20 lands without its config.json, which comes a second later. At INFO:
    what step 20 lacks, each step evaluated with its headline figures."""
    folder = copy_steps(saved, tmp_path / "ckpt", [10, 20])
    (folder / "checkpoint-20" / "config.json").rename(tmp_path / "config.json")

    def land() -> None:
        time.sleep(1.0)
        shutil.copy(tmp_path / "config.json", folder / "checkpoint-20" / "config.json")

    config = WatchConfig(
        checkpoint_dir=str(folder), run_dir=str(tmp_path / "run"), settle_s=0, poll_s=0.1, until_step=20
    )
    writer = threading.Thread(target=land)
    writer.start()
    try:
        with caplog.at_level(logging.INFO, logger="inloop_eval.watch"):
            assert Watcher(config, EvaluatorConfig.from_dict(eval_config(data_root))).run() == [10, 20]
    finally:
        writer.join()
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(
        f"step 20 at {folder / 'checkpoint-20'} is not complete yet: no config.json yet" in m for m in info
    )
    for step in (10, 20):
        assert any(
            m.startswith(f"watch: step {step} in {tmp_path / 'run' / 'metrics.jsonl'}: piqa acc ")
            for m in info
        )


def test_once_names_what_an_incomplete_checkpoint_lacks(saved, data_root, tmp_path, caplog):
    folder = copy_steps(saved, tmp_path / "ckpt", [10, 20])
    (folder / "checkpoint-20" / "model.safetensors").unlink()
    config = WatchConfig(checkpoint_dir=str(folder), run_dir=str(tmp_path / "run"), settle_s=0, once=True)
    with caplog.at_level(logging.WARNING, logger="inloop_eval.watch"):
        assert Watcher(config, EvaluatorConfig.from_dict(eval_config(data_root))).run() == [10]
    assert "step 20 at" in caplog.text
    assert (
        "is incomplete, not evaluated: no model.safetensors.index.json or model.safetensors yet"
        in caplog.text
    )


def test_the_command_prints_the_run_directory_the_figures_and_what_was_done_before(
    saved, data_root, tmp_path
):
    folder = copy_steps(saved, tmp_path / "ckpt", [10, 20])
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    run_dir = tmp_path / "run"
    args = [str(folder), "--config", str(config), "--run-dir", str(run_dir), "--once", "--settle", "0"]
    first = watch_cli(*args)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert first.stdout.splitlines()[0] == f"watch: {folder} -> run directory {run_dir}"
    assert f"watch: step 10 in {run_dir / 'metrics.jsonl'}: piqa acc " in first.stderr
    second = watch_cli(*args)
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert second.stdout.splitlines()[-1] == "watch: nothing new: steps 10, 20 already in metrics.jsonl"


def unusable_devices() -> list[str]:
    """Devices no machine here has: a name torch does not know, a CUDA device past any count, and plain
    cuda where this torch has no CUDA device."""
    return ["nosuch", "cuda:4096"] + ([] if torch.cuda.is_available() else ["cuda"])


@pytest.mark.parametrize("device", unusable_devices())
def test_a_device_this_torch_cannot_use_is_refused_at_the_start(saved, data_root, tmp_path, capsys, device):
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    args = ["watch", str(saved), "--config", str(config), "--run-dir", str(tmp_path / "run"), "--once"]
    assert main([*args, "--device", device]) == 2
    err = capsys.readouterr().err
    assert f"inloop-eval: error: watch: --device {device!r} is not a device this machine has (" in err
    assert "expected one of: cpu" in err
    if device == "nosuch":
        assert "not a torch device" in err
    elif torch.cuda.is_available():
        assert f"this machine has {torch.cuda.device_count()} cuda device(s)" in err
    else:
        assert "this torch" in err and "sees no cuda device" in err
    assert not (tmp_path / "run").exists()
