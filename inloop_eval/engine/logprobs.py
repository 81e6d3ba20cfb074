"""The arithmetic every layout shares: log p(target) and the greedy flag from float32 logits, a bounded number
of positions at a time, so peak memory grows with neither the sequence length nor the batch times the
vocabulary.
Legend: U positions read, V vocabulary, C positions of one chunk, M targets of a chunk, N targets.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from inloop_eval.errors import ModelOutputError

# Float32 logits materialised at once (positions x vocabulary): 16 Mi elements, 64 MiB.
HEAD_ELEMENTS = 1 << 24

# Scores the targets `target_M` read at the chunk's positions `local_M`, for the chunk [start, stop).
ChunkScorer = Callable[[int, int, Tensor, Tensor], tuple[Tensor, Tensor]]


def chunk_positions(vocab: int) -> int:
    """Positions per chunk: as many as keep a float32 [C, V] block within HEAD_ELEMENTS."""
    return max(1, HEAD_ELEMENTS // max(vocab, 1))


def chunked_logprobs(
    n_positions: int, vocab: int, position_N: Tensor, target_N: Tensor, score_chunk: ChunkScorer
) -> tuple[Tensor, Tensor]:
    """log p(target) [N] and greedy flags [N], the positions taken `chunk_positions(vocab)` at a time in order;
    `score_chunk(start, stop, local_M, target_M)` scores the targets of one chunk (local_M their positions
    within it). A position that predicts several targets (the last context position of a letter-key
    document predicts every choice) is projected once."""
    order_N = torch.argsort(position_N, stable=True)
    sorted_pos_N = position_N[order_N]
    chunk = chunk_positions(vocab)
    starts = torch.arange(0, n_positions + chunk, chunk, device=position_N.device)
    bounds = torch.searchsorted(sorted_pos_N, starts).tolist()
    logp_N = torch.zeros(target_N.shape[0], dtype=torch.float32, device=target_N.device)
    greedy_N = torch.zeros(target_N.shape[0], dtype=torch.bool, device=target_N.device)
    for c, start in enumerate(range(0, n_positions, chunk)):
        picked = order_N[bounds[c] : bounds[c + 1]]
        local_M = sorted_pos_N[bounds[c] : bounds[c + 1]] - start
        logp_N[picked], greedy_N[picked] = score_chunk(start, min(start + chunk, n_positions), local_M, target_N[picked])
    return logp_N, greedy_N


def plain_logprobs(logits_CV: Tensor, local_M: Tensor, target_M: Tensor, *, in_place: bool) -> tuple[Tensor, Tensor]:
    """log p(target) [M] and greedy flags [M] from float32 logits [C, V] holding the whole vocabulary.
    in_place: the logits are the caller's scratch, and may be overwritten (about twice as fast)."""
    logit_M = logits_CV[local_M, target_M]
    max_C = logits_CV.amax(dim=-1)
    greedy_M = _is_argmax(logits_CV, max_C, local_M, target_M, logit_M)
    return logit_M - _logsumexp(logits_CV, max_C, in_place=in_place)[local_M], greedy_M


def check_vocab(vocab: int, target_N: Tensor, min_vocab: int) -> None:
    """ModelOutputError unless logits `vocab` wide cover the tokenizer's vocabulary and every target."""
    max_target = int(target_N.max()) if target_N.numel() else -1  # one host sync per batch, not per chunk
    if vocab < min_vocab or max_target >= vocab:
        raise ModelOutputError(
            f"expected logits over at least {max(min_vocab, max_target + 1)} tokens (the tokenizer's "
            f"vocabulary), found {vocab}; the model and the tokenizer do not match"
        )


def _logsumexp(logits_CV: Tensor, max_C: Tensor, in_place: bool) -> Tensor:
    """logsumexp over the vocabulary given each row's max; in place (exponentials written over the logits)
    when the logits are ours to overwrite, about twice as fast as `torch.logsumexp`."""
    if not in_place:
        return torch.logsumexp(logits_CV, dim=-1)
    shift_C = torch.where(torch.isfinite(max_C), max_C, torch.zeros_like(max_C))  # as torch.logsumexp does
    return logits_CV.sub_(shift_C[:, None]).exp_().sum(dim=-1).log_().add_(shift_C)


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
