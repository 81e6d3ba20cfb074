"""`PerplexityMetric`: one domain label's sums as a torchmetrics `Metric` in the manner of its `MeanMetric`
(a weighted sum and its weights, synced by sum), its figures from `metrics/perplexity.py`.

State: `sums` [3] float64, the SUMS in order: Σ nll in nats, Σ predicted tokens, Σ bytes, in one state so
that a label syncs in one collective. The counts are exact in float64 below 2**53 tokens or bytes.
Sync: a state of one fixed shape reduced by sum needs no gather, so the metric's default `dist_sync_fn` is
`all_reduce_sum` (one all-reduce, handed back to torchmetrics as a one-entry "gathered" list, which its
sum reduction leaves as it is) instead of torchmetrics' `gather_all_tensors` (a barrier, a gather of the
shape and a gather of the values). A `dist_sync_fn` given to the constructor replaces it.
An evaluation's labels sync together: `PerplexityMetric.compute_labels` sums every label's `sums` in one all-reduce and syncs
each metric to its row through torchmetrics' own `sync_context`, so ten labels make one collective, not ten.
What every rank promises: it calls `compute` for every label, in the same order, a rank with nothing to add
keeping its zeros, so that all ranks make the same collectives. Without a sync (one process, or
`sync_on_compute=False`) `compute` reads this rank's own sums.
Legend: S sequences (or tokens: a token is a sequence of one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric

from inloop_eval.metrics.perplexity import perplexity_compute, perplexity_update

# The entries of the `sums` state, in order.
SUMS = ("sum_nll", "n_tokens", "n_bytes")


def all_reduce_sum(state: Tensor, group: Any = None) -> list[Tensor]:
    """A `dist_sync_fn` for a state reduced by sum: [the state summed over `group`] (one all-reduce of a
    copy; torchmetrics keeps the unsynced state to put back on `unsync`)."""
    summed = state.clone()
    dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
    return [summed]


class PerplexityMetric(Metric):
    """One domain's sums (`sum_nll`, `n_tokens`, `n_bytes`), synced by sum; `compute` gives the sums and the
    figures of `perplexity_compute` (ce, ppl, bpb: token-weighted).

    Args:
        kwargs: torchmetrics' `Metric` options: `process_group`, `sync_on_compute`, `dist_sync_fn` (default
            `all_reduce_sum`), ...
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    sums: Tensor

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("dist_sync_fn", all_reduce_sum)
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

    @staticmethod
    def compute_labels(metrics: Sequence[PerplexityMetric], group: Any, syncing: bool) -> list[dict[str, float]]:
        """Each label's `compute` over `group`: with `syncing`, all labels' sums summed in one all-reduce
        ([L, 3]), each metric synced to its own row (torchmetrics' `sync_context` with a `dist_sync_fn` that hands
        back that row), computed and put back to its own sums; without, each metric's own `compute`. The metrics
        are made with `sync_on_compute=False`, so that `compute` itself makes no collective."""
        if not syncing or not metrics:
            return [metric.compute() for metric in metrics]
        summed_L3 = torch.stack([metric.sums for metric in metrics])
        dist.all_reduce(summed_L3, op=dist.ReduceOp.SUM, group=group)
        out: list[dict[str, float]] = []
        for metric, summed in zip(metrics, summed_L3, strict=True):
            with metric.sync_context(
                dist_sync_fn=lambda _state, group=None, summed=summed: [summed],
                process_group=group,
                distributed_available=lambda: True,
            ):
                out.append(metric.compute())
        return out
