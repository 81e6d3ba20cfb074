"""Loggers: the no-op default, JSON lines, and a real offline W&B run read back from its `.wandb` file."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations import SECONDS_KEY, run_and_log
from inloop_eval.loggers import JSONLLogger, MetricsLogger, MultiLogger, NullLogger, WandbLogger
from inloop_eval.loggers.wandb_file import (
    BLOCK_SIZE,
    WandbFileError,
    find_run_files,
    is_finished,
    read_chunks,
    read_config,
    read_history,
    read_records,
)
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.report import load_run


def wait_until_finished(run_file, timeout_s: float = 30.0) -> None:
    """W&B's service may still be writing the run's last records when `finish()` returns."""
    deadline = time.monotonic() + timeout_s
    while not is_finished(run_file):
        assert time.monotonic() < deadline, f"{run_file}: no exit record after {timeout_s}s"
        time.sleep(0.1)


def test_null_logger_accepts_everything():
    for logger in (MetricsLogger(), NullLogger(), MultiLogger([NullLogger()])):
        with logger:
            logger.log_config({"a": 1})
            logger.log({"eval/x": 1.0}, step=3)


def test_jsonl_logger_writes_lines_and_config(tmp_path):
    with JSONLLogger(tmp_path / "run") as logger:
        logger.log_config({"eval_interval": 10, "evaluators": [{"task": "piqa"}]})
        logger.log({"eval/downstream/piqa/acc": 0.5}, step=0)
        logger.log({"eval/downstream/piqa/acc": 0.625}, step=10)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 0, "eval/downstream/piqa/acc": 0.5},
        {"step": 10, "eval/downstream/piqa/acc": 0.625},
    ]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["eval_interval"] == 10


def test_loggers_write_nothing_off_rank_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    jsonl = JSONLLogger(tmp_path / "run")
    jsonl.log({"eval/x": 1.0}, step=0)
    jsonl.finish()
    wandb_logger = WandbLogger(dir=tmp_path / "wb")
    wandb_logger.log({"eval/x": 1.0}, step=0)
    wandb_logger.finish()
    assert not (tmp_path / "run").exists() and not (tmp_path / "wb").exists()
    assert wandb_logger.run is None and "wandb" not in sys.modules


def test_wandb_offline_run_reads_back(tmp_path, monkeypatch):
    """History at the trainer's steps, `eval/*` against `trainer/step`, the whole config; enough data for
    records that span 32 KiB blocks (FIRST/MIDDLE/LAST chunks)."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    big = {f"evaluator_{i}": {"task": f"task_{i}", "note": "x" * 300} for i in range(150)}  # ~60 KB
    tasks = [f"task_{i}" for i in range(40)]
    logger = WandbLogger(dir=tmp_path, config=big, settings={"x_disable_stats": True})
    steps = (0, 100, 250)
    for step in steps:
        metrics = {f"eval/downstream/{t}/acc": step / 1000 + i / 100 for i, t in enumerate(tasks)}
        metrics |= {f"eval/downstream/{t}/acc_norm": step / 2000 for t in tasks}
        logger.log(metrics, step)
    logger.finish()

    (run_file,) = find_run_files(tmp_path)
    wait_until_finished(run_file)
    assert run_file.stat().st_size > 2 * BLOCK_SIZE
    assert "offline-run" in run_file.parent.name  # offline by default
    rows = [r for r in read_history(run_file) if "trainer/step" in r]
    assert [r["trainer/step"] for r in rows] == list(steps)
    for row, step in zip(rows, steps, strict=True):
        assert row["eval/downstream/task_7/acc"] == pytest.approx(step / 1000 + 0.07)
        assert row["eval/downstream/task_39/acc_norm"] == pytest.approx(step / 2000)
        assert "charts/task_7/acc_vs_acc_norm_table._type" in row  # the per-task line-series chart
    defined = {
        r.metric.glob_name or r.metric.name: r.metric.step_metric
        for r in read_records(run_file)
        if r.WhichOneof("record_type") == "metric"
    }
    assert defined["eval/*"] == "trainer/step"
    assert read_config(run_file)["evaluator_149"]["note"] == "x" * 300


