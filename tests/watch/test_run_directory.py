"""A step is done when its metrics line is in `metrics.jsonl`, whatever else the run directory says: a line
that could not be written (a file size limit the ledger's shorter lines still fit) or that was cleaned away
leaves the step to be evaluated again, and so do per-document outcomes that could not be written (the
line is then not written). A run directory deleted under a running watcher stops it; one it
cannot write is a clear error."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml
from watch_support import eval_lines, single_file_checkpoints, watch_cli

from inloop_eval.cli.main import main as cli_main
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.loggers import MetricsLogger
from inloop_eval.watch import WatchConfig, Watcher, WatchError
from inloop_eval.watch.ledger import LEDGER_FILE, WATCH_DIR, read_jsonl


def eval_config(data_root: Path, **fields) -> dict:
    return {
        "evaluators": [{"task": "piqa", "limit": 3}, {"task": "copa", "limit": 3}],
        "data_root": str(data_root),
        "max_length": 128,
        **fields,
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
    """Under a file size limit of 1,200 bytes the config (about 800 bytes) and the ledger's lines fit, the
    metrics line (about 1,800) does not (outcomes off: they would not fit either): the step is recorded
    failed with its figures, the command exits 1, and a watcher restarted with room evaluates it."""
    single = tmp_path / "ckpt"
    shutil.copytree(folder / "checkpoint-10", single / "checkpoint-10")
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root, outcomes=False)))
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


def test_outcomes_a_full_disk_has_no_room_for_leave_the_step_uncommitted_though_its_line_fits(
    folder, data_root, tmp_path
):
    """Under a file size limit of 3,000 bytes the config, the ledger's lines and the metrics line (about
    1,800 bytes) fit, `outcomes/step_10.npz` (about 5,000) does not: the step is recorded failed naming that
    file, no metrics line is written, and a watcher restarted with room evaluates it, outcomes and all,
    instead of saying "nothing new"."""
    single = tmp_path / "ckpt"
    shutil.copytree(folder / "checkpoint-10", single / "checkpoint-10")
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    run_dir = tmp_path / "run"
    args = [str(single), "--config", str(config), "--run-dir", str(run_dir), "--once", "--settle", "0"]
    full = watch_cli(*args, file_size_limit=3000)
    assert full.returncode == 1, full.stdout + full.stderr[-3000:]
    npz = run_dir / "outcomes" / "step_10.npz"
    assert f"step 10 failed: its per-document outcomes were not written to {npz} (" in full.stdout, full.stdout
    assert "File too large" in full.stdout
    assert eval_lines(run_dir) == [] and not npz.exists()
    again = watch_cli(*args)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert "watch: evaluated 1 checkpoint: step 10" in again.stdout
    assert [line["step"] for line in eval_lines(run_dir)] == [10] and npz.is_file()


def test_steps_whose_metrics_lines_were_cleaned_away_are_evaluated_again(folder, data_root, tmp_path):
    """The ledger says `evaluated`, but `metrics.jsonl` was removed (cleaned, rotated): evaluated again."""
    assert watcher(folder, tmp_path / "run", data_root).run() == [10, 20]
    (tmp_path / "run" / "metrics.jsonl").rename(tmp_path / "metrics.old.jsonl")
    assert watcher(folder, tmp_path / "run", data_root).run() == [10, 20]
    assert [line["step"] for line in eval_lines(tmp_path / "run")] == [10, 20]


class Records(MetricsLogger):
    """A logger that records the steps it is given (as W&B would get them)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def log(self, metrics, step: int) -> None:
        self.steps.append(step)


def test_outcomes_that_could_not_be_written_leave_the_step_uncommitted(folder, data_root, tmp_path, caplog):
    """A file where `outcomes/` should be: no step's outcomes can be written. Each step is recorded failed
    (to retry) with a reason naming its outcomes file, and nothing else is logged for it (no metrics line, no
    figures to the other loggers); a watcher restarted once the folder can be made evaluates both, with
    their outcomes."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "outcomes").write_text("not a folder")
    other = Records()
    with caplog.at_level(logging.ERROR, logger="inloop_eval.watch"):
        first = watcher(folder, run_dir, data_root, loggers=[other])
        assert first.run() == []
    for step in (10, 20):
        path = run_dir / "outcomes" / f"step_{step}.npz"
        assert f"its per-document outcomes were not written to {path} (" in first.failures[step]
        assert f"step {step} ({folder / f'checkpoint-{step}'}) failed" in caplog.text and str(path) in caplog.text
    assert eval_lines(run_dir) == [] and other.steps == []
    ledger = read_jsonl(run_dir / WATCH_DIR / LEDGER_FILE)
    assert [(e["step"], e["status"], e.get("retry")) for e in ledger] == [
        (10, "started", None),
        (10, "failed", True),
        (20, "started", None),
        (20, "failed", True),
    ]
    (run_dir / "outcomes").unlink()
    assert watcher(folder, run_dir, data_root).run() == [10, 20]
    assert [line["step"] for line in eval_lines(run_dir)] == [10, 20]
    assert sorted(p.name for p in (run_dir / "outcomes").iterdir()) == ["step_10.npz", "step_20.npz"]


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


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_a_watch_that_cannot_start_leaves_no_run_directory(folder, tmp_path, capsys):
    """`watch --once` of a folder that is not there or holds no checkpoint stops at once, naming the folder,
    before anything is written: no run directory (metrics.jsonl, config.json, the lock and ledger) is left."""
    (tmp_path / "empty").mkdir()
    config = tmp_path / "eval.yaml"
    config.write_text("evaluators:\n  - task: piqa\n    limit: 2\n")
    run_dir = tmp_path / "run"
    argv = ["watch", str(tmp_path / folder), "--config", str(config), "--run-dir", str(run_dir), "--once"]
    try:
        code = cli_main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code not in (0, None)
    err = capsys.readouterr().err
    assert str(tmp_path / folder) in err and ("does not exist" in err or "holds no checkpoint" in err), err
    assert not run_dir.exists()
