"""Model builders for the watcher's tests (`--model-builder module:function`)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from olmo_core.data import TokenizerConfig
from torch import nn
from workers.olmo_core_train import model_config


def olmo_core_model() -> nn.Module:
    """The tiny OLMo-core model of tests/support/workers/olmo_core_train.py (GPT-NeoX vocabulary)."""
    return model_config(TokenizerConfig.gpt_neox_olmo_dolma_v1_5()).build(init_device="cpu")


def olmo_core_model_changing_a_checkpoint() -> nn.Module:
    """`olmo_core_model()`, after changing the checkpoint `$WATCH_TEST_CHANGE` names (`delete:PATH` removes
    it, `rewrite:PATH` writes one of its shards again) once: a checkpoint rotated
    away or rewritten while the watcher reads it. The watcher calls the builder before it reads weights."""
    change, _, path = os.environ["WATCH_TEST_CHANGE"].partition(":")
    target = Path(path)
    marker = target.with_name(target.name + ".changed")  # a file: no checkpoint folder to the watcher
    if target.is_dir() and not marker.exists():
        marker.touch()
        if change == "delete":
            shutil.rmtree(target)
        else:
            shard = sorted((target / "model_and_optim").glob("*.distcp"))[0]
            shard.write_bytes(shard.read_bytes())
    return olmo_core_model()


def tiny_neox_model() -> nn.Module:
    """The tiny GPT-NeoX of tests/support/helpers.py, to load `watch_support.dcp_checkpoints` into."""
    from helpers import tiny_neox

    return tiny_neox()


def interrupted() -> nn.Module:
    """A model builder interrupted (Ctrl-C) while the watcher loads a checkpoint."""
    raise KeyboardInterrupt


def olmo_core_model_after_gate() -> nn.Module:
    """`olmo_core_model()`, once the file `$WATCH_TEST_GATE` names exists: a watcher as slow as the test
    needs it (the watcher calls the builder before it reads weights)."""
    gate = Path(os.environ["WATCH_TEST_GATE"])
    deadline = time.monotonic() + 300
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.1)
    return olmo_core_model()
