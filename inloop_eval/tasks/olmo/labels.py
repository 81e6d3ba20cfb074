"""`olmo:<label>`: every label of OLMo's in-loop downstream evaluation (ai2-olmo-eval 0.9.0
`olmo_eval.tasks.LABEL_TO_TASK_MAP`, 252 labels), rendered and tokenized as OLMo does, so that the loglikelihood
of each request equals the one OLMo-core computes for it.

Three kinds: OLMo's own formats (`olmo:piqa`, `olmo:hellaswag`, ..., `tasks.olmo.formats`), its MMLU
(`olmo:mmlu_stem_val_mc_5shot`, ..., `tasks.olmo.mmlu`) and its oe-eval request files
(`olmo:arc_easy_val_rc_5shot`, ..., `tasks.olmo.oe_eval`). Each task records OLMo's metric type for its label
in `olmo_metric_type` (acc, len_norm, pmi_dc, ce_loss, bpb or f1). Documents come in OLMo's order, so
`limit: N` evaluates OLMo's first N documents.
"""

from __future__ import annotations

import difflib
from typing import NamedTuple

from inloop_eval.errors import UnknownTaskError
from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.olmo.base import check_metric_type
from inloop_eval.tasks.olmo.formats import OWN_FORMATS
from inloop_eval.tasks.olmo.mmlu import OLMO_CATEGORIES, OLMoMMLU
from inloop_eval.tasks.olmo.oe_eval import OLMoOEEvalTask
from inloop_eval.tasks.registry import register_resolver

PREFIX = "olmo"
# OLMo's `_fast` labels score the letter keys of a document from one forward pass.
FAST_SUFFIX = "_fast"


class MMLULabel(NamedTuple):
    """How OLMo builds one of its MMLU labels (the arguments of its `MMLU` class)."""

    category: str
    split: str
    prompt_variations: int | None
    mc_labels: bool
    metric_type: str


def _mmlu_labels() -> dict[str, MMLULabel]:
    """OLMo's 75 MMLU labels, 19 per category (18 for stem, which has no `_val_bpb_var`)."""
    labels: dict[str, MMLULabel] = {}
    for category in OLMO_CATEGORIES:
        name = f"mmlu_{category}"
        labels[f"{name}_test"] = MMLULabel(category, "test", None, False, "len_norm")
        labels[name] = MMLULabel(category, "validation", None, False, "len_norm")
        labels[f"{name}_bpb"] = MMLULabel(category, "validation", None, False, "bpb")
        labels[f"{name}_var"] = MMLULabel(category, "validation", 1, False, "len_norm")
        labels[f"{name}_mc_5shot"] = MMLULabel(category, "validation", 2, True, "len_norm")
        labels[f"{name}_mc_5shot_test"] = MMLULabel(category, "test", 2, True, "len_norm")
        labels[f"{name}_var_bpb"] = MMLULabel(category, "validation", 1, False, "bpb")
        for split, tag in (("validation", "val"), ("test", "test")):
            labels[f"{name}_{tag}_rc_var"] = MMLULabel(category, split, 1, False, "len_norm")
            labels[f"{name}_{tag}_rc_5shot"] = MMLULabel(category, split, 2, False, "len_norm")
            # OLMo builds its `_bpb_var` labels with the 5-shot prompt, not the variations.
            labels[f"{name}_{tag}_bpb_var"] = MMLULabel(category, split, 2, False, "bpb")
            labels[f"{name}_{tag}_bpb_5shot"] = MMLULabel(category, split, 2, False, "bpb")
            labels[f"{name}_{tag}_mc_5shot"] = MMLULabel(category, split, 2, True, "len_norm")
            labels[f"{name}_{tag}_mc_5shot_fast"] = MMLULabel(category, split, 2, True, "len_norm")
    del labels["mmlu_stem_val_bpb_var"]  # the one combination OLMo does not define
    return labels


MMLU_LABELS: dict[str, MMLULabel] = _mmlu_labels()

