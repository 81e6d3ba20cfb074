"""The watcher on torchtitan's own `step-<N>` checkpoints: torchtitan's real `Trainer` on CPU (one gloo
process, tests/support/workers/torchtitan_checkpoints.py) saves one at every step with the in-loop
validator running at both; `inloop-eval watch --model-builder` evaluates each once, with the validator's
figures at the same step: in one process, and under torchrun at `--tp 2` (the model tensor parallel over two
ranks, each reading only its share of the checkpoint)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
import yaml
from helpers import EXACT
from watch_support import eval_lines
from workers.launch import REPO, launch, worker_env

from inloop_eval.keys import INTERVAL_KEY, SECONDS_KEY, TOKENS_KEY

# What the cost of an evaluation adds beside its figures (the watcher logs no interval: it does not train).
COST_KEYS = (SECONDS_KEY, TOKENS_KEY, INTERVAL_KEY)

EVAL_CONFIG = {
    "evaluators": [
        {"task": "copa", "limit": 5, "batch_tokens": 256},
        {"task": "piqa", "limit": 5, "batch_tokens": 256},
    ],
}
SEQ_LEN = 64  # the trainer's, and so the validator's max_length


@pytest.fixture(scope="module")
def watched(data_root, tmp_path_factory):
    work = tmp_path_factory.mktemp("torchtitan")
    (work / "eval.yaml").write_text(yaml.safe_dump(EVAL_CONFIG))
    worker = str(REPO / "tests" / "support" / "workers" / "torchtitan_checkpoints.py")
    args = [worker, "--data-root", str(data_root), "--work", str(work), "--out", str(work)]
    launch(1, [*args, "--config", str(work / "eval.yaml")], timeout=420)
    # The watcher's config: the validator's, its context and tokenizer (torchtitan's hf_assets_path).
    (work / "watch.yaml").write_text(
        yaml.safe_dump({**EVAL_CONFIG, "max_length": SEQ_LEN, "tokenizer": str(work / "tokenizer")})
    )
    run_dir = work / "run"
    cmd = [sys.executable, "-m", "inloop_eval.cli", "watch", str(work / "dump" / "checkpoint")]
    cmd += ["--config", str(work / "watch.yaml"), "--run-dir", str(run_dir), "--once", "--settle", "0"]
    cmd += ["--model-builder", "workers.torchtitan_checkpoints:model_config", "--data-root", str(data_root)]
    done = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tp2_dir = work / "run_tp2"
    tp2 = [*cmd[1:], "--tp", "2"]
    tp2[tp2.index("--run-dir") + 1] = str(tp2_dir)
    runs = launch(2, tp2, timeout=300)
    return json.loads((work / "in_loop.json").read_text()), eval_lines(run_dir), eval_lines(tp2_dir), runs, work


@pytest.mark.parametrize("layout", ["one process", "tp2"])
def test_each_torchtitan_checkpoint_is_evaluated_once_with_the_validators_figures(watched, layout):
    in_loop, one, tp2, *_ = watched
    lines = one if layout == "one process" else tp2
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        expected = in_loop[str(line["step"])]
        assert sorted(set(expected) - set(COST_KEYS)) == sorted(
            k for k in line if k not in ("step", *COST_KEYS)
        )
        assert INTERVAL_KEY not in line
        for key, value in expected.items():
            if key in COST_KEYS:
                continue
            if key.endswith(EXACT):
                assert line[key] == value, (line["step"], key)
            else:
                assert math.isclose(line[key], value, rel_tol=1e-6, abs_tol=1e-12), (line["step"], key)


def test_at_tp2_each_rank_reads_half_of_the_checkpoint(watched):
    """Each rank logs what it read of each checkpoint: its shards, half of the model's bytes and a little more
    (the norms, which tensor parallelism replicates, are read by both)."""
    runs = watched[3]
    pattern = r"step \d+: rank \d+ read ([0-9.]+) of its model's ([0-9.]+) MiB"
    for run in runs:
        reads = [(float(a), float(b)) for a, b in re.findall(pattern, run.stderr)]
        assert len(reads) == 2, run.stderr[-2000:]
        assert all(0.5 * whole <= read < 0.51 * whole for read, whole in reads), reads


def test_a_torchtitan_checkpoint_without_a_model_builder_is_a_clear_error(watched, data_root, tmp_path):
    import torch

    from inloop_eval.checkpoints.formats import Checkpoint
    from inloop_eval.errors import ConfigError
    from inloop_eval.watch.loading import load_model

    with pytest.raises(ConfigError, match="holds no model config; pass --model-builder"):
        load_model(Checkpoint(step=1, path=tmp_path / "step-1", format="torchtitan"), torch.device("cpu"))


def test_torchtitans_purge_keeps_a_checkpoint_a_lease_holds(watched):
    """The trainer's `KeepLeasedCheckpointManager` (keep_latest_k=2) purged the unleased folder of step 0
    and kept the leased one (tests/support/workers/torchtitan_checkpoints.py)."""
    assert json.loads((watched[4] / "purge.json").read_text()) == {"held": True, "free": False}
