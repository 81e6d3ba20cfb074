"""`PerplexityMetric`: one domain label's sums as a torchmetrics `Metric` in the manner of its `MeanMetric`
(a weighted sum and its weights, each synced by sum), its figures from `metrics/perplexity.py`.

States: `sum_nll` (float64: Σ nll in nats), `n_tokens` and `n_bytes` (int64), each a scalar synced by sum.
What every rank promises: it calls `compute` for every label, in the same order, a rank with nothing to add
keeping its zeros, so that all ranks make the same collectives (torchmetrics: per state a barrier and a
gather). Without a sync (one process, or `sync_on_compute=False`) `compute` reads this rank's own sums.
Legend: S sequences (or tokens: a token is a sequence of one).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from inloop_eval.metrics.perplexity import perplexity_compute, perplexity_update


class PerplexityMetric(Metric):
    """One domain's sums (`sum_nll`, `n_tokens`, `n_bytes`), each synced by sum; `compute` gives the sums and
    the figures of `perplexity_compute` (ce, ppl, bpb: token-weighted).

    Args:
        kwargs: torchmetrics' `Metric` options: `process_group`, `sync_on_compute`, `dist_sync_fn`, ...
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    sum_nll: Tensor
    n_tokens: Tensor
    n_bytes: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # persistent: a state_dict taken mid-evaluation carries the sums.
        self.add_state("sum_nll", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum", persistent=True)
        self.add_state("n_tokens", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum", persistent=True)
        self.add_state("n_bytes", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum", persistent=True)

    def update(self, nll_S: Tensor, n_tokens_S: Tensor, n_bytes_S: Tensor) -> None:  # type: ignore[override]
        """Add sequences: summed NLL [S], predicted tokens [S], bytes [S] (empty tensors add nothing)."""
        if not (nll_S.numel() == n_tokens_S.numel() == n_bytes_S.numel()):
            raise ValueError(
                f"PerplexityMetric.update: expected tensors of one length, found {nll_S.numel()}, "
                f"{n_tokens_S.numel()}, {n_bytes_S.numel()}"
            )
        sum_nll, n_tokens, n_bytes = perplexity_update(nll_S, n_tokens_S, n_bytes_S)
        self.sum_nll += sum_nll.to(self.device)
        self.n_tokens += n_tokens.to(self.device)
        self.n_bytes += n_bytes.to(self.device)

    def compute(self) -> dict[str, float]:
        """The sums (`sum_nll`, `n_tokens`, `n_bytes`) over the group and the figures of `perplexity_compute`."""
        sums = {"sum_nll": float(self.sum_nll), "n_tokens": int(self.n_tokens), "n_bytes": int(self.n_bytes)}
        return {**sums, **perplexity_compute(sums["sum_nll"], sums["n_tokens"], sums["n_bytes"])}
