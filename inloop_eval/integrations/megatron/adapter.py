"""The evaluator's adapter for a Megatron-core `GPTModel` in its training topology: a thin wrapper over
`forward` (the schedule run, the last stage's scoring, the sharing) that the engine calls per batch.

Every rank builds one from the model chunks Megatron trains (`model` as `setup_model_and_optimizer` returns
it: one chunk, or one per virtual pipeline stage) and passes it to `InLoopEvaluator.run` with
`dp_group=parallel_state.get_data_parallel_group()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, ModelAdapter
from inloop_eval.engine.attention_route import report_refusal
from inloop_eval.engine.outputs.pipeline_stage import ScoredTargets
from inloop_eval.integrations.megatron.attention import ROUTE
from inloop_eval.integrations.megatron.forward import (
    LastStageScores,
    batch_attention,
    forward_only,
    micro_batches,
    rng_tracker_untouched,
    share_scores,
)
from inloop_eval.integrations.megatron.topology import read_topology, unwrap_gpt


class MegatronAdapter(ModelAdapter):
    """A Megatron-core `GPTModel` (or its list of chunks, wrapped by Megatron's DDP or not), scored in place
    through Megatron's forward-only schedule.

    model: this rank's model chunk, or its chunks in virtual-stage order.
    micro_batch_size: rows of each micro-batch the schedule runs; by default each batch split over the
        pipeline's stages (one micro-batch without pipeline parallelism).
    pad_id: the token id of padding.
    """

    def __init__(self, model: Any, *, micro_batch_size: int | None = None, pad_id: int = 0) -> None:
        chunks = list(model) if isinstance(model, Sequence | nn.ModuleList) else [model]
        self.topology = read_topology(chunks)
        super().__init__(nn.ModuleList(chunks))
        self.chunks = chunks
        self.micro_batch_size = micro_batch_size
        self.pad_id = pad_id
        self.max_length = self.topology.max_length
        self.vocab_size = self.topology.vocab_size
        if self.topology.packing_blocker:
            report_refusal(ROUTE, unwrap_gpt(chunks[0]), self.topology.packing_blocker)

    @property
    def needs(self) -> AdapterNeeds:
        """Widths a multiple of TP under sequence parallelism; packed rows and kept prefixes where its
        attention route (`attention.ROUTE`) was verified for the model (`topology.packing_blocker`: under TP, SP,
        PP alike, since the mask is per position, not per head, sequence parallelism gathers the whole sequence
        before core attention, and every stage's chunks are routed); its tensor and pipeline peers fed the
        same documents."""
        named = (("tensor", self.topology.tp_group), ("pipeline", self.topology.pp_group))
        peers = tuple((name, g) for name, g in named if g is not None)
        packing = not self.topology.packing_blocker
        return AdapterNeeds(
            width_multiple=self.topology.sequence_multiple,
            packing=packing,
            peer_groups=peers,
            prefix_reuse=packing,
        )

    def tokens_fed(self, inputs: ForwardInputs) -> int:
        """The tokens of the whole micro-batches the schedule runs."""
        padded_BT, _ = micro_batches(inputs.input_ids_BT, self.topology, self.micro_batch_size, self.pad_id)
        return int(padded_BT.numel())

    def forward(self, inputs: ForwardInputs) -> ScoredTargets:
        """log p(target) [N] and greedy flags [N] on every rank, scored on the last stage."""
        padded_BT, rows = micro_batches(
            inputs.input_ids_BT, self.topology, self.micro_batch_size, self.pad_id
        )
        scores = LastStageScores(
            self.topology,
            inputs.rows_U,
            inputs.cols_U,
            inputs.position_N,
            inputs.target_N,
            inputs.min_vocab,
            rows,
        )
        attention = batch_attention(self, inputs, padded_BT, not self.topology.packing_blocker)
        with rng_tracker_untouched():
            failure = forward_only(self.chunks, self.topology, padded_BT, rows, attention, scores)
        logp_N, greedy_N = share_scores(self.topology, scores, failure)
        return ScoredTargets(logp_N, greedy_N, self.topology.vocab_size)
