"""BoolQ (yes/no questions about a Wikipedia passage)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.registry import register


class BoolQ(MultipleChoiceTask):
    """BoolQ, lm-evaluation-harness `boolq`: '{passage}\\nQuestion: {question}?\\nAnswer:', continuations
    ['no', 'yes'], gold `int(answer)`.

    OLMo's in-loop BoolQ renders the same prompt but orders the choices ['yes', 'no'].
    """

    dataset_path = "boolq"
    dataset_name = None
    uncond_context = "Answer:"  # OLMo's domain conditional for PMI
    format_source = "lm-evaluation-harness boolq: '{passage}\\nQuestion: {question}?\\nAnswer:' -> no/yes"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        passage = self.text(raw, index, "passage")
        return passage + "\nQuestion: " + self.text(raw, index, "question") + "?\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return ["no", "yes"]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        answer = self.field(raw, index, "answer")
        if not isinstance(answer, bool):
            raise self.error(index, f"field 'answer': expected true or false, found {answer!r}")
        return int(answer)


register("boolq", BoolQ)