def test_wandb_mode_from_environment_and_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    logger = WandbLogger(dir=tmp_path / "env")
    logger.log({"eval/x": 1.0}, step=0)
    logger.finish()
    assert find_run_files(tmp_path / "env") == []


def test_reader_rejects_foreign_and_corrupt_files(tmp_path):
    with pytest.raises(WandbFileError, match="not a W&B run log"):
        list(read_chunks(b"LEVELDB" + bytes(20)))
    payload = b"hello"
    chunk = struct.pack("<IHB", zlib.crc32(b"\x01" + payload), len(payload), 1) + payload
    header = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
    assert list(read_chunks(header + chunk)) == [payload]
    corrupt = header + chunk[:-1] + b"!"
    with pytest.raises(WandbFileError, match="checksum mismatch"):
        list(read_chunks(corrupt))


def jsonl_rows(path: Path) -> list[dict]:
    """Every line of a metrics file, each of which must parse."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_a_resumed_jsonl_logger_keeps_what_was_logged(tmp_path, monkeypatch):
    """`JSONLLogger("runs/my_run")` as the README writes it, built again by a resumed job, appends."""
    monkeypatch.chdir(tmp_path)
    with JSONLLogger("runs/my_run") as first:
        for step in (0, 10, 20):
            first.log({"eval/x": step / 100}, step)
    with JSONLLogger("runs/my_run") as resumed:
        resumed.log({"eval/x": 0.3}, 30)
    assert [r["step"] for r in jsonl_rows(tmp_path / "runs/my_run/metrics.jsonl")] == [0, 10, 20, 30]


def test_a_step_logged_again_is_appended_warned_once_and_read_as_the_last(tmp_path, caplog):
    """A job resumed from the checkpoint of step 10 re-runs steps 20 and 30; train/loss and eval/x at the
    same step on separate lines are not a repeat."""
    run = tmp_path / "run"
    with JSONLLogger(run) as first:
        for step in (10, 20, 30):
            first.log({"train/loss": 3.0 - step / 100}, step)
            first.log({"eval/x": step / 100}, step)
    assert warnings_of(caplog, "twice") == []
    with JSONLLogger(run) as resumed:
        for step in (20, 30):
            resumed.log({"eval/x": step / 10}, step)
    (warning,) = warnings_of(caplog, "twice")
    assert "step 20" in warning and "eval/x" in warning and "last value" in warning
    assert len(jsonl_rows(run / "metrics.jsonl")) == 8
    history = load_run(run)
    assert history.series["eval/x"] == [(10, 0.1), (20, 2.0), (30, 3.0)]
    assert history.series["train/loss"] == [(10, 2.9), (20, 2.8), (30, 2.7)]
    (note,) = history.notes
    assert "2 step(s) logged more than once" in note and "steps 20, 30" in note


def test_a_resumed_logger_starts_after_a_line_cut_off_by_a_killed_job(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/x": 0.5}\n{"step": 10, "eval/')
    with JSONLLogger(run) as resumed:
        resumed.log({"eval/x": 0.7}, 10)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines[1] == '{"step": 10, "eval/'
    assert [json.loads(line) for line in (lines[0], lines[2])] == [
        {"step": 0, "eval/x": 0.5},
        {"step": 10, "eval/x": 0.7},
    ]
    assert load_run(run).series["eval/x"] == [(0, 0.5), (10, 0.7)]


def full_disk_run(tmp_path: Path) -> Path:
    """A run directory whose metrics.jsonl is /dev/full (every write fails with ENOSPC) and whose
    config.json is a directory (the rename onto it fails)."""
    run = tmp_path / "full"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to("/dev/full")
    (run / "config.json").mkdir()
    return run


def test_a_full_disk_never_stops_training_and_warns_once_per_kind(tmp_path, caplog):
    """Every call returns, one warning for the writes and one for the config; a second logger
    beside the failing one still gets every line."""
    healthy = tmp_path / "healthy"
    logger = MultiLogger([JSONLLogger(full_disk_run(tmp_path)), JSONLLogger(healthy)])
    logger.log_config({"eval_interval": 10})
    for step in range(3):
        logger.log({"eval/x": float(step)}, step)
    logger.finish()
    (write_warning,) = warnings_of(caplog, "metrics at step")
    assert "step 0" in write_warning and "No space left on device" in write_warning
    assert len(warnings_of(caplog, "config not written")) == 1
    assert [r["step"] for r in jsonl_rows(healthy / "metrics.jsonl")] == [0, 1, 2]


def test_run_and_log_returns_the_figures_when_the_disk_is_full(data_root, neox_tokenizer, tmp_path, caplog):
    config = EvaluatorConfig(
        evaluators=[{"task": "piqa", "limit": 4, "batch_tokens": 1024}], data_root=str(data_root)
    )
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=256))
    with JSONLLogger(full_disk_run(tmp_path)) as logger:
        metrics = run_and_log(evaluator, model, step=7, logger=logger)
    assert metrics[SECONDS_KEY] > 0 and "eval/downstream/piqa/acc" in metrics
    assert len(warnings_of(caplog, "No space left on device")) == 1


# A file-size limit makes the kernel write part of a line and fail the rest (EFBIG), as a nearly full disk
# does: the logger must cut the part back out and write the next line whole once there is room again.
_PARTIAL_WRITE_SCRIPT = """
import os, resource, signal, sys
from inloop_eval.loggers import JSONLLogger

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of killing the process
logger = JSONLLogger(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(logger.path) + 20, hard))
logger.log({"eval/x": 1.0, "eval/long_key_that_crosses_the_limit": 1.0}, 1)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
logger.log({"eval/x": 2.0}, 2)
logger.finish()
"""


def test_a_write_that_fails_halfway_leaves_no_partial_line(tmp_path):
    """The file ends in a line a killed job cut off; the failed write is removed and the next line still
    starts on a line of its own."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/x": 0.0}\n{"step": 5, "eval/')
    repo = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", _PARTIAL_WRITE_SCRIPT, str(run)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 1 not written" in proc.stderr and "File too large" in proc.stderr
    assert (run / "metrics.jsonl").read_text().splitlines() == [
        '{"step": 0, "eval/x": 0.0}',
        '{"step": 5, "eval/',
        '{"step": 2, "eval/x": 2.0}',
    ]


class BrokenLogger(MetricsLogger):
    """A logger written elsewhere that raises from every call."""

    def log(self, metrics, step):
        raise OSError(5, "Input/output error")

    def finish(self):
        raise RuntimeError("cannot close")


def test_multilogger_keeps_going_past_a_logger_that_raises(tmp_path, caplog):
    with MultiLogger([BrokenLogger(), JSONLLogger(tmp_path)]) as logger:
        logger.log({"eval/x": 1.0}, 0)
        logger.log({"eval/x": 2.0}, 1)
    assert [r["step"] for r in jsonl_rows(tmp_path / "metrics.jsonl")] == [0, 1]
    assert len(warnings_of(caplog, "BrokenLogger.log failed")) == 1
    assert len(warnings_of(caplog, "BrokenLogger.finish failed")) == 1


def test_wandb_logger_survives_its_run_finished_under_it(tmp_path, monkeypatch, caplog):
    """`wandb.finish()` called elsewhere (transformers' W&B callback does it at the end of training) makes
    W&B raise UsageError on every later call to the run."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    import wandb

    logger = WandbLogger(dir=tmp_path, settings={"x_disable_stats": True})
    wandb.finish()
    logger.log({"eval/x": 1.0}, step=0)
    logger.log({"eval/x": 2.0}, step=1)
    logger.log_config({"eval_interval": 10})
    logger.finish()
    (log_warning,) = warnings_of(caplog, "WandbLogger.log at")
    assert "UsageError" in log_warning and "step 0" in log_warning
    assert len(warnings_of(caplog, "WandbLogger.log_config")) == 1


def test_a_value_or_step_that_is_not_a_number_is_left_out_not_raised(tmp_path, caplog):
    with JSONLLogger(tmp_path) as logger:
        logger.log({"eval/x": 1.0}, float("inf"))
        logger.log({"eval/x": None, "eval/y": 10**400, "eval/z": 2.0}, 3)
    assert jsonl_rows(tmp_path / "metrics.jsonl") == [{"step": 3, "eval/z": 2.0}]
    assert len(warnings_of(caplog, "step inf is not an integer")) == 1
    assert len(warnings_of(caplog, "is not a number")) == 2
