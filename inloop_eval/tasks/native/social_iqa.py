"""Social IQa (social commonsense, 3 answers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.native.letter_keys import LetterKeys
from inloop_eval.tasks.registry import register

_ANSWER_FIELDS = ("answerA", "answerB", "answerC")


class SocialIQA(MultipleChoiceTask):
    """Social IQa, OLMo in-loop `socialiqa` and OLMES `socialiqa` rc: 'Question: {context} {question}\\nAnswer:',
    continuations answerA..answerC, gold `int(label) - 1`.

    lm-evaluation-harness `siqa` uses 'Q: ... \\nA:'; this follows OLMo/OLMES.
    """

    dataset_path = "social_i_qa"
    dataset_name = None
    uncond_context = "Answer:"  # OLMo's domain conditional for PMI
    format_source = "OLMES socialiqa rc: 'Question: {context} {question}\\nAnswer:'"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        context = self.text(raw, index, "context")
        return "Question: " + context + " " + self.text(raw, index, "question") + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [self.text(raw, index, name, nonempty=True) for name in _ANSWER_FIELDS]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", len(_ANSWER_FIELDS), first=1)


class SocialIQAMC(LetterKeys, SocialIQA):
    """Social IQa mc, OLMES `socialiqa:mc`: 'Question: {context} {question}\\n A. {answerA}\\n ...\\nAnswer:'
    -> ' A'..' C'."""

    format_source = (
        "OLMES socialiqa mc: 'Question: {context} {question}\\n A. {answerA}\\n ...\\nAnswer:' -> A..C"
    )


register("social_iqa", SocialIQA)
register("social_iqa_rc", SocialIQA)
register("social_iqa_mc", SocialIQAMC)
