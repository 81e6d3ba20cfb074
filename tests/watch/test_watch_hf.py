"""The watcher on Hugging Face `save_pretrained` checkpoints (sharded safetensors with their index): the
figures of an in-process evaluation of the same model, `--once`, policies `all` and `latest`, the
completion evidence of a shard still being written, clear errors, and W&B figures at the checkpoint's step
read back from an offline run."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import EXACT
from watch_support import eval_lines, hf_checkpoints
from workers.launch import REPO, worker_env

from inloop_eval.data.root import TOKENIZER_DIR
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.loggers import WandbLogger
from inloop_eval.loggers.wandb_file import find_run_files, is_finished, read_history, read_records
from inloop_eval.watch import Checkpoint, WatchConfig, Watcher, WatchError
from inloop_eval.watch.completion import missing_evidence
from inloop_eval.watch.ledger import LEDGER_FILE, WATCH_DIR, read_jsonl

STEPS = [10, 20, 30]


def eval_config(data_root: Path, **fields) -> dict:
    """No `tokenizer:`: the watcher takes the Hugging Face checkpoint's own."""
    return {
        "evaluators": [{"task": "piqa", "limit": 5, "batch_tokens": 1024}, {"task": "copa", "limit": 5}],
        "data_root": str(data_root),
        "max_length": 256,
        **fields,
    }


