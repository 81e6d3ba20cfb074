"""From a model's features to per-pair loglikelihoods, in float32, at continuation positions only.

The vocabulary projection and the log-softmax run on the selected positions only, a bounded number of
them at a time, so peak memory grows with neither the sequence length nor the batch times the vocabulary.
A head whose logits are a DTensor sharded on the vocabulary is scored slice by slice (`vocab_parallel`); a
model splitting the sequence over ranks, each on the positions it holds (`sequence_parallel`).
Legend: N continuation tokens in a batch, U distinct positions predicting them, X feature width (hidden
size, or V for logits), V vocabulary, C positions of one head chunk, M targets of a chunk, P pairs scored,
B rows, T time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from inloop_eval.engine.adapters import ModelAdapter
from inloop_eval.engine.batching import Batch, attention_mask_B1TT
from inloop_eval.engine.sequence_parallel import SequenceShard
from inloop_eval.engine.vocab_parallel import VocabShard, sharded_logprobs, vocab_shard
from inloop_eval.errors import ModelOutputError

# Float32 logits materialised at once (positions x vocabulary): 16 Mi elements, 64 MiB.
_HEAD_ELEMENTS = 1 << 24


@dataclass
class PairScores:
    """ll: sum of continuation log-probs [P] (float32 log-probs summed in float64); greedy: every continuation
    token is the model's argmax [P]; tokens_forwarded: padded tokens sent through the model."""

    ll: np.ndarray
    greedy: np.ndarray
    tokens_forwarded: int


def _head_width(features_NX: Tensor, head: Callable[[Tensor], Tensor]) -> int:
    """The width of the head's logits: an nn.Linear's `out_features`, else measured on one position."""
    if isinstance(head, nn.Linear):
        return int(head.out_features)
    if features_NX.shape[0] == 0:
        return int(features_NX.shape[-1])
    return int(head(features_NX[:1]).shape[-1])


class HeadWorkspace:
    """One float32 logits buffer reused across chunks and batches: a fresh [chunk, V] tensor per chunk
    costs as much in page faults as the exponentials computed in it."""

    def __init__(self) -> None:
        self.buffer: Tensor | None = None

    def get(self, rows: int, vocab: int, device: torch.device) -> Tensor:
        buf = self.buffer
        if buf is None or buf.shape[1] != vocab or buf.shape[0] < rows or buf.device != device:
            buf = self.buffer = torch.empty(rows, vocab, dtype=torch.float32, device=device)
        return buf[:rows]


def _float32_linear(head: Callable[[Tensor], Tensor], features_UX: Tensor) -> nn.Linear | None:
    """The head, when calling it is exactly a float32 matrix product: a plain nn.Linear (no subclass, no
    hooks, no sharded or quantised weight) fed float32 features. Then it can write into a workspace."""
    if (
        type(head) is nn.Linear
        and not (head._forward_hooks or head._forward_pre_hooks)
        and type(head.weight.data) is Tensor
        and head.weight.dtype == features_UX.dtype == torch.float32
    ):
        return head
    return None


def _project(
    head: Callable[[Tensor], Tensor], linear: nn.Linear | None, x_CX: Tensor, workspace: HeadWorkspace
) -> tuple[Tensor, bool]:
    """Float32 logits [C, V] of a chunk, and whether they live in the workspace (may be overwritten)."""
    if linear is None:
        return head(x_CX).float(), False
    out = workspace.get(x_CX.shape[0], linear.out_features, x_CX.device)
    if linear.bias is None:
        return torch.mm(x_CX, linear.weight.t(), out=out), True
    return torch.addmm(linear.bias, x_CX, linear.weight.t(), out=out), True


def _logsumexp(logits_CV: Tensor, max_C: Tensor, in_place: bool) -> Tensor:
    """logsumexp over the vocabulary given each row's max; in place (exponentials written over the logits)
    when the logits are ours to overwrite, about twice as fast as `torch.logsumexp`."""
    if not in_place:
        return torch.logsumexp(logits_CV, dim=-1)
    shift_C = torch.where(torch.isfinite(max_C), max_C, torch.zeros_like(max_C))  # as torch.logsumexp does
    return logits_CV.sub_(shift_C[:, None]).exp_().sum(dim=-1).log_().add_(shift_C)


