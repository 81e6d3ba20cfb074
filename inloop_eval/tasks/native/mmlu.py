"""MMLU (57 subjects, 4 choices): per subject, per category group and overall, in rc and mc formats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inloop_eval.metrics.formats import MC_METRICS
from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.registry import register

# Subject -> category, as lm-evaluation-harness's `mmlu` groups (lm_eval/tasks/mmlu/_generate_configs.py).
# The MMLU paper's categories.py differs for one subject: it files anatomy under "other" (health).
SUBJECT_CATEGORY: dict[str, str] = {
    "abstract_algebra": "stem",
    "anatomy": "stem",
    "astronomy": "stem",
    "business_ethics": "other",
    "clinical_knowledge": "other",
    "college_biology": "stem",
    "college_chemistry": "stem",
    "college_computer_science": "stem",
    "college_mathematics": "stem",
    "college_medicine": "other",
    "college_physics": "stem",
    "computer_security": "stem",
    "conceptual_physics": "stem",
    "econometrics": "social_sciences",
    "electrical_engineering": "stem",
    "elementary_mathematics": "stem",
    "formal_logic": "humanities",
    "global_facts": "other",
    "high_school_biology": "stem",
    "high_school_chemistry": "stem",
    "high_school_computer_science": "stem",
    "high_school_european_history": "humanities",
    "high_school_geography": "social_sciences",
    "high_school_government_and_politics": "social_sciences",
    "high_school_macroeconomics": "social_sciences",
    "high_school_mathematics": "stem",
    "high_school_microeconomics": "social_sciences",
    "high_school_physics": "stem",
    "high_school_psychology": "social_sciences",
    "high_school_statistics": "stem",
    "high_school_us_history": "humanities",
    "high_school_world_history": "humanities",
    "human_aging": "other",
    "human_sexuality": "social_sciences",
    "international_law": "humanities",
    "jurisprudence": "humanities",
    "logical_fallacies": "humanities",
    "machine_learning": "stem",
    "management": "other",
    "marketing": "other",
    "medical_genetics": "other",
    "miscellaneous": "other",
    "moral_disputes": "humanities",
    "moral_scenarios": "humanities",
    "nutrition": "other",
    "philosophy": "humanities",
    "prehistory": "humanities",
    "professional_accounting": "other",
    "professional_law": "humanities",
    "professional_medicine": "other",
    "professional_psychology": "social_sciences",
    "public_relations": "social_sciences",
    "security_studies": "social_sciences",
    "sociology": "social_sciences",
    "us_foreign_policy": "social_sciences",
    "virology": "other",
    "world_religions": "humanities",
}
DATASET_PATH = "hails/mmlu_no_train"
SUBJECTS: tuple[str, ...] = tuple(sorted(SUBJECT_CATEGORY))
CATEGORIES: tuple[str, ...] = ("stem", "humanities", "social_sciences", "other")


def category_subjects(category: str) -> tuple[str, ...]:
    """The subjects of one category, sorted (the order their documents are concatenated in)."""
    return tuple(s for s in SUBJECTS if SUBJECT_CATEGORY[s] == category)


class MMLURC(MultipleChoiceTask):
    """MMLU rc, OLMo in-loop `mmlu_*_var` (zero-shot, no instruction) and OLMES rc:
    'Question: {question.strip()}\\nAnswer:', continuations the choice texts, gold `answer`.

    subjects: one subject, or several whose validation splits are concatenated in the given order.
    Few-shot (`mmlu_stem_mc_5shot`): 'The following are multiple choice questions (with answers) about
    {subject}.\\n\\n', then the first k documents of the subject's dev split, solved, each followed by '\\n\\n'.
    """

    dataset_path = DATASET_PATH
    uncond_context = "Answer:"  # OLMo's domain conditional for PMI
    format_source = "OLMES mmlu rc: 'Question: {question}\\nAnswer:'"
    # Few-shot examples: the first k of each subject's dev split, after the MMLU paper's instruction.
    fewshot_split = "dev"
    fewshot_sampler = "first_n"

    def __init__(self, subjects: tuple[str, ...]) -> None:
        self.dataset_name = subjects[0] if len(subjects) == 1 else subjects

    def description_for(self, raw: Mapping[str, Any], subset: str | None) -> str:
        """With few-shot examples only (zero-shot ids render as before): the MMLU paper's instruction."""
        if self.num_fewshot == 0 or not subset:
            return ""
        subject = subset.replace("_", " ")
        return f"The following are multiple choice questions (with answers) about {subject}.\n\n"

    def question(self, raw: Mapping[str, Any], index: int) -> str:
        return self.text(raw, index, "question").strip()

    def choices(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return self.texts(raw, index, "choices", nonempty=True)

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        return "Question: " + self.question(raw, index) + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        return self.choices(raw, index)

    def doc_to_gold(self, raw: Mapping[str, Any], index: int) -> int:
        return self.label(raw, index, "answer", len(self.choices(raw, index)))


class MMLUMC(MMLURC):
    """MMLU mc, OLMES mc: 'Question: {question.strip()}\\n A. {choice}\\n B. ...\\nAnswer:', continuations the
    letters 'A'..'D' (scored as ' A'..' D').

    OLMo's in-loop `mmlu_*_mc_5shot` lists the options without the 'Question: ' prefix and the leading space.
    """

    prompt_format = "mc"
    metrics = MC_METRICS
    format_source = "OLMES mmlu mc: 'Question: {question}\\n A. {choice}\\n ...\\nAnswer:' -> A..D"

    def doc_to_context(self, raw: Mapping[str, Any], index: int) -> str:
        letters = self.doc_to_continuations(raw, index)
        options = "".join(
            f"\n {letter}. {choice}" for letter, choice in zip(letters, self.choices(raw, index), strict=True)
        )
        return "Question: " + self.question(raw, index) + options + "\nAnswer:"

    def doc_to_continuations(self, raw: Mapping[str, Any], index: int) -> list[str]:
        n_choices = len(self.choices(raw, index))
        if n_choices > 26:
            raise self.error(
                index, f"field 'choices': expected at most 26 choices for letter keys, found {n_choices}"
            )
        return [chr(ord("A") + i) for i in range(n_choices)]


def _register(name: str, subjects: tuple[str, ...]) -> None:
    register(f"{name}_rc", lambda: MMLURC(subjects))
    register(f"{name}_mc", lambda: MMLUMC(subjects))


for _subject in SUBJECTS:
    _register(f"mmlu_{_subject}", (_subject,))
for _category in CATEGORIES:
    _register(f"mmlu_{_category}", category_subjects(_category))
_register("mmlu", SUBJECTS)
