"""OLMo's in-loop MMLU (ai2-olmo-eval 0.9.0 `MMLU`): a category's subjects in OLMo's order, its prompt
variations, letter keys and answer-only (bpb) variants, rendered exactly as OLMo renders them.

A prompt variation is None (zero-shot 'Question: {question}\\nAnswer:'), 'inst' (the instruction 'The
following are multiple choice questions (with answers) about {subject}:' first) or 'inst+k' (the
instruction, then the first k questions of the subject's dev split, solved). OLMo's `_var` labels render
every question once per variation, as consecutive documents; its `_5shot` labels use 'inst+5' alone.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inloop_eval.data.root import split_rows
from inloop_eval.errors import TaskDataError, UnknownTaskError
from inloop_eval.tasks.base import Doc
from inloop_eval.tasks.native.mmlu import MMLURC, SUBJECTS
from inloop_eval.tasks.olmo.base import OLMoFormat, with_metric_type

# OLMo's subcategory of each subject (`MMLU._subcategories`): its categories group these, not the
# subjects, so the subjects of a category come in the order of its subcategories.
OLMO_SUBCATEGORY: dict[str, str] = {
    "abstract_algebra": "math",
    "anatomy": "health",
    "astronomy": "physics",
    "business_ethics": "business",
    "clinical_knowledge": "health",
    "college_biology": "biology",
    "college_chemistry": "chemistry",
    "college_computer_science": "computer science",
    "college_mathematics": "math",
    "college_medicine": "health",
    "college_physics": "physics",
    "computer_security": "computer science",
    "conceptual_physics": "physics",
    "econometrics": "economics",
    "electrical_engineering": "engineering",
    "elementary_mathematics": "math",
    "formal_logic": "philosophy",
    "global_facts": "other",
    "high_school_biology": "biology",
    "high_school_chemistry": "chemistry",
    "high_school_computer_science": "computer science",
    "high_school_european_history": "history",
    "high_school_geography": "geography",
    "high_school_government_and_politics": "politics",
    "high_school_macroeconomics": "economics",
    "high_school_mathematics": "math",
    "high_school_microeconomics": "economics",
    "high_school_physics": "physics",
    "high_school_psychology": "psychology",
    "high_school_statistics": "math",
    "high_school_us_history": "history",
    "high_school_world_history": "history",
    "human_aging": "health",
    "human_sexuality": "culture",
    "international_law": "law",
    "jurisprudence": "law",
    "logical_fallacies": "philosophy",
    "machine_learning": "computer science",
    "management": "business",
    "marketing": "business",
    "medical_genetics": "health",
    "miscellaneous": "other",
    "moral_disputes": "philosophy",
    "moral_scenarios": "philosophy",
    "nutrition": "health",
    "philosophy": "philosophy",
    "prehistory": "history",
    "professional_accounting": "other",
    "professional_law": "law",
    "professional_medicine": "health",
    "professional_psychology": "psychology",
    "public_relations": "politics",
    "security_studies": "politics",
    "sociology": "culture",
    "us_foreign_policy": "politics",
    "virology": "health",
    "world_religions": "philosophy",
}
# OLMo's categories (`MMLU._categories`), each a list of subcategories.
OLMO_CATEGORIES: dict[str, tuple[str, ...]] = {
    "stem": ("physics", "chemistry", "biology", "computer science", "math", "engineering"),
    "humanities": ("history", "philosophy", "law"),
    "social_sciences": ("politics", "culture", "economics", "geography", "psychology"),
    "other": ("other", "business", "health"),
}
# OLMo's `prompt_variations`: 1 renders every variation, 2 the 5-shot prompt alone.
PROMPT_VARIATIONS: dict[int, tuple[str | None, ...]] = {
    1: (None, "inst", "inst+1", "inst+2", "inst+3", "inst+4", "inst+5"),
    2: ("inst+5",),
}
LETTERS: tuple[str, ...] = ("A", "B", "C", "D")
_SHOTS = re.compile(r"\+(\d+)")


def olmo_category_subjects(category: str) -> tuple[str, ...]:
    """The subjects of one of OLMo's categories, in OLMo's order: by subcategory, then alphabetically."""
    if category not in OLMO_CATEGORIES:
        raise UnknownTaskError(
            f"OLMo MMLU category {category!r}: expected one of {sorted(OLMO_CATEGORIES)}, found {category!r}"
        )
    return tuple(
        subject
        for sub in OLMO_CATEGORIES[category]
        for subject in SUBJECTS
        if OLMO_SUBCATEGORY[subject] == sub
    )


class OLMoMMLU(OLMoFormat, MMLURC):
    """OLMo's MMLU over one category: the native rc question and choices, or OLMo's own letter-key layout,
    with OLMo's prompt variations put before each question.

    split: "validation" or "test".
    prompt_variations: None (zero-shot), 1 (all seven variations) or 2 (5-shot), as OLMo's argument.
    mc_labels: options listed as '{letter}. {choice}' lines after the question (no 'Question: ' prefix),
        continuations ' A'..' D'.
    metric_type: OLMo's metric type; ce_loss and bpb score the gold answer alone.
    fast_mc: OLMo's `_fast` labels score every letter from one forward pass; the requests are the same.
    """

    uncond_context = "Answer:"
    olmo_metric_type = "len_norm"

    def __init__(
        self,
        category: str,
        *,
        split: str = "validation",
        prompt_variations: int | None = None,
        mc_labels: bool = False,
        metric_type: str | None = None,
        fast_mc: bool = False,
    ) -> None:
        self.split = split
        self.prompt_variations = prompt_variations
        self.prompts: tuple[str | None, ...] = (
            (None,) if prompt_variations is None else PROMPT_VARIATIONS[prompt_variations]
        )
        self.mc_labels = mc_labels
        self.fast_mc = fast_mc
        self._dev_splits: dict[Any, Sequence[Mapping[str, Any]]] = {}
        self.prompt_format = "mc" if mc_labels else "rc"
        super().__init__(olmo_category_subjects(category), metric_type=metric_type)
        shown_prompts = ", ".join("zero-shot" if p is None else p for p in self.prompts)
        self.format_source = with_metric_type(
            f"OLMo mmlu {category} {split} ({shown_prompts}{', letter keys' if mc_labels else ''}): "
            + (
                "'{question}\\nA. {choice}\\n...Answer:'" if mc_labels else "'Question: {question}\\nAnswer:'"
            ),
            self.olmo_metric_type,
        )

    @property
    def gold_only(self) -> bool:
        return self.prompt_format == "gold"

    def answer_index(self, raw: Mapping[str, Any], index: int) -> int:
        """The position of the gold choice (the native gold), also where only the gold answer is scored."""
        return super().doc_to_gold(raw, index)

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        """The native rc prompt; with letter keys, OLMo's: '{question}\\nA. {choice}\\n...Answer:'."""
        if not self.mc_labels:
            return super().doc_to_context(raw, index)
        choices = self.choices(raw, index)
        options = "".join(f"{key}. {choice}\n" for key, choice in zip(LETTERS, choices, strict=False))
        return f"{self.question(raw, index)}\n{options}Answer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        choices = list(LETTERS) if self.mc_labels else self.choices(raw, index)
        return [choices[self.answer_index(raw, index)]] if self.gold_only else choices

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return 0 if self.gold_only else self.answer_index(raw, index)

    def prompt_prefix(
        self, raw: Mapping[str, Any], index: int, prompt: str | None, dev_rows: Sequence[Mapping[str, Any]]
    ) -> str:
        """What variation `prompt` puts before the question: the instruction and solved dev questions."""
        if prompt is None:
            return ""
        prefix = ""
        if "inst" in prompt:
            subject = self.text(raw, index, "subject").replace("_", " ")
            prefix = f"The following are multiple choice questions (with answers) about {subject}:\n\n"
        shots = _SHOTS.findall(prompt)
        if shots:
            for k, example in enumerate(dev_rows):
                if k >= int(shots[0]):
                    break
                try:
                    answer = self.answer_index(example, k)
                    shown = LETTERS[answer] if self.mc_labels else self.choices(example, k)[answer]
                    prefix += self.doc_to_context(example, k) + " " + shown + "\n\n"
                except TaskDataError as exc:
                    raise TaskDataError(
                        f"few-shot example {k} (dev split) of task doc {index}: {exc}"
                    ) from None
        return prefix

    def rows(self, subset: str | None, split: str, data_root: str | Path | None) -> list[dict[str, Any]]:
        """Each question of the subject once per prompt variation, in OLMo's order (so `limit` counts
        documents, question and variation, as OLMo's doc ids do), with the dev examples its prompt shows."""
        needs_dev = any(prompt is not None and _SHOTS.search(prompt) for prompt in self.prompts)
        out: list[dict[str, Any]] = []
        for raw in split_rows(self.dataset_path, subset, split, data_root=data_root, task=self.name):
            examples = self.dev_rows(raw.get("subject"), data_root) if needs_dev else []
            out.extend({"raw": raw, "prompt": prompt, "examples": examples} for prompt in self.prompts)
        return out

    def dev_rows(self, subject: Any, data_root: str | Path | None) -> Sequence[Mapping[str, Any]]:
        """The dev split OLMo takes examples from: found by the row's own `subject`, among the category's
        subjects only; loaded once per subject."""
        if subject not in self.subsets():
            return []
        if subject not in self._dev_splits:
            self._dev_splits[subject] = split_rows(
                self.dataset_path, subject, "dev", data_root=data_root, task=self.name
            )
        return self._dev_splits[subject]

    def make_doc(self, raw: Mapping[str, Any], index: int) -> Doc:
        base = super().make_doc(raw["raw"], index)
        prefix = self.prompt_prefix(raw["raw"], index, raw["prompt"], raw["examples"])
        return dataclasses.replace(base, contexts=tuple(prefix + context for context in base.contexts))