def token_logprobs(
    features_UX: Tensor,
    head: Callable[[Tensor], Tensor],
    target_N: Tensor,
    min_vocab: int = 0,
    position_N: Tensor | None = None,
    workspace: HeadWorkspace | None = None,
) -> tuple[Tensor, Tensor]:
    """log p(target) in float32 and whether the target is the argmax, projecting in chunks.

    features_UX: features of U positions; target n is predicted by position `position_N[n]` (default: n),
        so a position that predicts several targets (the last context position of a letter-key document
        predicts every choice) is projected once.
    min_vocab: the tokenizer's vocabulary size; narrower logits mean the model does not match it.
    workspace: a logits buffer to reuse across calls (a float32 nn.Linear head writes into it).
    """
    if position_N is None:
        position_N = torch.arange(target_N.shape[0], device=target_N.device)
    workspace = workspace or HeadWorkspace()
    linear = _float32_linear(head, features_UX)
    order_N = torch.argsort(position_N, stable=True)
    sorted_pos_N = position_N[order_N]
    vocab = _head_width(features_UX, head)
    _check_vocab(vocab, target_N, min_vocab)
    chunk = max(1, _HEAD_ELEMENTS // max(vocab, 1))
    bounds = torch.searchsorted(
        sorted_pos_N, torch.arange(0, features_UX.shape[0] + chunk, chunk, device=position_N.device)
    ).tolist()
    logp_N = torch.zeros(target_N.shape[0], dtype=torch.float32, device=target_N.device)
    greedy_N = torch.zeros(target_N.shape[0], dtype=torch.bool, device=target_N.device)
    for c, start in enumerate(range(0, features_UX.shape[0], chunk)):
        logits_CV, owned = _project(head, linear, features_UX[start : start + chunk], workspace)
        picked = order_N[bounds[c] : bounds[c + 1]]
        local_M, target_M = sorted_pos_N[bounds[c] : bounds[c + 1]] - start, target_N[picked]
        if isinstance(logits_CV, DTensor):  # a tensor-parallel head: this rank's slice of the vocabulary
            logits_CV = vocab_shard(logits_CV)
            if isinstance(logits_CV, VocabShard):
                logp_N[picked], greedy_N[picked] = sharded_logprobs(logits_CV, local_M, target_M)
                continue
        logit_M = logits_CV[local_M, target_M]
        max_C = logits_CV.amax(dim=-1)
        greedy_N[picked] = _is_argmax(logits_CV, max_C, local_M, target_M, logit_M)
        logp_N[picked] = logit_M - _logsumexp(logits_CV, max_C, in_place=owned)[local_M]
    return logp_N, greedy_N


def _check_vocab(vocab: int, target_N: Tensor, min_vocab: int) -> None:
    """ModelOutputError unless logits `vocab` wide cover the tokenizer's vocabulary and every target."""
    max_target = int(target_N.max()) if target_N.numel() else -1  # one host sync per batch, not per chunk
    if vocab < min_vocab or max_target >= vocab:
        raise ModelOutputError(
            f"expected logits over at least {max(min_vocab, max_target + 1)} tokens (the tokenizer's "
            f"vocabulary), found {vocab}; the model and the tokenizer do not match"
        )


def sequence_shard_logprobs(
    shard: SequenceShard,
    target_N: Tensor,
    min_vocab: int,
    position_N: Tensor,
    workspace: HeadWorkspace | None = None,
) -> tuple[Tensor, Tensor]:
    """log p(target) [N] and the greedy flag [N] when this rank holds the logits of some positions only:
    its targets scored by `token_logprobs` on its positions, the others zero, then one all-reduce of [2, N]
    over the ranks holding the rest. The vocabulary is checked on every target first, so that every rank
    raises alike or joins the all-reduce."""
    _check_vocab(int(shard.logits_LV.shape[-1]), target_N, min_vocab)
    local_U = torch.full((shard.n_positions,), -1, dtype=torch.long, device=target_N.device)
    local_U[shard.held_L] = torch.arange(shard.held_L.shape[0], device=target_N.device)
    local_N = local_U[position_N]
    mine_N = local_N >= 0
    scores_2N = torch.zeros(2, target_N.shape[0], dtype=torch.float32, device=target_N.device)
    if bool(mine_N.any()):
        logp_M, greedy_M = token_logprobs(
            shard.logits_LV, _identity, target_N[mine_N], 0, local_N[mine_N], workspace
        )
        scores_2N[0, mine_N] = logp_M
        scores_2N[1, mine_N] = greedy_M.float()
    shard.all_reduce(scores_2N)
    return scores_2N[0], scores_2N[1] > 0


def _identity(x: Tensor) -> Tensor:
    return x


def _is_argmax(
    logits_CV: Tensor, max_C: Tensor, local_M: Tensor, target_M: Tensor, logit_M: Tensor
) -> Tensor:
    """`logits_CV[local_M].argmax(-1) == target_M`, with the full argmax only where the target reaches
    the maximum (ties go to the lowest index, as argmax breaks them)."""
    reaches_M = logit_M >= max_C[local_M]
    candidates = torch.nonzero(reaches_M)[:, 0]
    if candidates.numel():
        first = logits_CV[local_M[candidates]].argmax(dim=-1) == target_M[candidates]
        reaches_M[candidates] = first
    return reaches_M


def _packing_inputs(
    adapter: ModelAdapter, batch: Batch, device: torch.device
) -> tuple[Tensor | None, Tensor | None]:
    """(attention mask [B, 1, T, T], position ids [B, T]) of a packed batch; (None, None) otherwise."""
    if batch.segment_BT is None or batch.position_ids_BT is None:
        return None, None
    if not adapter.supports_packing:
        raise ValueError(
            f"run_batches: a packed batch was planned for {type(adapter).__name__}, which does not take an "
            "attention mask and position ids; plan with packing=adapter.supports_packing"
        )
    segment_BT = torch.from_numpy(batch.segment_BT).to(device)
    return attention_mask_B1TT(segment_BT), torch.from_numpy(batch.position_ids_BT).to(device)


def _unique_positions(batch: Batch, width: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(rows_U, cols_U) of the distinct positions read, and the position of each target [N]."""
    flat_N = batch.rows_N * width + batch.cols_N
    flat_U, position_N = np.unique(flat_N, return_inverse=True)
    rows_U, cols_U = np.divmod(flat_U, width)
    t = torch.from_numpy
    return t(rows_U).to(device), t(cols_U).to(device), t(position_N.reshape(-1)).to(device)


@contextmanager
def _naming_batch(describe: Callable[[int], str], batch: Batch) -> Iterator[None]:
    """A ModelOutputError raised in the block names the batch's first pair (or says it is padding)."""
    try:
        yield
    except ModelOutputError as exc:
        where = describe(int(batch.pair_N[0])) if batch.pair_N.size else "a padding batch"
        raise ModelOutputError(f"{where}: {exc}") from None


def run_batches(
    adapter: ModelAdapter,
    batches: Iterable[Batch],
    n_pairs: int,
    describe: Callable[[int], str] = lambda p: f"pair {p}",
    progress: Callable[[int], None] | None = None,
    min_vocab: int = 0,
) -> PairScores:
    """Forward every batch and sum log-probs per pair. Batches with no targets (dummies) are run and
    their output discarded."""
    device = adapter.device
    ll_P = torch.zeros(n_pairs, dtype=torch.float64)
    n_bad_P = torch.zeros(n_pairs, dtype=torch.int64)
    forwarded = 0
    workspace = HeadWorkspace()
    for batch in batches:
        input_ids_BT = torch.from_numpy(batch.input_ids_BT).to(device)
        rows_U, cols_U, position_N = _unique_positions(batch, input_ids_BT.shape[1], device)
        target_N = torch.from_numpy(batch.target_N).to(device)
        mask_B1TT, position_ids_BT = _packing_inputs(adapter, batch, device)
        if adapter.scores_targets:  # forward and scoring in one call, which every rank of its group joins
            with _naming_batch(describe, batch):
                logp_N, greedy_N, tokens = adapter.target_logprobs(
                    input_ids_BT, rows_U, cols_U, position_N, target_N, min_vocab
                )
            forwarded += tokens
            adapter.tokens_scored += tokens
        else:
            features_UX, head = adapter.features(input_ids_BT, rows_U, cols_U, mask_B1TT, position_ids_BT)
            forwarded += batch.n_tokens
            adapter.tokens_scored += batch.n_tokens
            if batch.pair_N.size == 0:
                continue
            with _naming_batch(describe, batch):
                if isinstance(features_UX, SequenceShard):
                    logp_N, greedy_N = sequence_shard_logprobs(
                        features_UX, target_N, min_vocab, position_N, workspace
                    )
                else:
                    logp_N, greedy_N = token_logprobs(
                        features_UX, head, target_N, min_vocab, position_N, workspace
                    )
        if batch.pair_N.size == 0:
            continue
        owners_N = torch.from_numpy(batch.pair_N)
        ll_P.index_add_(0, owners_N, logp_N.cpu().double())
        n_bad_P.index_add_(0, owners_N, (~greedy_N).long().cpu())
        if progress is not None:
            progress(len(np.unique(batch.pair_N)))
    return PairScores(ll_P.numpy(), (n_bad_P == 0).numpy(), forwarded)
