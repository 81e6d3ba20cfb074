"""`ICLMetric`: one task's scored requests as a torchmetrics `Metric`, synced over the data-parallel group by
concatenation; its figures come from the pure functions of `metrics/icl.py`.

States, one per dtype, so that a sync is two gathers whatever the number of fields (docs/design.md):
- `int_rows`: [N, F] int64, one row per scored pair, the columns INT_FIELDS (REQUEST_FIELDS but `ll`). A
  request's row has its document's id (>= 0); an unconditional pair's row has doc_id UNCONDITIONAL (-1), its
  id in `uncond_id` and zeros elsewhere.
- `ll`: [N] float64, each row's loglikelihood.

What every rank promises: it calls `compute` on the same metrics in the same order (torchmetrics then makes
the same collectives on every rank: per state a barrier, a gather of its shape and a gather of its values).
What the metric keeps, whatever a rank saw:
- a rank with no documents (one that never called `update`) sends states of the others' dtype and shape:
  each list state holds a typed empty tensor from construction and after `reset`, because torchmetrics sends
  an empty list state as an empty tensor of its default float dtype, which no gather with the other ranks'
  int64 [N, F] rows can take;
- ranks may hold different numbers of rows (torchmetrics pads them to the longest and cuts them back);
- without a sync (one process, or `sync_on_compute=False`) `compute` reads this rank's own list states.
Legend: N rows (requests and unconditional pairs), F the integer fields, U unconditional pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from inloop_eval.metrics.icl import (
    OLMO_FIGURE_NOTE,
    REQUEST_FIELDS,
    DocumentOutcomes,
    icl_evaluate,
    olmo_compute,
)
from inloop_eval.metrics.registry import unknown_metrics

# The integer columns of `int_rows`, in order.
INT_FIELDS: tuple[str, ...] = tuple(name for name in REQUEST_FIELDS if name != "ll")
# The doc_id of an unconditional pair's row: documents are indices, never negative.
UNCONDITIONAL = -1
# Fields kept as 0/1 in `int_rows` (not every backend gathers bool tensors) and read back as bool.
BOOL_FIELDS = ("is_gold", "is_greedy")


def request_rows(fields: dict[str, Tensor], device: torch.device) -> tuple[Tensor, Tensor]:
    """(int_rows [n, F] int64, ll [n] float64) of `fields`: the REQUEST_FIELDS, [n] each."""
    missing = sorted(set(REQUEST_FIELDS) - set(fields))
    unknown = sorted(set(fields) - set(REQUEST_FIELDS))
    if missing or unknown:
        raise ValueError(
            f"ICLMetric.update: expected the fields {list(REQUEST_FIELDS)}, found {missing} missing and "
            f"{unknown} unknown"
        )
    n = fields["doc_id"].numel()
    for name in REQUEST_FIELDS:
        if fields[name].numel() != n:
            raise ValueError(f"ICLMetric.update: field {name!r} has {fields[name].numel()} values, expected {n}")
    columns = [fields[name].detach().reshape(-1).to(device, torch.long) for name in INT_FIELDS]
    int_rows_nF = torch.stack(columns, dim=1)
    if bool((int_rows_nF[:, 0] < 0).any()):
        raise ValueError(
            f"ICLMetric.update: doc_id {int(int_rows_nF[:, 0].min())} is negative; documents are indices >= 0 "
            f"({UNCONDITIONAL} marks an unconditional pair)"
        )
    return int_rows_nF, fields["ll"].detach().reshape(-1).to(device, torch.float64)


def unconditional_rows(uncond_id_U: Tensor, uncond_ll_U: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
    """(int_rows [U, F] int64, ll [U] float64) of scored unconditional pairs: ids [U], loglikelihoods [U]."""
    uid_U = uncond_id_U.detach().reshape(-1).to(device, torch.long)
    ll_U = uncond_ll_U.detach().reshape(-1).to(device, torch.float64)
    if uid_U.numel() != ll_U.numel():
        raise ValueError(
            f"ICLMetric.update: {uid_U.numel()} unconditional ids but {ll_U.numel()} loglikelihoods; expected one each"
        )
    int_rows_UF = torch.zeros(uid_U.numel(), len(INT_FIELDS), dtype=torch.long, device=device)
    int_rows_UF[:, INT_FIELDS.index("doc_id")] = UNCONDITIONAL
    int_rows_UF[:, INT_FIELDS.index("uncond_id")] = uid_U
    return int_rows_UF, ll_U


def split_rows(int_rows_NF: Tensor, ll_N: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """(the requests' REQUEST_FIELDS [R] each, unconditional ids [U], their loglikelihoods [U]) of rows."""
    int_rows_NF, ll_N = int_rows_NF.cpu(), ll_N.cpu().to(torch.float64)
    is_request_N = int_rows_NF[:, INT_FIELDS.index("doc_id")] != UNCONDITIONAL
    columns_FR = int_rows_NF[is_request_N].t().contiguous()  # one field after another, each contiguous
    requests = dict(zip(INT_FIELDS, columns_FR, strict=True))
    for name in BOOL_FIELDS:
        requests[name] = requests[name] > 0
    requests["ll"] = ll_N[is_request_N]
    uncond_N = ~is_request_N
    return requests, int_rows_NF[uncond_N, INT_FIELDS.index("uncond_id")], ll_N[uncond_N]


class ICLMetric(Metric):
    """Per-request loglikelihoods of one task, synced across ranks by concatenation.

    `update(**fields)` takes flat [n] tensors named as REQUEST_FIELDS, `update(uncond_uid=, uncond_ll=)` (or
    `update_uncond`) the scored unconditional pairs, both at once too. `compute` gives the dict of
    `icl_compute`, and OLMo's figures for `olmo_metric_type`.

    Args:
        metrics: the figures to compute (names of `metrics/registry.py`).
        olmo_metric_type: an OLMo metric type (`metrics/olmo.py`) whose figures to add, or None.
        kwargs: torchmetrics' `Metric` options: `process_group`, `sync_on_compute`, `dist_sync_fn`, ...
    """

    full_state_update = False
    is_differentiable = False

    int_rows: list[Tensor] | Tensor
    ll: list[Tensor] | Tensor

    def __init__(self, metrics: Sequence[str], olmo_metric_type: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        unknown = unknown_metrics(metrics)
        if unknown:
            raise ValueError(f"ICLMetric: unknown metrics {unknown}")
        self.metric_names = tuple(metrics)
        self.olmo_metric_type = olmo_metric_type
        # persistent: a state_dict taken mid-evaluation carries the rows.
        self.add_state("int_rows", default=[], dist_reduce_fx="cat", persistent=True)
        self.add_state("ll", default=[], dist_reduce_fx="cat", persistent=True)
        self.add_typed_empty_rows()
        self.outcomes: DocumentOutcomes | None = None
        """The per-document values of the latest `compute`, over all ranks."""
        self.uncond_U: tuple[Tensor, Tensor] | None = None
        """The unconditional pairs of the latest `compute`, over all ranks: (uncond_id_U, ll_U)."""

    def add_typed_empty_rows(self) -> None:
        """Put an empty [0, F] int64 and [0] float64 tensor in the list states, so that a rank that never
        updates still gathers the other ranks' dtypes and shapes (see the module docstring)."""
        self.int_rows.append(torch.zeros(0, len(INT_FIELDS), dtype=torch.long, device=self.device))
        self.ll.append(torch.zeros(0, dtype=torch.float64, device=self.device))

    def reset(self) -> None:
        """Every state back to its typed empty rows."""
        super().reset()
        self.add_typed_empty_rows()

    def update(  # type: ignore[override]
        self, uncond_uid: Tensor | None = None, uncond_ll: Tensor | None = None, **fields: Tensor
    ) -> None:
        """Add scored requests (`fields`: every REQUEST_FIELDS, [n] each; empty tensors add nothing) and/or
        scored unconditional pairs (`uncond_uid`, `uncond_ll`: [u] each)."""
        if (uncond_uid is None) != (uncond_ll is None):
            raise ValueError("ICLMetric.update: give both uncond_uid and uncond_ll, or neither")
        if not fields and uncond_uid is None:
            raise ValueError("ICLMetric.update: no requests (REQUEST_FIELDS) and no unconditional pairs given")
        if fields:
            int_rows_nF, ll_n = request_rows(fields, self.device)
            self.int_rows.append(int_rows_nF)
            self.ll.append(ll_n)
        if uncond_uid is not None and uncond_ll is not None:
            int_rows_uF, ll_u = unconditional_rows(uncond_uid, uncond_ll, self.device)
            self.int_rows.append(int_rows_uF)
            self.ll.append(ll_u)

    def update_uncond(self, uncond_id: Tensor, ll: Tensor) -> None:
        """Add scored unconditional pairs: ids [u], loglikelihoods [u]."""
        self.update(uncond_uid=uncond_id, uncond_ll=ll)

    def compute(self) -> dict[str, float]:
        """`icl_compute`'s figures, and OLMo's (under OLMo's names, e.g. `len_norm_v1`) when the metric was
        made with an `olmo_metric_type`. Their per-document values (over all ranks) are kept in `outcomes`."""
        # A list state when not synced, one tensor when synced: dim_zero_cat takes either.
        requests, uncond_id_U, uncond_ll_U = split_rows(dim_zero_cat(self.int_rows), dim_zero_cat(self.ll))
        self.uncond_U = (uncond_id_U, uncond_ll_U)
        out, outcomes = icl_evaluate(requests, uncond_id_U, uncond_ll_U, self.metric_names)
        if self.olmo_metric_type is not None:
            olmo = olmo_compute(requests, uncond_id_U, uncond_ll_U, self.olmo_metric_type)
            out.update(olmo)
            outcomes.left_out.update({name: OLMO_FIGURE_NOTE for name in olmo})
        self.outcomes = outcomes
        return out
