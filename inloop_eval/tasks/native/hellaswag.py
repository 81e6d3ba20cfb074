"""HellaSwag (sentence completion, 4 endings)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.native.letter_keys import LetterKeys
from inloop_eval.tasks.registry import register

_BRACKETED = re.compile(r"\[.*?\]")


def preprocess(text: str) -> str:
    """lm-evaluation-harness's HellaSwag clean-up; the brackets are artefacts of the WikiHow portion."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = _BRACKETED.sub("", text)
    return text.replace("  ", " ")


class HellaSwag(MultipleChoiceTask):
    """HellaSwag, lm-evaluation-harness `hellaswag`: the preprocessed
    '{activity_label}: {ctx_a} {ctx_b.capitalize()}', continuations the preprocessed endings.

    OLMo's in-loop HellaSwag and OLMES (rc) render the same context.
    """

    dataset_path = "hellaswag"
    dataset_name = None
    format_source = "lm-evaluation-harness hellaswag: '{activity_label}: {ctx_a} {ctx_b.capitalize()}'"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        activity = self.text(raw, index, "activity_label")
        ctx_a = self.text(raw, index, "ctx_a")
        ctx_b = self.text(raw, index, "ctx_b")
        return preprocess(activity + ": " + ctx_a + " " + ctx_b.capitalize())

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [preprocess(ending) for ending in self.texts(raw, index, "endings", nonempty=True)]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", len(self.texts(raw, index, "endings")))


class HellaSwagMC(LetterKeys, HellaSwag):
    """HellaSwag mc, OLMES `hellaswag:mc`: '{context}\\nChoose the best continuation:\\n A. {ending}\\n ...\\nAnswer:'
    -> ' A'..' D', with the rc twin's preprocessed context and endings."""

    format_source = (
        "OLMES hellaswag mc: '{ctx}\\nChoose the best continuation:\\n A. {ending}\\n ...\\nAnswer:' -> A..D"
    )

    def mc_stem(self, raw: Mapping[str, Any], index: int) -> str:
        return HellaSwag.doc_to_context(self, raw, index) + "\nChoose the best continuation:"


register("hellaswag", HellaSwag)
register("hellaswag_rc", HellaSwag)
register("hellaswag_mc", HellaSwagMC)
