"""`PerplexityMetric`: one domain label's sums as a torchmetrics `Metric` in the manner of its `MeanMetric`
(a weighted sum and its weights, synced by sum), its figures from `metrics/perplexity.py`.

State: `sums` [3] float64, the SUMS in order: Σ nll in nats, Σ predicted tokens, Σ bytes, in one state so
that a label syncs in three collectives (torchmetrics: a barrier, a gather of its shape, a gather of its
values), not three per sum. The counts are exact in float64 below 2**53 tokens or bytes.
What every rank promises: it calls `compute` for every label, in the same order, a rank with nothing to add
keeping its zeros, so that all ranks make the same collectives. Without a sync (one process, or
`sync_on_compute=False`) `compute` reads this rank's own sums.
Legend: S sequences (or tokens: a token is a sequence of one).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from inloop_eval.metrics.perplexity import perplexity_compute, perplexity_update

# The entries of the `sums` state, in order.
SUMS = ("sum_nll", "n_tokens", "n_bytes")


class PerplexityMetric(Metric):
    """One domain's sums (`sum_nll`, `n_tokens`, `n_bytes`), synced by sum; `compute` gives the sums and the
    figures of `perplexity_compute` (ce, ppl, bpb: token-weighted).

    Args:
        kwargs: torchmetrics' `Metric` options: `process_group`, `sync_on_compute`, `dist_sync_fn`, ...
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    sums: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # persistent: a state_dict taken mid-evaluation carries the sums.
        default = torch.zeros(len(SUMS), dtype=torch.float64)
        self.add_state("sums", default=default, dist_reduce_fx="sum", persistent=True)

    def update(self, nll_S: Tensor, n_tokens_S: Tensor, n_bytes_S: Tensor) -> None:  # type: ignore[override]
        """Add sequences: summed NLL [S], predicted tokens [S], bytes [S] (empty tensors add nothing)."""
        if not (nll_S.numel() == n_tokens_S.numel() == n_bytes_S.numel()):
            raise ValueError(
                f"PerplexityMetric.update: expected tensors of one length, found {nll_S.numel()}, "
                f"{n_tokens_S.numel()}, {n_bytes_S.numel()}"
            )
        added = torch.stack([value.to(torch.float64) for value in perplexity_update(nll_S, n_tokens_S, n_bytes_S)])
        self.sums += added.to(self.device)

    def compute(self) -> dict[str, float]:
        """The sums (`sum_nll`, `n_tokens`, `n_bytes`) over the group and the figures of `perplexity_compute`."""
        sum_nll, n_tokens, n_bytes = self.sums.tolist()
        sums = {"sum_nll": sum_nll, "n_tokens": int(n_tokens), "n_bytes": int(n_bytes)}
        return {**sums, **perplexity_compute(sums["sum_nll"], sums["n_tokens"], sums["n_bytes"])}
