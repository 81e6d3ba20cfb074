"""The adapters of OLMo-core `Transformer`s (`olmo_core.nn.transformer`), one per way it is run, chosen once by
`build_adapter`: `OLMoCoreAdapter` (targets scored inside its output head, `head`, or else logits of the
positions kept, `full_logits`; packed rows and kept prefixes through `attention`) and, under tensor or
(Ulysses) context parallelism, `OLMoCoreSequenceSplitAdapter` (under tensor parallelism alone, targets
scored inside its output head, split on the vocabulary; else logits sharded on the sequence,
`sequence_sharded`, over the split `topology` reads).
Legend: B rows, T time, U positions read, C of them in this rank's context-parallel chunk, L of those this
rank holds, K positions kept per row, V vocabulary.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard

from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, HeadWorkspace, ModelAdapter, ModelOutputs
from inloop_eval.engine.attention_route import packs, routed, routing_for
from inloop_eval.engine.outputs.full_logits import FullLogits
from inloop_eval.engine.outputs.sequence_sharded import SequenceShard
from inloop_eval.errors import ConfigError, ModelOutputError
from inloop_eval.integrations.olmo_core.attention import ROUTE, SPLIT_SEQUENCE_ROUTE
from inloop_eval.integrations.olmo_core.head import scores_in_head, scoring_head
from inloop_eval.integrations.olmo_core.topology import SequenceSplit, read_sequence_split


def build_adapter(model: Any, max_length: int | None) -> ModelAdapter:
    """The adapter of an OLMo-core `Transformer`: over its sequence split under tensor or context parallelism,
    else the one that packs where its attention is verified. ConfigError without `max_length`."""
    if max_length is None:
        raise ConfigError(
            f"evaluator: the OLMo-core model {type(model).__name__} does not record the context length "
            "it was trained at; set `max_length:` in the evaluator config to the train module's "
            "max_sequence_length (the OLMo-core callback, inloop_eval.integrations.olmo_core.callback, reads it)"
        )
    split = read_sequence_split(model)
    if split is not None:
        return OLMoCoreSequenceSplitAdapter(model, max_length, split)
    return OLMoCoreAdapter(model, max_length)


class OLMoCoreAdapter(ModelAdapter):
    """An OLMo-core `Transformer`, called through `__call__` so that FSDP's hooks run. Its output head
    (`LMHead`) scores the targets itself, a chunk of positions at a time (`head.scoring_head`); a head of
    another class is handed `logits_to_keep` [B, K] (positions per row), so that it projects only the
    positions read. Its forward ignores an attention mask and position ids, so every forward of a model
    that packs runs under its attention route (`attention.ROUTE`), which gives its attention both through the
    engine's attention, on every backend; a model the route was not verified for (`packing_refusal`:
    MoE, attention sinks, ...) is scored one request per row, said once in the log. A model that packs
    keeps prefixes too (`adapter.SharedPrefix`): the keys and values of each attention, recorded while the
    prefix is forwarded, are attended to by the batches after it.

    max_length: the context length it was trained at (the train module's `max_sequence_length`); the model
        does not record it, and RoPE would run past it without complaint.
    """

    def __init__(self, model: Any, max_length: int) -> None:
        super().__init__(model)
        self.max_length = max_length
        self.vocab_size = int(model.vocab_size)
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.head_scores = scores_in_head(model)
        self.workspace = HeadWorkspace()
        self.packing = packs(ROUTE, model)

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(packing=self.packing, prefix_reuse=self.packing)

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        input_ids_BT, rows_U, cols_U = inputs.input_ids_BT, inputs.rows_U, inputs.cols_U
        packed = attention_for(self, inputs)
        if self.head_scores:
            with packed, scoring_head(self.model, inputs, self.workspace, peers_share_batch=False) as scored:
                self.model(input_ids_BT)
            return scored.result()
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


def attention_for(
    adapter: OLMoCoreAdapter | OLMoCoreSequenceSplitAdapter, inputs: ForwardInputs
) -> AbstractContextManager[None]:
    """The context a forward of this batch runs in: for a model that packs, its route (`attention.ROUTE`)
    whatever the batch (`attention_route.routing_for`), so that no backend kernel runs."""
    route = SPLIT_SEQUENCE_ROUTE if isinstance(adapter, OLMoCoreSequenceSplitAdapter) else ROUTE
    routing = routing_for(adapter, inputs, adapter.packing, max_positions=adapter.max_length)
    return routed(adapter.model, route, routing)


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


class OLMoCoreSequenceSplitAdapter(ModelAdapter):
    """An OLMo-core `Transformer` under tensor or (Ulysses) context parallelism, its batches padded to a
    multiple of TP x CP. Under tensor parallelism alone, with OLMo-core's plain `LMHead`, the head scores
    every target inside the forward, each rank over its slice of the vocabulary (`head.scoring_head`: no
    rank holds more than a chunk of positions' [C, V/TP] logits); otherwise each rank scores the positions
    it holds (`SequenceSplit`). Its rows are packed and its
    prefixes kept as `OLMoCoreAdapter`'s are (`attention.SPLIT_SEQUENCE_ROUTE`: every rank's attention sees every position
    and its own heads, under Ulysses after the exchange OLMo-core's backends make; a kept prefix's row, which
    the planner pads to the multiple, keeps only its own positions' keys and values).

    max_length: the context length it was trained at (as for `OLMoCoreAdapter`).
    split: how the model splits the sequence over ranks (`topology.read_sequence_split`).
    """

    def __init__(self, model: Any, max_length: int, split: SequenceSplit) -> None:
        super().__init__(model)
        self.max_length = max_length
        self.vocab_size = int(model.vocab_size)
        self.split = split
        self.packing = packs(SPLIT_SEQUENCE_ROUTE, model)
        self.head_scores = split.cp_size == 1 and split.tp_mesh is not None and scores_in_head(model)
        self.workspace = HeadWorkspace()

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(
            width_multiple=self.split.multiple,
            packing=self.packing,
            peer_groups=tuple(self.split.groups()),
            prefix_reuse=self.packing,
        )

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        """Run `model` on the full inputs: its head scoring the targets (see the class docstring), or
        projecting only the positions (rows_U, cols_U) in this rank's chunk (`logits_to_keep` in the chunk's
        coordinates; under tensor parallelism a replicated DTensor, the logits coming back sharded over the
        kept slots), keeping the logits of those this rank holds."""
        split, input_ids_BT, rows_U, cols_U = self.split, inputs.input_ids_BT, inputs.rows_U, inputs.cols_U
        if self.head_scores:
            scoring = scoring_head(self.model, inputs, self.workspace, peers_share_batch=True)
            with attention_for(self, inputs), scoring as scored:
                self.model(input_ids_BT)
            return scored.result()
        with attention_for(self, inputs):
            return self._forward(split, input_ids_BT, rows_U, cols_U)

    def _forward(
        self, split: SequenceSplit, input_ids_BT: Tensor, rows_U: Tensor, cols_U: Tensor
    ) -> SequenceShard:
        start, width = split.held(input_ids_BT.shape[1])
        chunk_C = torch.nonzero((cols_U >= start) & (cols_U < start + width))[:, 0]
        rows_C = rows_U[chunk_C]
        keep_BK, slot_C = positions_to_keep(rows_C, cols_U[chunk_C] - start, input_ids_BT.shape[0])
        if split.tp_mesh is None:
            logits_BKV = self.model(input_ids_BT, logits_to_keep=keep_BK)
            _check_local(logits_BKV, keep_BK.shape, "with logits_to_keep")
            logits_LV, held_L = logits_BKV[rows_C, slot_C], chunk_C
        else:
            keep = DTensor.from_local(keep_BK, split.tp_mesh, (Replicate(),), run_check=False)
            local_BWV = _sequence_local(self.model(input_ids_BT, logits_to_keep=keep))
            first = split.tp_rank * -(-keep_BK.shape[1] // split.tp_size)  # torch.chunk's split of the slots
            _check_local(local_BWV, (keep_BK.shape[0], local_BWV.shape[1]), "sharded on the kept positions")
            mine_C = (slot_C >= first) & (slot_C < first + local_BWV.shape[1])
            logits_LV, held_L = local_BWV[rows_C[mine_C], slot_C[mine_C] - first], chunk_C[mine_C]
        groups = [g for _, g in split.groups()]
        return SequenceShard(logits_LV, held_L, int(rows_U.shape[0]), groups)


def positions_to_keep(rows_N: Tensor, cols_N: Tensor, n_rows: int) -> tuple[Tensor, Tensor]:
    """The positions of each row to project, as OLMo-core's `logits_to_keep` takes them: keep [B, K] (K the
    most positions any row needs; a row needing fewer repeats position 0), and the slot of each selected
    position within its row's K [N]."""
    order_N = torch.argsort(rows_N, stable=True)
    rows_sorted_N = rows_N[order_N]
    count_B = torch.bincount(rows_N, minlength=n_rows)
    start_B = torch.cumsum(count_B, 0) - count_B
    slot_sorted_N = torch.arange(rows_N.shape[0], device=rows_N.device) - start_B[rows_sorted_N]
    slot_N = torch.empty_like(slot_sorted_N)
    slot_N[order_N] = slot_sorted_N
    width = max(int(count_B.max()) if n_rows else 0, 1)
    keep_BK = torch.zeros(n_rows, width, dtype=torch.long, device=rows_N.device)
    keep_BK[rows_N, slot_N] = cols_N.long()
    return keep_BK, slot_N


def _sequence_local(logits_BTV: object) -> Tensor:
    """This rank's positions of DTensor logits sharded on the positions (Shard(1)) over one mesh dimension."""
    if not isinstance(logits_BTV, DTensor) or tuple(logits_BTV.placements) != (Shard(1),):
        found = tuple(logits_BTV.placements) if isinstance(logits_BTV, DTensor) else type(logits_BTV).__name__
        raise ModelOutputError(
            f"tensor-parallel OLMo-core model output: expected logits as a DTensor sharded on the positions "
            f"(placements (Shard(dim=1),)), found {found}"
        )
    return logits_BTV.to_local()


def _check_local(logits_BXV: object, shape: tuple[int, ...] | torch.Size, how: str) -> None:
    if (
        not isinstance(logits_BXV, Tensor)
        or logits_BXV.dim() != 3
        or tuple(logits_BXV.shape[:2]) != tuple(shape)
    ):
        found = tuple(logits_BXV.shape) if isinstance(logits_BXV, Tensor) else type(logits_BXV).__name__
        raise ModelOutputError(
            f"sequence-parallel OLMo-core model output ({how}): expected this rank's logits of shape "
            f"[{shape[0]}, {shape[1]}, V], found {found}"
        )
