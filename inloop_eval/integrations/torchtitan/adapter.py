"""The adapter of torchtitan decoders as trained (FSDP, HSDP, tensor parallel with the vocabulary-sharded
output head): hidden states then `lm_head` at the positions read, or logits plain or sharded on the
vocabulary; packed rows and kept prefixes through `attention`.
Legend: B batch, T time, U positions read, D width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, ModelAdapter, ModelOutputs
from inloop_eval.engine.adapters.logits import input_embedding_rows
from inloop_eval.engine.outputs.vocab_sharded import logits_outputs, selected_logits
from inloop_eval.errors import ModelOutputError
from inloop_eval.integrations.torchtitan.attention import keeping_prefix, packed_attention, packs


class TorchTitanAdapter(ModelAdapter):
    """A torchtitan decoder (`model_parts[0]`, FSDP- and tensor-parallel-wrapped as trained), called through
    `forward`. Its output is either hidden states [B, T, D] (the head skipped, `_skip_lm_head`: the selected
    positions then go through `lm_head` in the same call, a vocabulary-sharded DTensor head under tensor
    parallelism) or logits [B, T, V], plain or sharded on the vocabulary. Batch widths must be a multiple of
    `seq_multiple` (sequence parallelism splits the positions over the tensor-parallel ranks).

    A decoder whose attention `attention.packing_refusal` verified (llama3 and qwen3 shapes, tensor parallel
    or not) takes packed rows and keeps prefixes: `forward` is called as for any batch, inside
    `packed_attention` (RoPE at the batch's position ids, each core attention through `tree_attention`; plain
    causal rows under a causal mask) or, for a kept prefix, `keeping_prefix` (its row, which the planner pads
    on the right to a multiple of `seq_multiple`, causal; each layer's keys and values of the prefix recorded
    in `inputs.prefix.states`). Any other model is scored one request per row as it runs, said once in the
    log."""

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
        self.packing = packs(model)

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(width_multiple=self.seq_multiple, packing=self.packing, prefix_reuse=self.packing)

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        input_ids_BT, rows_U, cols_U = inputs.input_ids_BT, inputs.rows_U, inputs.cols_U
        with self._routed(inputs, input_ids_BT.shape[1]):
            out = self.call(input_ids_BT)
        if getattr(self.model, "_skip_lm_head", False):
            hidden_BTD = replicated_local(out, input_ids_BT, "hidden states")
            # Projected here, once per forward on every rank: FSDP gathers the head's weights on each call, so
            # the number of calls must not depend on how many positions a rank's documents have.
            return logits_outputs(self.model.lm_head(hidden_BTD[rows_U, cols_U]))
        if isinstance(out, DTensor) and any(isinstance(p, Shard) for p in out.placements):
            return selected_logits(out, rows_U, cols_U)
        return selected_logits(replicated_local(out, input_ids_BT, "logits"), rows_U, cols_U)

    def _routed(self, inputs: ForwardInputs, width: int) -> AbstractContextManager[None]:
        """The context a forward of this batch runs in, for a model that packs: `keeping_prefix` for a kept
        prefix (its states: what each attention recorded), `packed_attention` for a packed batch (after the
        kept prefix it reads) and for plain causal rows (under a causal mask, so that no forward of an
        evaluation runs the model's own kernel or a compiled block); the model as it is otherwise."""
        tree, prefix = inputs.tree, inputs.prefix
        if not self.packing:
            if tree is not None or prefix is not None:
                raise ValueError(
                    f"TorchTitanAdapter: packed rows were planned for {type(self.model).__name__}, which is "
                    "scored one request per row (see the log); plan with the adapter's needs.packing"
                )
            return nullcontext()
        B, T = inputs.input_ids_BT.shape
        if inputs.keeps_prefix and prefix is not None:
            prefix.states = {}
            mask = inputs.causal_mask(1, width)
            return keeping_prefix(self.model, mask, prefix.states, prefix.length)
        if tree is None and prefix is None:
            return packed_attention(self.model, inputs.tree_or_causal())
        S = prefix.length if prefix is not None else 0
        found = None if tree is None else (tuple(tree.span_end_BT.shape), tree.prefix_length)
        if tree is None or found != ((B, T), S):
            raise ValueError(
                f"TorchTitanAdapter: a packed batch of input ids {(B, T)} after a kept prefix of {S} tokens needs "
                f"a mask of span ends {(B, T)} and prefix length {S}, found {found}"
            )
        return packed_attention(self.model, tree, None if prefix is None else prefix.states)


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
