"""CommonsenseQA (commonsense knowledge, 5 choices)."""

from __future__ import annotations

from inloop_eval.tasks.native.arc import LabelledChoicesTask
from inloop_eval.tasks.native.letter_keys import LetterKeys
from inloop_eval.tasks.registry import register


class CommonsenseQA(LabelledChoicesTask):
    """CommonsenseQA, OLMo in-loop `csqa` and OLMES `csqa` rc: 'Question: {question}\\nAnswer:', continuations the
    choice texts, gold `answerKey` among `choices.label`.

    lm-evaluation-harness `commonsense_qa` lists the options and scores letters; this is the rc form.
    """

    dataset_path = "tau/commonsense_qa"
    dataset_name = None
    format_source = "OLMES csqa rc: 'Question: {question}\\nAnswer:'"


class CommonsenseQAMC(LetterKeys, CommonsenseQA):
    """CommonsenseQA mc, OLMES `csqa:mc`: 'Question: {question}\\n A. {choice}\\n ...\\nAnswer:' -> ' A'.. ' E'."""

    format_source = "OLMES csqa mc: 'Question: {question}\\n A. {choice}\\n ...\\nAnswer:' -> A..E"


register("commonsense_qa", CommonsenseQA)
register("commonsense_qa_rc", CommonsenseQA)
register("commonsense_qa_mc", CommonsenseQAMC)
