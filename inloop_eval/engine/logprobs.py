"""The arithmetic every output form shares: log p(target) and the greedy flag from float32 logits, a bounded number
of positions at a time, so peak memory grows with neither the sequence length nor the batch times the
vocabulary.

What it promises its callers (`engine/outputs/`): the greedy flags come from the read of the logits that finds
each row's maximum, with no further pass over them; nothing is copied from the device to the host when the
batch's targets are given on the host (`HostTargets`, made by `scoring.forward_inputs` from the planner's
arrays), and the targets once per batch when they are not.
Legend: U positions read, V vocabulary, C positions of one chunk, K blocks of a row, W logits of one block,
M targets of a chunk, N targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from inloop_eval.errors import ModelOutputError

# Float32 logits materialised at once (positions x vocabulary): 16 Mi elements, 64 MiB.
HEAD_ELEMENTS = 1 << 24

# Logits per block of a row when looking for its maximum: wide enough for `amax` over a block to run as
# fast as over the whole row, and few enough blocks that finding the first one holding the maximum is cheap.
MAX_BLOCK = 1024

# Scores the targets `target_M` read at the chunk's positions `local_M`, for the chunk [start, stop).
ChunkScorer = Callable[[int, int, Tensor, Tensor], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class HostTargets:
    """A batch's targets as planned, on the host, so that chunking and checking them asks the device for
    nothing: target n is token `target_N[n]`, predicted by position `position_N[n]` of the U read."""

    position_N: np.ndarray
    target_N: np.ndarray

    @classmethod
    def read(cls, position_N: Tensor, target_N: Tensor) -> HostTargets:
        """The targets copied from wherever they are, in one copy (for callers that hold them only there)."""
        both_2N = torch.stack([position_N.long(), target_N.long()]).cpu().numpy()
        return cls(both_2N[0], both_2N[1])

    @property
    def max_target(self) -> int:
        """The largest token id among the targets; -1 when there are none."""
        return int(self.target_N.max()) if self.target_N.size else -1


def on_host(position_N: Tensor, target_N: Tensor, known: HostTargets | None) -> HostTargets:
    """The targets on the host: `known` when the caller has them, else read from the device once."""
    return known if known is not None else HostTargets.read(position_N, target_N)


def chunk_positions(vocab: int) -> int:
    """Positions per chunk: as many as keep a float32 [C, V] block within HEAD_ELEMENTS."""
    return max(1, HEAD_ELEMENTS // max(vocab, 1))


def chunk_bounds(position_N: np.ndarray, n_positions: int, chunk: int) -> list[int]:
    """Where each chunk's targets begin and end among the targets sorted by position: chunk c's are
    [bounds[c], bounds[c + 1]), for the chunks of `chunk` positions covering `n_positions`."""
    n_chunks = -(-n_positions // chunk)
    per_chunk = np.bincount(position_N // chunk, minlength=n_chunks)[:n_chunks]
    return [0, *np.cumsum(per_chunk).tolist()]


def chunked_logprobs(
    n_positions: int,
    vocab: int,
    position_N: Tensor,
    target_N: Tensor,
    host: HostTargets,
    score_chunk: ChunkScorer,
) -> tuple[Tensor, Tensor]:
    """log p(target) [N] and greedy flags [N], the positions taken `chunk_positions(vocab)` at a time in order;
    `score_chunk(start, stop, local_M, target_M)` scores the targets of one chunk (local_M their positions
    within it). A position that predicts several targets (the last context position of a letter-key
    document predicts every choice) is projected once. `host`: the same targets on the host, whence the
    chunks' bounds (the device sorts, the host counts: neither waits for the other)."""
    chunk = chunk_positions(vocab)
    bounds = chunk_bounds(host.position_N, n_positions, chunk)
    order_N = torch.argsort(position_N, stable=True)
    sorted_pos_N = position_N[order_N]
    logp_N = torch.zeros(target_N.shape[0], dtype=torch.float32, device=target_N.device)
    greedy_N = torch.zeros(target_N.shape[0], dtype=torch.bool, device=target_N.device)
    for c, start in enumerate(range(0, n_positions, chunk)):
        picked = order_N[bounds[c] : bounds[c + 1]]
        local_M = sorted_pos_N[bounds[c] : bounds[c + 1]] - start
        logp_N[picked], greedy_N[picked] = score_chunk(start, min(start + chunk, n_positions), local_M, target_N[picked])
    return logp_N, greedy_N


