"""LAMBADA (OpenAI's detokenised test set): predict a passage's last word, scored by greedy exact match.

The documents are OLMo's oe-eval `lambada` requests (context: the passage without its last word;
continuation: ' ' + the word), from the fetched data root. `acc_greedy` is lm-evaluation-harness's
`lambada_openai` `acc` (every token of the word is the model's argmax), `ppl_gold` its `perplexity`
(exp of the mean negative loglikelihood of the word), beside the word's `ce_gold` and `bpb_gold`.
"""

from __future__ import annotations

from inloop_eval.metrics.formats import GREEDY_METRICS
from inloop_eval.tasks.oe_eval import OEEvalRequestsTask
from inloop_eval.tasks.registry import register


class Lambada(OEEvalRequestsTask):
    """LAMBADA last-word prediction from `<root>/oe_eval_tasks/lambada/bpb_0shot/`."""

    split = "test"

    def __init__(self) -> None:
        super().__init__("lambada", "bpb_0shot")
        self.metrics = GREEDY_METRICS
        self.format_source = (
            "lm-evaluation-harness lambada_openai: '{passage without last word}' -> ' {word}'"
        )


register("lambada", Lambada)
