"""Target log-probabilities of a Megatron-core `GPTModel` for one planned batch, in the topology it trains in:
Megatron's own schedule run forward only, this rank's vocabulary slice of the logits scored with its
tensor-parallel group, and the scores shared from the last pipeline stage.

What every rank of the model-parallel groups promises: the same batch (the data-parallel group holds one rank
of each tensor- and pipeline-parallel group, so the evaluator hands peers the same documents), cut the same
way into `M` micro-batches of `R` rows (right padding, rows of padding for the last; neither seen by a real
position), the width a multiple of TP under sequence parallelism, and one call of
`get_forward_backward_func()(..., forward_only=True)`. Every stage's forward is given the micro-batch's
position ids and Megatron's causal attention mask (True: masked out); a packed micro-batch is run under
its attention route (`attention.ROUTE`: RoPE at its position ids, the core attention through the engine's
`tree_attention` under the planner's mask), a kept prefix's too, causal, its keys and values recorded
(`BatchAttention`). On the last stage, as each micro-batch's logits arrive,
the positions it holds are selected (a chunk of at most `HEAD_ELEMENTS` floats at a time) and scored over the
tensor-parallel group (`outputs.vocab_sharded.sharded_logprobs`: four all-reduces per chunk, the vocabulary never
gathered). Then one all-reduce over the pipeline group says whether a stage failed, and the last stage
broadcasts 2N floats (log-probabilities, greedy flags).

A forward that raises on a stage is caught: the stage sends zeros of the activation's shape on, so that the
schedule, and every other stage, runs to its end, and then every rank of the pipeline raises that stage's
error (`ModelOutputError`) instead of waiting in a receive that never comes. A scoring failure on the last
stage (logits narrower than the tokenizer's vocabulary) is shared the same way.

Training is left as it was: the schedule runs forward only (no gradient, no grad sync, no
`finalize_model_grads`), its micro-batch count is passed to it (the micro-batch calculator is not read or
changed), and Megatron's RNG tracker's states are restored after each batch.
Legend: B rows of a planned batch, R rows of a micro-batch, T width, U positions read, C of them in a
chunk, N targets, L this rank's slice of the vocabulary, H hidden size.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import tensor_parallel
from megatron.core.pipeline_parallel import get_forward_backward_func
from torch import Tensor

from inloop_eval.engine.adapter import ForwardInputs, ModelAdapter
from inloop_eval.engine.attention_route import Routing, routed, routing_for
from inloop_eval.engine.outputs.vocab_sharded import VocabShard, sharded_logprobs
from inloop_eval.engine.tree_attention import TreeMask
from inloop_eval.errors import ModelOutputError
from inloop_eval.integrations.megatron.attention import ROUTE
from inloop_eval.integrations.megatron.topology import MegatronTopology, unwrap_gpt

log = logging.getLogger(__name__)

# Float32 logits selected at once (positions x this rank's vocabulary): 16 Mi elements, 64 MiB.
HEAD_ELEMENTS = 1 << 24


def micro_batches(
    input_ids_BT: Tensor, topology: MegatronTopology, rows: int | None, pad_id: int
) -> tuple[Tensor, int]:
    """The batch padded to M micro-batches of R rows, and R. R: `rows`, or the batch split over the pipeline's
    stages; M at least the pipeline size and a multiple of the interleaved schedule's group. Its width is the
    planner's, a multiple of TP under sequence parallelism (`AdapterNeeds.width_multiple`, a kept prefix's
    row included); ValueError for any other."""
    n_rows, width = input_ids_BT.shape
    if width % topology.sequence_multiple:
        raise ValueError(
            f"MegatronAdapter: a batch of width {width} under sequence parallelism needs a width that is a "
            f"multiple of {topology.sequence_multiple} (TP); plan with the adapter's needs.width_multiple, and "
            "a max_length that is a multiple of TP"
        )
    stages = topology.pp_size
    per_micro = rows or max(1, -(-n_rows // stages))
    count = max(-(-n_rows // per_micro), stages if stages > 1 else 1)
    multiple = topology.microbatch_multiple()
    count = -(-count // multiple) * multiple
    padded_BT = torch.full(
        (count * per_micro, width), pad_id, dtype=input_ids_BT.dtype, device=input_ids_BT.device
    )
    padded_BT[:n_rows] = input_ids_BT
    return padded_BT, per_micro


def causal_inputs(n_rows: int, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Position ids [R, T] and Megatron's causal attention mask [1, 1, T, T] (True: masked out)."""
    position_ids_RT = torch.arange(width, device=device).expand(n_rows, width)
    mask_11TT = torch.ones(1, 1, width, width, dtype=torch.bool, device=device).triu_(1)
    return position_ids_RT, mask_11TT


