"""OLMo-core's metric keys: the `olmo_core` key style (`key_style: olmo_core`), so that a run moving from
OLMo-core's own evaluator callbacks continues its curves.

- The OLMo figures of an `olmo:<label>` task take the key OLMo-core's downstream callback gives them,
  `<prefix>/downstream/<OLMo label> (<words>)`, e.g. `eval/downstream/arc_easy (length-normalized accuracy)`
  (its `DownstreamEvaluator.metric_type_to_label`).
- The OLMo-core figures of a `documents` perplexity label (`olmo_ce_loss`, `olmo_ppl`) take the keys its
  `LMEvaluator` (named `lm`) gives them, `<prefix>/lm/<label>/CE loss` and `<prefix>/lm/<label>/PPL`.

Every other figure keeps its `inloop` key (`inloop_eval.keys`).
"""

from __future__ import annotations

from inloop_eval.errors import ConfigError
from inloop_eval.keys import DOWNSTREAM, PERPLEXITY, PREFIX, KeyStyle, figure_key
from inloop_eval.metrics.perplexity import PADDED_DOCUMENT_FIGURES

# OLMo-core's throughput metric its trainer sums the evaluation time into.
EVAL_TIME_KEY = "throughput/in-loop eval time (s)"
# The task ids whose OLMo figures OLMo-core reports: OLMo's tasks, `olmo:<its label there>`.
OLMO_TASK_PREFIX = "olmo:"

# OLMo-core 3.0.0 `DownstreamEvaluator.metric_type_to_label`: OLMo figure -> the words in its W&B key.
OLMO_CORE_FIGURE_NAMES: dict[str, str] = {
    "f1_v1": "F1 score",
    "acc_v1": "accuracy",
    "len_norm_v1": "length-normalized accuracy",
    "pmi_dc_v1": "PMI-DC accuracy",
    "ce_loss_v1": "CE loss",
    "bpb_v1": "BPB",
    "soft_v1": "soft loss",
    "soft_log_v1": "log soft loss",
    "f1_v2": "F1 score v2",
    "acc_v2": "accuracy v2",
    "len_norm_v2": "length-normalized accuracy v2",
    "pmi_dc_v2": "PMI-DC accuracy v2",
    "ce_loss_v2": "CE loss v2",
    "bpb_v2": "BPB v2",
    "soft_v2": "soft loss v2",
    "soft_log_v2": "log soft loss v2",
}

_OLMO_CORE_WORDS = frozenset(OLMO_CORE_FIGURE_NAMES.values())

# OLMo-core 3.0.0 `LMEvaluator.compute_metrics` (its evaluator named `lm`): figure -> its name in the key.
OLMO_CORE_LM_FIGURE_NAMES: dict[str, str] = dict(zip(PADDED_DOCUMENT_FIGURES, ("CE loss", "PPL"), strict=True))
_OLMO_CORE_LM_NAMES = frozenset(OLMO_CORE_LM_FIGURE_NAMES.values())


def olmo_core_key(label: str, figure: str, prefix: str = PREFIX) -> str:
    """OLMo-core's W&B key of one OLMo figure of a task: `<prefix>/downstream/<label> (<figure's words>)`.

    label: the task's name in OLMo-core's config (the olmo_eval task id, e.g. `arc_easy`), so that the
    curves continue those of the OLMo-core run.
    """
    if figure not in OLMO_CORE_FIGURE_NAMES:
        raise ConfigError(
            f"olmo_core_key: figure {figure!r} of task {label!r} has no OLMo-core name; "
            f"expected one of {sorted(OLMO_CORE_FIGURE_NAMES)} (the keys olmo_icl_compute returns)"
        )
    return f"{prefix}/{DOWNSTREAM}/{label} ({OLMO_CORE_FIGURE_NAMES[figure]})"


def olmo_core_lm_key(label: str, figure: str, prefix: str = PREFIX) -> str:
    """OLMo-core's W&B key of one OLMo-core figure of a perplexity label: `<prefix>/lm/<label>/CE loss` or
    `.../PPL`. label: the label in OLMo-core's dataset metadata, e.g. `c4_en-validation`."""
    if figure not in OLMO_CORE_LM_FIGURE_NAMES:
        raise ConfigError(
            f"olmo_core_lm_key: figure {figure!r} of label {label!r} has no OLMo-core name; expected one of "
            f"{sorted(OLMO_CORE_LM_FIGURE_NAMES)}"
        )
    return figure_key(PERPLEXITY, label, OLMO_CORE_LM_FIGURE_NAMES[figure], prefix)


def is_olmo_core_key(key: str) -> bool:
    """Whether `key` is one OLMo-core's evaluator callbacks would record: `<prefix>/downstream/<label>
    (<words>)` as `olmo_core_key` builds them, or `<prefix>/lm/<label>/<CE loss|PPL>` as `olmo_core_lm_key`
    does."""
    head, _, words = key.rpartition(" (")
    if head and words.endswith(")") and words[:-1] in _OLMO_CORE_WORDS:
        return True
    head, _, name = key.rpartition("/")
    return name in _OLMO_CORE_LM_NAMES and f"/{PERPLEXITY}/" in head


def olmo_core_metrics(label: str, figures: dict[str, float], prefix: str = PREFIX) -> dict[str, float]:
    """OLMo figures (as `olmo_icl_compute` returns them) under OLMo-core's keys."""
    return {olmo_core_key(label, figure, prefix): value for figure, value in figures.items()}


class OLMoCoreKeys(KeyStyle):
    """The `olmo_core` key style (see the module docstring)."""

    name = "olmo_core"

    def key(self, kind: str, source: str, figure: str, prefix: str) -> str | None:
        if kind == PERPLEXITY and figure in OLMO_CORE_LM_FIGURE_NAMES:
            return olmo_core_lm_key(source, figure, prefix)
        if kind == DOWNSTREAM and source.startswith(OLMO_TASK_PREFIX) and figure in OLMO_CORE_FIGURE_NAMES:
            return olmo_core_key(source.removeprefix(OLMO_TASK_PREFIX), figure, prefix)
        return None

    def owns(self, key: str) -> bool:
        return is_olmo_core_key(key)


KEY_STYLE = OLMoCoreKeys()
