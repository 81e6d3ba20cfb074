"""Hugging Face checkpoints as the watcher (and `inloop-eval evaluate --model`) reads them: `checkpoint-<N>`
folders its `Trainer` saves, each a `save_pretrained` directory.

- Complete when `config.json` is there and every safetensors file the index names (or the one
  `model.safetensors`) is at its full size: a safetensors file is complete when it is 8 + header length +
  the end of its last tensor's data bytes long, which its own header says.
- Whole: `AutoModelForCausalLM.from_pretrained` (float32; sharded safetensors through their index), each
  safetensors file read whole into memory rather than mapped (`disable_mmap`): a file truncated while mapped
  (rewritten in place) would kill the process with SIGBUS, a short read only fails the load. A tensor the
  files lack, or of another shape than the config's model, is refused naming it and its file
  (`CheckpointDamaged`, tried again when the files change), never initialised at random.
- Sharded (`--fsdp`; `--tp` is refused): FSDP2 over the data-parallel ranks, each reading only the rows it
  holds (`layout.py`).
- Its own `tokenizer.json`, when it holds one, is the tokenizer it records and may be evaluated with.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from inloop_eval.checkpoints.formats import (
    CONFIG_FILE,
    Checkpoint,
    CheckpointDamaged,
    CheckpointFormat,
    LoadedModel,
    RecordedVocabulary,
)
from inloop_eval.checkpoints.layout import ParallelLayout
from inloop_eval.errors import ConfigError
from inloop_eval.frameworks import resolve

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
# The longest header safetensors reads (its MAX_HEADER_SIZE): a longer length is a damaged file.
SAFETENSORS_MAX_HEADER = 100_000_000
# Imported for a sharded load only: it reads safetensors slices.
LOAD_IN_LAYOUT = "inloop_eval.integrations.hf.layout:load_in_layout"


def safetensors_shortfall(path: Path) -> str | None:
    """Why a safetensors file is not complete (missing, shorter than its header says); None when it is.
    CheckpointDamaged, naming the file, for a header length past safetensors' limit or a whole header that
    gives no offsets; OSError for a file that cannot be read."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} has {size} bytes, not yet a header"
            (header_len,) = struct.unpack("<Q", head)
            if header_len > SAFETENSORS_MAX_HEADER:
                raise CheckpointDamaged(
                    f"{path}: its header says it is {header_len} bytes long, past safetensors' limit of "
                    f"{SAFETENSORS_MAX_HEADER} (the file has {size}): the file is damaged; save the checkpoint again"
                )
            header = f.read(min(header_len, size))
    except FileNotFoundError:
        return f"{path.name} is missing"
    if len(header) < header_len:
        return f"{path.name} has {size} bytes, its header not yet whole"
    try:
        tensors = json.loads(header)
    except ValueError:
        return f"{path.name}: its header is not JSON yet"
    expected = 8 + header_len + data_end(tensors, path)
    if size < expected:
        return f"{path.name} has {size} of its {expected} bytes"
    return None


def data_end(tensors: Any, path: Path) -> int:
    """Where the last tensor's data bytes end, by a safetensors header read whole (`tensors`);
    CheckpointDamaged when the header does not say: a header of its full length is not being written."""
    if not isinstance(tensors, dict):
        raise CheckpointDamaged(f"{path}: its header is {type(tensors).__name__}, not a table of tensors")
    end = 0
    for name, entry in tensors.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise CheckpointDamaged(
                f"{path}: its header gives tensor {name!r} no data_offsets [begin, end] (found {offsets!r}): "
                "the file is damaged; save the checkpoint again"
            )
        end = max(end, offsets[1])
    return end


def saved_files(path: Path) -> dict[str, str]:
    """Each saved tensor's safetensors file, by the index of a sharded checkpoint; empty for one saved in one
    file (`model.safetensors` holds them all)."""
    index = path / INDEX_FILE
    return dict(json.loads(index.read_text()).get("weight_map", {})) if index.is_file() else {}


def load_saved(path: Path) -> nn.Module:
    """The causal LM saved at `path`, float32 on the CPU, every tensor read from its files (see the module
    docstring)."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ConfigError(
            "Hugging Face checkpoints need `transformers`: pip install 'inloop_eval[hf]'"
        ) from None
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype="float32", disable_mmap=True, output_loading_info=True, ignore_mismatched_sizes=True
    )
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise CheckpointDamaged(
            f"{path / (INDEX_FILE if (path / INDEX_FILE).is_file() else SINGLE_FILE)} holds no tensor "
            f"{missing[0]!r} ({len(missing)} missing: {', '.join(missing[:5])}) that the model of its config.json "
            "holds; not scored with it initialised at random: save the checkpoint again"
        )
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda entry: entry[0])
    if mismatched:
        name, stored, expected = mismatched[0]
        raise CheckpointDamaged(
            f"tensor {name!r} of {path / saved_files(path).get(name, SINGLE_FILE)} has shape "
            f"{tuple(stored)}, the model of its config.json {tuple(expected)} ({len(mismatched)} tensors differ): "
            "save the checkpoint again with its config"
        )
    return model


@dataclass(frozen=True)
class HuggingFaceCheckpoints(CheckpointFormat):
    """Hugging Face's `checkpoint-<N>` checkpoints (see the module docstring)."""

    def missing(self, path: Path, *, needs_config: bool) -> str | None:
        if not (path / CONFIG_FILE).is_file():
            return f"no {CONFIG_FILE} yet"
        index = path / INDEX_FILE
        if index.is_file():
            try:
                names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, OSError) as exc:
                return f"{INDEX_FILE} is not readable yet ({exc})"
        elif (path / SINGLE_FILE).is_file():
            names = [SINGLE_FILE]
        else:
            return f"no {INDEX_FILE} or {SINGLE_FILE} yet"
        for name in names:
            shortfall = safetensors_shortfall(path / name)
            if shortfall:
                return shortfall
        return None

    def load(self, checkpoint: Checkpoint, model_builder: str | None) -> nn.Module:
        return load_saved(checkpoint.path)

    def load_sharded(
        self, checkpoint: Checkpoint, device: torch.device, model_builder: str | None, layout: ParallelLayout
    ) -> LoadedModel:
        model, dp_group, reads, whole = resolve(LOAD_IN_LAYOUT)(checkpoint.path, layout, device)
        return LoadedModel(model=model, scored=model, dp_group=dp_group, reads=reads, whole=whole)

    def recorded_vocabulary(self, checkpoint: Checkpoint) -> RecordedVocabulary | None:
        path = self.own_tokenizer(checkpoint.path)
        if path is None:
            return None
        ids = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
        return RecordedVocabulary(size=len(ids), ids=ids, where=str(path))

    def own_tokenizer(self, path: Path) -> Path | None:
        return path / TOKENIZER_FILE if (path / TOKENIZER_FILE).is_file() else None


FORMAT = HuggingFaceCheckpoints(
    name="hf",
    title="Hugging Face",
    folder=re.compile(r"checkpoint-(\d+)"),
    folder_example="checkpoint-<N>",
    sharded=("fsdp",),
)
