"""Every figure a multiple-choice task can report, defined in one place, and the default set of each format.

A figure is computed from a task's complete documents laid out as dense [D, K] tensors (`Choices`). Three
kinds:
- `accuracy`: a per-choice score whose argmax (ties to the lowest index) is the prediction; reported as the
  share of documents predicted correctly, with `<name>_stderr`;
- `per_doc`: one value per document, reported as the mean (with `<name>_stderr` when `stderr`);
- `whole`: one value from all documents at once (F1, calibration error, perplexity).
Adding a metric is one entry in `METRICS` (and its case in the NumPy reference of the tests); config
validation reads the names from here, the tasks their default figures from `formats.py` (which loads no
torch). Definitions: docs/design.md.
Legend: D documents, K the most choices of any document, B calibration bins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

ECE_BINS = 10


@dataclass(frozen=True)
class Choices:
    """A task's complete documents as [D, K] float64 tensors (bool for the flags); absent choices (a
    document with fewer than K) have ll = -inf, lengths 1 and flags False."""

    ll: Tensor
    ll_uncond: Tensor
    n_tokens: Tensor
    n_chars: Tensor
    n_bytes: Tensor
    is_gold: Tensor
    is_greedy: Tensor
    present: Tensor

    def first_gold(self) -> Tensor:
        """[D, 1] index of each document's lowest-index gold choice."""
        return torch.argmax(self.is_gold.to(torch.int8), dim=1)[:, None]

    def at_first_gold(self, values_DK: Tensor) -> Tensor:
        return values_DK.gather(1, self.first_gold())[:, 0]

    def probabilities(self) -> Tensor:
        """[D, K] softmax of the loglikelihoods over each document's choices."""
        return torch.softmax(self.ll.masked_fill(~self.present, -math.inf), dim=1)


@dataclass(frozen=True)
class MetricDef:
    """One figure: its name, kind (see the module docstring) and how it is computed."""

    name: str
    kind: str
    compute: Callable[[Choices], Tensor | float]
    stderr: bool = False
    needs_uncond: bool = False
    compares_choices: bool = True
    """Whether the figure weighs a document's choices against each other (an argmax or a softmax over them),
    so that a document with a single choice scores perfectly whatever the model does."""
    zero_one: bool = False
    """A `per_doc` figure whose per-document values are 0 or 1 (`accuracy` figures always are)."""
    lower_is_better: bool = False
    """The figure improves downwards (a loss, an error); `inloop-eval compare` names the better side by it."""

    @property
    def binary(self) -> bool:
        """Whether each document scores 0 or 1 (paired comparisons then use the exact sign test)."""
        return self.kind == "accuracy" or self.zero_one


def _brier(c: Choices) -> Tensor:
    prob_DK = c.probabilities()
    prob_gold_D = (prob_DK * c.is_gold).sum(1)
    return (1.0 - prob_gold_D) ** 2 + (prob_DK**2 * (~c.is_gold)).sum(1)


def _ppl_gold(c: Choices) -> float:
    """lm-evaluation-harness's LAMBADA `perplexity`: exp of the mean negative loglikelihood per document."""
    ll_gold_D = c.at_first_gold(c.ll)
    return math.exp(float(-ll_gold_D.mean())) if ll_gold_D.numel() else math.nan


def _f1(c: Choices) -> float:
    """With two choices, F1 of choice 1 (scikit-learn's default `pos_label=1`, lm-evaluation-harness's `f1`);
    with more, the mean over choices of each choice's F1 (macro, the harness's CB). A document's label is its
    first gold."""
    n_docs, k = c.ll.shape
    if n_docs == 0:
        return math.nan
    classes_K = torch.arange(k)
    pred_DK = torch.argmax(c.ll, dim=1)[:, None] == classes_K
    label_DK = c.first_gold() == classes_K
    tp_K = (pred_DK & label_DK).sum(0).to(torch.float64)
    fp_K = (pred_DK & ~label_DK).sum(0).to(torch.float64)
    fn_K = (~pred_DK & label_DK).sum(0).to(torch.float64)
    denominator_K = 2 * tp_K + fp_K + fn_K
    f1_K = torch.where(denominator_K > 0, 2 * tp_K / denominator_K.clamp(min=1), torch.zeros_like(tp_K))
    return float(f1_K[1]) if k == 2 else float(f1_K.mean())


