"""The default figures of each prompt format, by name (what a task reports unless its config lists others),
and OLMo's metric types.

Names only, so that the task registry and `inloop-eval tasks` load no torch: `registry.py` defines each
figure named here (tests/metrics/test_icl_metric.py checks), `olmo.py` each OLMo metric type.
"""

from __future__ import annotations

# Default figures by prompt format (`MultipleChoiceTask.prompt_format`).
# Normalisations that only matter when choices differ in length.
LENGTH_NORM_METRICS: tuple[str, ...] = ("acc_norm", "acc_bytes", "acc_per_token")
# Answer text as continuation: every figure except those for other task kinds (and `ece`, on request).
RC_METRICS: tuple[str, ...] = (
    "acc",
    "acc_norm",
    "acc_bytes",
    "acc_per_token",
    "acc_pmi",
    "ce_gold",
    "bpb_gold",
    "brier",
    "prob_gold",
)
# Letter keys (" A".." D"): every choice has the same length, so length normalisation is a no-op.
MC_METRICS: tuple[str, ...] = ("acc", "acc_pmi", "ce_gold", "bpb_gold", "brier", "prob_gold")
# One shared continuation after per-choice contexts: both length norms and PMI are no-ops.
PARTIAL_METRICS: tuple[str, ...] = ("acc", "ce_gold", "bpb_gold", "brier", "prob_gold")
# Classification over a fixed label set (RTE, CB, MRPC, SST-2): F1 beside accuracy.
CLASSIFICATION_METRICS: tuple[str, ...] = ("acc", "f1")
# One continuation, the answer, scored for its likelihood only.
GOLD_ONLY_METRICS: tuple[str, ...] = ("ce_gold", "bpb_gold")
# Last-word prediction (LAMBADA): greedy exact match and the word's perplexity.
GREEDY_METRICS: tuple[str, ...] = ("acc_greedy", "ppl_gold", "ce_gold", "bpb_gold")
# The default figures of each prompt format: the one map from format to figures (task classes name theirs
# beside their format; tasks whose format is known only at run time, oe-eval files and OLMo labels, look it up).
METRICS_BY_FORMAT: dict[str, tuple[str, ...]] = {
    "rc": RC_METRICS,
    "mc": MC_METRICS,
    "partial": PARTIAL_METRICS,
    "classification": CLASSIFICATION_METRICS,
    "gold": GOLD_ONLY_METRICS,
}
# OLMo's in-loop metric types (ai2-olmo-eval's `ICLMetric(metric_type)`, computed in `olmo.py`).
OLMO_METRIC_TYPES: tuple[str, ...] = ("acc", "len_norm", "pmi_dc", "ce_loss", "bpb", "f1")
# Metric types that score the gold continuation alone: a document is its one gold request, as cont_id 0.
OLMO_GOLD_ONLY_TYPES: tuple[str, ...] = ("ce_loss", "bpb")
