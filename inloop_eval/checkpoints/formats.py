"""A checkpoint format: how one framework's checkpoints are found, checked and loaded, one `CheckpointFormat`
per framework (`integrations/<framework>/checkpoint.py`, declared by its plugin, `inloop_eval.frameworks`).

What the watcher asks of a format, and nothing else:
- `folder`: the name its framework gives the checkpoint of step N (`step_of` reads the step back);
- `missing`: what the checkpoint still lacks of the evidence its framework writes last (None: all there);
- `load`: the whole model with its weights, on the CPU; `load_sharded`: the model built in a parallel layout
  (`--tp`, `--fsdp`), each rank reading only its share (`LoadedModel` says what it read);
- `weights`: the folder its weights' files are in (a tensor saved with another shape is named in it);
- `recorded_vocabulary`, `own_tokenizer`: what the checkpoint records of its tokenizer, a tokenizer it holds;
- `evaluated_in_loop`: whether the training loop evaluated this step before saving it.

`model_builder` is `module:function`, a callable taking no argument that returns the `nn.Module` to load the
weights into or a config that builds it (`builders`); a format may take its own kinds of config. This module
imports no torch, so that reading a folder's name or a ready event costs a trainer nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inloop_eval.errors import ConfigError, InLoopEvalError
from inloop_eval.frameworks import frameworks

if TYPE_CHECKING:  # for the signatures only: a trainer reading a folder's name imports no torch
    import torch
    from torch import nn

    from inloop_eval.checkpoints.layout import ParallelLayout
    from inloop_eval.checkpoints.shard_reads import ShardRead

# The file a framework saves its model's (or its experiment's) config in.
CONFIG_FILE = "config.json"
# What torch.distributed.checkpoint writes after every shard.
DCP_METADATA = ".metadata"


class CheckpointDamaged(InLoopEvalError):
    """One checkpoint whose files say something impossible (a safetensors header without the offsets of a
    tensor): recorded failed, tried again once its files change; the watcher goes on to the others."""


@dataclass(frozen=True, order=True)
class Checkpoint:
    """One checkpoint folder: the training step it holds, where it is, its format (a `CheckpointFormat` name)."""

    step: int
    path: Path
    format: str


@dataclass
class LoadedModel:
    """One checkpoint's model as the watcher scores it: `model` (the module: its vocabulary is checked),
    `scored` (what the evaluator is given: the module, or its adapter in a layout that needs one),
    `dp_group` (what the documents are sharded over: None, the world, when every rank holds the whole
    model), `reads` (what this rank read of a sharded checkpoint; empty for a whole-model load) and `whole`
    (the bytes of those tensors whole, as one process reads them)."""

    model: nn.Module
    scored: Any
    dp_group: Any = None
    reads: list[ShardRead] = field(default_factory=list)
    whole: int = 0


@dataclass(frozen=True)
class RecordedVocabulary:
    """The tokenizer a checkpoint says it was trained with: its size, its token -> id map when the
    checkpoint holds the tokenizer itself, and the file that says so."""

    size: int
    ids: dict[str, int] | None
    where: str


@dataclass(frozen=True)
class CheckpointFormat:
    """One framework's checkpoints (see the module docstring); a plugin subclasses it and overrides `missing`,
    `load` and what else its checkpoints hold.

    name: the format's name (`--format`, `Checkpoint.format`, ready events' `checkpoint_format`).
    title: the framework's name in messages.
    folder: the pattern of a checkpoint folder's name, its one group the step.
    folder_example: that name as messages show it, e.g. `step<N>`.
    needs_builder: its checkpoints hold no model config, so `--model-builder` is required.
    sharded: the layout options it loads sharded (`tp`, `fsdp`); empty: none.
    """

    name: str
    title: str
    folder: re.Pattern[str]
    folder_example: str
    needs_builder: bool = False
    sharded: tuple[str, ...] = ()

    def step_of(self, name: str) -> int | None:
        """The step a folder called `name` holds; None when it is not one of this format's."""
        match = self.folder.fullmatch(name)
        return int(match.group(1)) if match else None

    def missing(self, path: Path, *, needs_config: bool) -> str | None:
        """What the checkpoint at `path` lacks of its completion evidence; None when it is all there.
        needs_config: the model is built from the checkpoint's own config (no `model_builder`)."""
        raise NotImplementedError

    def load(self, checkpoint: Checkpoint, model_builder: str | None) -> nn.Module:
        """The whole model with its weights, on the CPU."""
        raise NotImplementedError

    def load_sharded(
        self, checkpoint: Checkpoint, device: torch.device, model_builder: str | None, layout: ParallelLayout
    ) -> LoadedModel:
        """The model built in `layout`, each rank reading only its share; refused unless overridden."""
        raise ConfigError(
            f"watch: {checkpoint.path} is a {self.title} checkpoint, which --tp/--fsdp do not load sharded "
            f"yet ({sharded_formats()}); run the watcher without them"
        )

    def weights(self, path: Path) -> Path:
        """The folder the checkpoint at `path` keeps its weights' files in (a DCP checkpoint's `.metadata`)."""
        return path

    def recorded_vocabulary(self, checkpoint: Checkpoint) -> RecordedVocabulary | None:
        """What the checkpoint records of its tokenizer; None when it records none."""
        return None

    def own_tokenizer(self, path: Path) -> Path | None:
        """The tokenizer file the checkpoint at `path` holds, if it holds one."""
        return None

    def evaluated_in_loop(self, checkpoint: Checkpoint) -> bool:
        """Whether the training loop evaluated this checkpoint's step before saving it (the checkpoint says)."""
        return False


def checkpoint_formats() -> dict[str, CheckpointFormat]:
    """Every registered framework's checkpoint format, by name, in the order the frameworks are consulted."""
    found: dict[str, CheckpointFormat] = {}
    for plugin in frameworks():
        fmt = plugin.checkpoint_format()
        if fmt is not None:
            found.setdefault(fmt.name, fmt)
    return found


def format_of(checkpoint: Checkpoint) -> CheckpointFormat:
    """The format a checkpoint was found in."""
    formats = checkpoint_formats()
    if checkpoint.format not in formats:
        raise ValueError(f"unknown checkpoint format {checkpoint.format!r}; expected one of {sorted(formats)}")
    return formats[checkpoint.format]


def expected_names() -> str:
    """The folder names of every format, as messages list them: `step<N> (OLMo-core) or ...`."""
    named = [f"{fmt.folder_example} ({fmt.title})" for fmt in checkpoint_formats().values()]
    return ", ".join(named[:-1]) + (" or " if len(named) > 1 else "") + named[-1] if named else "none"


def sharded_formats() -> str:
    """The formats that load sharded and with which options, for messages."""
    return ", ".join(
        f"{fmt.title} with {'/'.join(f'--{o}' for o in fmt.sharded)}"
        for fmt in checkpoint_formats().values()
        if fmt.sharded
    )
