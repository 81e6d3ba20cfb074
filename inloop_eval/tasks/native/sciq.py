"""SciQ (science exam questions with a supporting paragraph, 4 choices)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.native.letter_keys import LetterKeys
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


class SciQMC(LetterKeys, SciQ):
    """SciQ mc: '{support}\\nQuestion: {question}\\n A. ..\\n B. ..\\n C. ..\\n D. ..\\nAnswer:' -> ' A'..' D'.

    The dataset always puts the correct answer last, so listing the options in that order would make ' D'
    always right; they are listed in a fixed per-document order, a permutation drawn from
    `numpy.random.default_rng([1234, document index])` (OLMES `sciq:mc` also shuffles, and drops the support).
    """

    format_source = (
        "sciq mc: '{support}\\nQuestion: {question}\\n A. ..\\nAnswer:' -> A..D, options shuffled per doc"
    )

    def mc_options(self, raw: Mapping[str, Any], index: int) -> tuple[list[str], int]:
        options, gold = super().mc_options(raw, index)
        order = np.random.default_rng([1234, index]).permutation(len(options)).tolist()
        return [options[i] for i in order], order.index(gold)


register("sciq", SciQ)
register("sciq_rc", SciQ)
register("sciq_mc", SciQMC)
