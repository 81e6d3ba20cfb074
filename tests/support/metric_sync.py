"""What the metrics sync on real gloo ranks (run by `metric_tester.run_job_in_processes`): their figures,
and how many states torchmetrics gathers, counted through its public `dist_sync_fn` option (each gathered
state is a barrier, a gather of its shape and a gather of its values), and how many collectives a perplexity
label's own sync makes (torch.distributed's calls counted, the real ones still run).

A task's rows are dealt as the metric tester deals them (ranks hold different numbers of rows); perplexity
sequences are dealt round-robin. With `MetricCase.empty_last_rank` and `update_when_empty=False`, the last
rank of two or more has nothing and never calls `update` on either metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from metric_tester import MetricCase, feed
from torch import Tensor
from torchmetrics.utilities.distributed import gather_all_tensors

from inloop_eval.metrics.icl_metric import ICLMetric
from inloop_eval.metrics.perplexity_metric import SUMS, PerplexityMetric

# States gathered by `counting_gather` in this process.
GATHERED = [0]


def counting_gather(result: Tensor, group: Any = None) -> list[Tensor]:
    """torchmetrics' own gather, counted."""
    GATHERED[0] += 1
    return gather_all_tensors(result, group)


@contextmanager
def counted_collectives() -> Iterator[list[int]]:
    """The number of torch.distributed barriers, all-gathers and all-reduces made inside (the real ones run)."""
    count = [0]
    names = ("barrier", "all_gather", "all_reduce")
    real = {name: getattr(dist, name) for name in names}

    def counting(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return real[name](*args, **kwargs)

        return call

    for name in names:
        setattr(dist, name, counting(name))
    try:
        yield count
    finally:
        for name in names:
            setattr(dist, name, real[name])


def perplexity_sequences(n: int = 23, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Summed NLL [S] (float64), predicted tokens [S] and bytes [S] of `n` random sequences."""
    rng = np.random.default_rng(seed)
    n_tokens_S = rng.integers(1, 400, n)
    return rng.gamma(2.0, 1.5, n) * n_tokens_S, n_tokens_S, n_tokens_S * rng.integers(2, 6, n)


def holders(case: MetricCase, world_size: int) -> int:
    """The ranks that hold data."""
    return world_size - 1 if (case.empty_last_rank and world_size > 1) else world_size


# The perplexity labels synced together: label l holds sequences l, l + LABELS, ...
LABELS = 3


@dataclass(frozen=True)
class SyncJob:
    """On each rank: `ICLMetric` syncing and not, and `PerplexityMetric`; their figures and states gathered."""

    case: MetricCase

    def __call__(self, rank: int, world_size: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, sync in (("icl", True), ("icl_unsynced", False)):
            metric = ICLMetric(self.case.metrics, dist_sync_fn=counting_gather, sync_on_compute=sync)
            feed(metric, self.case, *self.case.shard(world_size)[rank])
            before = GATHERED[0]
            out[name] = metric.compute()
            out[f"{name}_states_gathered"] = GATHERED[0] - before
            out[f"{name}_keeps_its_own_rows"] = isinstance(metric.int_rows, list) and isinstance(metric.ll, list)
        ppl = PerplexityMetric()  # its own sync: one all-reduce
        n_holders = holders(self.case, world_size)
        if rank < n_holders:
            ppl.update(*(torch.from_numpy(a[rank::n_holders]) for a in perplexity_sequences()))
        with counted_collectives() as count:
            out["ppl"] = ppl.compute()
        out["ppl_collectives"] = count[0]
        out["ppl_keeps_its_own_sums"] = ppl.sums.tolist() != [out["ppl"][k] for k in SUMS]
        # LABELS labels as the perplexity evaluator syncs them: all in one all-reduce
        labels = [PerplexityMetric(sync_on_compute=False) for _ in range(LABELS)]
        for label, metric in enumerate(labels):
            if rank < n_holders:
                metric.update(*(torch.from_numpy(a[label::LABELS][rank::n_holders]) for a in perplexity_sequences()))
        with counted_collectives() as count:
            out["labels"] = PerplexityMetric.compute_labels(labels, None, syncing=world_size > 1)
        out["labels_collectives"] = count[0]
        out["labels_keep_their_own_sums"] = [m.sums.tolist() for m in labels]
        return out
