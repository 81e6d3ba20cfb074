"""The adapter of OLMo-core `Transformer`s (`olmo_core.nn.transformer`), in their three layouts: logits of the
positions kept (`full_logits`), packed rows through `olmo_core_packing`, and, under tensor or (Ulysses)
context parallelism, logits sharded on the sequence (`sequence_sharded`, read by `sequence_parallel`).
Legend: B rows, T time, U positions read, K positions kept per row, V vocabulary.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from torch import Tensor

from inloop_eval.engine.layout import ForwardInputs, LayoutNeeds, ModelAdapter, ModelOutputs
from inloop_eval.engine.layouts.full_logits import FullLogits
from inloop_eval.engine.olmo_core_packing import keeping_prefix, packed_attention, packs
from inloop_eval.engine.sequence_parallel import olmo_core_layout, positions_to_keep
from inloop_eval.errors import ModelOutputError


class OLMoCoreAdapter(ModelAdapter):
    """An OLMo-core `Transformer`, called through `__call__` so that FSDP's hooks run. Its forward takes
    `logits_to_keep` [B, K] (positions per row), so the output head projects only the positions read. Its
    forward ignores an attention mask and position ids, so packed rows run inside `packed_attention`
    (olmo_core_packing.py), which gives its attention both; a model that module was not verified for
    (`packing_refusal`: flash backends, MoE, ...) is scored one request per row, said once in the log. A
    model that packs keeps prefixes too (`layout.SharedPrefix`): the keys and values of each attention,
    recorded by `keeping_prefix` while the prefix is forwarded, are attended to by the batches after it. With
    tensor or (Ulysses) context parallelism applied, each rank scores the positions it holds
    (`sequence_parallel`), its batches padded to a multiple of TP x CP, never packed.

    max_length: the context length it was trained at (the train module's `max_sequence_length`); the model
        does not record it, and RoPE would run past it without complaint.
    """

    def __init__(self, model: Any, max_length: int) -> None:
        super().__init__(model)
        self.max_length = max_length
        self.vocab_size = int(model.vocab_size)
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.layout = olmo_core_layout(model)
        self.packing = self.layout is None and packs(model)

    @property
    def needs(self) -> LayoutNeeds:
        if self.layout is None:
            return LayoutNeeds(packing=self.packing, prefix_reuse=self.packing)
        return LayoutNeeds(width_multiple=self.layout.multiple, peer_groups=tuple(self.layout.groups()))

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        input_ids_BT, rows_U, cols_U = inputs.input_ids_BT, inputs.rows_U, inputs.cols_U
        packed = self._packed(inputs)
        if self.layout is not None:
            return self.layout.features(self.model, input_ids_BT, rows_U, cols_U)
        if not self.keeps_logits:
            with packed:
                logits_BTV = self.model(input_ids_BT)
            _check_logits(logits_BTV, input_ids_BT.shape[0], input_ids_BT.shape[1])
            return FullLogits(logits_BTV[rows_U, cols_U])
        keep_BK, slot_U = positions_to_keep(rows_U, cols_U, input_ids_BT.shape[0])
        with packed:
            logits_BKV = self.model(input_ids_BT, logits_to_keep=keep_BK)
        _check_logits(logits_BKV, keep_BK.shape[0], keep_BK.shape[1])
        return FullLogits(logits_BKV[rows_U, slot_U])

    def _packed(self, inputs: ForwardInputs) -> AbstractContextManager[None]:
        """The context a forward of this batch runs in: `keeping_prefix` for a kept prefix (its states: what
        each attention recorded), `packed_attention` for a packed batch (after the kept prefix it reads)."""
        mask, position_ids, prefix = inputs.attention_mask_B1TT, inputs.position_ids_BT, inputs.prefix
        if mask is None and position_ids is None and prefix is None:
            return nullcontext()
        if not self.packing:
            raise ValueError(
                f"OLMoCoreAdapter: packed rows were planned for {type(self.model).__name__}, which is scored "
                "one request per row (see the log); plan with the adapter's needs.packing"
            )
        if inputs.keeps_prefix and prefix is not None:
            prefix.states = {}
            return keeping_prefix(self.model, prefix.states)
        B, T = inputs.input_ids_BT.shape
        K = T + (prefix.length if prefix is not None else 0)
        shapes = [None if x is None else tuple(x.shape) for x in (mask, position_ids)]
        if shapes != [(B, 1, T, K), (B, T)]:
            raise ValueError(
                f"OLMoCoreAdapter: a packed batch of input ids {(B, T)} needs an attention mask "
                f"{(B, 1, T, K)} and position ids {(B, T)}, found {shapes[0]} and {shapes[1]}"
            )
        kept = prefix.states if prefix is not None else None
        return packed_attention(self.model, mask, position_ids, kept, max_positions=self.max_length)


def _check_logits(logits_BXV: Any, n_rows: int, n_positions: int) -> None:
    """ModelOutputError unless `logits_BXV` is a tensor [n_rows, n_positions, V]."""
    if (
        not isinstance(logits_BXV, Tensor)
        or logits_BXV.dim() != 3
        or tuple(logits_BXV.shape[:2]) != (n_rows, n_positions)
    ):
        found = tuple(logits_BXV.shape) if isinstance(logits_BXV, Tensor) else type(logits_BXV).__name__
        raise ModelOutputError(
            f"OLMo-core model output: expected logits of shape [{n_rows}, {n_positions}, V], found {found}"
        )
