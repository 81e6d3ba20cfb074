"""Multiple-choice metrics from per-request loglikelihoods: pure tensor functions and a thin Metric.

Legend: R requests (rows, possibly duplicated by sampler padding), U unconditional results,
D documents, K the most choices of any document, B calibration bins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

# Accuracy variants: name -> how a request's score is derived (see `scores` in `icl_compute`).
ACCURACY_METRICS: tuple[str, ...] = ("acc", "acc_norm", "acc_bytes", "acc_per_token", "acc_pmi")
GOLD_METRICS: tuple[str, ...] = ("ce_gold", "bpb_gold", "brier", "prob_gold", "ppl_gold")
# Figures over the documents' predictions (each reported with `_stderr` when it is a mean of 0/1 values).
PREDICTION_METRICS: tuple[str, ...] = ("f1", "ece", "acc_greedy")
# lm-evaluation-harness's names, reported under these names: name -> the figure computed.
METRIC_ALIASES: dict[str, str] = {"acc_mutual_info": "acc_pmi", "brier_score": "brier"}
ECE_BINS = 10
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


def canonical(metrics: Sequence[str]) -> set[str]:
    """The figures to compute for the requested names (aliases resolved)."""
    return {METRIC_ALIASES.get(m, m) for m in metrics}


def needs_uncond(metrics: Sequence[str]) -> bool:
    """Whether the unconditional requests must be scored (PMI, under either name)."""
    return "acc_pmi" in canonical(metrics)


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


def icl_compute(
    requests: dict[str, Tensor],
    uncond_id_U: Tensor,
    uncond_ll_U: Tensor,
    metrics: Sequence[str],
) -> dict[str, float]:
    """Every requested metric (harness aliases under their own names), each accuracy with `<name>_stderr`,
    plus `n_docs`, `n_skipped_docs` (documents missing a request or with a non-finite score) and
    `n_nonfinite_docs`.

    requests: the REQUEST_FIELDS, each a [R] tensor; rows repeated by sampler padding count once.
    uncond_id_U, uncond_ll_U: scored unconditional pairs, joined to requests by `uncond_id`.
    """
    wanted = canonical(metrics)
    unknown = sorted(wanted - set(ACCURACY_METRICS + GOLD_METRICS + PREDICTION_METRICS))
    if unknown:
        raise ValueError(f"icl_compute: unknown metrics {unknown}")
    keep = dedup_requests(requests["doc_id"], requests["cont_id"])
    r = {k: requests[k][keep] for k in REQUEST_FIELDS}
    ll_R = r["ll"].to(torch.float64)
    ll_uncond_R = uncond_lookup(r["uncond_id"], uncond_id_U, uncond_ll_U)
    docs_D, doc_of_R = torch.unique(r["doc_id"], return_inverse=True)
    n_docs_seen = docs_D.numel()

    # A document is complete when it has all of its choices and all of them are finite.
    count_D = torch.zeros(n_docs_seen, dtype=torch.long).index_add_(0, doc_of_R, torch.ones_like(doc_of_R))
    expected_D = torch.zeros(n_docs_seen, dtype=torch.long).scatter_reduce_(
        0, doc_of_R, r["n_choices"], reduce="amax", include_self=False
    )
    finite_R = torch.isfinite(ll_R)
    if "acc_pmi" in wanted:
        finite_R &= torch.isfinite(ll_uncond_R)
    bad_D = torch.zeros(n_docs_seen, dtype=torch.long).index_add_(0, doc_of_R, (~finite_R).long()) > 0
    complete_D = (count_D == expected_D) & ~bad_D
    use_R = complete_D[doc_of_R]

    out: dict[str, float] = {
        "n_docs": float(complete_D.sum()),
        "n_skipped_docs": float(n_docs_seen - int(complete_D.sum())),
        "n_nonfinite_docs": float((bad_D & (count_D == expected_D)).sum()),
    }
    # Dense [D, K] layout of the complete documents.
    new_doc_D = torch.cumsum(complete_D.long(), 0) - 1
    row_R = new_doc_D[doc_of_R[use_R]]
    col_R = r["cont_id"][use_R]
    n_docs = int(complete_D.sum())
    k = int(col_R.max()) + 1 if col_R.numel() else 1

    def dense(values_R: Tensor, fill: float) -> Tensor:
        out_DK = torch.full((n_docs, k), fill, dtype=torch.float64)
        out_DK[row_R, col_R] = values_R[use_R].to(torch.float64)
        return out_DK

    present_DK = dense(torch.ones_like(ll_R), 0.0) > 0
    ll_DK = dense(ll_R, -math.inf)
    gold_DK = dense(r["is_gold"].to(torch.float64), 0.0) > 0
    scores = {
        "acc": ll_DK,
        "acc_norm": ll_DK / dense(r["n_chars"], 1.0),
        "acc_bytes": ll_DK / dense(r["n_bytes"], 1.0),
        "acc_per_token": ll_DK / dense(r["n_tokens"], 1.0),
        "acc_pmi": ll_DK - dense(ll_uncond_R, 0.0),
    }
    figures: dict[str, tuple[float, float | None]] = {}  # name -> (value, stderr or None)
    for name in ACCURACY_METRICS:
        if name not in wanted:
            continue
        score_DK = scores[name].masked_fill(~present_DK, -math.inf)
        pred_D = torch.argmax(score_DK, dim=1)  # ties go to the lowest index
        correct_D = gold_DK.gather(1, pred_D[:, None])[:, 0].to(torch.float64)
        figures[name] = mean_and_stderr(correct_D)

    if wanted & set(GOLD_METRICS):
        gold = _gold_figures(ll_DK, gold_DK, present_DK, dense, r)
        figures.update({name: (value, None) for name, value in gold.items()})
    if wanted & set(PREDICTION_METRICS):
        greedy_DK = dense(r["is_greedy"].to(torch.float64), 0.0) > 0
        figures.update(_prediction_figures(ll_DK, gold_DK, present_DK, greedy_DK))
    for name in metrics:
        value, stderr = figures[METRIC_ALIASES.get(name, name)]
        out[name] = value
        if stderr is not None:
            out[f"{name}_stderr"] = stderr
    return out


def _gold_figures(ll_DK, gold_DK, present_DK, dense, r) -> dict[str, float]:  # noqa: ANN001
    """CE / bits-per-byte / perplexity of the first gold choice, and Brier / probability of the gold set."""
    first_gold_D = torch.argmax(gold_DK.to(torch.int8), dim=1)[:, None]
    ll_gold_D = ll_DK.gather(1, first_gold_D)[:, 0]
    tokens_gold_D = dense(r["n_tokens"], 1.0).gather(1, first_gold_D)[:, 0]
    bytes_gold_D = dense(r["n_bytes"], 1.0).gather(1, first_gold_D)[:, 0]
    prob_DK = torch.softmax(ll_DK.masked_fill(~present_DK, -math.inf), dim=1)
    prob_gold_D = (prob_DK * gold_DK).sum(1)
    brier_D = (1.0 - prob_gold_D) ** 2 + (prob_DK**2 * (~gold_DK)).sum(1)
    per_doc = {
        "ce_gold": -ll_gold_D / tokens_gold_D,
        "bpb_gold": -ll_gold_D / bytes_gold_D / math.log(2),
        "brier": brier_D,
        "prob_gold": prob_gold_D,
    }
    out = {name: float(x_D.mean()) if x_D.numel() else math.nan for name, x_D in per_doc.items()}
    # lm-evaluation-harness's LAMBADA `perplexity`: exp of the mean negative loglikelihood per document.
    out["ppl_gold"] = math.exp(float(-ll_gold_D.mean())) if ll_gold_D.numel() else math.nan
    return out


def _prediction_figures(ll_DK, gold_DK, present_DK, greedy_DK) -> dict[str, tuple[float, float | None]]:  # noqa: ANN001
    """F1 of the predicted choice, expected calibration error, and greedy exact match of the gold.

    f1: with two choices, F1 of choice 1 (scikit-learn's default `pos_label=1`, as lm-evaluation-harness's
    `f1`); with more, the mean over choices 0..K-1 of each choice's F1 (macro, as the harness's CB). A
    document's label is its first gold. ece: 10 equal bins (lo, hi] of the softmax probability of the
    predicted (argmax) choice; sum over bins of |sum(correct - confidence)| / documents.
    acc_greedy: some gold continuation is the model's greedy output, token by token.
    """
    n_docs, k = ll_DK.shape
    if n_docs == 0:
        return {"f1": (math.nan, None), "ece": (math.nan, None), "acc_greedy": mean_and_stderr(ll_DK[:, 0])}
    pred_D = torch.argmax(ll_DK, dim=1)  # absent choices are -inf: never the argmax of a complete document
    label_D = torch.argmax(gold_DK.to(torch.int8), dim=1)
    classes_K = torch.arange(k)
    pred_DK = pred_D[:, None] == classes_K
    label_DK = label_D[:, None] == classes_K
    tp_K = (pred_DK & label_DK).sum(0).to(torch.float64)
    fp_K = (pred_DK & ~label_DK).sum(0).to(torch.float64)
    fn_K = (~pred_DK & label_DK).sum(0).to(torch.float64)
    denominator_K = 2 * tp_K + fp_K + fn_K
    f1_K = torch.where(denominator_K > 0, 2 * tp_K / denominator_K.clamp(min=1), torch.zeros_like(tp_K))
    f1 = float(f1_K[1]) if k == 2 else float(f1_K.mean())

    confidence_D = torch.softmax(ll_DK.masked_fill(~present_DK, -math.inf), dim=1).max(dim=1).values
    correct_D = gold_DK.gather(1, pred_D[:, None])[:, 0].to(torch.float64)
    upper_B = torch.arange(1, ECE_BINS + 1, dtype=torch.float64) / ECE_BINS
    bin_D = torch.bucketize(confidence_D, upper_B, right=False).clamp(max=ECE_BINS - 1)
    gap_B = torch.zeros(ECE_BINS, dtype=torch.float64).index_add_(0, bin_D, correct_D - confidence_D)
    ece = float(gap_B.abs().sum() / n_docs)

    greedy_D = (greedy_DK & gold_DK).any(dim=1).to(torch.float64)
    return {"f1": (f1, None), "ece": (ece, None), "acc_greedy": mean_and_stderr(greedy_D)}


class ICLMetric(Metric):
    """Per-request loglikelihoods of one task, synced across ranks by concatenation.

    `update` takes flat [N] tensors named as REQUEST_FIELDS; `update_uncond` the scored unconditional
    pairs. `compute` gives the dict of `icl_compute`. Under torch.distributed every rank must call both
    updates (with empty tensors if it has nothing) so that all ranks gather states of one dtype.
    """

    full_state_update = False

    def __init__(self, metrics: Sequence[str], **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.metric_names = tuple(metrics)
        for name in REQUEST_FIELDS:
            self.add_state(name, default=[], dist_reduce_fx="cat")
        self.add_state("uncond_uid", default=[], dist_reduce_fx="cat")
        self.add_state("uncond_ll", default=[], dist_reduce_fx="cat")

    def update(self, **fields: Tensor) -> None:  # type: ignore[override]
        missing = set(REQUEST_FIELDS) - set(fields)
        if missing:
            raise ValueError(f"ICLMetric.update: missing fields {sorted(missing)}")
        n = fields["doc_id"].numel()
        for name in REQUEST_FIELDS:
            value = fields[name].detach().reshape(-1).to(self.device)
            if value.numel() != n:
                raise ValueError(f"ICLMetric.update: field {name!r} has {value.numel()} values, expected {n}")
            # is_gold and is_greedy travel as int64: not every backend gathers bool tensors.
            getattr(self, name).append(value.to(torch.float64 if name == "ll" else torch.long))

    def update_uncond(self, uncond_id: Tensor, ll: Tensor) -> None:
        self.uncond_uid.append(uncond_id.detach().reshape(-1).to(self.device, torch.long))
        self.uncond_ll.append(ll.detach().reshape(-1).to(self.device, torch.float64))

    def _cat(self, name: str, dtype: torch.dtype) -> Tensor:
        value = getattr(self, name)
        if not isinstance(value, Tensor):  # after a sync, states are already one tensor
            value = dim_zero_cat(value) if value else torch.zeros(0)
        return value.cpu().to(dtype)

    def compute(self) -> dict[str, float]:
        dtypes = {"ll": torch.float64, "is_gold": torch.bool, "is_greedy": torch.bool}
        requests = {name: self._cat(name, dtypes.get(name, torch.long)) for name in REQUEST_FIELDS}
        return icl_compute(
            requests,
            self._cat("uncond_uid", torch.long),
            self._cat("uncond_ll", torch.float64),
            self.metric_names,
        )
