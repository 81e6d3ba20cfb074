"""Multiple-choice metrics from per-request loglikelihoods, as pure tensor functions.

The requests of a task arrive as flat tensors (kept and synced across ranks by `metrics/icl_metric.py`'s
`ICLMetric`), are deduplicated and laid out per document; the figures themselves are defined in
`inloop_eval.metrics.registry`. Nothing here imports torchmetrics: the per-document outcomes
(`DocumentOutcomes`) are read by the loggers and the comparison commands without it.
Legend: R requests (rows, possibly duplicated by sampler padding), U unconditional results,
D documents, K the most choices of any document.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from inloop_eval.metrics.olmo import olmo_icl_compute
from inloop_eval.metrics.registry import METRICS, Choices, MetricDef, canonical, unknown_metrics

REQUEST_FIELDS: tuple[str, ...] = (
    "doc_id",
    "cont_id",
    "n_choices",
    "is_gold",
    "ll",
    "uncond_id",
    "n_tokens",
    "n_chars",
    "n_bytes",
    "is_greedy",
)


def dedup_requests(doc_id_R: Tensor, cont_id_R: Tensor) -> Tensor:
    """Row indices keeping the first occurrence of each (doc_id, cont_id), sorted by that pair."""
    order = torch.argsort(cont_id_R, stable=True)
    order = order[torch.argsort(doc_id_R[order], stable=True)]
    doc, cont = doc_id_R[order], cont_id_R[order]
    first = torch.ones_like(doc, dtype=torch.bool)
    first[1:] = (doc[1:] != doc[:-1]) | (cont[1:] != cont[:-1])
    return order[first]


def uncond_lookup(uncond_id_R: Tensor, uid_U: Tensor, ll_U: Tensor) -> Tensor:
    """ll of each request's unconditional pair (NaN where none was scored or it is missing)."""
    out_R = torch.full(uncond_id_R.shape, math.nan, dtype=torch.float64)
    if uid_U.numel() == 0 or uncond_id_R.numel() == 0:
        return out_R
    uid_sorted, order = torch.sort(uid_U, stable=True)
    pos_R = torch.searchsorted(uid_sorted, uncond_id_R).clamp(max=uid_sorted.numel() - 1)
    found_R = (uid_sorted[pos_R] == uncond_id_R) & (uncond_id_R >= 0)
    out_R[found_R] = ll_U.to(torch.float64)[order[pos_R[found_R]]]
    return out_R


def mean_and_stderr(x_D: Tensor) -> tuple[float, float]:
    """Mean and its standard error with the n-1 sample deviation (lm-evaluation-harness's `mean_stderr`);
    the error is 0.0 for fewer than two documents."""
    n = x_D.numel()
    if n < 2:
        return (float(x_D.mean()) if n else math.nan), 0.0
    return float(x_D.mean()), float(x_D.std(unbiased=True) / math.sqrt(n))


@dataclass(frozen=True)
class DocumentOutcomes:
    """What each complete document of a task scored: the values its figures are the means of.

    doc_id: [D] the documents' ids, ascending. n_choices: [D] each document's number of choices.
    values: figure -> [D] float64 (requested names, aliases under their own), for `accuracy` and `per_doc`
        figures: the figure is the mean of its values (0 or 1 for the figures in `binary`).
    binary: the figures whose values are 0 or 1.
    left_out: figure -> why it has no per-document values (`whole` figures, OLMo's figures).
    doc_task: [D] the task label of each document when the outcomes pool several tasks (a suite average,
        `metrics.suite`): documents are then keyed by (task, doc_id); None for one task's outcomes.
    """

    doc_id: np.ndarray
    n_choices: np.ndarray
    values: dict[str, np.ndarray]
    binary: frozenset[str] = frozenset()
    left_out: dict[str, str] = field(default_factory=dict)
    doc_task: np.ndarray | None = None


# Why a `whole` figure has no per-document values.
WHOLE_FIGURE_NOTE = "computed from all documents at once, not a mean of per-document values"
# Why OLMo's figures have none.
OLMO_FIGURE_NOTE = "OLMo's own figure (metrics.olmo); per-document values are kept for our figures only"