@dataclass
class BatchAttention:
    """How each micro-batch of a padded batch [B', T'] is run: the position ids [B', T'] and Megatron's causal
    mask [1, 1, T', T'] (True: masked out) `GPTModel.forward` is given and, for a packed batch or a kept prefix,
    its `Routing` over the padded batch (the padding `micro_batches` added seeing only itself, at position 0),
    applied by `attention.ROUTE` to each micro-batch's chunk; a kept prefix (micro-batch 0's row 0) recorded
    from micro-batch 0 only."""

    position_ids_BT: Tensor
    causal_11TT: Tensor
    routing: Routing | None = None
    _slices: dict[int, Routing] = field(default_factory=dict, repr=False)

    def around(self, gpt: Any, m: int, rows: int) -> AbstractContextManager[None]:
        """The context chunk `gpt` forwards micro-batch m (rows m * rows ..) in."""
        routing = self.routing
        if routing is not None and m not in self._slices:
            micro, tree = slice(m * rows, (m + 1) * rows), routing.tree
            mask = TreeMask(
                tree.span_end_BT[micro],
                tree.position_ids_BT[micro],
                tree.prefix_length,
                tree.rendering,
                tree.kernel,
            )
            record = routing.record if m == 0 else None
            self._slices[m] = Routing(mask, routing.kept, record, routing.record_length)
        return routed(gpt, ROUTE, self._slices.get(m))


def batch_attention(
    adapter: ModelAdapter, inputs: ForwardInputs, padded_BT: Tensor, packing: bool
) -> BatchAttention:
    """The `BatchAttention` of `inputs` padded to `padded_BT` [B', T']: plain causal rows (Megatron's own
    attention), a kept prefix (causal rows, row 0's keys and values recorded in `inputs.prefix.states`), or a
    packed batch (after the kept prefix `inputs.prefix` where one is). ValueError for packed rows planned for a
    model that does not pack (`packing`), or a mask that does not fit the batch."""
    n_rows, width = padded_BT.shape
    position_ids_BT, causal_11TT = causal_inputs(n_rows, width, padded_BT.device)
    keeping = inputs.keeps_prefix and inputs.prefix is not None
    routing = routing_for(adapter, inputs, packing)
    if routing is None or (inputs.tree is None and not keeping):
        return BatchAttention(position_ids_BT, causal_11TT)
    if keeping:
        causal = dataclasses.replace(routing, tree=inputs.causal_mask(n_rows, width))
        return BatchAttention(position_ids_BT, causal_11TT, causal)
    B, T = inputs.input_ids_BT.shape
    tree = routing.tree
    position_ids_BT = torch.zeros(n_rows, width, dtype=torch.long, device=padded_BT.device)
    position_ids_BT[:B, :T] = tree.position_ids_BT
    span_end_BT = torch.arange(1, width + 1, device=padded_BT.device).expand(n_rows, width).clone()
    span_end_BT[:B, :T] = tree.span_end_BT
    padded = TreeMask(span_end_BT, position_ids_BT, tree.prefix_length, tree.rendering, tree.kernel)
    return BatchAttention(position_ids_BT, causal_11TT, dataclasses.replace(routing, tree=padded))


