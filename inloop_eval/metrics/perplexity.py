"""Perplexity of one domain from sums of negative log-likelihood, tokens and bytes, as pure functions (the
sums are kept and synced across ranks by `metrics/perplexity_metric.py`'s `PerplexityMetric`).

ce = Σ nll / Σ tokens (token-weighted: a 10-token document weighs a tenth of a 100-token one, never a mean
of per-document means), ppl = exp(ce), bpb = Σ nll / Σ bytes / ln 2 (nll in nats).
OLMo-core's `LMEvaluator` (for `documents` domains): olmo_ce_loss = Σ nll / Σ positions, where a sequence of
L tokens has L positions, the last predicting nothing (loss 0); olmo_ppl = exp(olmo_ce_loss).
Legend: S sequences (or tokens: a token is a sequence of one).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

FIGURES = ("ce", "ppl", "bpb")
# The figures of a label of padded documents (`documents` domains), as OLMo-core's `LMEvaluator` computes
# them: its `CE loss` and `PPL`.
PADDED_DOCUMENT_FIGURES = ("olmo_ce_loss", "olmo_ppl")


def perplexity_update(nll_S: Tensor, n_tokens_S: Tensor, n_bytes_S: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(Σ nll in float64, Σ tokens, Σ bytes) of sequences with summed NLL `nll_S` [S] over `n_tokens_S` [S]
    predicted tokens covering `n_bytes_S` [S] bytes."""
    return (
        nll_S.detach().to(torch.float64).sum(),
        n_tokens_S.detach().to(torch.int64).sum(),
        n_bytes_S.detach().to(torch.int64).sum(),
    )


def perplexity_compute(sum_nll: float, n_tokens: int, n_bytes: int) -> dict[str, float]:
    """ce, ppl and bpb from the sums; bpb only when bytes are known (n_bytes > 0); {} without tokens, so a
    domain nobody scored is left out rather than reported as NaN."""
    if n_tokens <= 0:
        return {}
    ce = sum_nll / n_tokens
    try:
        ppl = math.exp(ce)
    except OverflowError:
        ppl = math.inf
    out = {"ce": ce, "ppl": ppl}
    if n_bytes > 0:
        out["bpb"] = sum_nll / n_bytes / math.log(2)
    return out


def padded_documents_perplexity(sum_nll: float, n_positions: int) -> dict[str, float]:
    """OLMo-core's CE loss and PPL of a label from its synced Σ nll over `n_positions` positions (Σ L over its
    sequences); NaN for a label without positions, as OLMo-core's mean of nothing is."""
    ce = sum_nll / n_positions if n_positions > 0 else math.nan
    try:
        ppl = math.exp(ce)
    except OverflowError:
        ppl = math.inf
    return dict(zip(PADDED_DOCUMENT_FIGURES, (ce, ppl), strict=True))