def icl_compute(
    requests: dict[str, Tensor],
    uncond_id_U: Tensor,
    uncond_ll_U: Tensor,
    metrics: Sequence[str],
) -> dict[str, float]:
    """Every requested figure of `inloop_eval.metrics.registry` (harness aliases under their own names),
    `<name>_stderr` beside those that have one, and the COUNTS: `n_docs`, `n_skipped_docs` (documents missing a
    request or with a non-finite score) and `n_nonfinite_docs`.

    requests: the REQUEST_FIELDS, each a [R] tensor; rows repeated by sampler padding count once.
    uncond_id_U, uncond_ll_U: scored unconditional pairs, joined to requests by `uncond_id`.
    """
    return icl_evaluate(requests, uncond_id_U, uncond_ll_U, metrics)[0]


def icl_evaluate(
    requests: dict[str, Tensor],
    uncond_id_U: Tensor,
    uncond_ll_U: Tensor,
    metrics: Sequence[str],
) -> tuple[dict[str, float], DocumentOutcomes]:
    """`icl_compute`'s figures, and the per-document values they are the means of (`DocumentOutcomes`)."""
    unknown = unknown_metrics(metrics)
    if unknown:
        raise ValueError(f"icl_compute: unknown metrics {unknown}")
    wanted = [METRICS[canonical(m)] for m in metrics]
    r = unique_requests(requests)
    ll_R = r["ll"].to(torch.float64)
    ll_uncond_R = uncond_lookup(r["uncond_id"], uncond_id_U, uncond_ll_U)
    docs = complete_documents(r, ll_R, ll_uncond_R, needs_uncond=any(m.needs_uncond for m in wanted))
    choices = dense_choices(r, ll_R, ll_uncond_R, docs)
    figures, values, left_out = document_figures(metrics, wanted, choices)
    outcomes = DocumentOutcomes(
        doc_id=docs.doc_id_D[docs.complete_D].numpy().astype(np.int64),
        n_choices=docs.expected_D[docs.complete_D].numpy().astype(np.int64),
        values=values,
        binary=frozenset(n for n, d in zip(metrics, wanted, strict=True) if d.binary and n in values),
        left_out=left_out,
    )
    return docs.counts() | figures, outcomes


def unique_requests(requests: dict[str, Tensor]) -> dict[str, Tensor]:
    """The REQUEST_FIELDS of `requests` with each (doc_id, cont_id) once, sorted by that pair: rows repeated
    by sampler padding count once."""
    keep = dedup_requests(requests["doc_id"], requests["cont_id"])
    return {k: requests[k][keep] for k in REQUEST_FIELDS}


@dataclass(frozen=True)
class DocumentGrid:
    """The documents seen in a task's unique requests, which of them are complete, and where each request of
    a complete document goes in the dense [D, K] array (D complete documents, K the most choices).

    doc_id_D, expected_D, complete_D, nonfinite_D: over every document seen (ids ascending): its id, its
    number of choices, whether it has all of them and all are finite, whether it has all of them but one is
    not finite. use_R: the requests of complete documents; row_R, col_R: their [D, K] cells.
    """

    doc_id_D: Tensor
    expected_D: Tensor
    complete_D: Tensor
    nonfinite_D: Tensor
    use_R: Tensor
    row_R: Tensor
    col_R: Tensor

    @property
    def n_docs(self) -> int:
        return int(self.complete_D.sum())

    def counts(self) -> dict[str, float]:
        """The COUNTS figures: complete, skipped and non-finite documents."""
        return {
            "n_docs": float(self.n_docs),
            "n_skipped_docs": float(self.doc_id_D.numel() - self.n_docs),
            "n_nonfinite_docs": float(self.nonfinite_D.sum()),
        }

    def dense(self, values_R: Tensor, fill: float) -> Tensor:
        """[D, K] float64: each complete document's values by choice, `fill` where it has fewer choices."""
        k = int(self.col_R.max()) + 1 if self.col_R.numel() else 1
        out_DK = torch.full((self.n_docs, k), fill, dtype=torch.float64)
        out_DK[self.row_R, self.col_R] = values_R[self.use_R].to(torch.float64)
        return out_DK


