"""From a model's features to per-pair loglikelihoods, in float32, at continuation positions only.

Legend: N continuation tokens in a batch, V vocabulary, P pairs scored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from inloop_eval.adapters import ModelAdapter
from inloop_eval.batching import Batch
from inloop_eval.errors import ModelOutputError

# Positions projected to the vocabulary at once: bounds the float32 [chunk, V] buffer.
_HEAD_CHUNK = 1024


@dataclass
class PairScores:
    """ll: sum of continuation log-probs [P] (float32 log-probs summed in float64); greedy: every continuation
    token is the model's argmax [P]; tokens_forwarded: padded tokens sent through the model."""

    ll: np.ndarray
    greedy: np.ndarray
    tokens_forwarded: int


def token_logprobs(
    features_NX: Tensor, head: Callable[[Tensor], Tensor], target_N: Tensor, min_vocab: int = 0
) -> tuple[Tensor, Tensor]:
    """log p(target) in float32 and whether the target is the argmax, projecting in chunks.

    min_vocab: the tokenizer's vocabulary size; narrower logits mean the model does not match it.
    """
    logp, greedy = [], []
    for start in range(0, features_NX.shape[0], _HEAD_CHUNK):
        logits_NV = head(features_NX[start : start + _HEAD_CHUNK]).float()
        target = target_N[start : start + _HEAD_CHUNK]
        vocab = logits_NV.shape[-1]
        if vocab < min_vocab or (target.numel() and int(target.max()) >= vocab):
            raise ModelOutputError(
                f"expected logits over at least {max(min_vocab, int(target.max()) + 1)} tokens (the tokenizer's "
                f"vocabulary), found {vocab}; the model and the tokenizer do not match"
            )
        picked = logits_NV.gather(1, target[:, None])[:, 0]
        logp.append(picked - torch.logsumexp(logits_NV, dim=-1))
        greedy.append(logits_NV.argmax(dim=-1) == target)
    if not logp:
        return torch.zeros(0), torch.zeros(0, dtype=torch.bool)
    return torch.cat(logp), torch.cat(greedy)


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
    for batch in batches:
        input_ids = torch.from_numpy(batch.input_ids_BT).to(device)
        rows = torch.from_numpy(batch.rows_N).to(device)
        cols = torch.from_numpy(batch.cols_N).to(device)
        target = torch.from_numpy(batch.target_N).to(device)
        features, head = adapter.features(input_ids, rows, cols)
        forwarded += batch.n_tokens
        if batch.pair_N.size == 0:
            continue
        try:
            logp_N, greedy_N = token_logprobs(features, head, target, min_vocab)
        except ModelOutputError as exc:
            raise ModelOutputError(f"{describe(int(batch.pair_N[0]))}: {exc}") from None
        owners = torch.from_numpy(batch.pair_N)
        ll_P.index_add_(0, owners, logp_N.cpu().double())
        n_bad_P.index_add_(0, owners, (~greedy_N).long().cpu())
        if progress is not None:
            progress(len(np.unique(batch.pair_N)))
    return PairScores(ll_P.numpy(), (n_bad_P == 0).numpy(), forwarded)
