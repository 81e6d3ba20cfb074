"""The watcher beside a real OLMo-core `Trainer` on CPU: `inloop-eval watch` in another process evaluates
every checkpoint once, with the figures the in-loop callback recorded at the same steps; and on copies of
those checkpoints: killed and restarted, a slow writer, a checkpoint deleted or rewritten while read, and
steps the loop already evaluated; and under a 2-rank process group in sharded layouts (FSDP, TP=2), each rank
reading only its shards: the same figures, and exactly once across a SIGKILL of the whole job and a
restart, and a shard rewritten in place while a rank reads it."""

from __future__ import annotations

import json
import logging
import math
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import EXACT
from watch_support import eval_lines, olmo_eval_yaml, train_olmo_core, wait_for
from workers.launch import REPO, LaunchFailed, launch, read_ranks, worker_env

from inloop_eval.config_fields import read_config_file
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.watch import WatchConfig, Watcher
from inloop_eval.watch.ledger import LEDGER_FILE, WATCH_DIR, read_jsonl

STEPS = 4
SAVE_INTERVAL = 2
SAVED = [0, 2, 4]  # OLMo-core saves the starting weights too
WATCH_TIMEOUT_S = 300


def watch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "inloop_eval.cli", "watch", *args]


def ledger(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / WATCH_DIR / LEDGER_FILE)


def statuses(run_dir: Path, status: str) -> list[int]:
    return [e["step"] for e in ledger(run_dir) if e["status"] == status]


