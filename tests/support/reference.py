"""Independent NumPy reference for the multiple-choice metrics, written from the exact definitions in docs/design.md.

Plain Python loops over documents and choices, float64 throughout; deliberately shares no code with
`inloop_eval.metrics.icl` so the two can be compared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

ACCURACIES = ("acc", "acc_norm", "acc_bytes", "acc_per_token", "acc_pmi")
# Means of 0/1 values per document, each reported with `_stderr`: the argmax accuracies and greedy match.
ZERO_ONE = (*ACCURACIES, "acc_greedy")
GOLD_FIGURES = ("ce_gold", "bpb_gold", "brier", "prob_gold", "ppl_gold")
PREDICTION_FIGURES = ("f1", "ece")
# lm-evaluation-harness's names: reported under their own names, equal to the figure they alias.
ALIASES = {"acc_mutual_info": "acc_pmi", "brier_score": "brier"}
FIELDS = (
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
N_BINS = 10


def mean_stderr(xs: Sequence[float]) -> float:
    """lm-evaluation-harness's `mean_stderr`: sample std (n - 1) over sqrt(n); 0.0 below two values."""
    n = len(xs)
    if n < 2:
        return 0.0
    mu = sum(xs) / n
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)


def first_argmax(scores: Sequence[float]) -> int:
    """Index of the largest score, the lowest index on ties (as `numpy.argmax`)."""
    best = 0
    for i in range(1, len(scores)):
        if scores[i] > scores[best]:
            best = i
    return best


def softmax(xs: Sequence[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    z = sum(e)
    return [v / z for v in e]


def f1_score(labels: Sequence[int], preds: Sequence[int], n_classes: int) -> float:
    """Two classes: F1 of class 1 (scikit-learn's default). More: the mean of every class's F1 (macro)."""
    f1s = []
    for c in range(n_classes):
        tp = sum(1 for y, p in zip(labels, preds, strict=True) if y == c and p == c)
        fp = sum(1 for y, p in zip(labels, preds, strict=True) if y != c and p == c)
        fn = sum(1 for y, p in zip(labels, preds, strict=True) if y == c and p != c)
        f1s.append(2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0)
    return f1s[1] if n_classes == 2 else sum(f1s) / n_classes


def expected_calibration_error(confidences: Sequence[float], correct: Sequence[float]) -> float:
    """Bins (b/10, (b+1)/10]: sum over bins of (n_bin / n) |accuracy - mean confidence| of the bin."""
    n = len(confidences)
    total = 0.0
    for b in range(N_BINS):
        lo, hi = b / N_BINS, (b + 1) / N_BINS
        members = [i for i, c in enumerate(confidences) if lo < c <= hi]
        if members:
            acc = sum(correct[i] for i in members) / len(members)
            conf = sum(confidences[i] for i in members) / len(members)
            total += len(members) / n * abs(acc - conf)
    return total


def reference_icl(
    rows: Mapping[str, np.ndarray],
    uncond_ids: np.ndarray,
    uncond_lls: np.ndarray,
    metrics: Sequence[str],
) -> dict[str, float]:
    """The metric dict `icl_compute` should return, from flat request rows and unconditional pairs."""
    uncond: dict[int, float] = {}
    for uid, value in zip(
        np.asarray(uncond_ids).tolist(), np.asarray(uncond_lls, dtype=np.float64).tolist(), strict=True
    ):
        uncond[int(uid)] = float(value)  # duplicates carry identical values

    # doc_id -> {cont_id: row}; the first of duplicated (doc_id, cont_id) rows wins (they are identical).
    docs: dict[int, dict[int, dict[str, float]]] = {}
    n_rows = len(rows["doc_id"])
    for r in range(n_rows):
        row = {name: rows[name][r].item() for name in FIELDS}
        doc = docs.setdefault(int(row["doc_id"]), {})
        doc.setdefault(int(row["cont_id"]), row)

    need_uncond = "acc_pmi" in metrics or "acc_mutual_info" in metrics
    correct: dict[str, list[float]] = {m: [] for m in ZERO_ONE}
    gold_vals: dict[str, list[float]] = {m: [] for m in GOLD_FIGURES}
    labels: list[int] = []
    preds: list[int] = []
    confidences: list[float] = []
    n_classes = 0
    n_scored = n_skipped = n_nonfinite = 0
    for doc in docs.values():
        k = int(next(iter(doc.values()))["n_choices"])
        if any(c not in doc for c in range(k)):
            n_skipped += 1
            continue
        choices = [doc[c] for c in range(k)]
        ll = [float(c["ll"]) for c in choices]
        ll_unc = []
        for c in choices:
            uid = int(c["uncond_id"])
            ll_unc.append(uncond.get(uid, math.nan) if uid != -1 else math.nan)
        finite = all(math.isfinite(x) for x in ll)
        if need_uncond:
            finite = finite and all(math.isfinite(x) for x in ll_unc)
        if not finite:
            n_skipped += 1
            n_nonfinite += 1
            continue
        n_scored += 1
        golds = {i for i, c in enumerate(choices) if bool(c["is_gold"])}
        scores = {
            "acc": ll,
            "acc_norm": [ll[i] / choices[i]["n_chars"] for i in range(k)],
            "acc_bytes": [ll[i] / choices[i]["n_bytes"] for i in range(k)],
            "acc_per_token": [ll[i] / choices[i]["n_tokens"] for i in range(k)],
            "acc_pmi": [ll[i] - ll_unc[i] for i in range(k)] if need_uncond else ll,
        }
        for name in ACCURACIES:
            correct[name].append(1.0 if first_argmax(scores[name]) in golds else 0.0)
        correct["acc_greedy"].append(1.0 if any(bool(choices[i]["is_greedy"]) for i in golds) else 0.0)
        g = min(golds)
        p = softmax(ll)
        prob_gold = sum(p[i] for i in golds)
        gold_vals["ce_gold"].append(-ll[g] / choices[g]["n_tokens"])
        gold_vals["bpb_gold"].append(-ll[g] / choices[g]["n_bytes"] / math.log(2))
        gold_vals["prob_gold"].append(prob_gold)
        gold_vals["brier"].append((1.0 - prob_gold) ** 2 + sum(p[i] ** 2 for i in range(k) if i not in golds))
        gold_vals["ppl_gold"].append(-ll[g])  # exponentiated after the mean
        labels.append(g)
        preds.append(first_argmax(ll))
        confidences.append(max(p))
        n_classes = max(n_classes, k)

    out: dict[str, float] = {
        "n_docs": float(n_scored),
        "n_skipped_docs": float(n_skipped),
        "n_nonfinite_docs": float(n_nonfinite),
    }
    for requested in metrics:
        name = ALIASES.get(requested, requested)
        if name == "f1":
            out[requested] = f1_score(labels, preds, n_classes) if labels else math.nan
            continue
        if name == "ece":
            out[requested] = expected_calibration_error(confidences, correct["acc"]) if labels else math.nan
            continue
        values = correct[name] if name in ZERO_ONE else gold_vals[name]
        out[requested] = sum(values) / len(values) if values else math.nan
        if name == "ppl_gold" and values:
            out[requested] = math.exp(out[requested])
        if name in ZERO_ONE:
            out[f"{requested}_stderr"] = mean_stderr(values)
    return out
