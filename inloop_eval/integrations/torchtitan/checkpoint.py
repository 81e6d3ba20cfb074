"""torchtitan's checkpoints as the watcher reads them: `step-<N>` folders its `CheckpointManager` saves.

- Complete when `.metadata` is there, which torch.distributed.checkpoint writes after every shard.
- torchtitan saves no model config, so `model_builder` is required: a function of the user's
  `config_registry` (e.g. `torchtitan.models.llama3.config_registry:llama3_debugmodel`) returning the trainer
  config, whose `model_spec.model.build()` is the model, or any module or config with `build()`.
- Whole: the weights read with `torch.distributed.checkpoint.load` into the model's own state dict (only the
  model's keys, not the optimizer's, the data loader's or the train state's). Sharded (`--tp`, `--fsdp`):
  the model parallelised by its own `parallelize_fn` (`layout.py`), each rank reading only its slices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from inloop_eval.checkpoints.builders import build_model, resolve_builder
from inloop_eval.checkpoints.formats import (
    DCP_METADATA,
    Checkpoint,
    CheckpointFormat,
    LoadedModel,
)
from inloop_eval.checkpoints.layout import ParallelLayout
from inloop_eval.checkpoints.shard_reads import load_shards
from inloop_eval.errors import ConfigError
from inloop_eval.frameworks import resolve

# Imported once a trainer config is built: a builder may set torchtitan up (its device) before torchtitan's
# modules are imported.
BUILD_IN_LAYOUT = "inloop_eval.integrations.torchtitan.layout:build_in_layout"


def built(made: Any, spec: str) -> nn.Module:
    """The module a builder's result stands for: a trainer config's `model_spec.model.build()`, else
    `build_model`'s."""
    model_spec = getattr(made, "model_spec", None)
    return build_model(model_spec.model.build() if model_spec is not None else made, spec)


@dataclass(frozen=True)
class TorchTitanCheckpoints(CheckpointFormat):
    """torchtitan's `step-<N>` checkpoints (see the module docstring)."""

    def missing(self, path: Any, *, needs_config: bool) -> str | None:
        return None if (path / DCP_METADATA).is_file() else f"no {DCP_METADATA} yet"

    def load(self, checkpoint: Checkpoint, model_builder: str | None) -> nn.Module:
        spec = str(model_builder)
        model = built(resolve_builder(spec)(), spec)
        state = model.state_dict()
        dcp.load(state, checkpoint_id=str(checkpoint.path))
        model.load_state_dict(state)
        return model

    def load_sharded(
        self, checkpoint: Checkpoint, device: torch.device, model_builder: str | None, layout: ParallelLayout
    ) -> LoadedModel:
        trainer_config = resolve_builder(str(model_builder))()
        if isinstance(trainer_config, nn.Module) or getattr(trainer_config, "model_spec", None) is None:
            raise ConfigError(
                f"watch: --tp/--fsdp build the torchtitan model in the layout from its config; model_builder "
                f"{model_builder!r} returned {type(trainer_config).__name__}, expected torchtitan's trainer "
                "config (a config_registry function)"
            )
        model, scored, dp_group = resolve(BUILD_IN_LAYOUT)(trainer_config, layout, device)
        # The module's own state dict: torchtitan's hooks split its fused QKV into the wq, wk, wv it saves,
        # and fuse them back on load.
        reader = load_shards(model, checkpoint.path)
        model.eval()
        return LoadedModel(model, scored, dp_group, reader.reads, reader.whole_bytes())


FORMAT = TorchTitanCheckpoints(
    name="torchtitan",
    title="torchtitan",
    folder=re.compile(r"step-(\d+)"),
    folder_example="step-<N>",
    needs_builder=True,
    sharded=("tp", "fsdp"),
)