# OLMo's oe-eval-backed labels: label -> (task directory, variant directory, metric type). Several labels
# read one variant (`hellaswag_bpb_5shot` and `hellaswag_rc_5shot_bpb` both score rc_5shot's gold answers).
OE_EVAL_LABELS: dict[str, tuple[str, str, str]] = {
    "arc_challenge_mc_5shot": ("arc_challenge", "mc_5shot", "acc"),
    "arc_challenge_rc_0shot": ("arc_challenge", "rc_0shot", "len_norm"),
    "arc_challenge_rc_5shot": ("arc_challenge", "rc_5shot", "len_norm"),
    "arc_easy_mc_5shot": ("arc_easy", "mc_5shot", "acc"),
    "arc_easy_rc_0shot": ("arc_easy", "rc_0shot", "acc"),
    "arc_easy_rc_5shot": ("arc_easy", "rc_5shot", "acc"),
    "basic_skills_arithmetic_rc_5shot": ("basic_skills_arithmetic", "rc_5shot", "acc"),
    "basic_skills_coding_rc_5shot": ("basic_skills_coding", "rc_5shot", "acc"),
    "basic_skills_common_knowledge_rc_5shot": ("basic_skills_common_knowledge", "rc_5shot", "acc"),
    "basic_skills_logical_reasoning_rc_5shot": ("basic_skills_logical_reasoning", "rc_5shot", "acc"),
    "basic_skills_pattern_rc_5shot": ("basic_skills_pattern", "rc_5shot", "acc"),
    "basic_skills_string_operations_rc_5shot": ("basic_skills_string_operations", "rc_5shot", "acc"),
    "boolq_mc_5shot": ("boolq", "mc_5shot", "acc"),
    "boolq_rc_0shot": ("boolq", "rc_0shot", "acc"),
    "boolq_rc_5shot": ("boolq", "rc_5shot", "acc"),
    "copycolors_10way": ("copycolors", "10way", "acc"),
    "copycolors_xl_10way": ("copycolors", "xl_10way", "acc"),
    "copycolors_10way_fast": ("copycolors", "10way", "acc"),
    "copycolors_xl_10way_fast": ("copycolors", "xl_10way", "acc"),
    "csqa_mc_5shot": ("csqa", "mc_5shot", "acc"),
    "csqa_rc_0shot": ("csqa", "rc_0shot", "len_norm"),
    "csqa_rc_5shot": ("csqa", "rc_5shot", "len_norm"),
    "hellaswag_mc_5shot": ("hellaswag", "mc_5shot", "acc"),
    "hellaswag_rc_0shot": ("hellaswag", "rc_0shot", "len_norm"),
    "hellaswag_rc_5shot": ("hellaswag", "rc_5shot", "len_norm"),
    "hellaswag_bpb_5shot": ("hellaswag", "rc_5shot", "bpb"),
    "openbookqa_mc_5shot": ("openbookqa", "mc_5shot", "acc"),
    "openbookqa_rc_0shot": ("openbookqa", "rc_0shot", "len_norm"),
    "openbookqa_rc_5shot": ("openbookqa", "rc_5shot", "len_norm"),
    "piqa_mc_5shot": ("piqa", "mc_5shot", "acc"),
    "piqa_rc_0shot": ("piqa", "rc_0shot", "len_norm"),
    "piqa_rc_5shot": ("piqa", "rc_5shot", "len_norm"),
    "sciq_rc_0shot": ("sciq", "rc_0shot", "acc"),
    "socialiqa_mc_5shot": ("socialiqa", "mc_5shot", "acc"),
    "socialiqa_rc_0shot": ("socialiqa", "rc_0shot", "len_norm"),
    "socialiqa_rc_5shot": ("socialiqa", "rc_5shot", "len_norm"),
    "winogrande_mc_5shot": ("winogrande", "mc_5shot", "acc"),
    "winogrande_rc_0shot": ("winogrande", "rc_0shot", "acc"),
    "winogrande_rc_5shot": ("winogrande", "rc_5shot", "acc"),
    "arc_challenge_mc_5shot_bpb": ("arc_challenge", "mc_5shot", "bpb"),
    "arc_challenge_rc_0shot_bpb": ("arc_challenge", "rc_0shot", "bpb"),
    "arc_challenge_rc_5shot_bpb": ("arc_challenge", "rc_5shot", "bpb"),
    "arc_easy_mc_5shot_bpb": ("arc_easy", "mc_5shot", "bpb"),
    "arc_easy_rc_0shot_bpb": ("arc_easy", "rc_0shot", "bpb"),
    "arc_easy_rc_5shot_bpb": ("arc_easy", "rc_5shot", "bpb"),
    "boolq_mc_5shot_bpb": ("boolq", "mc_5shot", "bpb"),
    "boolq_rc_0shot_bpb": ("boolq", "rc_0shot", "bpb"),
    "boolq_rc_5shot_bpb": ("boolq", "rc_5shot", "bpb"),
    "copycolors_10way_bpb": ("copycolors", "10way", "bpb"),
    "copycolors_xl_10way_bpb": ("copycolors", "xl_10way", "bpb"),
    "csqa_mc_5shot_bpb": ("csqa", "mc_5shot", "bpb"),
    "csqa_rc_0shot_bpb": ("csqa", "rc_0shot", "bpb"),
    "csqa_rc_5shot_bpb": ("csqa", "rc_5shot", "bpb"),
    "hellaswag_mc_5shot_bpb": ("hellaswag", "mc_5shot", "bpb"),
    "hellaswag_rc_0shot_bpb": ("hellaswag", "rc_0shot", "bpb"),
    "hellaswag_rc_5shot_bpb": ("hellaswag", "rc_5shot", "bpb"),
    "openbookqa_mc_5shot_bpb": ("openbookqa", "mc_5shot", "bpb"),
    "openbookqa_rc_0shot_bpb": ("openbookqa", "rc_0shot", "bpb"),
    "openbookqa_rc_5shot_bpb": ("openbookqa", "rc_5shot", "bpb"),
    "piqa_mc_5shot_bpb": ("piqa", "mc_5shot", "bpb"),
    "piqa_rc_0shot_bpb": ("piqa", "rc_0shot", "bpb"),
    "piqa_rc_5shot_bpb": ("piqa", "rc_5shot", "bpb"),
    "sciq_rc_0shot_bpb": ("sciq", "rc_0shot", "bpb"),
    "socialiqa_mc_5shot_bpb": ("socialiqa", "mc_5shot", "bpb"),
    "socialiqa_rc_0shot_bpb": ("socialiqa", "rc_0shot", "bpb"),
    "socialiqa_rc_5shot_bpb": ("socialiqa", "rc_5shot", "bpb"),
    "winogrande_mc_5shot_bpb": ("winogrande", "mc_5shot", "bpb"),
    "winogrande_rc_0shot_bpb": ("winogrande", "rc_0shot", "bpb"),
    "winogrande_rc_5shot_bpb": ("winogrande", "rc_5shot", "bpb"),
    "arc_challenge_val_rc_5shot": ("arc_challenge", "val_rc_5shot", "len_norm"),
    "arc_challenge_val_bpb_5shot": ("arc_challenge", "val_rc_5shot", "bpb"),
    "arc_challenge_val_mc_5shot": ("arc_challenge", "val_mc_5shot", "acc"),
    "arc_challenge_test_rc_5shot": ("arc_challenge", "test_rc_5shot", "len_norm"),
    "arc_challenge_test_bpb_5shot": ("arc_challenge", "test_rc_5shot", "bpb"),
    "arc_challenge_test_mc_5shot": ("arc_challenge", "test_mc_5shot", "acc"),
    "arc_challenge_test_mc_5shot_fast": ("arc_challenge", "test_mc_5shot", "acc"),
    "arc_easy_val_rc_5shot": ("arc_easy", "val_rc_5shot", "len_norm"),
    "arc_easy_val_bpb_5shot": ("arc_easy", "val_rc_5shot", "bpb"),
    "arc_easy_val_mc_5shot": ("arc_easy", "val_mc_5shot", "acc"),
    "arc_easy_val_mc_5shot_fast": ("arc_easy", "val_mc_5shot", "acc"),
    "arc_easy_test_rc_5shot": ("arc_easy", "test_rc_5shot", "len_norm"),
    "arc_easy_test_bpb_5shot": ("arc_easy", "test_rc_5shot", "bpb"),
    "arc_easy_test_mc_5shot": ("arc_easy", "test_mc_5shot", "acc"),
    "arc_easy_test_mc_5shot_fast": ("arc_easy", "test_mc_5shot", "acc"),
    "boolq_val_rc_5shot": ("boolq", "val_rc_5shot", "acc"),
    "boolq_val_bpb_5shot": ("boolq", "val_rc_5shot", "bpb"),
    "boolq_val_mc_5shot": ("boolq", "val_mc_5shot", "acc"),
    "boolq_val_mc_5shot_fast": ("boolq", "val_mc_5shot", "acc"),
    "csqa_val_rc_5shot": ("csqa", "val_rc_5shot", "len_norm"),
    "csqa_val_bpb_5shot": ("csqa", "val_rc_5shot", "bpb"),
    "csqa_val_mc_5shot": ("csqa", "val_mc_5shot", "acc"),
    "csqa_val_mc_5shot_fast": ("csqa", "val_mc_5shot", "acc"),
    "hellaswag_val_rc_5shot": ("hellaswag", "val_rc_5shot", "len_norm"),
    "hellaswag_val_bpb_5shot": ("hellaswag", "val_rc_5shot", "bpb"),
    "hellaswag_val_mc_5shot": ("hellaswag", "val_mc_5shot", "acc"),
    "hellaswag_val_mc_5shot_fast": ("hellaswag", "val_mc_5shot", "acc"),
    "openbookqa_val_rc_5shot": ("openbookqa", "val_rc_5shot", "len_norm"),
    "openbookqa_val_bpb_5shot": ("openbookqa", "val_rc_5shot", "bpb"),
    "openbookqa_val_mc_5shot": ("openbookqa", "val_mc_5shot", "acc"),
    "openbookqa_val_mc_5shot_fast": ("openbookqa", "val_mc_5shot", "acc"),
    "openbookqa_test_rc_5shot": ("openbookqa", "test_rc_5shot", "len_norm"),
    "openbookqa_test_bpb_5shot": ("openbookqa", "test_rc_5shot", "bpb"),
    "openbookqa_test_mc_5shot": ("openbookqa", "test_mc_5shot", "acc"),
    "openbookqa_test_mc_5shot_fast": ("openbookqa", "test_mc_5shot", "acc"),
    "piqa_val_rc_5shot": ("piqa", "val_rc_5shot", "len_norm"),
    "piqa_val_bpb_5shot": ("piqa", "val_rc_5shot", "bpb"),
    "piqa_val_mc_5shot": ("piqa", "val_mc_5shot", "acc"),
    "piqa_val_mc_5shot_fast": ("piqa", "val_mc_5shot", "acc"),
    "socialiqa_val_rc_5shot": ("socialiqa", "val_rc_5shot", "len_norm"),
    "socialiqa_val_bpb_5shot": ("socialiqa", "val_rc_5shot", "bpb"),
    "socialiqa_val_mc_5shot": ("socialiqa", "val_mc_5shot", "acc"),
    "socialiqa_val_mc_5shot_fast": ("socialiqa", "val_mc_5shot", "acc"),
    "winogrande_val_rc_5shot": ("winogrande", "val_rc_5shot", "len_norm"),
    "winogrande_val_bpb_5shot": ("winogrande", "val_rc_5shot", "bpb"),
    "winogrande_val_mc_5shot": ("winogrande", "val_mc_5shot", "acc"),
    "winogrande_val_mc_5shot_fast": ("winogrande", "val_mc_5shot", "acc"),
    "gsm8k_gold_bpb_5shot": ("gsm8k", "gold_bpb_5shot", "bpb"),
    "codex_humaneval_gold_bpb_0shot": ("codex_humaneval", "gold_bpb_0shot", "bpb"),
    "codex_humaneval_gold_bpb_3shot": ("codex_humaneval", "gold_bpb_3shot", "bpb"),
    "codex_mbpp_gold_bpb_0shot": ("codex_mbpp", "gold_bpb_0shot", "bpb"),
    "codex_mbpp_gold_bpb_3shot": ("codex_mbpp", "gold_bpb_3shot", "bpb"),
    "minerva_math_algebra_gold_bpb_0shot": ("minerva_math_algebra", "gold_bpb_0shot", "bpb"),
    "minerva_math_counting_and_probability_gold_bpb_0shot": (
        "minerva_math_counting_and_probability",
        "gold_bpb_0shot",
        "bpb",
    ),
    "minerva_math_geometry_gold_bpb_0shot": ("minerva_math_geometry", "gold_bpb_0shot", "bpb"),
    "minerva_math_intermediate_algebra_gold_bpb_0shot": (
        "minerva_math_intermediate_algebra",
        "gold_bpb_0shot",
        "bpb",
    ),
    "minerva_math_number_theory_gold_bpb_0shot": ("minerva_math_number_theory", "gold_bpb_0shot", "bpb"),
    "minerva_math_prealgebra_gold_bpb_0shot": ("minerva_math_prealgebra", "gold_bpb_0shot", "bpb"),
    "minerva_math_precalculus_gold_bpb_0shot": ("minerva_math_precalculus", "gold_bpb_0shot", "bpb"),
    "minerva_math_500_gold_bpb_0shot": ("minerva_math_500", "gold_bpb_0shot", "bpb"),
    "mt_mbpp_haskell_gold_bpb_3shot": ("mt_mbpp_haskell", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_go_gold_bpb_3shot": ("mt_mbpp_go", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_python_gold_bpb_3shot": ("mt_mbpp_python", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_cpp_gold_bpb_3shot": ("mt_mbpp_cpp", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_javascript_gold_bpb_3shot": ("mt_mbpp_javascript", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_swift_gold_bpb_3shot": ("mt_mbpp_swift", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_scala_gold_bpb_3shot": ("mt_mbpp_scala", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_bash_gold_bpb_3shot": ("mt_mbpp_bash", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_typescript_gold_bpb_3shot": ("mt_mbpp_typescript", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_c_gold_bpb_3shot": ("mt_mbpp_c", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_php_gold_bpb_3shot": ("mt_mbpp_php", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_rust_gold_bpb_3shot": ("mt_mbpp_rust", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_csharp_gold_bpb_3shot": ("mt_mbpp_csharp", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_r_gold_bpb_3shot": ("mt_mbpp_r", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_ruby_gold_bpb_3shot": ("mt_mbpp_ruby", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_java_gold_bpb_3shot": ("mt_mbpp_java", "gold_bpb_3shot", "bpb"),
    "mt_mbpp_matlab_gold_bpb_3shot": ("mt_mbpp_matlab", "gold_bpb_3shot", "bpb"),
    "coqa_bpb_0shot": ("coqa", "bpb_0shot", "bpb"),
    "drop_bpb_5shot": ("drop", "bpb_5shot", "bpb"),
    "jeopardy_bpb_5shot": ("jeopardy", "bpb_5shot", "bpb"),
    "naturalqs_bpb_5shot": ("naturalqs_open", "bpb_5shot", "bpb"),
    "squad_bpb_5shot": ("squad", "bpb_5shot", "bpb"),
    "lab_bench_dbqa_rc_3shot": ("lab_bench_dbqa", "rc_3shot", "acc"),
    "lab_bench_protocolqa_rc_3shot": ("lab_bench_protocolqa", "rc_3shot", "acc"),
    "medmcqa_rc_5shot": ("medmcqa", "rc_5shot", "acc"),
    "medqa_en_rc_5shot": ("medqa_en", "rc_5shot", "acc"),
    "qasper_yesno_rc_5shot": ("qasper_yesno", "rc_5shot", "acc"),
    "sciriff_yesno_rc_5shot": ("sciriff_yesno", "rc_5shot", "acc"),
    "lambada_bpb_0shot": ("lambada", "bpb_0shot", "bpb"),
}


def _make(label: str) -> MultipleChoiceTask:
    """A fresh task for one of OLMo's labels."""
    fast = label.endswith(FAST_SUFFIX)
    if label in OWN_FORMATS:
        return OWN_FORMATS[label]()
    if label in MMLU_LABELS:
        spec = MMLU_LABELS[label]
        return OLMoMMLU(
            spec.category,
            split=spec.split,
            prompt_variations=spec.prompt_variations,
            mc_labels=spec.mc_labels,
            metric_type=check_metric_type(label, spec.metric_type),
            fast_mc=fast,
        )
    if label in OE_EVAL_LABELS:
        task_dir, variant, metric_type = OE_EVAL_LABELS[label]
        return OLMoOEEvalTask(task_dir, variant, check_metric_type(label, metric_type), fast_mc=fast)
    close = difflib.get_close_matches(label, olmo_labels(), n=5)
    hint = f"; did you mean {', '.join(f'{PREFIX}:{c}' for c in close)}?" if close else ""
    raise UnknownTaskError(
        f"unknown task '{PREFIX}:{label}': expected one of OLMo's {len(olmo_labels())} in-loop labels "
        f"(ai2-olmo-eval 0.9.0){hint}; `inloop-eval tasks` lists them"
    )


def olmo_labels() -> list[str]:
    """OLMo's in-loop labels, sorted (each is the task id `olmo:<label>`)."""
    return sorted([*OWN_FORMATS, *MMLU_LABELS, *OE_EVAL_LABELS])


def olmo_task_ids() -> list[str]:
    """The task ids of OLMo's labels, `olmo:<label>`, sorted."""
    return [f"{PREFIX}:{label}" for label in olmo_labels()]


register_resolver(PREFIX, _make)
