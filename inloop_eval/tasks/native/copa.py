"""COPA (choice of plausible alternatives: cause or effect, 2 choices)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.registry import register

_CONNECTORS = {"cause": "because", "effect": "therefore"}


def _lower_first(choice: str) -> str:
    return choice[:1].lower() + choice[1:]


class COPA(MultipleChoiceTask):
    """COPA, lm-evaluation-harness `copa`: the premise without its final '.' then ' because' (cause) or
    ' therefore' (effect); continuations choice1 and choice2 with the first letter lower-cased.

    'The man turned on the faucet therefore' -> 'water flowed from the spout.'. Same as OLMo's in-loop COPA.
    """

    dataset_path = "super_glue"
    dataset_name = "copa"
    format_source = "lm-evaluation-harness copa: '{premise without final .} because|therefore'"

    def premise(self, raw: Mapping[str, Any], index: int) -> str:
        """The premise, stripped, without its final '.'."""
        premise = self.text(raw, index, "premise").strip()
        # The harness drops the last character unconditionally; every COPA premise ends in '.'.
        return premise[:-1] if premise.endswith(".") else premise

    def connector(self, raw: Mapping[str, Any], index: int) -> str:
        """'because' for a cause, 'therefore' for an effect."""
        question = self.text(raw, index, "question")
        if question not in _CONNECTORS:
            raise self.error(index, f"field 'question': expected 'cause' or 'effect', found {question!r}")
        return _CONNECTORS[question]

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return self.premise(raw, index) + " " + self.connector(raw, index)

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return [_lower_first(self.text(raw, index, name, nonempty=True)) for name in ("choice1", "choice2")]

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "label", 2)


register("copa", COPA)
