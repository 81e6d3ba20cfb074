"""Letter-key (mc) twins of answer-text (rc) tasks: the same question with its options listed.

The mc twin of an rc task whose prompt ends in '\\nAnswer:' renders, as OLMES does,

    {rc prompt without '\\nAnswer:'}
     A. {choice 1}
     B. {choice 2}
    Answer:

with continuations ' A', ' B', ... and the rc gold. Every continuation is one letter, so length normalisation
is a no-op and not reported. Comparing the twins tells a capability change from a change in output
sharpness: if mc stays flat while rc acc and acc_norm diverge, it was never capability.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.metrics.formats import MC_METRICS
from inloop_eval.tasks.base import MultipleChoiceTask

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
ANSWER_CUE = "\nAnswer:"


class LetterKeys(MultipleChoiceTask):
    """Mixin to put before an rc task class: `class ARCEasyMC(LetterKeys, ARCEasy)`."""

    prompt_format = "mc"
    metrics = MC_METRICS
    uncond_context = "Answer:"  # OLMo's domain conditional for PMI

    def mc_stem(self, raw: Mapping[str, Any], index: int) -> str:
        """The rc prompt without its answer cue, which the options go after."""
        context = super().doc_to_context(raw, index)
        if not isinstance(context, str) or not context.endswith(ANSWER_CUE):
            raise self.error(
                index,
                f"letter keys expect an rc prompt ending in {ANSWER_CUE!r}, found {str(context)[-40:]!r}",
            )
        return context[: -len(ANSWER_CUE)]

    def mc_options(self, raw: Mapping[str, Any], index: int) -> tuple[list[str], int]:
        """(the options in listed order, index of the gold option): the rc choices and gold."""
        options = [str(c) for c in super().doc_to_continuations(raw, index)]
        if len(options) > len(LETTERS):
            raise self.error(
                index,
                f"field 'choices': expected at most {len(LETTERS)} choices for letter keys, found {len(options)}",
            )
        gold = self._gold_indices(super().doc_to_gold(raw, index), options, index)
        return options, gold[0]

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        options, _ = self.mc_options(raw, index)
        listed = "".join(f"\n {letter}. {option}" for letter, option in zip(LETTERS, options, strict=False))
        return self.mc_stem(raw, index) + listed + ANSWER_CUE

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return list(LETTERS[: len(self.mc_options(raw, index)[0])])

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.mc_options(raw, index)[1]
