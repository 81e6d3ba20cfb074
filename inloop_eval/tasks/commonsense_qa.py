"""CommonsenseQA (commonsense knowledge, 5 choices)."""

from __future__ import annotations

from inloop_eval.tasks.arc import LabelledChoicesTask
from inloop_eval.tasks.registry import register


class CommonsenseQA(LabelledChoicesTask):
    """CommonsenseQA, OLMo in-loop `csqa` and OLMES `csqa` rc: 'Question: {question}\\nAnswer:', continuations the
    choice texts, gold `answerKey` among `choices.label`.

    lm-evaluation-harness `commonsense_qa` lists the options and scores letters; this is the rc form.
    """

    dataset_path = "tau/commonsense_qa"
    dataset_name = None
    format_source = "OLMES csqa rc: 'Question: {question}\\nAnswer:'"


register("commonsense_qa", CommonsenseQA)
