"""OLMo's in-loop multiple-choice figures (ai2-olmo-eval 0.9.0 `ICLMetric`), as pure functions of this
package's per-request fields, so that a run moving from OLMo-core keeps its curves.

`olmo_icl_compute(metric_type, ...)` returns exactly the dict that `olmo_eval.metrics.ICLMetric(metric_type)
.compute()` returns for the same requests: the same keys in the same order, each value the float32 that
OLMo returns, as a Python float. `inloop_eval.integrations.olmo_core.keys.olmo_core_key(label, figure)` is the name OLMo-core's
`EvaluatorCallback` records it under, e.g. `eval/downstream/arc_easy (length-normalized accuracy)`.

What each request must carry (one row per (doc_id, cont_id), duplicates from sampler padding removed):

- `ll`: sum over the continuation's tokens of log p(token | context, earlier tokens). OLMo tokenizes the
  continuation string on its own (`encode(continuation, add_special_tokens=False)`), puts BOS before the
  context, and computes the sum in the logits' dtype (`-F.cross_entropy(logits, tokens, reduction="sum")`),
  float32 for OLMo-core's float32 LM head; it is rounded to float32 here before any arithmetic, as OLMo
  stores it (a model whose logits are bfloat16 makes OLMo's arithmetic bfloat16, not reproduced here).
  All figures use it.
- `n_chars`: `len(continuation)` of the continuation string exactly as OLMo's task gives it, WITH its
  leading space (" Paris" is 6). Used by len_norm's score and by every CE loss (`ce_loss_v2` divides by
  `n_chars`, `ce_loss_v1` by `n_chars - 1`, whatever the first character is: OLMo's "no leading space"
  length is `len(continuation) - 1`).
- `n_bytes`: `len(continuation.encode("utf-8"))`, leading space included. Used by `bpb_v2`.
- `n_bytes_no_leading_space`: `len(continuation[1:].encode("utf-8"))`, used by `bpb_v1`. It defaults to
  `n_bytes - 1`, right whenever the first character is one byte (OLMo's continuations start with " ");
  pass it when a continuation may start with a multi-byte character.
- `is_gold`: exactly one gold per document (OLMo's `label_id`) for acc, len_norm, pmi_dc and f1.
- `ll_uncond` (pmi_dc only): the same continuation tokens' sum log p after the task's domain-conditional
  string (OLMo's `doc_to_domain_conditional`: "Answer:" for most tasks, " " by default), tokenized
  WITHOUT BOS, in float32. OLMo-core 3.0.0's `DownstreamEvaluator.update_metrics` passes no
  domain-conditional logits, so OLMo-core itself cannot run a pmi_dc task.

How OLMo computes each figure (per document, then the mean over documents):

- score of a choice, argmax'd for accuracy and f1 and softmax'd for soft / soft_log (v2 uses the score,
  v1 the "no leading space" score): acc and f1: `ll`; len_norm: `ll / n_chars` (v1: `ll / (n_chars - 1)`);
  pmi_dc: `ll / ll_uncond` (a ratio of the two loglikelihoods, not their difference; v1 = v2).
- `<metric_type>_v1` and `<metric_type>_v2` (acc, len_norm, pmi_dc): both the accuracy of the v2 score
  (OLMo 0.9.0 computes the v1 accuracy and reports the v2 one under both names). The argmax is
  `torch.argmax` over the document's float32 scores: ties go to the lowest cont_id, a NaN wins.
- `ce_loss_v2` / `ce_loss_v1`: the gold choice's `-ll / n_chars` / `-ll / (n_chars - 1)`: per character,
  not per token. `bpb_v2` / `bpb_v1`: the gold's `-ll / n_bytes * 1.44269504089` / with
  `n_bytes_no_leading_space`. For pmi_dc all four are `-ll / ll_uncond` of the gold.
- `soft_v*`: softmax over the document's scores at the gold; `soft_log_v*`: log_softmax at the gold
  (float32, over the document's own choices only).
- metric_type ce_loss / bpb: only `ce_loss_v1, ce_loss_v2` / `bpb_v1, bpb_v2`, of choice 0, which OLMo's
  ce_loss and bpb tasks make the document's one (gold) continuation; a document with more than one
  request is refused here.
- `f1_v1` / `f1_v2`: binary F1 with choice 0 as the positive class (`custom_f1_score(pos_label=0)`, the
  "yes"/"true" of OLMo's NLI tasks) of the argmax of the v2 / v1 score against the gold, 0.0 when there
  are no predicted or no gold positives; not macro-averaged, whatever the number of choices. For the f1
  metric type the two scores are both `ll`, so v1 = v2.

Which documents count: a document whose cont_ids are exactly 0..m-1 (m the number of its requests) is
scored over those m choices, even if the task gave it more (OLMo never looks at `n_choices`); any other
document is skipped. NaN and infinite values are kept, as OLMo keeps them. The means over documents are
taken as OLMo takes them: for acc, len_norm and pmi_dc a Python float (float64) sum of the float32
per-document values divided by their count, for metric types ce_loss and bpb a float32 running sum divided
in float32; either is then returned as float32. Documents are summed in ascending doc_id; OLMo sums them
in the order they reached its metric, so the results are bit for bit OLMo's when the documents reached it
in doc_id order (one process) and otherwise differ only by the rounding of those sums. With no document
scored a mean is NaN (OLMo raises ZeroDivisionError) and f1 is 0.0 (as OLMo).

Legend: R requests, D documents (ascending doc_id), G documents of one group, M choices in that group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from inloop_eval.errors import ConfigError, RequestError, TaskDataError
from inloop_eval.metrics.formats import OLMO_GOLD_ONLY_TYPES, OLMO_METRIC_TYPES

# OLMo's constant; its float32 multiplication makes it indistinguishable from 1 / ln 2.
LOG_2_OF_E = 1.44269504089
# Metric types whose figures need the gold choice (OLMo's label_id).
_LABELLED_TYPES: tuple[str, ...] = ("acc", "len_norm", "pmi_dc", "f1")
_COMPANIONS: tuple[str, ...] = (
    "ce_loss_v1",
    "ce_loss_v2",
    "bpb_v1",
    "bpb_v2",
    "soft_v1",
    "soft_v2",
    "soft_log_v1",
    "soft_log_v2",
)
# Per-document values behind _COMPANIONS, in the same order ("nls": no leading space, OLMo's v1).
_COMPANION_VALUES: tuple[str, ...] = (
    "ce_nls",
    "ce",
    "bpb_nls",
    "bpb",
    "soft_nls",
    "soft",
    "log_soft_nls",
    "log_soft",
)
# What _per_document returns for acc, len_norm and pmi_dc.
_GOLD_VALUES: tuple[str, ...] = ("pred", *_COMPANION_VALUES)
# metric_type ce_loss / bpb -> the name of its per-request value.
_SHORT: dict[str, str] = {"ce_loss": "ce", "bpb": "bpb"}


def olmo_figures(metric_type: str) -> tuple[str, ...]:
    """The keys `ICLMetric(metric_type).compute()` returns, in its order."""
    _check_metric_type(metric_type)
    if metric_type in ("ce_loss", "bpb", "f1"):
        return (f"{metric_type}_v1", f"{metric_type}_v2")
    return (f"{metric_type}_v1", f"{metric_type}_v2", *_COMPANIONS)


def olmo_request_values(
    metric_type: str,
    ll_R: Tensor,
    n_chars_R: Tensor,
    n_bytes_R: Tensor,
    n_bytes_no_leading_space_R: Tensor,
    ll_uncond_R: Tensor | None = None,
) -> dict[str, Tensor]:
    """The six float32 numbers OLMo's `update` stores per request, computed in its order of operations.

    Returns [R] float32 tensors: `score` / `score_nls` (what the argmax and softmax see, leading space
    counted / not), `ce` / `ce_nls` and `bpb` / `bpb_nls`.
    """
    _check_metric_type(metric_type)
    ll_R = ll_R.to(torch.float32)
    if metric_type == "pmi_dc":
        if ll_uncond_R is None:
            raise RequestError("olmo_request_values('pmi_dc'): ll_uncond_R is required (see the module doc)")
        score_R = ll_R / ll_uncond_R.to(torch.float32)
        # OLMo: "the normalization factors cancel out", so CE and BPB are both the negated ratio.
        return {
            "score": score_R,
            "score_nls": score_R,
            **dict.fromkeys(("ce", "ce_nls", "bpb", "bpb_nls"), -score_R),
        }
    # Integer lengths, so that the division is float32 / int as in OLMo (a float64 length would promote).
    n_chars_R = n_chars_R.to(torch.long)
    n_chars_nls_R = n_chars_R - 1
    values = {
        "ce": -ll_R / n_chars_R,
        "ce_nls": -ll_R / n_chars_nls_R,
        "bpb": -ll_R / n_bytes_R.to(torch.long) * LOG_2_OF_E,
        "bpb_nls": -ll_R / n_bytes_no_leading_space_R.to(torch.long) * LOG_2_OF_E,
    }
    if metric_type in ("acc", "f1"):
        return {"score": ll_R, "score_nls": ll_R, **values}
    return {"score": ll_R / n_chars_R, "score_nls": ll_R / n_chars_nls_R, **values}


def olmo_icl_compute(
    metric_type: str,
    *,
    doc_id_R: Tensor,
    cont_id_R: Tensor,
    is_gold_R: Tensor,
    ll_R: Tensor,
    n_chars_R: Tensor,
    n_bytes_R: Tensor,
    n_bytes_no_leading_space_R: Tensor | None = None,
    ll_uncond_R: Tensor | None = None,
) -> dict[str, float]:
    """What ai2-olmo-eval 0.9.0's `ICLMetric(metric_type).compute()` returns for these requests.

    metric_type: one of OLMO_METRIC_TYPES (the OLMo task's `metric_type`).
    doc_id_R, cont_id_R: [R] one row per (doc_id, cont_id): pass the rows through `dedup_requests` first.
    is_gold_R, ll_R, n_chars_R, n_bytes_R, n_bytes_no_leading_space_R, ll_uncond_R: [R], as the module
    docstring defines them (n_bytes_no_leading_space_R defaults to n_bytes_R - 1; ll_uncond_R is needed
    for pmi_dc only). Any device; the figures are computed on the CPU.
    """
    _check_metric_type(metric_type)
    if n_bytes_no_leading_space_R is None:
        n_bytes_no_leading_space_R = n_bytes_R.to(torch.long) - 1
    given = {
        "doc_id_R": doc_id_R,
        "cont_id_R": cont_id_R,
        "is_gold_R": is_gold_R,
        "ll_R": ll_R,
        "n_chars_R": n_chars_R,
        "n_bytes_R": n_bytes_R,
        "n_bytes_no_leading_space_R": n_bytes_no_leading_space_R,
        "ll_uncond_R": ll_uncond_R,
    }
    fields = {name: value.cpu() for name, value in given.items() if value is not None}
    _check_shapes(metric_type, fields)
    values = olmo_request_values(
        metric_type,
        fields["ll_R"],
        fields["n_chars_R"],
        fields["n_bytes_R"],
        fields["n_bytes_no_leading_space_R"],
        fields.get("ll_uncond_R"),
    )
    docs = _documents(metric_type, fields["doc_id_R"], fields["cont_id_R"], fields["is_gold_R"], values)
    return _figures(metric_type, docs)


@dataclass(frozen=True)
class _Documents:
    """A task's requests sorted by (doc_id, cont_id), so that each document's rows are contiguous and in
    choice order, and the documents OLMo scores.

    doc_id_D: [D] ascending. start_D, count_D: [D] the first of its rows and how many. scored_D: [D] whether
    OLMo scores it. label_D: [D] its gold cont_id. values: OLMo's per-request values, [R] in sorted order.
    """

    doc_id_D: Tensor
    start_D: Tensor
    count_D: Tensor
    scored_D: Tensor
    label_D: Tensor
    values: dict[str, Tensor]


def _documents(
    metric_type: str, doc_id_R: Tensor, cont_id_R: Tensor, is_gold_R: Tensor, values: dict[str, Tensor]
) -> _Documents:
    """The requests laid out by document (`_Documents`), checked as OLMo's metric needs them."""
    order_R = torch.argsort(cont_id_R, stable=True)
    order_R = order_R[torch.argsort(doc_id_R[order_R], stable=True)]
    doc_R, cont_R = doc_id_R[order_R].to(torch.long), cont_id_R[order_R].to(torch.long)
    gold_R = is_gold_R[order_R].to(torch.bool)
    _check_requests(metric_type, doc_R, cont_R)
    doc_id_D, count_D = torch.unique_consecutive(doc_R, return_counts=True)
    start_D = torch.cumsum(count_D, 0) - count_D
    doc_of_R = torch.repeat_interleave(torch.arange(doc_id_D.numel()), count_D)
    # OLMo fills a tensor of m = (number of cont_ids seen) slots by cont_id and skips the document on an
    # IndexError, so it scores exactly the documents whose cont_ids are 0..m-1.
    scored_D = cont_R[start_D + count_D - 1] == count_D - 1
    label_D = torch.zeros(doc_id_D.numel(), dtype=torch.long).index_put_((doc_of_R[gold_R],), cont_R[gold_R])
    if metric_type in _LABELLED_TYPES:
        n_gold_D = torch.zeros(doc_id_D.numel(), dtype=torch.long).index_add_(0, doc_of_R, gold_R.long())
        _check_one_gold(metric_type, doc_id_D[scored_D], n_gold_D[scored_D])
    return _Documents(
        doc_id_D=doc_id_D,
        start_D=start_D,
        count_D=count_D,
        scored_D=scored_D,
        label_D=label_D,
        values={name: value_R[order_R] for name, value_R in values.items()},
    )


def _figures(metric_type: str, docs: _Documents) -> dict[str, float]:
    """OLMo's figures of `metric_type` over the documents it scores, in its order."""
    if metric_type in OLMO_GOLD_ONLY_TYPES:
        # One request per document (checked): choice 0's values, summed in float32 as OLMo sums tensors.
        first_D = docs.start_D[docs.scored_D]
        return {
            f"{metric_type}_v1": _float32_mean(docs.values[f"{_SHORT[metric_type]}_nls"][first_D]),
            f"{metric_type}_v2": _float32_mean(docs.values[_SHORT[metric_type]][first_D]),
        }
    per_doc = _per_document(metric_type, docs.values, docs.label_D, docs.start_D, docs.count_D, docs.scored_D)
    label_S = docs.label_D[docs.scored_D]
    if metric_type == "f1":
        return {
            "f1_v1": _olmo_f1(label_S, per_doc["pred"]),
            "f1_v2": _olmo_f1(label_S, per_doc["pred_nls"]),
        }
    correct = _float64_mean((per_doc["pred"] == label_S).to(torch.float64))
    out = {f"{metric_type}_v1": correct, f"{metric_type}_v2": correct}
    for figure, name in zip(_COMPANIONS, _COMPANION_VALUES, strict=True):
        out[figure] = _float64_mean(per_doc[name])
    return out


def _per_document(
    metric_type: str,
    values: dict[str, Tensor],
    label_D: Tensor,
    start_D: Tensor,
    count_D: Tensor,
    scored_D: Tensor,
) -> dict[str, Tensor]:
    """Per scored document (ascending doc_id): predictions, and the gold's CE, BPB, soft and log soft.

    Documents are grouped by their number of choices M so that each softmax runs over a [G, M] tensor: a
    row padded with -inf to a longer width can round differently from OLMo's softmax over the M choices.
    """
    n_docs = count_D.numel()
    names = ("pred", "pred_nls") if metric_type == "f1" else _GOLD_VALUES
    out_D = {
        name: torch.zeros(n_docs, dtype=torch.long if name.startswith("pred") else torch.float32)
        for name in names
    }
    for m in torch.unique(count_D[scored_D]).tolist():
        docs_G = torch.nonzero(scored_D & (count_D == m))[:, 0]
        rows_GM = start_D[docs_G][:, None] + torch.arange(m)
        score_GM, score_nls_GM = values["score"][rows_GM], values["score_nls"][rows_GM]
        out_D["pred"][docs_G] = torch.argmax(score_GM, dim=1)
        if metric_type == "f1":
            out_D["pred_nls"][docs_G] = torch.argmax(score_nls_GM, dim=1)
            continue
        gold_G1 = label_D[docs_G][:, None]
        for name in ("ce", "ce_nls", "bpb", "bpb_nls"):
            out_D[name][docs_G] = values[name][rows_GM].gather(1, gold_G1)[:, 0]
        out_D["soft"][docs_G] = torch.softmax(score_GM, dim=1).gather(1, gold_G1)[:, 0]
        out_D["soft_nls"][docs_G] = torch.softmax(score_nls_GM, dim=1).gather(1, gold_G1)[:, 0]
        out_D["log_soft"][docs_G] = torch.log_softmax(score_GM, dim=1).gather(1, gold_G1)[:, 0]
        out_D["log_soft_nls"][docs_G] = torch.log_softmax(score_nls_GM, dim=1).gather(1, gold_G1)[:, 0]
    return {name: value_D[scored_D] for name, value_D in out_D.items()}


def _to_float32(x: float) -> float:
    """x rounded to float32, as `torch.tensor(x)` rounds OLMo's Python floats."""
    return float(np.float32(x))


def _float64_mean(x_D: Tensor) -> float:
    """OLMo's `torch.tensor(sum(xs) / len(xs))` over Python floats: a left-to-right float64 sum."""
    if x_D.numel() == 0:
        return math.nan
    return _to_float32(sum(x_D.tolist()) / x_D.numel())


def _float32_mean(x_D: Tensor) -> float:
    """OLMo's `sum(tensors) / len(tensors)` over float32 scalars: a left-to-right float32 running sum
    (`np.add.accumulate` adds in order, in the array's dtype), divided in float32."""
    if x_D.numel() == 0:
        return math.nan
    total = np.add.accumulate(x_D.to(torch.float32).numpy())[-1]
    return float(np.float32(total) / np.float32(x_D.numel()))


def _olmo_f1(label_D: Tensor, pred_D: Tensor) -> float:
    """OLMo's `custom_f1_score(labels, preds, pos_label=0)`: binary F1 of choice 0, in Python floats."""
    tp = int(((label_D == 0) & (pred_D == 0)).sum())
    fp = int(((label_D != 0) & (pred_D == 0)).sum())
    fn = int(((label_D == 0) & (pred_D != 0)).sum())
    if tp + fp == 0 or tp + fn == 0:
        return 0.0
    precision = tp / (tp + fp)
    recall = tp / (tp + fn)
    if precision + recall == 0:
        return 0.0
    return _to_float32(2 * precision * recall / (precision + recall))


def _check_metric_type(metric_type: str) -> None:
    if metric_type not in OLMO_METRIC_TYPES:
        raise ConfigError(
            f"OLMo metric_type {metric_type!r} is unknown: expected one of {list(OLMO_METRIC_TYPES)} "
            "(ai2-olmo-eval's ICLMetric types)"
        )


def _check_shapes(metric_type: str, fields: dict[str, Tensor]) -> None:
    """Every field a 1-D tensor of one length; ll_uncond_R present for pmi_dc."""
    if metric_type == "pmi_dc" and "ll_uncond_R" not in fields:
        raise RequestError(
            "olmo_icl_compute('pmi_dc'): ll_uncond_R is missing; score each continuation after the task's "
            "domain-conditional prompt (see the module doc) and pass its loglikelihood per request"
        )
    n = fields["doc_id_R"].numel()
    for name, value in fields.items():
        if value.dim() != 1 or value.numel() != n:
            raise RequestError(
                f"olmo_icl_compute({metric_type!r}): {name} has shape {tuple(value.shape)}, expected ({n},) "
                "like doc_id_R: pass one value per request"
            )


def _check_requests(metric_type: str, doc_R: Tensor, cont_R: Tensor) -> None:
    """No negative cont_id, no repeated (doc_id, cont_id); one request per document for ce_loss / bpb.

    doc_R, cont_R: sorted by (doc_id, cont_id).
    """
    if bool((cont_R < 0).any()):
        i = int(torch.nonzero(cont_R < 0)[0, 0])
        raise RequestError(
            f"olmo_icl_compute({metric_type!r}): doc {int(doc_R[i])} has cont_id {int(cont_R[i])}, "
            "expected a choice index >= 0"
        )
    repeated = (doc_R[1:] == doc_R[:-1]) & (cont_R[1:] == cont_R[:-1])
    if bool(repeated.any()):
        i = int(torch.nonzero(repeated)[0, 0])
        raise RequestError(
            f"olmo_icl_compute({metric_type!r}): doc {int(doc_R[i])} cont {int(cont_R[i])} appears more than "
            "once; pass the rows through dedup_requests first (sampler padding repeats requests)"
        )
    if metric_type in _SHORT:
        shared = doc_R[1:] == doc_R[:-1]
        if bool(shared.any()):
            doc = int(doc_R[1:][shared][0])
            raise TaskDataError(
                f"olmo_icl_compute({metric_type!r}): doc {doc} has {int((doc_R == doc).sum())} requests, "
                f"expected 1: OLMo's {metric_type} tasks score only the gold continuation, as cont_id 0; "
                "pass only the gold requests"
            )


def _check_one_gold(metric_type: str, docs_D: Tensor, n_gold_D: Tensor) -> None:
    """Each scored document has exactly one gold choice (OLMo's single label_id)."""
    bad_D = n_gold_D != 1
    if bool(bad_D.any()):
        docs = docs_D[bad_D][:5].tolist()
        golds = n_gold_D[bad_D][:5].tolist()
        raise TaskDataError(
            f"olmo_icl_compute({metric_type!r}): {int(bad_D.sum())} documents have not exactly one gold "
            f"choice (doc_id: golds {dict(zip(docs, golds, strict=True))}); OLMo's metric needs one label "
            "per document: mark one choice is_gold, or use the package's own metrics for multi-gold tasks"
        )