@pytest.fixture(scope="module")
def hf(data_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "checkpoints"
    folder.mkdir()
    return folder, hf_checkpoints(folder, data_root, STEPS)


def copy_steps(source: Path, target: Path, steps: list[int]) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for step in steps:
        shutil.copytree(source / f"checkpoint-{step}", target / f"checkpoint-{step}")
    return target


def watcher(folder: Path, run_dir: Path, data_root: Path, **fields) -> Watcher:
    config = WatchConfig(checkpoint_dir=str(folder), run_dir=str(run_dir), once=True, settle_s=0, **fields)
    return Watcher(config, EvaluatorConfig.from_dict(eval_config(data_root)))


def test_sharded_checkpoints_give_the_figures_of_the_same_model_evaluated_in_process(hf, data_root, tmp_path):
    folder, models = hf
    assert (folder / "checkpoint-10" / "model.safetensors.index.json").is_file()
    assert len(list((folder / "checkpoint-10").glob("model-*.safetensors"))) > 1
    assert watcher(folder, tmp_path / "run", data_root).run() == STEPS
    lines = {line["step"]: line for line in eval_lines(tmp_path / "run")}
    assert sorted(lines) == STEPS
    config = EvaluatorConfig.from_dict({**eval_config(data_root), "tokenizer": str(folder / "checkpoint-10")})
    for step in STEPS:
        expected = InLoopEvaluator(config).run(models[step])
        for key, value in expected.items():
            if key.endswith(EXACT):
                assert lines[step][key] == value, (step, key)
            else:
                assert math.isclose(lines[step][key], value, rel_tol=1e-6, abs_tol=1e-12), (step, key)


def test_policy_latest_evaluates_the_newest_and_records_the_others_skipped(hf, data_root, tmp_path):
    folder, _ = hf
    assert watcher(folder, tmp_path / "run", data_root, policy="latest").run() == [30]
    ledger = read_jsonl(tmp_path / "run" / WATCH_DIR / LEDGER_FILE)
    assert sorted(e["step"] for e in ledger if e["status"] == "skipped") == [10, 20]
    assert all("policy latest" in e["reason"] for e in ledger if e["status"] == "skipped")
    # Restarted with policy `all`: the skipped steps stay skipped, none is evaluated twice.
    assert watcher(folder, tmp_path / "run", data_root).run() == []
    assert [line["step"] for line in eval_lines(tmp_path / "run")] == [30]


def test_a_shard_still_being_written_is_not_evidence_of_a_complete_checkpoint(hf, tmp_path):
    folder, _ = hf
    copy = copy_steps(folder, tmp_path / "ckpt", [10]) / "checkpoint-10"
    checkpoint = Checkpoint(step=10, path=copy, format="hf")
    assert missing_evidence(checkpoint) is None
    shard = sorted(copy.glob("model-*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    assert f"{shard.name} has {len(data) // 2} of its {len(data)} bytes" in missing_evidence(checkpoint)
    shard.unlink()
    assert f"{shard.name} is missing" in missing_evidence(checkpoint)
    (copy / "config.json").unlink()
    assert missing_evidence(checkpoint) == "no config.json yet"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "inloop_eval.cli", "watch", *args]
    return subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=300)


def test_once_from_the_command_line_evaluates_what_is_there_and_exits(hf, data_root, tmp_path):
    folder = copy_steps(hf[0], tmp_path / "ckpt", [10, 20])
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    run_dir = tmp_path / "run"
    done = run_cli(str(folder), "--config", str(config), "--run-dir", str(run_dir), "--once", "--settle", "0")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"watch: {folder} -> run directory {run_dir}" in done.stdout
    assert "watch: evaluated 2 checkpoints: steps 10, 20" in done.stdout
    assert [line["step"] for line in eval_lines(run_dir)] == [10, 20]
    assert (run_dir / "outcomes" / "step_20.npz").is_file()


def test_a_folder_without_checkpoints_is_a_clear_error(data_root, tmp_path):
    (tmp_path / "ckpt" / "logs").mkdir(parents=True)
    (tmp_path / "ckpt" / "model-final").mkdir()
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    done = run_cli(
        str(tmp_path / "ckpt"), "--config", str(config), "--run-dir", str(tmp_path / "run"), "--once"
    )
    assert done.returncode == 2
    assert "holds no checkpoint of a known format: expected folders named checkpoint-<N>" in done.stderr
    assert "found logs/, model-final/" in done.stderr


def test_watching_the_folder_above_the_checkpoints_is_a_clear_error(hf, data_root, tmp_path):
    """Not `--once`: an empty folder is waited for (training has not saved yet), but one whose sub-folder
    holds the checkpoints (torchtitan's dump folder, say) is refused at once, naming that sub-folder."""
    copy_steps(hf[0], tmp_path / "dump" / "checkpoint", [10])
    config = WatchConfig(checkpoint_dir=str(tmp_path / "dump"), run_dir=str(tmp_path / "run"), settle_s=0)
    with pytest.raises(WatchError, match=r"dump/checkpoint holds checkpoints: watch that folder"):
        Watcher(config, EvaluatorConfig.from_dict(eval_config(data_root))).run()


def test_a_tokenizer_that_does_not_match_the_checkpoints_vocabulary_is_a_clear_failure(
    hf, data_root, tmp_path
):
    """Recorded failed before any forward, with what differs; not tried again under the same config."""
    folder = copy_steps(hf[0], tmp_path / "ckpt", [10])
    other = str(data_root / TOKENIZER_DIR / "gpt-neox-olmo-dolma-v1_5.json")
    config = WatchConfig(checkpoint_dir=str(folder), run_dir=str(tmp_path / "run"), once=True, settle_s=0)
    evaluator_config = EvaluatorConfig.from_dict(eval_config(data_root, tokenizer=other))
    watch = Watcher(config, evaluator_config)
    assert watch.run() == []
    message = r"does not match the one .* was trained with: 2 tokens have other ids \(e.g. '<\|endoftext\|>'"
    assert re.search(message, watch.failures[10])
    (failed,) = [e for e in read_jsonl(tmp_path / "run" / WATCH_DIR / LEDGER_FILE) if e["status"] == "failed"]
    assert failed["retry"] is False and re.search(message, failed["reason"])
    assert eval_lines(tmp_path / "run") == []
    again = Watcher(config, evaluator_config)
    assert again.run() == [] and again.failures == {}


def test_a_tokenizer_with_ids_past_the_models_embedding_is_a_clear_failure(data_root, tmp_path):
    """A model embedding fewer ids than the tokenizer has (no tokenizer of its own in the checkpoint)."""
    import transformers

    config = transformers.GPTNeoXConfig(
        vocab_size=1000, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    transformers.GPTNeoXForCausalLM(config).save_pretrained(tmp_path / "ckpt" / "checkpoint-5")
    neox = str(data_root / TOKENIZER_DIR / "gpt-neox-20b.json")
    watch = WatchConfig(
        checkpoint_dir=str(tmp_path / "ckpt"), run_dir=str(tmp_path / "run"), once=True, settle_s=0
    )
    watcher = Watcher(watch, EvaluatorConfig.from_dict(eval_config(data_root, tokenizer=neox)))
    assert watcher.run() == []
    assert re.search("has 50280 tokens but the model of .*checkpoint-5 embeds 1000", watcher.failures[5])


def test_a_second_watcher_on_one_run_directory_is_refused(hf, data_root, tmp_path):
    first = watcher(hf[0], tmp_path / "run", data_root)
    try:
        with pytest.raises(WatchError, match="another watcher holds"):
            watcher(hf[0], tmp_path / "run", data_root)
    finally:
        first.close()


def test_wandb_figures_logged_late_land_at_the_checkpoints_step(hf, data_root, tmp_path, monkeypatch):
    """Step 20 evaluated first, step 10 landing later (a restarted watcher picks it up): in the offline W&B
    run each row holds its checkpoint's `trainer/step`, `eval/*` is plotted against it, and W&B's own
    `_step` counts every row (none dropped as "step must increase")."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    folder = copy_steps(hf[0], tmp_path / "ckpt", [20])
    wandb = WandbLogger(dir=tmp_path / "run", settings={"x_disable_stats": True})
    try:
        assert Watcher(
            WatchConfig(checkpoint_dir=str(folder), run_dir=str(tmp_path / "run"), once=True, settle_s=0),
            EvaluatorConfig.from_dict(eval_config(data_root)),
            loggers=[wandb],
        ).run() == [20]
        copy_steps(hf[0], folder, [10])
        assert Watcher(
            WatchConfig(checkpoint_dir=str(folder), run_dir=str(tmp_path / "run"), once=True, settle_s=0),
            EvaluatorConfig.from_dict(eval_config(data_root)),
            loggers=[wandb],
        ).run() == [10]
    finally:
        wandb.finish()
    (run_file,) = find_run_files(tmp_path / "run")
    import time

    deadline = time.monotonic() + 30
    while not is_finished(run_file):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    rows = [r for r in read_history(run_file) if "trainer/step" in r]
    assert [r["trainer/step"] for r in rows] == [20, 10]
    assert [r["_step"] for r in rows] == [0, 1]
    lines = {line["step"]: line for line in eval_lines(tmp_path / "run")}
    for row in rows:
        assert row["eval/downstream/piqa/acc"] == lines[row["trainer/step"]]["eval/downstream/piqa/acc"]
    defined = {
        r.metric.glob_name or r.metric.name: r.metric.step_metric
        for r in read_records(run_file)
        if r.WhichOneof("record_type") == "metric"
    }
    assert defined["eval/*"] == "trainer/step"


@pytest.fixture(scope="module")
def two_ranks(hf, data_root, tmp_path_factory):
    """One launch of 2 gloo ranks (tests/support/workers/watch_hf_layouts.py) on steps 10 and 20: a watcher
    holding the whole model on every rank, one FSDP over the 2 ranks, one asking for TP=2 (refused), one
    whose rank 1 sees another copy of the folder, one FSDP on a damaged copy then on it repaired; one
    process's watcher beside."""
    from workers.launch import launch

    work = tmp_path_factory.mktemp("two_ranks")
    folder = copy_steps(hf[0], work / "ckpt", [10, 20])
    config = work / "eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(data_root)))
    args = [str(REPO / "tests" / "support" / "workers" / "watch_hf_layouts.py"), "--save", str(folder)]
    args += ["--config", str(config), "--run-root", str(work / "runs"), "--out", str(work / "out")]
    launch(2, args, timeout=480)
    assert watcher(folder, work / "one", data_root).run() == [10, 20]
    ranks = [json.loads((work / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    return {"folder": folder, "runs": work / "runs", "one": work / "one", "ranks": ranks}


@pytest.mark.parametrize("layout", ["two", "fsdp"])
def test_under_torchrun_two_ranks_give_the_one_process_figures(two_ranks, layout):
    """2 gloo ranks, each holding the whole model or FSDP-sharded (`--fsdp`): rank 0 decides and writes,
    both load each checkpoint and share its documents; accuracies equal one process's, the rest within
    float rounding."""
    assert [r[layout]["evaluated"] for r in two_ranks["ranks"]] == [[10, 20]] * 2
    two, one = eval_lines(two_ranks["runs"] / layout), eval_lines(two_ranks["one"])
    assert [line["step"] for line in two] == [10, 20]
    for a, b in zip(two, one, strict=True):
        for key, value in b.items():
            if key.endswith(EXACT) or key == "step":
                assert a[key] == value, key
            elif not key.endswith(("/seconds", "/tokens_forwarded")):
                assert math.isclose(a[key], value, rel_tol=1e-6, abs_tol=1e-9), key


def test_ranks_that_see_different_copies_of_a_checkpoint_are_refused_naming_them(two_ranks):
    """Rank 1 reads another copy of the folder (another mount): step 10 the same files (copied keeping their
    times), evaluated; step 20's first file another copy (other weights): no figures from a model made of
    parts of both, every rank records it failed naming rank 1 and the file."""
    for rank in two_ranks["ranks"]:
        assert rank["copies"]["evaluated"] == [10]
        reason = rank["copies"]["failures"]["20"]
        assert "rank(s) 1 see another copy of" in reason and "checkpoint-20" in reason, reason
        assert ".safetensors: rank 0" in reason, reason
    assert [line["step"] for line in eval_lines(two_ranks["runs"] / "copies")] == [10]


def test_under_fsdp_a_checkpoint_missing_a_tensor_is_refused_naming_it_and_tried_again_once_repaired(two_ranks):
    for rank in two_ranks["ranks"]:
        assert rank["damaged"]["evaluated"] == []
        reason = rank["damaged"]["failures"]["10"]
        assert "model.safetensors.index.json holds no tensor" in reason, reason
        assert "config cannot take it" not in reason
        assert rank["repaired"]["evaluated"] == [10]
    assert [line["step"] for line in eval_lines(two_ranks["runs"] / "damaged")] == [10]


def test_tensor_parallel_hugging_face_checkpoints_are_refused_with_the_remedy(two_ranks):
    for rank in two_ranks["ranks"]:
        assert rank["tp2"]["evaluated"] == []
        for step in ("10", "20"):
            assert "which --tp does not load sharded (only --fsdp does)" in rank["tp2"]["failures"][step]
    assert eval_lines(two_ranks["runs"] / "tp2") == []


def test_under_fsdp_each_rank_reads_only_its_rows_of_the_safetensors(two_ranks):
    """Per checkpoint, the rows the two ranks read of each saved tensor never overlap and cover it (FSDP2's
    `Shard(0)`, uneven splits included); the replicated buffers no file holds are read by neither; each
    rank reads about half of the bytes. The watcher holding the whole model reads nothing sharded."""
    from safetensors import safe_open

    sizes = {}
    for file in sorted((two_ranks["folder"] / "checkpoint-10").glob("model-*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            sizes.update({k: handle.get_slice(k).get_shape() for k in handle.keys()})
    for step in ("10", "20"):
        assert [r["two"]["reads"][step] for r in two_ranks["ranks"]] == [[], []]
        reads = [r["fsdp"]["reads"][step] for r in two_ranks["ranks"]]
        assert {x["fqn"] for x in reads[0]} == {x["fqn"] for x in reads[1]} == set(sizes)
        whole = 0
        for fqn, shape in sizes.items():
            (a,), (b,) = ([x for x in rank if x["fqn"] == fqn] for rank in reads)
            assert a["in_place"] and b["in_place"], fqn
            assert a["offsets"][0] + a["lengths"][0] == b["offsets"][0], fqn  # rank 1 starts where 0 ends
            assert a["offsets"][0] == 0 and b["offsets"][0] + b["lengths"][0] == shape[0], fqn
            assert a["lengths"][1:] == b["lengths"][1:] == shape[1:], fqn
            assert a["lengths"][0] == -(-shape[0] // 2), fqn  # torch.chunk's split: rank 0 the larger half
            whole += math.prod(shape) * 4
        for rank in reads:
            assert 0.49 * whole <= sum(x["nbytes"] for x in rank) <= 0.51 * whole
