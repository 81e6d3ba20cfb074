"""PIQA (physical commonsense, 2 solutions)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.native.letter_keys import LetterKeys
from inloop_eval.tasks.registry import register


class PIQA(MultipleChoiceTask):
    """PIQA, lm-evaluation-harness `piqa`: 'Question: {goal}\\nAnswer:', continuations sol1 and sol2.

    OLMo's in-loop PIQA uses the same prompt; OLMES uses 'Goal:' instead of 'Question:'.
    """

    dataset_path = "piqa"
    dataset_name = "plain_text"
    uncond_context = "Answer:"  # OLMo's domain conditional for PMI
    format_source = "lm-evaluation-harness piqa: 'Question: {goal}\\nAnswer:'"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return "Question: " + self.text(raw, index, "goal") + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [self.text(raw, index, name, nonempty=True) for name in ("sol1", "sol2")]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", 2)


class PIQAMC(LetterKeys, PIQA):
    """PIQA mc: 'Question: {goal}\\n A. {sol1}\\n B. {sol2}\\nAnswer:' -> ' A' / ' B'.

    OLMES `piqa:mc` lists the same options after 'Goal: {goal}'; this keeps the rc twin's 'Question:'.
    """

    format_source = "piqa mc: 'Question: {goal}\\n A. {sol1}\\n B. {sol2}\\nAnswer:' -> A/B"


register("piqa", PIQA)
register("piqa_rc", PIQA)
register("piqa_mc", PIQAMC)