def complete_documents(
    r: dict[str, Tensor], ll_R: Tensor, ll_uncond_R: Tensor, *, needs_uncond: bool
) -> DocumentGrid:
    """The `DocumentGrid` of unique requests `r`. A document is complete when it has all of its choices
    and all of them are finite (their unconditional scores too, when a figure needs them)."""
    doc_id_D, doc_of_R = torch.unique(r["doc_id"], return_inverse=True)
    n_seen = doc_id_D.numel()
    count_D = torch.zeros(n_seen, dtype=torch.long).index_add_(0, doc_of_R, torch.ones_like(doc_of_R))
    expected_D = torch.zeros(n_seen, dtype=torch.long).scatter_reduce_(
        0, doc_of_R, r["n_choices"], reduce="amax", include_self=False
    )
    finite_R = torch.isfinite(ll_R)
    if needs_uncond:
        finite_R &= torch.isfinite(ll_uncond_R)
    bad_D = torch.zeros(n_seen, dtype=torch.long).index_add_(0, doc_of_R, (~finite_R).long()) > 0
    all_choices_D = count_D == expected_D
    complete_D = all_choices_D & ~bad_D
    use_R = complete_D[doc_of_R]
    new_doc_D = torch.cumsum(complete_D.long(), 0) - 1
    return DocumentGrid(
        doc_id_D=doc_id_D,
        expected_D=expected_D,
        complete_D=complete_D,
        nonfinite_D=bad_D & all_choices_D,
        use_R=use_R,
        row_R=new_doc_D[doc_of_R[use_R]],
        col_R=r["cont_id"][use_R],
    )


def dense_choices(r: dict[str, Tensor], ll_R: Tensor, ll_uncond_R: Tensor, docs: DocumentGrid) -> Choices:
    """The complete documents' requests as the [D, K] `Choices` the figures are computed from."""
    return Choices(
        ll=docs.dense(ll_R, -math.inf),
        ll_uncond=docs.dense(ll_uncond_R, 0.0),
        n_tokens=docs.dense(r["n_tokens"], 1.0),
        n_chars=docs.dense(r["n_chars"], 1.0),
        n_bytes=docs.dense(r["n_bytes"], 1.0),
        is_gold=docs.dense(r["is_gold"].to(torch.float64), 0.0) > 0,
        is_greedy=docs.dense(r["is_greedy"].to(torch.float64), 0.0) > 0,
        present=docs.dense(torch.ones_like(ll_R), 0.0) > 0,
    )


def document_figures(
    metrics: Sequence[str], wanted: Sequence[MetricDef], choices: Choices
) -> tuple[dict[str, float], dict[str, np.ndarray], dict[str, str]]:
    """(each figure with its `_stderr` where it has one, the per-document values of those that are means,
    why the others have none) for the figures `metrics` named, defined by `wanted`."""
    out: dict[str, float] = {}
    values: dict[str, np.ndarray] = {}
    left_out: dict[str, str] = {}
    for name, definition in zip(metrics, wanted, strict=True):
        per_doc_D = document_values(definition, choices)
        if per_doc_D is None:
            out[name] = float(definition.compute(choices))
            left_out[name] = WHOLE_FIGURE_NOTE
            continue
        out[name], stderr = mean_and_stderr(per_doc_D)
        if definition.stderr:
            out[f"{name}_stderr"] = stderr
        values[name] = per_doc_D.numpy()
    return out, values, left_out


def olmo_compute(
    requests: dict[str, Tensor], uncond_id_U: Tensor, uncond_ll_U: Tensor, metric_type: str
) -> dict[str, float]:
    """OLMo's figures for `metric_type` (ai2-olmo-eval's `ICLMetric`, see `inloop_eval.metrics.olmo`) from
    the same requests as `icl_compute`; rows repeated by sampler padding count once."""
    r = unique_requests(requests)
    ll_uncond_R = None
    if metric_type == "pmi_dc":
        ll_uncond_R = uncond_lookup(r["uncond_id"], uncond_id_U, uncond_ll_U)
    return olmo_icl_compute(
        metric_type,
        doc_id_R=r["doc_id"],
        cont_id_R=r["cont_id"],
        is_gold_R=r["is_gold"],
        ll_R=r["ll"],
        n_chars_R=r["n_chars"],
        n_bytes_R=r["n_bytes"],
        ll_uncond_R=ll_uncond_R,
    )


def document_values(definition: MetricDef, choices: Choices) -> Tensor | None:
    """[D] float64 per-document values whose mean is the figure: 1.0 where the prediction is gold, else 0.0,
    for `accuracy` figures; the value itself for `per_doc` ones; None for `whole` figures."""
    if definition.kind == "whole":
        return None
    values = torch.as_tensor(definition.compute(choices))
    if definition.kind == "accuracy":
        pred_D = torch.argmax(values.masked_fill(~choices.present, -math.inf), dim=1)  # ties: lowest index
        values = choices.is_gold.gather(1, pred_D[:, None])[:, 0]
    return values.to(torch.float64)
