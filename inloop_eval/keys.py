"""Every metric key, in every key style, decided here and nowhere else.

Evaluators return bare figure names per label (`acc`, `ce`, `failed`); the orchestrator turns them into keys
with `figure_key`, the way OLMo-core's evaluator callback records `f"{prefix}/{evaluator}/{figure}"`:

- `inloop` style (ours): `<prefix>/<kind>/<label>/<figure>`, e.g. `eval/downstream/piqa/acc_norm`,
  `eval/lm/c4/ppl`; a suite average (`suite_average:` in the config) `<prefix>/suite/<label>/centered_acc`
  (and `_stderr`). No spaces, so the keys sort and filter well on W&B.
- `olmo_core` style: the OLMo figures of an `olmo:<label>` task take the key OLMo-core's downstream callback
  gives them, `<prefix>/downstream/<OLMo label> (<words>)`, e.g. `eval/downstream/arc_easy (length-normalized
  accuracy)`, and the OLMo-core figures of a `documents` perplexity label take the keys OLMo-core's
  `LMEvaluator` gives them, `<prefix>/lm/<label>/CE loss` and `<prefix>/lm/<label>/PPL`, so that a run moving
  from OLMo-core continues its curves; every other figure keeps its `inloop` key.

`prefix` is `eval` for the in-loop evaluation (OLMo-core records merged weights under `eval/merged`).
"""

from __future__ import annotations

from dataclasses import dataclass

from inloop_eval.errors import ConfigError

PREFIX = "eval"
# The kind of each evaluator, the second part of its keys.
DOWNSTREAM = "downstream"
PERPLEXITY = "lm"
# Not an evaluator: the orchestrator's averages over named tasks (`EvaluatorConfig.suite_average`).
SUITE = "suite"
# The figure every evaluator reports, set to 1, for a label whose evaluation failed.
FAILED = "failed"


def seconds_key(prefix: str = PREFIX) -> str:
    """The wall time of one evaluation, added by `run_and_log`: `<prefix>/seconds`."""
    return f"{prefix}/seconds"


def tokens_key(prefix: str = PREFIX) -> str:
    """The tokens one evaluation forwarded, added by `run_and_log`: `<prefix>/tokens_forwarded`."""
    return f"{prefix}/tokens_forwarded"


SECONDS_KEY = seconds_key()
TOKENS_KEY = tokens_key()
# The training loss a run logs beside its evaluations (the demo does), drawn by the report.
TRAIN_LOSS_KEY = "train/loss"
# OLMo-core's throughput metric its trainer sums the evaluation time into.
OLMO_CORE_EVAL_TIME_KEY = "throughput/in-loop eval time (s)"

KEY_STYLES = ("inloop", "olmo_core")

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
OLMO_CORE_LM_FIGURE_NAMES: dict[str, str] = {"olmo_ce_loss": "CE loss", "olmo_ppl": "PPL"}
_OLMO_CORE_LM_NAMES = frozenset(OLMO_CORE_LM_FIGURE_NAMES.values())


def kind_prefix(kind: str, prefix: str = PREFIX) -> str:
    """`<prefix>/<kind>/`: what every key of one kind of evaluator starts with, e.g. `eval/downstream/`."""
    return f"{prefix}/{kind}/"


def figure_key(kind: str, label: str, figure: str, prefix: str = PREFIX) -> str:
    """Our key of one figure: `<prefix>/<kind>/<label>/<figure>`, e.g. `eval/lm/c4/ppl`."""
    return f"{kind_prefix(kind, prefix)}{label}/{figure}"


def suite_outcomes_label(label: str) -> str:
    """The label a suite average's per-document outcomes are filed under, beside the tasks' labels (which
    a `suite/` prefix cannot clash with: a task label has no '/' unless it is a harness file path)."""
    return f"{SUITE}/{label}"


def split_key(key: str, kind: str, prefix: str = PREFIX) -> tuple[str, str] | None:
    """(label, figure) of our key `key` of evaluator kind `kind`; None for any other key. A label may hold
    '/' (a harness task id), the figure never does."""
    head = kind_prefix(kind, prefix)
    if not key.startswith(head):
        return None
    label, _, figure = key[len(head) :].rpartition("/")
    return (label, figure) if label and figure else None


def failed_labels(metrics: dict[str, float], prefix: str = PREFIX) -> list[str]:
    """`<kind>/<label>` of every evaluator label that reported `failed = 1` in `metrics`, in key order."""
    head = f"{prefix}/"
    return [
        key[len(head) : -len(FAILED) - 1]
        for key, value in metrics.items()
        if key.startswith(head) and key.endswith(f"/{FAILED}") and value
    ]


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
    `.../PPL` (its `LMEvaluator`, named `lm`, records `<label>/CE loss` and `<label>/PPL`).

    label: the label in OLMo-core's dataset metadata, e.g. `c4_en-validation`.
    """
    if figure not in OLMO_CORE_LM_FIGURE_NAMES:
        raise ConfigError(
            f"olmo_core_lm_key: figure {figure!r} of label {label!r} has no OLMo-core name; expected one of "
            f"{sorted(OLMO_CORE_LM_FIGURE_NAMES)}"
        )
    return figure_key(PERPLEXITY, label, OLMO_CORE_LM_FIGURE_NAMES[figure], prefix)


def olmo_core_figure_key(kind: str, label: str, figure: str, prefix: str = PREFIX) -> str:
    """OLMo-core's key of an OLMo-core figure of an evaluator of kind `kind`: `olmo_core_lm_key` for
    perplexity, `olmo_core_key` for downstream tasks."""
    if kind == PERPLEXITY:
        return olmo_core_lm_key(label, figure, prefix)
    return olmo_core_key(label, figure, prefix)


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


@dataclass(frozen=True)
class OlmoCoreNames:
    """How OLMo-core names some figures of a label (used with `key_style: olmo_core`): an `olmo:` task's
    (its `DownstreamEvaluator` keys) or a `documents` perplexity label's (its `LMEvaluator` keys).

    label: the label in OLMo-core (an `olmo:` task's id without `olmo:`; a perplexity label as it is).
    figures: the figures that take OLMo-core's key; the others keep ours.
    """

    label: str
    figures: frozenset[str]


def metric_keys(
    kind: str,
    figures: dict[str, dict[str, float]],
    olmo_core_names: dict[str, OlmoCoreNames],
    key_style: str,
    prefix: str = PREFIX,
) -> dict[str, float]:
    """One evaluator's figures (label -> {figure: value}) under their keys: `<prefix>/<kind>/<label>/<figure>`;
    with `key_style: olmo_core`, the figures OLMo-core also reports (`olmo_core_names`) under its keys
    instead (`<prefix>/downstream/<OLMo label> (<words>)`, `<prefix>/lm/<label>/CE loss`)."""
    metrics: dict[str, float] = {}
    for label, values in figures.items():
        names = olmo_core_names.get(label) if key_style == "olmo_core" else None
        for figure, value in values.items():
            if names is not None and figure in names.figures:
                metrics[olmo_core_figure_key(kind, names.label, figure, prefix)] = value
            else:
                metrics[figure_key(kind, label, figure, prefix)] = value
    return metrics
