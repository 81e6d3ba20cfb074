"""WinoGrande (pronoun resolution as a fill-in-the-blank with 2 options), scored by partial evaluation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.metrics.formats import PARTIAL_METRICS
from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.registry import register


class WinoGrande(MultipleChoiceTask):
    """WinoGrande, lm-evaluation-harness `winogrande` (partial evaluation, Trinh & Le 2018).

    One context per option, the sentence up to the blank with the option filled in
    ('Sarah was a much better surgeon than Maria so Sarah'); one shared continuation, the rest of the
    sentence after the blank, stripped ('always got the easier cases.'). OLMo's in-loop WinoGrande and
    OLMES (rc) do the same.
    """

    dataset_path = "winogrande"
    dataset_name = "winogrande_xl"
    prompt_format = "partial"
    metrics = PARTIAL_METRICS
    format_source = (
        "lm-evaluation-harness winogrande: partial scoring, '{sentence up to _}{option}' -> '{rest}'"
    )

    def blank(self, raw: Mapping[str, Any], index: int) -> tuple[str, int]:
        """The sentence and the position of its '_' blank."""
        sentence = self.text(raw, index, "sentence")
        if sentence.count("_") != 1:
            raise self.error(
                index,
                f"field 'sentence': expected exactly one '_' blank, found {sentence.count('_')} in {sentence!r}",
            )
        return sentence, sentence.index("_")

    def options(self, raw: Mapping[str, Any], index: int) -> list[str]:
        """The two fillers of the blank."""
        return [self.text(raw, index, name, nonempty=True) for name in ("option1", "option2")]

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> list[str]:
        sentence, blank = self.blank(raw, index)
        return [sentence[:blank] + option for option in self.options(raw, index)]

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        sentence, blank = self.blank(raw, index)
        rest = sentence[blank + 1 :].strip()
        if not rest:
            raise self.error(
                index, f"field 'sentence': expected text after the '_' blank, found {sentence!r}"
            )
        return [rest]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "answer", 2, first=1)


register("winogrande", WinoGrande)
