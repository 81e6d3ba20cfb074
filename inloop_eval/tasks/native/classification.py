"""Classification-style tasks over a fixed label set, scored by accuracy and by F1 over the predicted choice:
RTE, CommitmentBank, MRPC and SST-2, prompts as lm-evaluation-harness writes them.

`f1` is F1 of choice 1 for two labels (scikit-learn's default, as the harness's `f1`) and the mean of every
label's F1 for more (as the harness's CB); see `inloop_eval.metrics.icl`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.metrics.formats import CLASSIFICATION_METRICS
from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.registry import register


class ClassificationTask(MultipleChoiceTask):
    """`template` filled with the row's `fields`; continuations the label words; gold the `label` index."""

    prompt_format = "classification"
    metrics = CLASSIFICATION_METRICS
    uncond_context = "Answer:"
    template: str = ""
    fields: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    def field_text(self, raw: Mapping[str, Any], index: int, name: str) -> str:
        """One field as the template shows it."""
        return self.text(raw, index, name)

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return self.template.format(**{name: self.field_text(raw, index, name) for name in self.fields})

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return list(self.choices)

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", len(self.choices))


class RTE(ClassificationTask):
    """RTE (GLUE), lm-evaluation-harness `rte`: '{sentence1}\\nQuestion: {sentence2} True or False?\\nAnswer:'
    -> True (entailment, label 0) / False."""

    dataset_path = "glue"
    dataset_name = "rte"
    template = "{sentence1}\nQuestion: {sentence2} True or False?\nAnswer:"
    fields = ("sentence1", "sentence2")
    choices = ("True", "False")
    format_source = (
        "lm-evaluation-harness rte: '{sentence1}\\nQuestion: {sentence2} True or False?\\nAnswer:'"
    )


class CommitmentBank(ClassificationTask):
    """CommitmentBank (SuperGLUE CB), lm-evaluation-harness `cb`:
    '{premise}\\nQuestion: {hypothesis}. True, False, or Neither?\\nAnswer:' -> True / False / Neither
    (labels entailment, contradiction, neutral); f1 is the macro F1 over the three."""

    dataset_path = "super_glue"
    dataset_name = "cb"
    template = "{premise}\nQuestion: {hypothesis}. True, False, or Neither?\nAnswer:"
    fields = ("premise", "hypothesis")
    choices = ("True", "False", "Neither")
    format_source = (
        "lm-evaluation-harness cb: '{premise}\\nQuestion: {hypothesis}. True, False, or Neither?\\nAnswer:'"
    )


class MRPC(ClassificationTask):
    """MRPC (GLUE), lm-evaluation-harness `mrpc`: 'Sentence 1: {sentence1}\\nSentence 2: {sentence2}\\nQuestion: Do
    both sentences mean the same thing?\\nAnswer:' -> no / yes (label 1, equivalent); f1 is F1 of 'yes'."""

    dataset_path = "glue"
    dataset_name = "mrpc"
    template = "Sentence 1: {sentence1}\nSentence 2: {sentence2}\nQuestion: Do both sentences mean the same thing?\nAnswer:"
    fields = ("sentence1", "sentence2")
    choices = ("no", "yes")
    format_source = "lm-evaluation-harness mrpc: 'Sentence 1: ..\\nSentence 2: ..\\nQuestion: Do both sentences mean the same thing?'"


class SST2(ClassificationTask):
    """SST-2 (GLUE), lm-evaluation-harness `sst2`: '{sentence}\\nQuestion: Is this sentence positive or
    negative?\\nAnswer:' -> negative / positive (label 1); f1 is F1 of 'positive'."""

    dataset_path = "glue"
    dataset_name = "sst2"
    template = "{sentence}\nQuestion: Is this sentence positive or negative?\nAnswer:"
    fields = ("sentence",)
    choices = ("negative", "positive")
    format_source = "lm-evaluation-harness sst2: '{sentence}\\nQuestion: Is this sentence positive or negative?\\nAnswer:'"


register("rte", RTE)
register("commitment_bank", CommitmentBank)
register("mrpc", MRPC)
register("sst2", SST2)