def plain_logprobs(logits_CV: Tensor, local_M: Tensor, target_M: Tensor, *, in_place: bool) -> tuple[Tensor, Tensor]:
    """log p(target) [M] and greedy flags [M] from float32 logits [C, V] holding the whole vocabulary.
    in_place: the logits are the caller's scratch, and may be overwritten (about twice as fast).
    A target is greedy when it is `logits_CV[local_M].argmax(-1)` (ties to the lowest id); in a row holding
    NaN none is (as in the vocabulary-sharded path)."""
    logit_M = logits_CV[local_M, target_M]  # read before the log-sum-exp may overwrite the logits
    max_C, first_C = row_max(logits_CV)
    greedy_M = (first_C[local_M] == target_M) & ~max_C[local_M].isnan()
    return logit_M - _logsumexp(logits_CV, max_C, in_place=in_place)[local_M], greedy_M


def row_max(logits_CV: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's maximum [C] and the lowest index reaching it [C] (`torch.argmax`'s tie-break), in one read
    of the logits: the maximum of each block of MAX_BLOCK logits (`amax`, vectorised; `torch.max` with its
    indices is about 4x slower on CPU), the first block reaching the row's maximum (`argmax` over K blocks),
    then the first index within that block (`argmax` over MAX_BLOCK logits a row)."""
    max_C, block_C = _block_max(logits_CV).max(dim=-1)  # the first block reaching the maximum, as argmax
    index_CW = block_C[:, None] * MAX_BLOCK + torch.arange(MAX_BLOCK, device=logits_CV.device)
    index_CW.clamp_(max=logits_CV.shape[1] - 1)  # a short last block: its last logit repeated, never first
    first_C = index_CW.gather(1, logits_CV.gather(1, index_CW).argmax(dim=-1, keepdim=True))[:, 0]
    return max_C, first_C


def check_vocab(vocab: int, max_target: int, min_vocab: int) -> None:
    """ModelOutputError unless logits `vocab` wide cover the tokenizer's vocabulary and every target, the
    largest of which is `max_target` (`HostTargets.max_target`)."""
    if vocab < min_vocab or max_target >= vocab:
        raise ModelOutputError(
            f"expected logits over at least {max(min_vocab, max_target + 1)} tokens (the tokenizer's "
            f"vocabulary), found {vocab}; the model and the tokenizer do not match"
        )


def _block_max(logits_CV: Tensor) -> Tensor:
    """The maximum [C, K] of each run of MAX_BLOCK logits of a row, the last run possibly shorter."""
    whole = logits_CV.shape[1] - logits_CV.shape[1] % MAX_BLOCK
    blocks_CK = [logits_CV[:, :whole].unflatten(1, (whole // MAX_BLOCK, MAX_BLOCK)).amax(dim=-1)]
    if whole < logits_CV.shape[1]:
        blocks_CK.append(logits_CV[:, whole:].amax(dim=-1, keepdim=True))
    return torch.cat(blocks_CK, dim=1)


def _logsumexp(logits_CV: Tensor, max_C: Tensor, in_place: bool) -> Tensor:
    """logsumexp over the vocabulary given each row's max; in place (exponentials written over the logits)
    when the logits are ours to overwrite, about twice as fast as `torch.logsumexp`."""
    if not in_place:
        return torch.logsumexp(logits_CV, dim=-1)
    shift_C = torch.where(torch.isfinite(max_C), max_C, torch.zeros_like(max_C))  # as torch.logsumexp does
    return logits_CV.sub_(shift_C[:, None]).exp_().sum(dim=-1).log_().add_(shift_C)
