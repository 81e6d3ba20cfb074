"""One bad checkpoint never stops the others: a distributed checkpoint missing a shard or holding a tensor of
another shape, a safetensors
header without its offsets or claiming 2**62 bytes, a Hugging Face checkpoint missing a tensor or holding one
of another shape, a file or folder the watcher may not read, a model the config cannot take (fewer
positions than `max_length`, another vocabulary), and two folders naming one step. Each is recorded failed
(or warned about) with the reason, and every other checkpoint is evaluated."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
import yaml
from helpers import tiny_neox
from watch_support import (
    claim_a_huge_header,
    dcp_checkpoints,
    drop_data_offsets,
    drop_tensor,
    eval_lines,
    single_file_checkpoints,
    watch_cli,
)
from workers.launch import REPO, worker_env

from inloop_eval.data.root import TOKENIZER_DIR, neox_tokenizer_path
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.watch import WatchConfig, Watcher
from inloop_eval.watch.ledger import LEDGER_FILE, WATCH_DIR, read_jsonl


def eval_config(data_root: Path, **fields) -> dict:
    return {
        "evaluators": [{"task": "piqa", "limit": 3}, {"task": "copa", "limit": 3}],
        "data_root": str(data_root),
        "max_length": 128,
        **fields,
    }


@pytest.fixture(scope="module")
def saved(data_root, tmp_path_factory) -> Path:
    """checkpoint-10, -20, -30 (one model.safetensors each), and short/checkpoint-20: a model of 32
    positions."""
    folder = single_file_checkpoints(tmp_path_factory.mktemp("hf"), data_root, [10, 20, 30])
    single_file_checkpoints(folder / "short", data_root, [20], positions={20: 32})
    return folder


def copy(saved: Path, to: Path, names: list[tuple[str, str]]) -> Path:
    """`to` holding saved folders under new names ((source, name) pairs)."""
    for source, name in names:
        shutil.copytree(saved / source, to / name)
    return to


def same_names(*steps: int) -> list[tuple[str, str]]:
    return [(f"checkpoint-{s}", f"checkpoint-{s}") for s in steps]


def watch(folder: Path, run_dir: Path, data_root: Path, **fields) -> Watcher:
    evaluator_fields = fields.pop("evaluator", {})
    config = WatchConfig(checkpoint_dir=str(folder), run_dir=str(run_dir), once=True, settle_s=0, **fields)
    return Watcher(config, EvaluatorConfig.from_dict(eval_config(data_root, **evaluator_fields)))


def failed_entries(run_dir: Path) -> list[dict]:
    return [e for e in read_jsonl(run_dir / WATCH_DIR / LEDGER_FILE) if e["status"] == "failed"]


def test_a_distributed_checkpoint_missing_a_shard_is_recorded_failed_and_the_others_evaluated(
    data_root, tmp_path
):
    """`step-20/` with its `.metadata` but not its `__0_0.distcp`: torch.distributed.checkpoint raises its
    CheckpointException (a BaseException) naming the shard; step 20 is recorded failed with that reason, 10
    and 30 are evaluated, and once the shard is there a restarted watcher evaluates 20."""
    folder = dcp_checkpoints(tmp_path / "ckpt", [10, 20, 30])
    shard = folder / "step-20" / "__0_0.distcp"
    shard.rename(tmp_path / "shard")
    tokenizer = str(neox_tokenizer_path(data_root))
    fields = {"model_builder": "watch_builders:tiny_neox_model", "evaluator": {"tokenizer": tokenizer}}
    first = watch(folder, tmp_path / "run", data_root, **fields)
    assert first.run() == [10, 30]
    assert "FileNotFoundError" in first.failures[20] and "__0_0.distcp" in first.failures[20]
    (entry,) = failed_entries(tmp_path / "run")
    assert entry["step"] == 20 and entry["retry"] is True and "__0_0.distcp" in entry["reason"]
    (tmp_path / "shard").rename(shard)
    assert watch(folder, tmp_path / "run", data_root, **fields).run() == [20]
    assert sorted(line["step"] for line in eval_lines(tmp_path / "run")) == [10, 20, 30]


def test_a_distributed_checkpoint_tensor_of_another_shape_is_refused_naming_it_then_tried_again(data_root, tmp_path):
    """`step-20/` saved with its input embedding one row short of the model `--model-builder` builds: recorded
    failed (CheckpointDamaged) naming the tensor, the shape saved, the shape expected and the folder, to be tried
    again; saved again whole, it is evaluated by a restarted watcher."""
    folder = dcp_checkpoints(tmp_path / "ckpt", [10, 20])
    state = tiny_neox(seed=20).state_dict()
    rows, width = state["gpt_neox.embed_in.weight"].shape
    state["gpt_neox.embed_in.weight"] = state["gpt_neox.embed_in.weight"][:-1].clone()
    shutil.rmtree(folder / "step-20")
    dcp.save(state, checkpoint_id=str(folder / "step-20"))
    tokenizer = str(neox_tokenizer_path(data_root))
    fields = {"model_builder": "watch_builders:tiny_neox_model", "evaluator": {"tokenizer": tokenizer}}
    first = watch(folder, tmp_path / "run", data_root, **fields)
    assert first.run() == [10]
    expected = (
        f"{folder / 'step-20'}: tensor 'gpt_neox.embed_in.weight' is saved with shape [{rows - 1}, {width}], "
        f"but the model it is read into holds [{rows}, {width}]"
    )
    assert expected in first.failures[20], first.failures
    (entry,) = failed_entries(tmp_path / "run")
    assert entry["retry"] is True and expected in entry["reason"]
    shutil.rmtree(folder / "step-20")
    dcp_checkpoints(folder, [20])
    assert watch(folder, tmp_path / "run", data_root, **fields).run() == [20]


def test_an_interrupt_while_loading_still_stops_the_watcher(data_root, tmp_path):
    """Catching the CheckpointException (a BaseException) must not swallow Ctrl-C."""
    folder = dcp_checkpoints(tmp_path / "ckpt", [10])
    fields = {"model_builder": "watch_builders:interrupted"}
    tokenizer = str(neox_tokenizer_path(data_root))
    with pytest.raises(KeyboardInterrupt):
        watch(folder, tmp_path / "run", data_root, **fields, evaluator={"tokenizer": tokenizer}).run()


def test_a_damaged_safetensors_header_is_recorded_failed_and_the_others_evaluated(saved, data_root, tmp_path):
    folder = copy(saved, tmp_path / "ckpt", same_names(10, 20, 30))
    name = drop_data_offsets(folder / "checkpoint-20" / "model.safetensors")
    first = watch(folder, tmp_path / "run", data_root)
    assert first.run() == [10, 30]
    assert f"gives tensor {name!r} no data_offsets" in first.failures[20]
    assert [e["step"] for e in failed_entries(tmp_path / "run")] == [20]
    # A restarted watcher looks at it again (it may have been saved again), and fails it again.
    again = watch(folder, tmp_path / "run", data_root)
    assert again.run() == [] and list(again.failures) == [20]


def test_a_safetensors_header_claiming_2_62_bytes_is_refused_naming_the_file(saved, data_root, tmp_path):
    folder = copy(saved, tmp_path / "ckpt", same_names(10, 20))
    damaged = folder / "checkpoint-20" / "model.safetensors"
    claim_a_huge_header(damaged)
    first = watch(folder, tmp_path / "run", data_root)
    assert first.run() == [10]
    assert f"{damaged}: its header says it is {2**62} bytes long" in first.failures[20]
    assert "MemoryError" not in first.failures[20]


@pytest.mark.parametrize("cut_a_row", [False, True], ids=["missing", "reshaped"])
def test_a_checkpoint_missing_a_tensor_or_of_another_shape_is_refused_naming_it_then_tried_again(
    saved, data_root, tmp_path, cut_a_row
):
    """Step 20's model.safetensors without one matrix, or with it one row short: not scored with that tensor
    initialised at random; recorded failed naming the tensor and the file, to be tried again, and evaluated
    by a restarted watcher once the file is saved again."""
    folder = copy(saved, tmp_path / "ckpt", same_names(10, 20))
    damaged = folder / "checkpoint-20" / "model.safetensors"
    name = drop_tensor(damaged, cut_a_row=cut_a_row)
    first = watch(folder, tmp_path / "run", data_root)
    assert first.run() == [10]
    assert f"{name!r}" in first.failures[20] and "model.safetensors" in first.failures[20], first.failures
    assert ("has shape" if cut_a_row else "model.safetensors holds no tensor") in first.failures[20]
    (entry,) = failed_entries(tmp_path / "run")
    assert entry["retry"] is True
    shutil.copy(saved / "checkpoint-20" / "model.safetensors", damaged)
    assert watch(folder, tmp_path / "run", data_root).run() == [20]


def test_a_safetensors_file_truncated_while_read_in_one_process_is_skipped_with_a_log_line(saved, data_root, tmp_path):
    """`inloop-eval watch` (one process, no layout) whose read of step 20's model.safetensors finds it truncated
    to half right after transformers opens it (tests/support/workers/hf_truncated_read.py): no SIGBUS (the file
    is read into memory, never mapped), no traceback; step 20 logged as deleted or rewritten while being read,
    recorded `vanished`, nothing logged for it; step 10 evaluated. Saved again, step 20 is evaluated by a
    restarted watcher."""
    folder = copy(saved, tmp_path / "ckpt", same_names(10, 20))
    target = folder / "checkpoint-20" / "model.safetensors"
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    run_dir = tmp_path / "run"
    args = [str(folder), "--config", str(config), "--run-dir", str(run_dir), "--once", "--settle", "0"]
    worker = REPO / "tests" / "support" / "workers" / "hf_truncated_read.py"
    done = subprocess.run(
        [sys.executable, str(worker), *args], cwd=REPO, env=worker_env(WATCH_TEST_TRUNCATE=str(target)),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode in (0, 1), f"exit {done.returncode}: " + done.stderr[-3000:]
    assert target.stat().st_size < (saved / "checkpoint-20" / "model.safetensors").stat().st_size  # truncated
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"step 20: {folder / 'checkpoint-20'} was deleted or rewritten while being read" in done.stderr
    assert [line["step"] for line in eval_lines(run_dir)] == [10]
    ledger = read_jsonl(run_dir / WATCH_DIR / LEDGER_FILE)
    assert [e["step"] for e in ledger if e["status"] == "vanished"] == [20]
    shutil.copy(saved / "checkpoint-20" / "model.safetensors", target)
    assert watch(folder, run_dir, data_root).run() == [20]


def test_checkpoints_without_read_permission_are_recorded_failed_and_the_others_evaluated(saved, data_root, tmp_path):
    """`inloop-eval watch` in a process that obeys file permissions (root's override dropped): step 20's
    `model.safetensors` mode 000, and step 25's whole folder (one run for both, so the command starts once)."""
    folder = copy(saved, tmp_path / "ckpt", [*same_names(10, 20, 30), ("checkpoint-20", "checkpoint-25")])
    unreadable = [folder / "checkpoint-20" / "model.safetensors", folder / "checkpoint-25"]
    for target in unreadable:
        target.chmod(0)
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    run_dir = tmp_path / "run"
    try:
        done = watch_cli(
            str(folder),
            "--config",
            str(config),
            "--run-dir",
            str(run_dir),
            "--once",
            "--settle",
            "0",
            obey_permissions=True,
        )
    finally:
        for target in unreadable:
            target.chmod(0o755)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    closing = next(line for line in done.stdout.splitlines() if line.startswith("watch: evaluated"))
    evaluated, *failures = closing.split("; step ")
    assert evaluated == "watch: evaluated 2 checkpoints: steps 10, 30", closing
    assert [failure.partition(" failed: ")[0] for failure in failures] == ["20", "25"], closing
    assert all("PermissionError" in failure for failure in failures), closing
    assert sorted(line["step"] for line in eval_lines(run_dir)) == [10, 30]


def test_a_checkpoint_the_config_cannot_take_is_recorded_failed_and_later_ones_evaluated(
    saved, data_root, tmp_path, caplog
):
    """Step 20 a model of 32 positions under `max_length: 128`, step 40 trained with another tokenizer (its
    tokenizer.json OLMo's): both recorded failed with the reason, 10 and 30 evaluated; a restart under the
    same config does not try them again, one under another config does."""
    names = [
        *same_names(10, 30),
        ("short/checkpoint-20", "checkpoint-20"),
        ("checkpoint-10", "checkpoint-40"),
    ]
    folder = copy(saved, tmp_path / "ckpt", names)
    shutil.copy(
        data_root / TOKENIZER_DIR / "gpt-neox-olmo-dolma-v1_5.json",
        folder / "checkpoint-40" / "tokenizer.json",
    )
    with caplog.at_level(logging.INFO, logger="inloop_eval.watch"):
        first = watch(folder, tmp_path / "run", data_root)
        assert first.run() == [10, 30]
    assert "max_length 128 is longer than the 32 positions" in first.failures[20]
    assert "does not match the one" in first.failures[40]
    assert "step 20" in caplog.text and "not tried again under this config" in caplog.text
    assert all(e["retry"] is False for e in failed_entries(tmp_path / "run"))
    assert sorted(line["step"] for line in eval_lines(tmp_path / "run")) == [10, 30]
    again = watch(folder, tmp_path / "run", data_root)
    assert again.run() == [] and again.failures == {}
    assert again.planner.before == {
        "in metrics.jsonl": [10, 30],
        "failed: the config cannot take it": [20, 40],
    }
    other = watch(folder, tmp_path / "run", data_root, evaluator={"outcomes": False})
    assert other.run() == [] and sorted(other.failures) == [20, 40]


def test_two_folders_naming_one_step_are_warned_about_and_evaluated_once(saved, data_root, tmp_path, caplog):
    """checkpoint-10 and checkpoint-00010 (other weights): a warning naming both, checkpoint-10 evaluated (the
    name Hugging Face gives), one metrics line at step 10, and a restart evaluates neither again."""
    names = [*same_names(10, 30), ("checkpoint-20", "checkpoint-00010")]
    folder = copy(saved, tmp_path / "ckpt", names)
    with caplog.at_level(logging.WARNING, logger="inloop_eval.watch"):
        assert watch(folder, tmp_path / "run", data_root).run() == [10, 30]
    assert f"{folder / 'checkpoint-10'} and {folder / 'checkpoint-00010'} all name step 10" in caplog.text
    assert "only checkpoint-10 is evaluated" in caplog.text
    started = [
        e["checkpoint"]
        for e in read_jsonl(tmp_path / "run" / WATCH_DIR / LEDGER_FILE)
        if e["status"] == "started"
    ]
    assert started == [str(folder / "checkpoint-10"), str(folder / "checkpoint-30")]
    assert [line["step"] for line in eval_lines(tmp_path / "run")] == [10, 30]
    assert watch(folder, tmp_path / "run", data_root).run() == []
