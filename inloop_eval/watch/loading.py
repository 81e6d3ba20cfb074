"""Loading one checkpoint's model through its format (`inloop_eval.checkpoints.formats`; each framework's in
`integrations/<framework>/checkpoint.py`), and checking the tokenizer against the one the checkpoint records.

Whole, every rank loads the whole model; in a sharded layout (`--tp`, `--fsdp`) the format builds the model
in the layout and each rank reads only its share. Every model is returned in eval mode on `device`, one at a
time: the watcher drops it before the next.
"""

from __future__ import annotations

from typing import Any

import torch

from inloop_eval.checkpoints.formats import Checkpoint, LoadedModel, RecordedVocabulary, format_of
from inloop_eval.checkpoints.layout import ParallelLayout
from inloop_eval.errors import ConfigError


def require_builder(checkpoint: Checkpoint, model_builder: str | None) -> None:
    """ConfigError for a checkpoint of a format that holds no model config and no `model_builder`."""
    fmt = format_of(checkpoint)
    if fmt.needs_builder and not model_builder:
        raise ConfigError(
            f"watch: {checkpoint.path} is a {fmt.title} checkpoint, which holds no model config; pass "
            "--model-builder module:function (a function returning the model or its config)"
        )


def load_model(
    checkpoint: Checkpoint,
    device: torch.device,
    model_builder: str | None = None,
    layout: ParallelLayout | None = None,
) -> LoadedModel:
    """The checkpoint's model with its weights, in eval mode on `device`: whole on every rank, or in
    `layout` when it is sharded (each rank reading only its share)."""
    fmt = format_of(checkpoint)
    require_builder(checkpoint, model_builder)
    if layout is not None and layout.sharded:
        return fmt.load_sharded(checkpoint, device, model_builder, layout)
    model = fmt.load(checkpoint, model_builder).to(device).eval()
    return LoadedModel(model=model, scored=model)


def recorded_vocabulary(checkpoint: Checkpoint) -> RecordedVocabulary | None:
    """What the checkpoint records of its tokenizer; None when it records none."""
    return format_of(checkpoint).recorded_vocabulary(checkpoint)


def evaluated_in_loop(checkpoint: Checkpoint) -> bool:
    """Whether the training loop evaluated this checkpoint's step before saving it (its format's checkpoints
    say so, or they do not: their in-loop figures are found in `metrics.jsonl`)."""
    return format_of(checkpoint).evaluated_in_loop(checkpoint)


def vocabulary_mismatch(tokenizer: Any, recorded: RecordedVocabulary) -> str | None:
    """How `tokenizer` differs from the one the checkpoint records; None when they agree."""
    backend = getattr(tokenizer, "backend", None)
    if recorded.ids is not None and backend is not None and hasattr(backend, "get_vocab"):
        ids = backend.get_vocab(with_added_tokens=True)
        moved = sorted(t for t in set(ids) | set(recorded.ids) if ids.get(t) != recorded.ids.get(t))
        if moved:
            token = moved[0]
            return (
                f"{len(moved)} tokens have other ids (e.g. {token!r}: {ids.get(token)} in the config's "
                f"tokenizer, {recorded.ids.get(token)} in {recorded.where})"
            )
        return None
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(size, int) and size != recorded.size:
        return f"it has {size} tokens, the checkpoint's ({recorded.where}) {recorded.size}"
    return None
