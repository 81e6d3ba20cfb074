"""From a model's features to per-pair loglikelihoods, in float32, at continuation positions only.

The vocabulary projection and the log-softmax run on the selected positions only, a bounded number of
them at a time, so peak memory grows with neither the sequence length nor the batch times the vocabulary.
Legend: N continuation tokens in a batch, X feature width (hidden size, or V for logits), V vocabulary,
P pairs scored, B rows, T time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from inloop_eval.adapters import ModelAdapter
from inloop_eval.batching import Batch, attention_mask_B1TT
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
    """The vocabulary the head projects to, without running it when it says (nn.Linear does)."""
    weight = getattr(head, "weight", None)
    if isinstance(weight, Tensor) and weight.dim() == 2:
        return int(weight.shape[0])
    return int(features_NX.shape[-1])


def token_logprobs(
    features_NX: Tensor, head: Callable[[Tensor], Tensor], target_N: Tensor, min_vocab: int = 0
) -> tuple[Tensor, Tensor]:
    """log p(target) in float32 and whether the target is the argmax, projecting in chunks.

    min_vocab: the tokenizer's vocabulary size; narrower logits mean the model does not match it.
    """
    chunk = max(1, _HEAD_ELEMENTS // max(_head_width(features_NX, head), 1))
    logp, greedy = [], []
    for start in range(0, features_NX.shape[0], chunk):
        logits_NV = head(features_NX[start : start + chunk]).float()
        target = target_N[start : start + chunk]
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
        input_ids_BT = torch.from_numpy(batch.input_ids_BT).to(device)
        rows_N = torch.from_numpy(batch.rows_N).to(device)
        cols_N = torch.from_numpy(batch.cols_N).to(device)
        target_N = torch.from_numpy(batch.target_N).to(device)
        mask_B1TT, position_ids_BT = _packing_inputs(adapter, batch, device)
        features_NX, head = adapter.features(input_ids_BT, rows_N, cols_N, mask_B1TT, position_ids_BT)
        forwarded += batch.n_tokens
        if batch.pair_N.size == 0:
            continue
        try:
            logp_N, greedy_N = token_logprobs(features_NX, head, target_N, min_vocab)
        except ModelOutputError as exc:
            raise ModelOutputError(f"{describe(int(batch.pair_N[0]))}: {exc}") from None
        owners_N = torch.from_numpy(batch.pair_N)
        ll_P.index_add_(0, owners_N, logp_N.cpu().double())
        n_bad_P.index_add_(0, owners_N, (~greedy_N).long().cpu())
        if progress is not None:
            progress(len(np.unique(batch.pair_N)))
    return PairScores(ll_P.numpy(), (n_bad_P == 0).numpy(), forwarded)
