"""Independent NumPy reference for the multiple-choice metrics, written from DESIGN.md's exact definitions.

Plain Python loops over documents and choices, float64 throughout; deliberately shares no code with
`inloop_eval.metrics.icl` so the two can be compared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

ACCURACIES = ("acc", "acc_norm", "acc_bytes", "acc_per_token", "acc_pmi")
GOLD_FIGURES = ("ce_gold", "bpb_gold", "brier", "prob_gold")
FIELDS = ("doc_id", "cont_id", "n_choices", "is_gold", "ll", "uncond_id", "n_tokens", "n_chars", "n_bytes")


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

    need_uncond = "acc_pmi" in metrics
    correct: dict[str, list[float]] = {m: [] for m in ACCURACIES}
    gold_vals: dict[str, list[float]] = {m: [] for m in GOLD_FIGURES}
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
        g = min(golds)
        p = softmax(ll)
        prob_gold = sum(p[i] for i in golds)
        gold_vals["ce_gold"].append(-ll[g] / choices[g]["n_tokens"])
        gold_vals["bpb_gold"].append(-ll[g] / choices[g]["n_bytes"] / math.log(2))
        gold_vals["prob_gold"].append(prob_gold)
        gold_vals["brier"].append((1.0 - prob_gold) ** 2 + sum(p[i] ** 2 for i in range(k) if i not in golds))

    out: dict[str, float] = {
        "n_docs": float(n_scored),
        "n_skipped_docs": float(n_skipped),
        "n_nonfinite_docs": float(n_nonfinite),
    }
    for name in metrics:
        values = correct[name] if name in ACCURACIES else gold_vals[name]
        out[name] = sum(values) / len(values) if values else math.nan
        if name in ACCURACIES:
            out[f"{name}_stderr"] = mean_stderr(values)
    return out
