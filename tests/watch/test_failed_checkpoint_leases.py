"""Leases never hold training's disk for as long as a watcher runs: a checkpoint that failed for good (the
config cannot take it) is released at once; one that failed and is tried again once its files change (a
damaged header here; an out-of-memory load alike) is held `--hold-failed` seconds past its failure (default
`--lease`), then released while the watcher goes on, and held again and evaluated once its files are
mended. `inloop-eval watch` runs as a user runs it, without `--once`, and is killed at the end."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from watch_support import drop_data_offsets, single_file_checkpoints, wait_for
from workers.launch import REPO, worker_env

from inloop_eval.checkpoints.leases import held, lease_folder
from inloop_eval.watch.ledger import LEDGER_FILE, WATCH_DIR, read_jsonl

TIMEOUT_S = 240
SLACK_S = 5  # the lease keeper's look (a third of --lease at most) and a loaded machine


@pytest.fixture(scope="module")
def saved(data_root, tmp_path_factory) -> Path:
    """checkpoint-10 and checkpoint-20 (a model of 32 positions: `max_length: 128` cannot take it)."""
    folder = single_file_checkpoints(tmp_path_factory.mktemp("hf"), data_root, [10])
    return single_file_checkpoints(folder, data_root, [20], positions={20: 32})


def failed_at(run_dir: Path) -> dict[int, dict]:
    path = run_dir / WATCH_DIR / LEDGER_FILE
    return {e["step"]: e for e in (read_jsonl(path) if path.is_file() else []) if e["status"] == "failed"}


def lease_files(checkpoint: Path) -> list[Path]:
    folder = lease_folder(checkpoint)
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("hold", [[], ["--hold-failed", "8"]], ids=["default", "hold-failed-8"])
def test_a_failed_checkpoint_is_held_at_most_its_hold_past_the_failure_while_the_watcher_runs(
    saved, data_root, tmp_path, hold
):
    folder = tmp_path / "save"
    shutil.copytree(saved, folder)
    damaged, unfit = folder / "checkpoint-10", folder / "checkpoint-20"
    weights = damaged / "model.safetensors"
    shutil.copy(weights, tmp_path / "model.safetensors")
    drop_data_offsets(weights)
    config = tmp_path / "eval.yaml"
    evaluators = [{"task": "piqa", "limit": 3}]
    config.write_text(yaml.safe_dump({"evaluators": evaluators, "data_root": str(data_root), "max_length": 128}))
    run_dir, lease_s = tmp_path / "run", 2
    hold_s = float(hold[1]) if hold else lease_s
    args = [str(folder), "--config", str(config), "--run-dir", str(run_dir), "--settle", "0", "--poll", "0.2"]
    with (tmp_path / "watch.log").open("w") as log:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "inloop_eval.cli", "watch", *args, "--lease", str(lease_s), *hold],
            cwd=REPO,
            env=worker_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: 10 in failed_at(run_dir), TIMEOUT_S, "the damaged checkpoint failing")
        failed = failed_at(run_dir)[10]
        assert failed["retry"] is True, failed
        if hold:  # held past --lease: still held a while after what --lease alone would allow
            time.sleep(max(0.0, failed["time"] + lease_s + SLACK_S / 2 - time.time()))
            assert time.time() < failed["time"] + hold_s and held(damaged)
        wait_for(lambda: not lease_files(damaged), hold_s + SLACK_S, "the failed checkpoint released")
        assert hold_s - 1 <= time.time() - failed["time"] <= hold_s + SLACK_S
        wait_for(lambda: 20 in failed_at(run_dir), TIMEOUT_S, "the checkpoint the config cannot take failing")
        assert failed_at(run_dir)[20]["retry"] is False
        wait_for(lambda: not lease_files(unfit), SLACK_S, "the checkpoint the config cannot take released")
        assert watcher.poll() is None, (tmp_path / "watch.log").read_text()[-3000:]
        time.sleep(1)  # several looks of the lease keeper: not leased again while its files are as they were
        assert not lease_files(damaged) and damaged.is_dir()
        if not hold:  # mended: tried again, held meanwhile, evaluated, released
            shutil.copy(tmp_path / "model.safetensors", weights)
            evaluated = lambda: any(  # noqa: E731
                e["status"] == "evaluated" and e["step"] == 10
                for e in read_jsonl(run_dir / WATCH_DIR / LEDGER_FILE)
            )
            wait_for(evaluated, TIMEOUT_S, "the mended checkpoint evaluated")
            wait_for(lambda: not lease_files(damaged), SLACK_S, "its lease released once evaluated")
    finally:
        watcher.send_signal(signal.SIGKILL)
        watcher.wait(timeout=60)
    log_text = (tmp_path / "watch.log").read_text()
    assert f"{damaged} failed" in log_text and "its lease is released" in log_text, log_text[-3000:]
