"""A step is done when its metrics line is in `metrics.jsonl`, whatever else the run directory says: a line
that could not be written (a file size limit the ledger's shorter lines still fit) or that was cleaned away
leaves the step to be evaluated again. A run directory deleted under a running watcher stops it; one it
cannot write is a clear error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from watch_support import eval_lines, single_file_checkpoints, watch_cli

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.loggers import MetricsLogger
from inloop_eval.watch import WatchConfig, Watcher, WatchError
from inloop_eval.watch.ledger import LEDGER_FILE, WATCH_DIR, read_jsonl


def eval_config(data_root: Path) -> dict:
    return {
        "evaluators": [{"task": "piqa", "limit": 3}, {"task": "copa", "limit": 3}],
        "data_root": str(data_root),
        "max_length": 128,
    }


@pytest.fixture(scope="module")
def folder(data_root, tmp_path_factory) -> Path:
    return single_file_checkpoints(tmp_path_factory.mktemp("hf"), data_root, [10, 20])


def watcher(folder: Path, run_dir: Path, data_root: Path, **fields) -> Watcher:
    config = WatchConfig(checkpoint_dir=str(folder), run_dir=str(run_dir), once=True, settle_s=0)
    return Watcher(config, EvaluatorConfig.from_dict(eval_config(data_root)), **fields)


def test_a_metrics_line_that_could_not_be_written_leaves_the_step_to_evaluate_again(
    folder, data_root, tmp_path
):
    """Under a file size limit of 1,200 bytes the config (778 bytes) and the ledger's lines fit, the metrics
    line (about 1,800) does not: the step is recorded failed with its figures, the command exits 1, and a
    watcher restarted with room evaluates it."""
    single = tmp_path / "ckpt"
    shutil.copytree(folder / "checkpoint-10", single / "checkpoint-10")
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    args = [
        str(single),
        "--config",
        str(config),
        "--run-dir",
        str(tmp_path / "run"),
        "--once",
        "--settle",
        "0",
    ]
    full = watch_cli(*args, file_size_limit=1200)
    assert full.returncode == 1, full.stdout + full.stderr[-3000:]
    assert "step 10 failed: its metrics line was not written to" in full.stdout
    assert "piqa acc" in full.stdout  # the figures, which no file holds
    assert eval_lines(tmp_path / "run") == []
    ledger = read_jsonl(tmp_path / "run" / WATCH_DIR / LEDGER_FILE)
    assert [e["status"] for e in ledger] == ["started", "failed"]
    again = watch_cli(*args)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert "watch: evaluated 1 checkpoint: step 10" in again.stdout
    assert [line["step"] for line in eval_lines(tmp_path / "run")] == [10]


def test_steps_whose_metrics_lines_were_cleaned_away_are_evaluated_again(folder, data_root, tmp_path):
    """The ledger says `evaluated`, but `metrics.jsonl` was removed (cleaned, rotated): evaluated again."""
    assert watcher(folder, tmp_path / "run", data_root).run() == [10, 20]
    (tmp_path / "run" / "metrics.jsonl").rename(tmp_path / "metrics.old.jsonl")
    assert watcher(folder, tmp_path / "run", data_root).run() == [10, 20]
    assert [line["step"] for line in eval_lines(tmp_path / "run")] == [10, 20]


class RemovesRunDir(MetricsLogger):
    """A logger (called before the metrics line) that deletes the run directory at its first step."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def log(self, metrics, step: int) -> None:
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)


def test_a_run_directory_deleted_under_the_watcher_stops_it_before_it_writes(folder, data_root, tmp_path):
    run_dir = tmp_path / "run"
    watch = watcher(folder, run_dir, data_root, loggers=[RemovesRunDir(run_dir)])
    with pytest.raises(
        WatchError,
        match=rf"{run_dir} was deleted while the watcher ran, so what it writes now would be lost: stopped",
    ):
        watch.run()
    assert watch.evaluated == []
    assert not run_dir.exists()


def test_a_run_directory_it_cannot_write_is_a_clear_error(folder, data_root, tmp_path):
    """A read-only run directory, in a process that obeys file permissions even as root."""
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o555)
    run_dir.chmod(0o555)
    done = watch_cli(
        str(folder), "--config", str(config), "--run-dir", str(run_dir), "--once", obey_permissions=True
    )
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    assert (
        f"inloop-eval: error: watch: cannot write the run directory {run_dir} (PermissionError" in done.stderr
    )
    assert "Traceback" not in done.stderr
