"""Gold-only tasks: one continuation per document, the answer, scored for its cross-entropy and bits per byte
only (`ce_gold`, `bpb_gold`), so a run can track answer likelihood long before accuracy moves.

ARC-Easy answers ('Question: {question}\\nAnswer:' -> the gold choice), TriviaQA answers (rc.wikipedia.nocontext,
-> `answer.value`) and Natural Questions answers (nq_open, -> the first answer), in OLMES's question-answer
format as OLMo's `naturalqs_open` bpb requests have it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.metrics.formats import GOLD_ONLY_METRICS
from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.native.arc import ARCEasy
from inloop_eval.tasks.registry import register


class GoldOnly(MultipleChoiceTask):
    """'Question: {question}\\nAnswer:' -> `answer(raw)`; one choice, the gold."""

    prompt_format = "gold"
    metrics = GOLD_ONLY_METRICS

    def answer(self, raw: Mapping[str, Any], index: int) -> str:
        raise NotImplementedError

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return "Question: " + self.text(raw, index, "question").strip() + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [self.answer(raw, index)]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0


class ARCEasyAnswers(ARCEasy):
    """ARC-Easy answers: the `arc_easy` prompt with its gold choice as the only continuation."""

    prompt_format = "gold"
    metrics = GOLD_ONLY_METRICS
    format_source = "ARC-Easy answers: 'Question: {question}\\nAnswer:' -> the gold choice (ce/bpb only)"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        choices = super().doc_to_continuations(raw, index)
        return [choices[super().doc_to_gold(raw, index)]]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0


class TriviaQAAnswers(GoldOnly):
    """TriviaQA (rc.wikipedia.nocontext) answers: 'Question: {question}\\nAnswer:' -> `answer.value`."""

    dataset_path = "trivia_qa"
    dataset_name = "rc.wikipedia.nocontext"
    format_source = "TriviaQA answers: 'Question: {question}\\nAnswer:' -> answer.value (ce/bpb only)"

    def answer(self, raw: Mapping[str, Any], index: int) -> str:
        answer = self.field(raw, index, "answer")
        if not isinstance(answer, Mapping):
            raise self.error(
                index, f"field 'answer': expected a mapping with 'value', found {type(answer).__name__}"
            )
        return self.text(answer, index, "value", nonempty=True)


class NaturalQuestionsAnswers(GoldOnly):
    """Natural Questions (nq_open) answers: 'Question: {question}\\nAnswer:' -> the first of `answer`, as OLMo's
    `naturalqs_open` bpb requests."""

    dataset_path = "nq_open"
    dataset_name = None
    format_source = "Natural Questions answers: 'Question: {question}\\nAnswer:' -> answer[0] (ce/bpb only)"

    def answer(self, raw: Mapping[str, Any], index: int) -> str:
        answers = self.texts(raw, index, "answer", nonempty=True)
        if not answers:
            raise self.error(index, "field 'answer': expected at least one answer, found none")
        return answers[0]


register("arc_easy_bpb", ARCEasyAnswers)
register("trivia_qa_bpb", TriviaQAAnswers)
register("nq_open_bpb", NaturalQuestionsAnswers)
