"""A module or callable that returns logits: the adapter of any model no other family claims.
Legend: B batch, T time, V vocabulary.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from inloop_eval.engine.adapter import ForwardInputs, ModelAdapter, ModelOutputs
from inloop_eval.engine.outputs.vocab_sharded import selected_logits
from inloop_eval.errors import ModelOutputError


class LogitsAdapter(ModelAdapter):
    """Any module or callable mapping input_ids [B, T] to logits [B, T, V] (or an object with `.logits`), or
    to a DTensor of them sharded on the vocabulary (a tensor-parallel head, scored without gathering it).
    A module's vocabulary is the size of its input embedding (`input_embedding_rows`); a plain callable's
    is unknown, and `ModelAdapter.logits_width` measures its logits instead."""

    def __init__(self, model: Any, max_length: int | None = None) -> None:
        super().__init__(model)
        self.max_length = max_length
        self.vocab_size = input_embedding_rows(model)

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        input_ids_BT = inputs.input_ids_BT
        out = self.model(input_ids_BT)
        logits_BTV = getattr(out, "logits", out)
        if (
            not isinstance(logits_BTV, Tensor)
            or logits_BTV.dim() != 3
            or tuple(logits_BTV.shape[:2]) != tuple(input_ids_BT.shape)
        ):
            found = tuple(logits_BTV.shape) if isinstance(logits_BTV, Tensor) else type(logits_BTV).__name__
            raise ModelOutputError(
                f"model output: expected logits of shape [B, T, V] = [{input_ids_BT.shape[0]}, "
                f"{input_ids_BT.shape[1]}, V] (a tensor or an object with .logits), found {found}"
            )
        return selected_logits(logits_BTV, inputs.rows_U, inputs.cols_U)


def input_embedding_rows(model: Any) -> int | None:
    """The number of token ids `model` can embed: the rows of `get_input_embeddings()` where the model has
    one, else of its first `nn.Embedding` (in registration order the token embedding, ahead of position
    embeddings, in the common GPT module names); None for a callable that is not a module."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except NotImplementedError:  # Hugging Face's base class, for a model that does not say
        embedding = None
    if embedding is None and isinstance(model, nn.Module):
        embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    rows = getattr(embedding, "num_embeddings", None)
    return rows if isinstance(rows, int) else None