def _ece(c: Choices) -> float:
    """Expected calibration error: 10 equal bins (lo, hi] of the predicted choice's softmax probability; the
    sum over bins of |Σ(correct - confidence)| / documents."""
    n_docs = c.ll.shape[0]
    if n_docs == 0:
        return math.nan
    pred_D = torch.argmax(c.ll, dim=1)
    confidence_D = c.probabilities().max(dim=1).values
    correct_D = c.is_gold.gather(1, pred_D[:, None])[:, 0].to(torch.float64)
    upper_B = torch.arange(1, ECE_BINS + 1, dtype=torch.float64) / ECE_BINS
    bin_D = torch.bucketize(confidence_D, upper_B, right=False).clamp(max=ECE_BINS - 1)
    gap_B = torch.zeros(ECE_BINS, dtype=torch.float64).index_add_(0, bin_D, correct_D - confidence_D)
    return float(gap_B.abs().sum() / n_docs)


METRICS: dict[str, MetricDef] = {
    m.name: m
    for m in (
        MetricDef("acc", "accuracy", lambda c: c.ll, stderr=True),
        MetricDef("acc_norm", "accuracy", lambda c: c.ll / c.n_chars, stderr=True),
        MetricDef("acc_bytes", "accuracy", lambda c: c.ll / c.n_bytes, stderr=True),
        MetricDef("acc_per_token", "accuracy", lambda c: c.ll / c.n_tokens, stderr=True),
        MetricDef("acc_pmi", "accuracy", lambda c: c.ll - c.ll_uncond, stderr=True, needs_uncond=True),
        MetricDef(
            "ce_gold",
            "per_doc",
            lambda c: -c.at_first_gold(c.ll) / c.at_first_gold(c.n_tokens),
            compares_choices=False,
            lower_is_better=True,
        ),
        MetricDef(
            "bpb_gold",
            "per_doc",
            lambda c: -c.at_first_gold(c.ll) / c.at_first_gold(c.n_bytes) / math.log(2),
            compares_choices=False,
            lower_is_better=True,
        ),
        MetricDef("brier", "per_doc", _brier, lower_is_better=True),
        MetricDef("prob_gold", "per_doc", lambda c: (c.probabilities() * c.is_gold).sum(1)),
        MetricDef("ppl_gold", "whole", _ppl_gold, compares_choices=False, lower_is_better=True),
        MetricDef("f1", "whole", _f1),
        MetricDef("ece", "whole", _ece, lower_is_better=True),
        MetricDef(
            "acc_greedy",
            "per_doc",
            lambda c: (c.is_greedy & c.is_gold).any(dim=1).to(torch.float64),
            stderr=True,
            compares_choices=False,
            zero_one=True,
        ),
    )
}
# lm-evaluation-harness's names, reported under these names: name -> the figure computed.
METRIC_ALIASES: dict[str, str] = {"acc_mutual_info": "acc_pmi", "brier_score": "brier"}
ALL_METRICS: tuple[str, ...] = (*METRICS, *METRIC_ALIASES)
# Counts every task reports beside its figures (see `icl_compute`).
COUNTS: tuple[str, ...] = ("n_docs", "n_skipped_docs", "n_nonfinite_docs")

def canonical(name: str) -> str:
    """The figure computed for a requested name (aliases resolved)."""
    return METRIC_ALIASES.get(name, name)


def unknown_metrics(names: Sequence[str]) -> list[str]:
    """The names that are neither a figure nor an alias, sorted."""
    return sorted(set(names) - set(ALL_METRICS))


def comparing_choices(metrics: Sequence[str]) -> list[str]:
    """The names among `metrics` whose figure weighs a document's choices against each other (perfect, and
    meaningless, on a document with a single choice)."""
    return [m for m in metrics if canonical(m) in METRICS and METRICS[canonical(m)].compares_choices]


def lower_is_better(name: str) -> bool:
    """Whether the figure `name` (a figure or an alias) improves downwards; False for a name not known."""
    return canonical(name) in METRICS and METRICS[canonical(name)].lower_is_better


def needs_uncond(metrics: Sequence[str]) -> bool:
    """Whether the unconditional requests must be scored (PMI, under either name)."""
    return any(METRICS[canonical(m)].needs_uncond for m in metrics if canonical(m) in METRICS)
