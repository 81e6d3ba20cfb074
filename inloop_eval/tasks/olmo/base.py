"""What every `olmo:<label>` task shares, and `OLMoFormat`, the mixin that makes a native task OLMo's.

OLMo (ai2-olmo-eval 0.9.0, `olmo_eval/tasks.py`) renders most of its in-loop tasks as the native tasks here
do. `OLMoFormat` goes before a native task class, as `LetterKeys` does (`class OLMoPIQA(OLMoFormat, PIQA)`):
the native class renders the prompt, the choices and the gold, and the mixin changes only what OLMo does
differently:

- requests encoded as OLMo encodes them (`pair_encoding = "olmo"`: the context and the continuation each on
  their own, see `inloop_eval.requests.tokenize.tokenize_pair_olmo`);
- each choice's unconditional context is OLMo's domain conditional (`doc_to_uncond`, encoded without BOS):
  `uncond_context`, OLMo's default " " unless the format names one, or one per document;
- OLMo's metric type of the label in `olmo_metric_type`, which also decides the figures (`set_metric_type`);
- OLMo's laxer checks: fields are read as they are, where native tasks refuse a blank choice field by name
  (`make_doc` still refuses an empty continuation, as for every task);
- no `_<k>shot` suffix: OLMo's few-shot prompts are part of its label (`olmo:mmlu_stem_mc_5shot`).

Every continuation OLMo scores starts with a space: here that space is the target delimiter and the choices
are stored without it, so `target_delimiter + choice` is OLMo's continuation string.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from inloop_eval.errors import UnknownTaskError
from inloop_eval.metrics.formats import METRICS_BY_FORMAT, OLMO_GOLD_ONLY_TYPES, OLMO_METRIC_TYPES
from inloop_eval.tasks.base import Doc, MultipleChoiceTask

# OLMo's domain conditional where a task names none (`ICLMultiChoiceTaskDataset.doc_to_domain_conditional`).
DEFAULT_DOMAIN_CONDITIONAL = " "


def check_metric_type(label: str, metric_type: str) -> str:
    """`metric_type` if it is one of OLMo's, else UnknownTaskError naming the label."""
    if metric_type not in OLMO_METRIC_TYPES:
        raise UnknownTaskError(
            f"OLMo label {label!r}: metric type expected one of {OLMO_METRIC_TYPES}, found {metric_type!r}"
        )
    return metric_type


def set_metric_type(task: MultipleChoiceTask, metric_type: str) -> None:
    """Score `task` as OLMo scores a label of `metric_type`: ce_loss and bpb make it a gold-answer task;
    the figures are its format's defaults, with PMI added where OLMo scores the label by pmi_dc."""
    task.olmo_metric_type = metric_type
    if metric_type in OLMO_GOLD_ONLY_TYPES:
        task.prompt_format = "gold"
    metrics = METRICS_BY_FORMAT[task.prompt_format]
    if metric_type == "pmi_dc" and "acc_pmi" not in metrics:
        metrics = (*metrics, "acc_pmi")
    task.metrics = metrics


def with_metric_type(format_source: str, metric_type: str) -> str:
    """A task's format line for `inloop-eval tasks`, naming OLMo's metric type of its label."""
    return f"{format_source}; OLMo metric type {metric_type}"


class OLMoFormat(MultipleChoiceTask):
    """Mixin to put before a native task class: OLMo's encoding, domain conditionals, metric type and checks.

    metric_type: OLMo's metric type of the label; None keeps the format's default `olmo_metric_type`.
    Other arguments go to the native class.
    """

    pair_encoding = "olmo"
    supports_fewshot = False
    uncond_context = DEFAULT_DOMAIN_CONDITIONAL
    # OLMo's default metric type for the format; an `olmo:` label may override it.
    olmo_metric_type: str = "acc"

    def __init__(self, *args: Any, metric_type: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        set_metric_type(self, self.olmo_metric_type if metric_type is None else metric_type)
        self.format_source = with_metric_type(self.format_source, self.olmo_metric_type)

    def text(self, raw: Mapping[str, Any], index: int, name: str, *, nonempty: bool = False) -> str:
        """`raw[name]` as a string, blank or not: OLMo refuses no blank field."""
        return super().text(raw, index, name)

    def texts(self, raw: Mapping[str, Any], index: int, name: str, *, nonempty: bool = False) -> list[str]:
        """`raw[name]` as a list of strings, blank or not: OLMo refuses no blank field."""
        return super().texts(raw, index, name)

    def doc_to_uncond(self, raw: Mapping[str, Any], index: int) -> str | Sequence[str]:
        """OLMo's domain conditional: one string, or one per context (WinoGrande)."""
        return self.uncond_context

    def make_doc(self, raw: Mapping[str, Any], index: int) -> Doc:
        doc = super().make_doc(raw, index)
        uncond = self.doc_to_uncond(raw, index)
        texts = (uncond,) * doc.n_choices if isinstance(uncond, str) else tuple(uncond)
        if len(texts) != doc.n_choices:
            raise self.error(
                index,
                f"expected one unconditional context per choice ({doc.n_choices}), found {len(texts)}",
            )
        return dataclasses.replace(doc, uncond_contexts=texts)
