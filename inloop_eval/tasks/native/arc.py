"""ARC-Easy and ARC-Challenge (grade-school science, 3 to 5 choices), and the shared question-answer format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.native.letter_keys import LetterKeys
from inloop_eval.tasks.registry import register


class LabelledChoicesTask(MultipleChoiceTask):
    """'Question: {question}\\nAnswer:' with the choice texts as continuations and the gold answer named by
    `answerKey` among `choices.label` (the schema of ARC, OpenBookQA and CommonsenseQA)."""

    question_field: str = "question"
    uncond_context = "Answer:"  # OLMo's domain conditional for PMI

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return "Question: " + self.text(raw, index, self.question_field) + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return self._choices(raw, index)[0]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        labels = self._choices(raw, index)[1]
        key = self.text(raw, index, "answerKey").strip()
        if key not in labels:
            raise self.error(
                index, f"field 'answerKey': expected one of the choice labels {labels}, found {key!r}"
            )
        return labels.index(key)

    def _choices(self, raw: Mapping[str, Any], index: int) -> tuple[list[str], list[str]]:
        """(texts, labels) of `choices`, checked to have one label per text."""
        choices = self.field(raw, index, "choices")
        if not isinstance(choices, Mapping):
            raise self.error(
                index,
                f"field 'choices': expected a mapping with 'text' and 'label' lists, found {type(choices).__name__}",
            )
        texts = self.texts(choices, index, "text")
        labels = [label.strip() for label in self.texts(choices, index, "label")]
        if len(labels) != len(texts):
            raise self.error(
                index,
                f"field 'choices': expected one label per text, found {len(labels)} labels for {len(texts)} texts",
            )
        if len(set(labels)) != len(labels):
            raise self.error(index, f"field 'choices.label': expected distinct labels, found {labels}")
        for label, text in zip(labels, texts, strict=True):
            if not text.strip():
                raise self.error(
                    index, f"field 'choices.text': expected non-empty choices, found {label}: {text!r}"
                )
        return texts, labels


class ARCEasy(LabelledChoicesTask):
    """ARC-Easy, lm-evaluation-harness `arc_easy`: 'Question: {question}\\nAnswer:', continuations the choice
    texts, gold `choices.label.index(answerKey)` (labels are 'A'..'E' or '1'..'5'). Same as OLMo and OLMES rc."""

    dataset_path = "ai2_arc"
    dataset_name = "ARC-Easy"
    format_source = "lm-evaluation-harness arc_easy: 'Question: {question}\\nAnswer:'"


class ARCChallenge(ARCEasy):
    """ARC-Challenge, lm-evaluation-harness `arc_challenge`: the ARC-Easy format on the Challenge set."""

    dataset_name = "ARC-Challenge"
    format_source = "lm-evaluation-harness arc_challenge: 'Question: {question}\\nAnswer:'"


class ARCEasyMC(LetterKeys, ARCEasy):
    """ARC-Easy mc, OLMES `arc_easy:mc`: 'Question: {question}\\n A. {choice}\\n ...\\nAnswer:' -> ' A'.. (always
    letters, also where the dataset labels choices '1'..'5')."""

    format_source = "OLMES arc_easy mc: 'Question: {question}\\n A. {choice}\\n ...\\nAnswer:' -> A.."


class ARCChallengeMC(LetterKeys, ARCChallenge):
    """ARC-Challenge mc, OLMES `arc_challenge:mc`: the ARC-Easy mc format on the Challenge set."""

    format_source = "OLMES arc_challenge mc: 'Question: {question}\\n A. {choice}\\n ...\\nAnswer:' -> A.."


register("arc_easy", ARCEasy)
register("arc_easy_rc", ARCEasy)
register("arc_easy_mc", ARCEasyMC)
register("arc_challenge", ARCChallenge)
register("arc_challenge_rc", ARCChallenge)
register("arc_challenge_mc", ARCChallengeMC)