def forward_only(
    chunks: Sequence[Any],
    topology: MegatronTopology,
    padded_BT: Tensor,
    rows: int,
    attention: BatchAttention,
    on_logits: Callable[[int, Tensor], None],
) -> str:
    """Run Megatron's schedule forward only over the micro-batches of `padded_BT`, each run as `attention`
    says; on the last stage call `on_logits(m, logits_RTL)` for micro-batch m. Returns '' or
    the error a forward raised on this rank."""
    count, width = padded_BT.shape[0] // rows, padded_BT.shape[1]
    failures: list[str] = []

    def step(data_iterator: Iterator[int], model: Any) -> tuple[Tensor, Callable[..., None]]:
        m = next(data_iterator)
        gpt = unwrap_gpt(model)
        output = None
        if not failures:
            try:
                micro = slice(m * rows, (m + 1) * rows)
                with attention.around(gpt, m, rows):
                    output = model(padded_BT[micro], attention.position_ids_BT[micro], attention.causal_11TT)
            except Exception as exc:  # shared after the schedule, so that no stage waits for this one
                log.exception("Megatron stage %d: the forward of micro-batch %d raised", topology.pp_rank, m)
                failures.append(f"Megatron stage {topology.pp_rank}: {type(exc).__name__}: {exc}")
        if output is None:
            output = _stand_in(gpt, topology, rows, width, padded_BT.device)

        def collect(output_RTL: Tensor, non_loss_data: bool = False) -> None:
            if failures:
                return
            try:
                on_logits(m, output_RTL)
            except Exception as exc:  # inside the schedule: shared after it, as a forward's error
                log.exception("Megatron last stage: scoring micro-batch %d raised", m)
                failures.append(f"Megatron last stage: {type(exc).__name__}: {exc}")

        return output, collect

    iterators = [iter(range(count)) for _ in chunks]
    get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iterators if len(chunks) > 1 else iterators[0],
        model=list(chunks),
        num_microbatches=count,
        seq_length=width,
        micro_batch_size=rows,
        forward_only=True,
        collect_non_loss_data=True,
    )
    return failures[0] if failures else ""


def _stand_in(gpt: Any, topology: MegatronTopology, rows: int, width: int, device: torch.device) -> Tensor:
    """Zeros of the activation a stage sends on [T / TP under sequence parallelism, R, H]."""
    dtype = getattr(gpt.config, "pipeline_dtype", None) or next(gpt.parameters()).dtype
    return torch.zeros(
        width // topology.sequence_multiple, rows, topology.hidden_size, dtype=dtype, device=device
    )


