"""Loggers: the no-op default, JSON lines, and a real offline W&B run read back from its `.wandb` file."""

from __future__ import annotations

import json
import logging
import math
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch

import inloop_eval.loggers.jsonl as jsonl_module
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


def test_null_logger_accepts_everything_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for logger in (MetricsLogger(), NullLogger(), MultiLogger([NullLogger()])):
        with logger as entered:
            assert entered is logger
            assert logger.log_config({"a": 1}) is None
            assert logger.log({"eval/x": 1.0}, step=3) is None
            assert logger.log_outcomes({}, step=3) is None
    assert list(tmp_path.iterdir()) == []


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
    """`JSONLLogger("runs/my_run")` as the README writes it, built again by a resumed job."""
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


def run_script(script: str, *args: str) -> subprocess.Popen:
    """Start `python -c script *args` with this checkout first on the path; stdout and stderr piped."""
    repo = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


# A file-size limit makes the kernel write part of a line, as a nearly full disk does: the logger must cut
# the part back out and write the next line whole once there is room again.
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
    proc = run_script(_PARTIAL_WRITE_SCRIPT, str(run))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    # One write per line: the kernel writes what fits and reports no error for the rest.
    assert "step 1 not written" in err and "bytes fit: the disk or the file size limit is full" in err
    assert (run / "metrics.jsonl").read_text().splitlines() == [
        '{"step": 0, "eval/x": 0.0}',
        '{"step": 5, "eval/',
        '{"step": 2, "eval/x": 2.0}',
    ]


# One of several writers sharing a metrics.jsonl on a disk that keeps filling: before each line the file size
# limit lands somewhere in the next line or two (other jobs fill and free the disk), so most writes fail
# whole or partway while the other writer appends. Prints the steps `JSONLLogger` reported written.
_SHARED_LOG_SCRIPT = """
import json, os, pathlib, random, resource, signal, sys, time
from inloop_eval.loggers import JSONLLogger

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of killing the process
run, writer, n_lines, n_writers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(writer)
logger = JSONLLogger(run)
# Start together (imports take seconds on a busy machine), so that the writers overlap.
pathlib.Path(run, f"ready-{writer}").touch()
while len(list(pathlib.Path(run).glob("ready-*"))) < n_writers:
    time.sleep(0.01)
written = []
write = logger._write
def recording_write(*args):
    ok = write(*args)
    if ok:
        written.append(args[-1])
    return ok
logger._write = recording_write
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
for step in range(n_lines):
    room = os.path.getsize(logger.path) + rng.randrange(0, 200)
    resource.setrlimit(resource.RLIMIT_FSIZE, (room, hard))
    logger.log({f"eval/{writer}/{i}": step + i / 10 for i in range(rng.randrange(1, 6))}, step)
logger.finish()
print(json.dumps(written))
"""


def test_two_writers_on_a_filling_disk_lose_no_line_and_leave_no_part(tmp_path):
    """Two processes log to one metrics.jsonl while writes keep failing whole or partway: every line a writer
    was told is written is in the file whole, once; nothing else is (no cut lines, no NUL bytes)."""
    run = tmp_path / "run"
    writers = ("a", "b")
    procs = {w: run_script(_SHARED_LOG_SCRIPT, str(run), w, "1000", str(len(writers))) for w in writers}
    believed = {}
    for writer, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert "not written" in err  # the disk did fill for this writer
        believed[writer] = json.loads(out)
    data = (run / "metrics.jsonl").read_bytes()
    assert b"\0" not in data
    found = {w: [] for w in writers}
    for line in data.decode().splitlines():
        row = json.loads(line)  # every line whole
        (writer,) = {key.split("/")[1] for key in row if key != "step"}
        found[writer].append(row["step"])
    for writer in writers:
        assert 0 < len(believed[writer]) < 1000
        assert found[writer] == believed[writer]


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


def test_a_writer_whose_lock_is_held_waits_briefly_then_writes_whole(tmp_path, monkeypatch, caplog):
    """Another writer holding the file's lock (a stopped process) delays a line by LOCK_WAIT_S, never more."""
    monkeypatch.setattr(jsonl_module, "LOCK_WAIT_S", 0.2)
    with JSONLLogger(tmp_path) as logger, open(logger.path, "ab") as holder:
        fcntl = pytest.importorskip("fcntl")
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        started = time.monotonic()
        logger.log({"eval/x": 1.0}, 0)
        logger.log({"eval/x": 2.0}, 1)
        assert time.monotonic() - started < 2.0
    assert jsonl_rows(tmp_path / "metrics.jsonl") == [{"step": 0, "eval/x": 1.0}, {"step": 1, "eval/x": 2.0}]
    assert len(warnings_of(caplog, "cannot lock")) == 1


def strict_json(line: str) -> dict:
    """`line` parsed as strict JSON (RFC 8259 has no NaN or Infinity), as jq or a JavaScript reader would."""

    def reject(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=reject)


def test_non_finite_figures_are_written_as_null_and_read_back_as_nan(tmp_path, caplog):
    with JSONLLogger(tmp_path) as logger:
        logger.log(
            {"eval/downstream/piqa/acc": float("nan"), "eval/lm/c4/ppl": float("inf"), "eval/x": 1.0}, 0
        )
        logger.log({"eval/downstream/piqa/acc": 0.5, "eval/lm/c4/ppl": -float("inf")}, 1)
    rows = [strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 0, "eval/downstream/piqa/acc": None, "eval/lm/c4/ppl": None, "eval/x": 1.0},
        {"step": 1, "eval/downstream/piqa/acc": 0.5, "eval/lm/c4/ppl": None},
    ]
    (warning,) = warnings_of(caplog, "not a finite number")
    assert "eval/downstream/piqa/acc = nan at step 0" in warning and "null" in warning
    series = load_run(tmp_path).series
    assert [s for s, _ in series["eval/downstream/piqa/acc"]] == [0, 1]
    assert (
        math.isnan(series["eval/downstream/piqa/acc"][0][1])
        and series["eval/downstream/piqa/acc"][1][1] == 0.5
    )


def test_a_file_with_bare_nan_from_an_older_logger_is_still_read(tmp_path, caplog):
    """Files written before NaN became null hold bare NaN and Infinity: a resumed logger and the report read
    them."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/x": NaN, "eval/y": Infinity}\n')
    with JSONLLogger(tmp_path) as resumed:
        resumed.log({"eval/x": 0.5}, 0)
    assert "step 0 twice" in warnings_of(caplog, "twice")[0]  # the old line was read
    series = load_run(tmp_path).series
    assert series["eval/x"] == [(0, 0.5)] and series["eval/y"] == [(0, math.inf)]
