"""SciQ (science exam questions with a supporting paragraph, 4 choices)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.registry import register

_CHOICE_FIELDS = ("distractor1", "distractor2", "distractor3", "correct_answer")


class SciQ(MultipleChoiceTask):
    """SciQ, lm-evaluation-harness `sciq`: '{support}\\nQuestion: {question}\\nAnswer:' (support stripped, as
    OLMo does; the harness strips only the left), continuations distractor1..3 then correct_answer, gold 3."""

    dataset_path = "sciq"
    dataset_name = None
    uncond_context = "Answer:"  # OLMo's domain conditional for PMI
    format_source = "lm-evaluation-harness sciq: '{support}\\nQuestion: {question}\\nAnswer:'"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        support = self.text(raw, index, "support").strip()
        return support + "\nQuestion: " + self.text(raw, index, "question") + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [self.text(raw, index, name, nonempty=True) for name in _CHOICE_FIELDS]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return _CHOICE_FIELDS.index("correct_answer")


register("sciq", SciQ)
