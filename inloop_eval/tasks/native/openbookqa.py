"""OpenBookQA (elementary science with an open book of facts, 4 choices)."""

from __future__ import annotations

from inloop_eval.tasks.native.arc import LabelledChoicesTask
from inloop_eval.tasks.native.letter_keys import LetterKeys
from inloop_eval.tasks.registry import register


class OpenBookQA(LabelledChoicesTask):
    """OpenBookQA, OLMES `openbookqa` rc: 'Question: {question_stem}\\nAnswer:', continuations the choice texts,
    gold `answerKey` among `choices.label`.

    lm-evaluation-harness `openbookqa` gives the bare question stem; OLMES adds the 'Question:'/'Answer:' frame.
    """

    dataset_path = "openbookqa"
    dataset_name = "main"
    question_field = "question_stem"
    format_source = "OLMES openbookqa rc: 'Question: {question_stem}\\nAnswer:'"


class OpenBookQAMC(LetterKeys, OpenBookQA):
    """OpenBookQA mc, OLMES `openbookqa:mc`: 'Question: {question_stem}\\n A. {choice}\\n ...\\nAnswer:' -> ' A'.."""

    format_source = "OLMES openbookqa mc: 'Question: {question_stem}\\n A. {choice}\\n ...\\nAnswer:' -> A.."


register("openbookqa", OpenBookQA)
register("openbookqa_rc", OpenBookQA)
register("openbookqa_mc", OpenBookQAMC)
