"""Loggers: the no-op default, JSON lines, and a real offline W&B run read back from its `.wandb` file."""

from __future__ import annotations

import json
import struct
import sys
import time
import zlib

import pytest

from inloop_eval.loggers import JSONLLogger, MetricsLogger, MultiLogger, NullLogger, WandbLogger
from inloop_eval.wandb_file import (
    BLOCK_SIZE,
    WandbFileError,
    find_run_files,
    is_finished,
    read_chunks,
    read_config,
    read_history,
    read_records,
)


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