class LastStageScores:
    """The scores of a batch's targets, filled micro-batch by micro-batch on the last stage: target n is
    predicted by position `position_N[n]` of (rows_U, cols_U) of the padded batch."""

    def __init__(
        self,
        topology: MegatronTopology,
        rows_U: Tensor,
        cols_U: Tensor,
        position_N: Tensor,
        target_N: Tensor,
        min_vocab: int,
        rows: int,
    ) -> None:
        self.topology, self.rows_U, self.cols_U = topology, rows_U, cols_U
        self.position_N, self.target_N, self.min_vocab, self.rows = position_N, target_N, min_vocab, rows
        self.logp_N = torch.zeros(target_N.shape[0], dtype=torch.float32, device=target_N.device)
        self.greedy_N = torch.zeros(target_N.shape[0], dtype=torch.bool, device=target_N.device)
        self.failure = ""

    def __call__(self, m: int, logits_RTL: Tensor) -> None:
        """Score the targets of micro-batch m from its logits [R, T, L] (L: V/TP, or V when gathered)."""
        if self.failure:
            return
        self.failure = self._check(logits_RTL)
        if self.failure:
            return
        first = m * self.rows
        in_U = (self.rows_U >= first) & (self.rows_U < first + self.rows)
        picked_N = torch.nonzero(in_U[self.position_N])[:, 0]
        if picked_N.numel() == 0:
            return
        order = torch.argsort(self.position_N[picked_N], stable=True)
        picked_N = picked_N[order]
        position_M = self.position_N[picked_N]
        target_M = self.target_N[picked_N]
        width = logits_RTL.shape[-1]
        sharded = width != self.topology.vocab_size
        chunk = max(1, HEAD_ELEMENTS // max(width, 1))
        starts = torch.unique_consecutive(position_M)
        for c in range(0, starts.shape[0], chunk):
            positions_C = starts[c : c + chunk]
            in_chunk = (position_M >= positions_C[0]) & (position_M <= positions_C[-1])
            local_M = torch.searchsorted(positions_C, position_M[in_chunk])
            logits_CL = logits_RTL[self.rows_U[positions_C] - first, self.cols_U[positions_C]].float()
            logp_M, greedy_M = _score(logits_CL, local_M, target_M[in_chunk], self.topology, sharded)
            self.logp_N[picked_N[in_chunk]] = logp_M
            self.greedy_N[picked_N[in_chunk]] = greedy_M

    def _check(self, logits_RTL: Any) -> str:
        """'' when the logits are [R, T, V/TP] (vocabulary-parallel) or [R, T, V] (gathered) over at least the
        tokenizer's vocabulary; else what was found."""
        topology = self.topology
        if not isinstance(logits_RTL, Tensor) or logits_RTL.dim() != 3 or logits_RTL.shape[0] != self.rows:
            found = tuple(logits_RTL.shape) if isinstance(logits_RTL, Tensor) else type(logits_RTL).__name__
            return f"Megatron last stage: expected logits [{self.rows}, T, V], found {found}"
        width = int(logits_RTL.shape[-1])
        vocab = width * topology.tp_size if width * topology.tp_size == topology.vocab_size else width
        max_target = int(self.target_N.max()) if self.target_N.numel() else -1
        if vocab < self.min_vocab or max_target >= vocab:
            return (
                f"expected logits over at least {max(self.min_vocab, max_target + 1)} tokens (the tokenizer's "
                f"vocabulary), found {vocab}; the model and the tokenizer do not match"
            )
        return ""


def _score(
    logits_CL: Tensor, local_M: Tensor, target_M: Tensor, topology: MegatronTopology, sharded: bool
) -> tuple[Tensor, Tensor]:
    """log p(target) [M] and greedy flags [M] of targets predicted by the chunk's positions `local_M`."""
    if sharded and topology.tp_group is not None:
        shard = VocabShard(logits_CL, topology.tp_rank * logits_CL.shape[1], topology.tp_group)
        return sharded_logprobs(shard, local_M, target_M)
    logp_CL = torch.log_softmax(logits_CL, dim=-1)
    return logp_CL[local_M, target_M], logits_CL.argmax(dim=-1)[local_M] == target_M


def share_scores(topology: MegatronTopology, scores: LastStageScores, failure: str) -> tuple[Tensor, Tensor]:
    """(log p [N], greedy [N]) on every rank of the pipeline group, from its last stage; every rank raises
    the first failing stage's error (a forward that raised, or the last stage's scoring)."""
    failure = failure or (scores.failure if topology.has_last_stage else "")
    device = scores.target_N.device
    if topology.pp_group is None:
        if failure:
            raise ModelOutputError(failure)
        return scores.logp_N, scores.greedy_N
    code = torch.tensor(
        [topology.pp_size - topology.pp_rank if failure else 0], dtype=torch.int64, device=device
    )
    dist.all_reduce(code, op=dist.ReduceOp.MAX, group=topology.pp_group)
    if int(code[0]):
        message = [failure]
        source = topology.pp_size - int(code[0])
        dist.broadcast_object_list(message, group=topology.pp_group, group_src=source)
        raise ModelOutputError(message[0])
    scores_2N = torch.stack([scores.logp_N, scores.greedy_N.float()])
    dist.broadcast(scores_2N, group=topology.pp_group, group_src=topology.pp_size - 1)
    return scores_2N[0], scores_2N[1] == 1.0


@contextmanager
def rng_tracker_untouched() -> Iterator[None]:
    """Megatron's (CUDA) RNG tracker states as they were after the body, whether it returns or raises."""
    tracker = tensor_parallel.get_cuda_rng_tracker()
    states = {name: state.clone() for name, state in tracker.get_states().items()}
    try:
        yield
    finally:
        tracker.set_states(states)
