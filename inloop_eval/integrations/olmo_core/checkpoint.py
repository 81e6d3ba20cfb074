"""OLMo-core's checkpoints as the watcher reads them: `step<N>` folders its `Trainer` saves.

- Complete when `.metadata.json` (the marker its checkpointer writes after moving the finished folder into
  place) and `model_and_optim/.metadata` are there, and `config.json` (which its `ConfigSaverCallback`
  writes just after) unless the model is built by `model_builder`.
- The model is built from `config.json` (its `model` entry is a `TransformerConfig`), or by `model_builder`;
  its weights read with torch.distributed.checkpoint from `model_and_optim/` through OLMo-core's
  `load_model_and_optim_state` with no optimizer, so no optimizer state is read.
- Sharded (`--tp`, `--fsdp`): built on the meta device and parallelised by OLMo-core (`layout.py`), each rank
  reading only the slices it holds (`ShardReader`): the model's entries sit under `model.`.
- Its `config.json` records the tokenizer's size (a `TokenizerConfig`); its trainer state (`train/rank0.pt`)
  records the step the in-loop callback evaluated last.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inloop_eval.checkpoints.builders import build_model, resolve_builder
from inloop_eval.checkpoints.formats import (
    CONFIG_FILE,
    DCP_METADATA,
    Checkpoint,
    CheckpointFormat,
    LoadedModel,
    RecordedVocabulary,
)
from inloop_eval.checkpoints.layout import ParallelLayout
from inloop_eval.checkpoints.shard_reads import load_shards
from inloop_eval.errors import ConfigError
from inloop_eval.integrations.olmo_core.layout import build_in_layout

MARKER = ".metadata.json"
WEIGHTS = "model_and_optim"
TOKENIZER_CONFIG_CLASS = "olmo_core.data.tokenizer.TokenizerConfig"
# What an OLMo-core trainer state needs beyond tensors: NumPy arrays (the reconstructor, whatever module
# this NumPy keeps it in) and their dtypes.
NUMPY_GLOBALS = [
    np.ndarray(0).__reduce__()[0],
    np.ndarray,
    np.dtype,
    *{type(np.dtype(name)) for name in ("uint32", "int64", "float64", "bool")},
]


def model_config(checkpoint: Checkpoint) -> Any:
    """OLMo-core's `TransformerConfig` from the checkpoint's `config.json` (its `model` entry, or the whole
    file when it is a model config itself)."""
    from olmo_core.nn.transformer import TransformerConfig

    path = checkpoint.path / CONFIG_FILE
    data = json.loads(path.read_text())
    entry = data.get("model", data) if isinstance(data, dict) else None
    if not isinstance(entry, dict) or "d_model" not in entry:
        raise ConfigError(
            f"watch: {path} holds no OLMo-core model config (expected a `model` entry with `d_model`, as "
            "OLMo-core's ConfigSaverCallback saves the experiment config); pass --model-builder module:function"
        )
    return TransformerConfig.from_dict(entry)


def find_tokenizer_config(data: Any) -> dict[str, Any] | None:
    """The first OLMo-core `TokenizerConfig` entry anywhere in a saved config."""
    if isinstance(data, dict):
        if data.get("_CLASS_") == TOKENIZER_CONFIG_CLASS:
            return data
        children: Any = data.values()
    elif isinstance(data, list):
        children = data
    else:
        return None
    for child in children:
        found = find_tokenizer_config(child)
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class OLMoCoreCheckpoints(CheckpointFormat):
    """OLMo-core's `step<N>` checkpoints (see the module docstring)."""

    def missing(self, path: Path, *, needs_config: bool) -> str | None:
        if not (path / WEIGHTS / DCP_METADATA).is_file():
            return f"no {WEIGHTS}/{DCP_METADATA} yet"
        if not (path / MARKER).is_file():
            return f"no {MARKER} (OLMo-core's completion marker) yet"
        if needs_config and not (path / CONFIG_FILE).is_file():
            return f"no {CONFIG_FILE} (written by OLMo-core's ConfigSaverCallback) yet"
        return None

    def load(self, checkpoint: Checkpoint, model_builder: str | None) -> torch.nn.Module:
        from olmo_core.distributed.checkpoint import load_model_and_optim_state

        if model_builder:
            model = build_model(resolve_builder(model_builder)(), model_builder)
        else:
            model = model_config(checkpoint).build(init_device="cpu")
        load_model_and_optim_state(str(checkpoint.path / WEIGHTS), model)
        return model

    def load_sharded(
        self, checkpoint: Checkpoint, device: torch.device, model_builder: str | None, layout: ParallelLayout
    ) -> LoadedModel:
        config = model_config(checkpoint) if not model_builder else resolve_builder(model_builder)()
        if isinstance(config, torch.nn.Module) or not callable(getattr(config, "build", None)):
            raise ConfigError(
                f"watch: --tp/--fsdp build the OLMo-core model in the layout from its config; model_builder "
                f"{model_builder!r} returned {type(config).__name__}, expected a TransformerConfig (or drop "
                "--model-builder: the checkpoint's config.json is used)"
            )
        model, scored, dp_group = build_in_layout(config, layout, device)
        reader = load_shards(model, self.weights(checkpoint.path), under="model")
        model.eval()
        return LoadedModel(model, scored, dp_group, reader.reads, reader.whole_bytes())

    def weights(self, path: Path) -> Path:
        return path / WEIGHTS

    def recorded_vocabulary(self, checkpoint: Checkpoint) -> RecordedVocabulary | None:
        path = checkpoint.path / CONFIG_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        found = find_tokenizer_config(data)
        if found is None or not isinstance(found.get("vocab_size"), int):
            return None
        return RecordedVocabulary(int(found["vocab_size"]), None, f"{path} ({found.get('identifier')})")

    def evaluated_in_loop(self, checkpoint: Checkpoint) -> bool:
        """The trainer state holds an evaluator callback's `last_evaluated_step` equal to the checkpoint's step
        (the in-loop callback evaluates before the checkpointer saves)."""
        try:
            # The safe loader, allowed NumPy arrays (OLMo-core keeps NumPy's RNG state there), nothing else.
            with torch.serialization.safe_globals(NUMPY_GLOBALS):
                state = torch.load(checkpoint.path / "train" / "rank0.pt", map_location="cpu", weights_only=True)
        except Exception:  # absent, or holding objects the safe loader refuses: the checkpoint does not say
            return False
        callbacks = state.get("callbacks") if isinstance(state, dict) else None
        if not isinstance(callbacks, dict):
            return False
        return any(
            isinstance(entry, dict) and entry.get("last_evaluated_step") == checkpoint.step
            for entry in callbacks.values()
        )


FORMAT = OLMoCoreCheckpoints(
    name="olmo_core",
    title="OLMo-core",
    folder=re.compile(r"step(\d+)"),
    folder_example="step<N>",
    sharded=("tp", "fsdp"),
)