@pytest.fixture(scope="module")
def live(data_root, tmp_path_factory):
    """The trainer in this process saving every SAVE_INTERVAL steps, evaluating in the loop at those steps,
    while `inloop-eval watch --redo-in-loop` runs in another process from before the first checkpoint."""
    work = tmp_path_factory.mktemp("live")
    config = olmo_eval_yaml(data_root, work / "eval.yaml", SAVE_INTERVAL)
    run_dir = work / "sidecar"
    args = [str(work / "save"), "--config", str(config), "--run-dir", str(run_dir), "--settle", "1"]
    args += ["--poll", "0.3", "--until-step", str(STEPS), "--redo-in-loop", "--data-root", str(data_root)]
    watcher = subprocess.Popen(
        watch_command(*args),
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        trained = train_olmo_core(work, data_root, steps=STEPS, save_interval=SAVE_INTERVAL, in_loop=True)
        out, _ = watcher.communicate(timeout=WATCH_TIMEOUT_S)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, out[-5000:]
    return {
        "work": work,
        "save": work / "save",
        "config": config,
        "run_dir": run_dir,
        "trained": trained,
        "out": out,
    }


def test_every_saved_step_is_evaluated_once_by_the_watcher_beside_training(live):
    lines = eval_lines(live["run_dir"])
    assert sorted(line["step"] for line in lines) == SAVED
    assert sorted(statuses(live["run_dir"], "evaluated")) == SAVED
    assert (live["run_dir"] / "outcomes" / "step_4.npz").is_file()
    assert json.loads((live["run_dir"] / "config.json").read_text())["evaluators"][0]["task"] == "piqa"


def test_the_watchers_figures_equal_the_in_loop_evaluation_at_the_same_step(live):
    """Accuracies and counts identical, every other figure within 1e-6 relative, at each step the loop
    evaluated (the same weights: the checkpoint saved after the step's in-loop evaluation)."""
    by_step = {line["step"]: line for line in eval_lines(live["run_dir"])}
    compared = 0
    for step in (2, 4):
        in_loop = {
            k: v for k, v in live["trained"]["logged"][str(step)].items() if k.startswith("eval/downstream/")
        }
        assert in_loop, step
        for key, value in in_loop.items():
            found = by_step[step][key]
            if key.endswith(EXACT):
                assert found == value, (step, key)
            else:
                assert math.isclose(found, value, rel_tol=1e-6, abs_tol=1e-12), (step, key, found, value)
            compared += 1
    assert compared > 40


def copy_checkpoints(save: Path, to: Path, steps: list[int]) -> Path:
    to.mkdir(parents=True)
    for step in steps:
        shutil.copytree(save / f"step{step}", to / f"step{step}")
    return to


def test_steps_the_loop_evaluated_are_not_redone_unless_asked(live, tmp_path):
    """Steps 2 and 4 were evaluated in the loop (their checkpoints' trainer state says so): recorded as
    `in_loop`, not evaluated; step 0 was not, and is."""
    run_dir = tmp_path / "run"
    config = WatchConfig(checkpoint_dir=str(live["save"]), run_dir=str(run_dir), once=True, settle_s=0)
    evaluator_config = EvaluatorConfig.from_dict(read_config_file(live["config"]))
    assert Watcher(config, evaluator_config).run() == [0]
    assert sorted(statuses(run_dir, "in_loop")) == [2, 4]
    assert [line["step"] for line in eval_lines(run_dir)] == [0]


def test_a_watcher_killed_mid_run_and_restarted_evaluates_each_step_exactly_once(live, tmp_path):
    folder = copy_checkpoints(live["save"], tmp_path / "save", SAVED)
    run_dir = tmp_path / "run"
    args = [str(folder), "--config", str(live["config"]), "--run-dir", str(run_dir), "--settle", "0"]
    args += ["--poll", "0.2", "--once", "--redo-in-loop"]
    first = subprocess.Popen(
        watch_command(*args),
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Killed once it has started reading the second checkpoint: mid-evaluation, its figures not logged.
        wait_for(lambda: 2 in statuses(run_dir, "started"), WATCH_TIMEOUT_S, "the watcher reading step 2")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    before = sorted(line["step"] for line in eval_lines(run_dir))
    assert before in ([0], [0, 2])
    second = subprocess.run(
        watch_command(*args),
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=WATCH_TIMEOUT_S,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    counts = {step: 0 for step in SAVED}
    for line in eval_lines(run_dir):
        counts[line["step"]] += 1
    assert counts == {step: 1 for step in SAVED}


def slow_copy(source: Path, target: Path, pause_s: float, done: list[float]) -> None:
    """Copies a checkpoint file by file with pauses, as OLMo-core's order has it: the shards, the DCP
    metadata, OLMo-core's completion marker, then its config; `done` gets the time the last file landed."""
    last = ("model_and_optim/.metadata", ".metadata.json", "config.json")
    files = sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file())
    order = [f for f in files if f not in last] + list(last)
    for name in order:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target / name)
        (target / name).touch()
        time.sleep(pause_s)
    done.append(time.time())


def test_a_checkpoint_written_slowly_is_read_only_once_complete(live, tmp_path):
    """Files appear over seconds, the metadata last: the watcher starts reading only after the last file
    landed, and reads every file of it; its figures are those of the whole checkpoint."""
    folder, run_dir, done = tmp_path / "save", tmp_path / "run", []
    folder.mkdir()
    writer = threading.Thread(target=slow_copy, args=(live["save"] / "step2", folder / "step2", 0.4, done))
    config = WatchConfig(
        checkpoint_dir=str(folder),
        run_dir=str(run_dir),
        settle_s=1.0,
        poll_s=0.1,
        until_step=2,
        redo_in_loop=True,
    )
    evaluator_config = EvaluatorConfig.from_dict(read_config_file(live["config"]))
    writer.start()
    try:
        assert Watcher(config, evaluator_config).run() == [2]
    finally:
        writer.join()
    (started,) = [e for e in ledger(run_dir) if e["status"] == "started"]
    assert started["time"] > done[0]
    (evaluated,) = [e for e in ledger(run_dir) if e["status"] == "evaluated"]
    assert evaluated["files"] == sum(1 for p in (live["save"] / "step2").rglob("*") if p.is_file())
    (line,) = eval_lines(run_dir)
    (whole,) = [x for x in eval_lines(live["run_dir"]) if x["step"] == 2]
    assert line["eval/downstream/piqa/ce_gold"] == whole["eval/downstream/piqa/ce_gold"]


@pytest.mark.parametrize("change", ["delete", "rewrite"])
def test_a_checkpoint_deleted_or_rewritten_while_read_is_skipped_with_a_log_line(
    live, tmp_path, monkeypatch, caplog, change
):
    """The model builder (run between the first look at the files and the read of the weights) deletes the
    checkpoint, or rewrites one of its files: the watcher logs it, records it `vanished`, logs no figures
    for it, and goes on to the next checkpoint."""
    folder = copy_checkpoints(live["save"], tmp_path / "save", [2, 4])
    run_dir = tmp_path / "run"
    monkeypatch.setenv("WATCH_TEST_CHANGE", f"{change}:{folder / 'step2'}")
    config = WatchConfig(
        checkpoint_dir=str(folder),
        run_dir=str(run_dir),
        once=True,
        settle_s=0,
        redo_in_loop=True,
        model_builder="watch_builders:olmo_core_model_changing_a_checkpoint",
    )
    evaluator_config = EvaluatorConfig.from_dict(read_config_file(live["config"]))
    # A rewritten checkpoint is a new one at that step: evaluated once it has landed again.
    expected = [4] if change == "delete" else [4, 2]
    with caplog.at_level(logging.WARNING, logger="inloop_eval.watch.loop"):
        assert Watcher(config, evaluator_config).run() == expected
    assert "step 2" in caplog.text and "deleted or rewritten while being read" in caplog.text
    assert statuses(run_dir, "vanished") == [2]
    assert [line["step"] for line in eval_lines(run_dir)] == expected


@pytest.fixture(scope="module")
def layouts(live, tmp_path_factory):
    """The watcher under a 2-rank process group in sharded layouts, on the live run's checkpoints
    (tests/support/workers/watch_layouts.py): FSDP over 2 ranks, the whole job SIGKILLed when it starts
    reading step 2, then restarted; then tensor parallel over 2 ranks. Every rank's result and the run
    directories."""
    work = tmp_path_factory.mktemp("layouts")
    args = [str(REPO / "tests" / "support" / "workers" / "watch_layouts.py"), "--save", str(live["save"])]
    args += ["--config", str(live["config"]), "--run-root", str(work / "runs"), "--out", str(work / "out")]
    with pytest.raises(LaunchFailed) as killed:
        launch(2, [*args, "--kill-at", "2"], timeout=WATCH_TIMEOUT_S)
    before_restart = sorted(line["step"] for line in eval_lines(work / "runs" / "fsdp"))
    launch(2, args, timeout=2 * WATCH_TIMEOUT_S)
    return {
        "killed": killed.value.ranks,
        "before_restart": before_restart,
        "ranks": read_ranks(work / "out", 2),
        "runs": work / "runs",
    }


def test_a_2_rank_fsdp_watcher_killed_and_restarted_evaluates_each_step_exactly_once(layouts):
    assert layouts["killed"][0].returncode == -signal.SIGKILL
    assert layouts["before_restart"] == [0]
    assert 2 in statuses(layouts["runs"] / "fsdp", "started")
    counts = {step: 0 for step in SAVED}
    for line in eval_lines(layouts["runs"] / "fsdp"):
        counts[line["step"]] += 1
    assert counts == {step: 1 for step in SAVED}
    assert [r["fsdp"]["evaluated"] for r in layouts["ranks"]] == [[2, 4], [2, 4]]


@pytest.mark.parametrize("layout", ["fsdp", "tp2"])
def test_a_sharded_watchers_figures_equal_the_in_loop_evaluation(live, layouts, layout):
    """FSDP and TP=2 over 2 ranks: accuracies and counts identical to the in-loop callback's at steps 2 and
    4, every other figure within 1e-6 relative."""
    by_step = {line["step"]: line for line in eval_lines(layouts["runs"] / layout)}
    assert sorted(by_step) == SAVED
    compared = 0
    for step in (2, 4):
        in_loop = {k: v for k, v in live["trained"]["logged"][str(step)].items() if k.startswith("eval/downstream/")}
        for key, value in in_loop.items():
            found = by_step[step][key]
            if key.endswith(EXACT):
                assert found == value, (layout, step, key)
            else:
                assert math.isclose(found, value, rel_tol=1e-6, abs_tol=1e-12), (layout, step, key, found, value)
            compared += 1
    assert compared > 40


def test_a_shard_rewritten_in_place_while_read_is_skipped_then_evaluated_again(layouts):
    """FSDP over 2 ranks, rank 0's shard truncated under its shard reader and written back (DCP's writer
    rewriting it "wb"): no SIGBUS; the step recorded `vanished`, naming the shard, then evaluated once its
    files have settled again, by both ranks."""
    run_dir = layouts["runs"] / "rewritten"
    (vanished,) = [e for e in ledger(run_dir) if e["status"] == "vanished"]
    assert vanished["step"] == 2 and ".distcp" in vanished["reason"], vanished
    assert [r["rewritten"]["evaluated"] for r in layouts["ranks"]] == [[2], [2]]
    assert [line["step"] for line in eval_lines(run_dir)] == [2]


def overlap(a: dict, b: dict) -> bool:
    return all(
        o1 < o2 + n2 and o2 < o1 + n1
        for o1, n1, o2, n2 in zip(a["offsets"], a["lengths"], b["offsets"], b["lengths"], strict=True)
    )


@pytest.mark.parametrize("layout", ["fsdp", "tp2"])
def test_each_shard_of_the_model_is_read_by_one_rank_only(live, layouts, layout):
    """Per checkpoint, what the two ranks read (each a region of a stored tensor, read in place) covers every
    model tensor; the regions of two ranks never overlap, except for a tensor both hold whole (the norms,
    which tensor parallelism replicates); each rank reads at most 51% of the model's bytes."""
    import torch.distributed.checkpoint as dcp

    for step in (2, 4):
        metadata = dcp.FileSystemReader(str(live["save"] / f"step{step}" / "model_and_optim")).read_metadata()
        sizes = {k: v.size for k, v in metadata.state_dict_metadata.items() if k.startswith("model.")}
        reads = [r[layout]["reads"][str(step)] for r in layouts["ranks"]]
        assert {x["fqn"] for x in reads[0]} == {x["fqn"] for x in reads[1]} == set(sizes)
        assert all(x["in_place"] for rank in reads for x in rank)
        replicated = 0
        for fqn, size in sizes.items():
            regions = [[x for x in rank if x["fqn"] == fqn] for rank in reads]
            elements = sum(math.prod(x["lengths"]) for rank in regions for x in rank)
            if any(overlap(a, b) for a in regions[0] for b in regions[1]):
                assert [[x["lengths"] for x in rank] for rank in regions] == [[list(size)]] * 2, fqn
                replicated += 1
            else:
                assert elements == size.numel(), fqn  # disjoint boxes of the tensor: each element read once
        assert replicated == (0 if layout == "fsdp" else sum(1 for f in sizes if f.endswith("norm.weight")))
        whole = sum(size.numel() * 4 for size in sizes.values())
        for rank in reads:
            assert sum(x["nbytes"] for x in rank) <= 0.51 * whole
