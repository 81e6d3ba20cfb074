"""A model that shows its hidden states and output head (the reference GPT): packed rows, kept prefixes, and
the head projected at the positions read only.
Legend: B batch, T time, U positions read, D width.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import Tensor

from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, ModelAdapter, ModelOutputs
from inloop_eval.engine.outputs.projected_head import ProjectedHead


class HiddenStatesAdapter(ModelAdapter):
    """A model that takes packed rows and shows its hidden states (the reference GPT, or any module with
    the same three members): `hidden_states(input_ids [B, T], attention_mask bool [B, 1, T, T] or None,
    position_ids [B, T] or None) -> [B, T, D]`, the output head `lm_head` ([N, D] -> [N, V]), and
    `config.max_seq_len`, `config.vocab_size`. The head runs on the selected positions only. Where
    `hidden_states` also takes `kv_out` and `kv_prefix` (the reference GPT), a prefix many rows begin with
    is forwarded once and its keys and values kept (`adapter.SharedPrefix`)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.max_length = model.config.max_seq_len
        self.vocab_size = model.config.vocab_size
        parameters = inspect.signature(model.hidden_states).parameters
        self.prefix_reuse = "kv_prefix" in parameters and "kv_out" in parameters

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(packing=True, prefix_reuse=self.prefix_reuse)

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        ids, mask, positions = inputs.input_ids_BT, inputs.attention_mask_B1TT, inputs.position_ids_BT
        if inputs.keeps_prefix and inputs.prefix is not None:
            kept: list[tuple[Tensor, Tensor]] = []
            hidden_BTD = self.model.hidden_states(ids, kv_out=kept)
            inputs.prefix.states = kept
        elif inputs.prefix is not None:
            hidden_BTD = self.model.hidden_states(ids, mask, positions, kv_prefix=inputs.prefix.states)
        else:
            hidden_BTD = self.model.hidden_states(ids, mask, positions)
        return ProjectedHead(hidden_BTD[inputs.rows_U, inputs.cols_U], self.model.lm_head)
