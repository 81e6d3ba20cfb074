"""The evaluator's adapter for a Megatron-core `GPTModel` in its training layout: a thin wrapper over
`forward` (the schedule run, the last stage's scoring, the sharing) that the engine calls per batch.

Every rank builds one from the model chunks Megatron trains (`model` as `setup_model_and_optimizer` returns
it: one chunk, or one per virtual pipeline stage) and passes it to `InLoopEvaluator.run` with
`dp_group=parallel_state.get_data_parallel_group()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from inloop_eval.engine.adapters import ModelAdapter
from inloop_eval.integrations.megatron.forward import (
    LastStageScores,
    forward_only,
    micro_batches,
    rng_tracker_untouched,
    share_scores,
)
from inloop_eval.integrations.megatron.layout import read_layout


class MegatronAdapter(ModelAdapter):
    """A Megatron-core `GPTModel` (or its list of chunks, wrapped by Megatron's DDP or not), scored in place
    through Megatron's forward-only schedule.

    model: this rank's model chunk, or its chunks in virtual-stage order.
    micro_batch_size: rows of each micro-batch the schedule runs; by default each batch split over the
        pipeline's stages (one micro-batch without pipeline parallelism).
    pad_id: the token id of padding.
    """

    supports_packing = False  # Megatron packs sequences only in Transformer Engine's THD attention
    scores_targets = True

    def __init__(self, model: Any, *, micro_batch_size: int | None = None, pad_id: int = 0) -> None:
        chunks = list(model) if isinstance(model, Sequence | nn.ModuleList) else [model]
        self.layout = read_layout(chunks)
        super().__init__(nn.ModuleList(chunks))
        self.chunks = chunks
        self.micro_batch_size = micro_batch_size
        self.pad_id = pad_id
        self.max_length = self.layout.max_length
        self.vocab_size = self.layout.vocab_size
        self.sequence_multiple = self.layout.sequence_multiple
        named = (("tensor", self.layout.tp_group), ("pipeline", self.layout.pp_group))
        self.model_parallel_groups = tuple((name, g) for name, g in named if g is not None)

    def target_logprobs(
        self,
        input_ids_BT: Tensor,
        rows_U: Tensor,
        cols_U: Tensor,
        position_N: Tensor,
        target_N: Tensor,
        min_vocab: int = 0,
    ) -> tuple[Tensor, Tensor, int]:
        """log p(target) [N] and greedy flags [N] on every rank, and the tokens this rank's schedule ran."""
        padded_BT, rows = micro_batches(input_ids_BT, self.layout, self.micro_batch_size, self.pad_id)
        scores = LastStageScores(self.layout, rows_U, cols_U, position_N, target_N, min_vocab, rows)
        with rng_tracker_untouched():
            failure = forward_only(self.chunks, self.layout, padded_BT, rows, scores)
        logp_N, greedy_N = share_scores(self.layout, scores, failure)
        return logp_N, greedy_N, padded_BT.numel()
