"""The adapter of torchtitan decoders as trained (FSDP, HSDP, tensor parallel with the vocabulary-sharded
output head): hidden states then `lm_head` at the positions read, or logits plain or sharded on the
vocabulary; packed rows and kept prefixes through `attention`.
Legend: B batch, T time, U positions read, D width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, ModelAdapter, ModelOutputs
from inloop_eval.engine.adapters.logits import input_embedding_rows
from inloop_eval.engine.attention_route import packs, routed, routing_for
from inloop_eval.engine.outputs.vocab_sharded import logits_outputs, selected_logits
from inloop_eval.errors import ModelOutputError
from inloop_eval.integrations.torchtitan.attention import ROUTE


class TorchTitanAdapter(ModelAdapter):
    """A torchtitan decoder (`model_parts[0]`, FSDP- and tensor-parallel-wrapped as trained), called through
    `forward`. Its output is either hidden states [B, T, D] (the head skipped, `_skip_lm_head`: the selected
    positions then go through `lm_head` in the same call, a vocabulary-sharded DTensor head under tensor
    parallelism) or logits [B, T, V], plain or sharded on the vocabulary. Batch widths must be a multiple of
    `seq_multiple` (sequence parallelism splits the positions over the tensor-parallel ranks).

    A decoder whose attention `attention.packing_refusal` verified (llama3 and qwen3 shapes, tensor parallel
    or not) takes packed rows and keeps prefixes: `forward` is called as for any batch, under its attention
    route (`attention.ROUTE`: RoPE at the batch's position ids, each core attention through the engine's; plain
    causal rows under a causal mask; a kept prefix's row, which the planner pads on the right to a multiple of
    `seq_multiple`, causal, its keys and values recorded in `inputs.prefix.states`). Any other model is
    scored one request per row as it runs, said once in the log."""

    def __init__(
        self,
        model: nn.Module,
        *,
        forward: Callable[[Tensor], Any],
        max_length: int | None,
        seq_multiple: int = 1,
    ) -> None:
        super().__init__(model)
        self.call = forward
        self.max_length = max_length
        self.vocab_size = input_embedding_rows(model)
        self.seq_multiple = max(1, seq_multiple)
        self.packing = packs(ROUTE, model)

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(width_multiple=self.seq_multiple, packing=self.packing, prefix_reuse=self.packing)

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        input_ids_BT, rows_U, cols_U = inputs.input_ids_BT, inputs.rows_U, inputs.cols_U
        with routed(self.model, ROUTE, routing_for(self, inputs, self.packing)):
            out = self.call(input_ids_BT)
        if getattr(self.model, "_skip_lm_head", False):
            hidden_BTD = replicated_local(out, input_ids_BT, "hidden states")
            # Projected here, once per forward on every rank: FSDP gathers the head's weights on each call, so
            # the number of calls must not depend on how many positions a rank's documents have.
            return logits_outputs(self.model.lm_head(hidden_BTD[rows_U, cols_U]))
        if isinstance(out, DTensor) and any(isinstance(p, Shard) for p in out.placements):
            return selected_logits(out, rows_U, cols_U)
        return selected_logits(replicated_local(out, input_ids_BT, "logits"), rows_U, cols_U)


def replicated_local(out: Any, input_ids_BT: Tensor, what: str) -> Tensor:
    """`out` as a plain tensor [B, T, X] for the rows `input_ids_BT`: a replicated DTensor's local copy.
    ModelOutputError for any other output (sharded over the batch or the positions)."""
    if isinstance(out, DTensor):
        if not all(isinstance(p, Replicate) for p in out.placements):
            raise ModelOutputError(
                f"torchtitan model output: {what} as a DTensor with placements {tuple(out.placements)}; "
                "expected them replicated (or logits sharded on the vocabulary only)"
            )
        out = out.to_local()
    if not isinstance(out, Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(input_ids_BT.shape):
        found = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ModelOutputError(
            f"torchtitan model output: expected {what} of shape [{input_ids_BT.shape[0]}, "
            f"{input_ids_BT.shape[1]}, *], found {found}"
        )
    return out
