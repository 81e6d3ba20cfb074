"""The built-in task families: every id loads, the rendered prompts match the published formats, bad rows
raise TaskDataError naming the task, document and field.

Expected strings are written out by hand from each format (see the task docstrings), so a change to a
prompt shows up here.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inloop_eval.errors import TaskDataError
from inloop_eval.metrics.formats import MC_METRICS, PARTIAL_METRICS, RC_METRICS
from inloop_eval.tasks import get_task, load_docs, task_names
from inloop_eval.tasks.base import Doc
from inloop_eval.tasks.native.mmlu import CATEGORIES, SUBJECT_CATEGORY, SUBJECTS, category_subjects
from inloop_eval.tasks.native.piqa import PIQA

FAMILY_IDS = (
    "piqa",
    "hellaswag",
    "winogrande",
    "arc_easy",
    "arc_challenge",
    "boolq",
    "sciq",
    "openbookqa",
    "commonsense_qa",
    "social_iqa",
    "copa",
)
# Other task kinds: classification (acc, f1), gold-only answers (ce/bpb), LAMBADA (greedy exact match).
KIND_IDS = (
    "rte",
    "commitment_bank",
    "mrpc",
    "sst2",
    "arc_easy_bpb",
    "trivia_qa_bpb",
    "nq_open_bpb",
    "lambada",
)
# Families with listed options: each also as `<family>_rc` (the plain id) and `<family>_mc` (letter keys).
TWIN_FAMILIES = (
    "arc_easy",
    "arc_challenge",
    "openbookqa",
    "commonsense_qa",
    "sciq",
    "social_iqa",
    "piqa",
    "hellaswag",
)


@functools.cache
def _all_docs(name: str, root: str) -> tuple[Doc, ...]:
    return tuple(load_docs(get_task(name), root))


@pytest.fixture
def all_docs(data_root: Path):
    """Every document of a task's full split, loaded once per session."""
    return lambda name: _all_docs(name, str(data_root))


# ---------------------------------------------------------------- registry


def test_every_listed_task_id_is_registered_once():
    names = task_names()
    mmlu_ids = 2 * (len(SUBJECTS) + len(CATEGORIES) + 1)
    twin_ids = {f"{family}_{fmt}" for family in TWIN_FAMILIES for fmt in ("rc", "mc")}
    assert set(FAMILY_IDS) | twin_ids | set(KIND_IDS) <= set(names)
    # At least the ids listed here, each once: a lost task fails, a new one does not.
    assert len(set(names)) == len(names)
    assert len(names) >= len(FAMILY_IDS) + len(twin_ids) + len(KIND_IDS) + mmlu_ids
    for name in FAMILY_IDS:
        assert name in names
    for fmt in ("rc", "mc"):
        assert f"mmlu_{fmt}" in names
        for category in CATEGORIES:
            assert f"mmlu_{category}_{fmt}" in names
        for subject in SUBJECTS:
            assert f"mmlu_{subject}_{fmt}" in names


@pytest.mark.parametrize("name", task_names())
def test_every_task_loads(name: str, data_root: Path):
    task = get_task(name)
    assert task.name == name
    assert task.format_source
    assert task.split == ("test" if name == "lambada" else "validation")
    docs = load_docs(task, data_root, limit=3)
    assert [d.index for d in docs] == [0, 1, 2]
    for doc in docs:
        assert doc.n_choices >= (1 if task.prompt_format == "gold" else 2)
        assert len(doc.contexts) == doc.n_choices
        assert all(0 <= g < doc.n_choices for g in doc.gold)
        assert all(c.strip() for c in doc.contexts)


def test_formats_and_metrics():
    for name in ("piqa", "hellaswag", "arc_easy", "boolq", "copa", "mmlu_rc", "mmlu_anatomy_rc"):
        task = get_task(name)
        assert (task.prompt_format, task.metrics) == ("rc", RC_METRICS)
    for name in ("mmlu_mc", "mmlu_stem_mc", "mmlu_anatomy_mc"):
        task = get_task(name)
        assert (task.prompt_format, task.metrics) == ("mc", MC_METRICS)
        assert task.length_norm_is_noop
    task = get_task("winogrande")
    assert (task.prompt_format, task.metrics) == ("partial", PARTIAL_METRICS)


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("hellaswag", 10042),
        ("piqa", 1838),
        ("winogrande", 1267),
        ("arc_easy", 570),
        ("arc_challenge", 299),
        ("boolq", 3270),
        ("sciq", 1000),
        ("openbookqa", 500),
        ("commonsense_qa", 1221),
        ("social_iqa", 1954),
        ("copa", 100),
        ("mmlu_rc", 1531),
        ("mmlu_mc", 1531),
    ],
)
def test_full_split_counts(name: str, count: int, all_docs):
    docs = all_docs(name)
    assert len(docs) == count
    assert [d.index for d in docs] == list(range(count))


# ---------------------------------------------------------------- the first document of each family

BOOLQ_PASSAGE = (
    "All biomass goes through at least some of these steps: it needs to be grown, collected, dried, "
    "fermented, distilled, and burned. All of these steps require resources and an infrastructure. The total "
    "amount of energy input into the process compared to the energy released by burning the resulting ethanol "
    "fuel is known as the energy balance (or ``energy returned on energy invested''). Figures compiled in a "
    "2007 report by National Geographic Magazine point to modest results for corn ethanol produced in the US: "
    "one unit of fossil-fuel energy is required to create 1.3 energy units from the resulting ethanol. The "
    "energy balance for sugarcane ethanol produced in Brazil is more favorable, with one unit of fossil-fuel "
    "energy required to create 8 from the ethanol. Energy balance estimates are not easily produced, thus "
    "numerous such reports have been generated that are contradictory. For instance, a separate survey "
    "reports that production of ethanol from sugarcane, which requires a tropical climate to grow "
    "productively, returns from 8 to 9 units of energy for each unit expended, as compared to corn, which "
    "only returns about 1.34 units of fuel energy for each unit of energy expended. A 2006 University of "
    "California Berkeley study, after analyzing six separate studies, concluded that producing ethanol from "
    "corn uses much less petroleum than producing gasoline."
)
ANATOMY_QUESTION = "Which of the following terms describes the body's ability to maintain its normal state?"
FORMAL_LOGIC_QUESTION = (
    "Identify the antecedent of the following conditional proposition: If the Bees win their first game, "
    "then neither the Aardvarks nor the Chipmunks win their first games."
)

# name -> (context, or one context per choice; continuations; gold)
FIRST_DOCS: dict[str, tuple[str | list[str], list[str], tuple[int, ...]]] = {
    "piqa": (
        "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:",
        [
            "Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper strips, "
            "you will also need to supply it with a water bottle and a food dish.",
            "Provide the guinea pig with a cage full of a few inches of bedding made of ripped jeans material, "
            "you will also need to supply it with a water bottle and a food dish.",
        ],
        (0,),
    ),
    "hellaswag": (
        "Roof shingle removal: A man is sitting on a roof. He",
        [
            "is using wrap to wrap a pair of skis.",
            "is ripping level tiles off.",
            "is holding a rubik's cube.",
            "starts pulling up roofing on a roof.",
        ],
        (3,),
    ),
    "winogrande": (
        [
            "Sarah was a much better surgeon than Maria so Sarah",
            "Sarah was a much better surgeon than Maria so Maria",
        ],
        ["always got the easier cases.", "always got the easier cases."],
        (1,),
    ),
    "arc_easy": (
        "Question: Which technology was developed most recently?\nAnswer:",
        ["cellular telephone", "television", "refrigerator", "airplane"],
        (0,),
    ),
    "arc_challenge": (
        "Question: Juan and LaKeisha roll a few objects down a ramp. They want to see which object rolls the "
        "farthest. What should they do so they can repeat their investigation?\nAnswer:",
        [
            "Put the objects in groups.",
            "Change the height of the ramp.",
            "Choose different objects to roll.",
            "Record the details of the investigation.",
        ],
        (3,),
    ),
    "boolq": (
        BOOLQ_PASSAGE + "\nQuestion: does ethanol take more energy make that produces?\nAnswer:",
        ["no", "yes"],
        (0,),
    ),
    "sciq": (
        "\nQuestion: Who proposed the theory of evolution by natural selection?\nAnswer:",
        ["Linnaeus", "shaw", "Scopes", "darwin"],
        (3,),
    ),
    "openbookqa": (
        "Question: Frilled sharks and angler fish live far beneath the surface of the ocean, which is why they "
        "are known as\nAnswer:",
        ["Deep sea animals", "fish", "Long Sea Fish", "Far Sea Animals"],
        (0,),
    ),
    "commonsense_qa": (
        "Question: A revolving door is convenient for two direction travel, but it also serves as a security "
        "measure at a what?\nAnswer:",
        ["bank", "library", "department store", "mall", "new york"],
        (0,),
    ),
    "social_iqa": (
        "Question: Tracy didn't go home that evening and resisted Riley's attacks. What does Tracy need to do "
        "before this?\nAnswer:",
        ["make a new plan", "Go home and see Riley", "Find somewhere to go"],
        (2,),
    ),
    "copa": (
        "The man turned on the faucet therefore",
        ["the toilet filled with water.", "water flowed from the spout."],
        (1,),
    ),
    "mmlu_anatomy_rc": (
        f"Question: {ANATOMY_QUESTION}\nAnswer:",
        ["Anabolism", "Catabolism", "Tolerance", "Homeostasis"],
        (3,),
    ),
    "mmlu_anatomy_mc": (
        f"Question: {ANATOMY_QUESTION}\n A. Anabolism\n B. Catabolism\n C. Tolerance\n D. Homeostasis\nAnswer:",
        ["A", "B", "C", "D"],
        (3,),
    ),
    # Groups start with their alphabetically first subject.
    "mmlu_rc": (
        "Question: The cyclic subgroup of Z_24 generated by 18 has order\nAnswer:",
        ["4", "8", "12", "6"],
        (0,),
    ),
    "mmlu_humanities_mc": (
        f"Question: {FORMAL_LOGIC_QUESTION}\n"
        " A. The Aardvarks do not win their first game.\n"
        " B. The Bees win their first game.\n"
        " C. The Chipmunks do not win their first game.\n"
        " D. Neither the Aardvarks nor the Chipmunks win their first games.\n"
        "Answer:",
        ["A", "B", "C", "D"],
        (1,),
    ),
}


@pytest.mark.parametrize("name", sorted(FIRST_DOCS))
def test_first_document_format(name: str, data_root: Path):
    context, continuations, gold = FIRST_DOCS[name]
    contexts = context if isinstance(context, list) else [context] * len(continuations)
    (doc,) = load_docs(get_task(name), data_root, limit=1)
    assert doc == Doc(0, tuple(contexts), tuple(continuations), gold)


def test_every_family_has_a_pinned_first_document():
    assert set(FAMILY_IDS) <= set(FIRST_DOCS)


# ---------------------------------------------------------------- family specifics


def test_hellaswag_preprocessing():
    task = get_task("hellaswag")
    raw = {
        "activity_label": "Home and Garden",
        "ctx_a": "[header] How to clean a grill. [title] Heat the grill.",
        "ctx_b": "",
        "endings": ["[step] Scrub the grates.  Rinse.", "Burn it [substeps] all.", "c", "d"],
        "label": "0",
    }
    doc = task.make_doc(raw, 0)
    # ' [title]' -> '. ', brackets removed, double spaces collapsed, as the harness does (double '.' kept).
    assert doc.contexts[0] == "Home and Garden: How to clean a grill.. Heat the grill."
    assert doc.continuations == (" Scrub the grates. Rinse.", "Burn it all.", "c", "d")
    assert doc.gold == (0,)


def test_arc_has_three_and_five_choice_documents(all_docs):
    for name in ("arc_easy", "arc_challenge"):
        counts = {d.n_choices for d in all_docs(name)}
        assert {3, 4, 5} == counts


def test_arc_numeric_answer_keys(data_root: Path):
    from inloop_eval.data.root import load_split

    task = get_task("arc_easy")
    rows = load_split(task.dataset_path, task.dataset_name, task.split, data_root=data_root)
    numeric = [(i, row) for i, row in enumerate(rows) if row["answerKey"].isdigit()]
    assert numeric, "ARC-Easy validation has questions labelled '1'..'4'"
    for i, row in numeric:
        assert task.make_doc(row, i).gold == (row["choices"]["label"].index(row["answerKey"]),)


def test_winogrande_contexts_differ_and_share_one_continuation(all_docs):
    for doc in all_docs("winogrande"):
        assert doc.n_choices == 2
        assert doc.contexts[0] != doc.contexts[1]
        assert doc.continuations[0] == doc.continuations[1]
        assert doc.continuations[0] == doc.continuations[0].strip()


def test_mmlu_subjects_match_the_data(data_root: Path):
    on_disk = sorted(p.name for p in (data_root / "hails" / "mmlu_no_train").iterdir() if p.is_dir())
    assert len(SUBJECTS) == 57
    assert list(SUBJECTS) == on_disk


def test_mmlu_categories_partition_the_subjects():
    groups = {c: category_subjects(c) for c in CATEGORIES}
    assert {c: len(s) for c, s in groups.items()} == {
        "stem": 19,
        "humanities": 13,
        "social_sciences": 12,
        "other": 13,
    }
    assert sorted(s for subjects in groups.values() for s in subjects) == list(SUBJECTS)
    assert all(list(subjects) == sorted(subjects) for subjects in groups.values())
    # lm-evaluation-harness's map (the MMLU paper's categories.py files anatomy under "other").
    assert SUBJECT_CATEGORY["anatomy"] == "stem"
    assert SUBJECT_CATEGORY["professional_law"] == "humanities"
    assert SUBJECT_CATEGORY["econometrics"] == "social_sciences"
    assert SUBJECT_CATEGORY["virology"] == "other"


@pytest.mark.parametrize("fmt", ["rc", "mc"])
@pytest.mark.parametrize("category", CATEGORIES)
def test_mmlu_group_is_its_subjects_concatenated(category: str, fmt: str, all_docs):
    task = get_task(f"mmlu_{category}_{fmt}")
    assert task.dataset_name == category_subjects(category)
    group = all_docs(f"mmlu_{category}_{fmt}")
    parts = [doc for s in category_subjects(category) for doc in all_docs(f"mmlu_{s}_{fmt}")]
    assert len(group) == len(parts)
    assert [(d.contexts, d.continuations, d.gold) for d in group] == [
        (d.contexts, d.continuations, d.gold) for d in parts
    ]


def test_mmlu_all_is_every_subject(all_docs):
    assert get_task("mmlu_rc").dataset_name == SUBJECTS
    assert len(all_docs("mmlu_rc")) == sum(len(all_docs(f"mmlu_{c}_rc")) for c in CATEGORIES)


# ---------------------------------------------------------------- bad rows

ARC_ROW = {
    "question": "Which is a metal?",
    "choices": {"text": ["iron", "wood", "glass", "cloth"], "label": ["A", "B", "C", "D"]},
    "answerKey": "A",
}
VALID_ROWS: dict[str, dict[str, Any]] = {
    "piqa": {"goal": "Open a jar.", "sol1": "Twist the lid.", "sol2": "Paint the lid.", "label": 0},
    "hellaswag": {
        "activity_label": "Cooking",
        "ctx_a": "A man stands at a stove.",
        "ctx_b": "he",
        "endings": ["stirs a pot.", "flies away.", "sings.", "sleeps."],
        "label": "0",
    },
    "winogrande": {
        "sentence": "The cup fell off the shelf because _ was tilted.",
        "option1": "cup",
        "option2": "shelf",
        "answer": "2",
    },
    "arc_easy": ARC_ROW,
    "commonsense_qa": ARC_ROW,
    "openbookqa": {**{k: v for k, v in ARC_ROW.items() if k != "question"}, "question_stem": "A metal is"},
    "boolq": {"passage": "Iron is a metal.", "question": "is iron a metal", "answer": True},
    "sciq": {
        "support": "Iron is a metal.",
        "question": "Which is a metal?",
        "distractor1": "wood",
        "distractor2": "glass",
        "distractor3": "cloth",
        "correct_answer": "iron",
    },
    "social_iqa": {
        "context": "Kai lent Sam a pen.",
        "question": "How would Sam feel?",
        "answerA": "grateful",
        "answerB": "angry",
        "answerC": "sleepy",
        "label": "1",
    },
    "copa": {
        "premise": "The glass broke.",
        "choice1": "It fell on the floor.",
        "choice2": "It was full.",
        "question": "cause",
        "label": 0,
    },
    "mmlu_anatomy_rc": {
        "question": "Which is a bone?",
        "choices": ["femur", "heart", "lung", "skin"],
        "answer": 0,
    },
    "mmlu_anatomy_mc": {
        "question": "Which is a bone?",
        "choices": ["femur", "heart", "lung", "skin"],
        "answer": 0,
    },
}
DOC_INDEX = 17


def _raises(name: str, raw: dict[str, Any], *fragments: str) -> str:
    with pytest.raises(TaskDataError) as info:
        get_task(name).make_doc(raw, DOC_INDEX)
    message = str(info.value)
    for fragment in (repr(name), f"doc {DOC_INDEX}", *fragments):
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def test_valid_rows_make_documents():
    assert set(VALID_ROWS) >= set(FAMILY_IDS) - {"arc_challenge"}
    for name, raw in VALID_ROWS.items():
        doc = get_task(name).make_doc(copy.deepcopy(raw), DOC_INDEX)
        assert doc.index == DOC_INDEX


@pytest.mark.parametrize(
    ("name", "field"), [(name, field) for name, raw in VALID_ROWS.items() for field in raw]
)
def test_missing_field(name: str, field: str):
    raw = copy.deepcopy(VALID_ROWS[name])
    del raw[field]
    _raises(name, raw, f"missing field {field!r}")


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("piqa", "label", 7),
        ("piqa", "label", -1),
        ("piqa", "label", "x"),
        ("piqa", "label", None),
        ("piqa", "label", True),
        ("hellaswag", "label", "7"),
        ("hellaswag", "label", "4"),
        ("hellaswag", "label", "three"),
        ("hellaswag", "label", ""),
        ("winogrande", "answer", "3"),
        ("winogrande", "answer", "0"),
        ("social_iqa", "label", "4"),
        ("social_iqa", "label", "A"),
        ("copa", "label", 2),
        ("mmlu_anatomy_rc", "answer", 4),
        ("mmlu_anatomy_mc", "answer", "D"),
        ("boolq", "answer", "yes"),
        ("copa", "question", "reason"),
    ],
)
def test_bad_label(name: str, field: str, value: Any):
    raw = copy.deepcopy(VALID_ROWS[name])
    raw[field] = value
    message = _raises(name, raw, f"field {field!r}", repr(value), "expected")
    assert "found" in message


@pytest.mark.parametrize(
    ("name", "field", "mutate"),
    [
        ("piqa", "sol2", lambda r: r.update(sol2="")),
        ("hellaswag", "endings", lambda r: r["endings"].__setitem__(1, " ")),
        ("winogrande", "option1", lambda r: r.update(option1="")),
        ("arc_easy", "choices.text", lambda r: r["choices"]["text"].__setitem__(2, "")),
        ("sciq", "correct_answer", lambda r: r.update(correct_answer="")),
        ("social_iqa", "answerB", lambda r: r.update(answerB="")),
        ("copa", "choice1", lambda r: r.update(choice1="")),
        ("mmlu_anatomy_rc", "choices", lambda r: r["choices"].__setitem__(3, "")),
        ("mmlu_anatomy_mc", "choices", lambda r: r["choices"].__setitem__(0, "  ")),
    ],
)
def test_empty_choice(name: str, field: str, mutate):
    raw = copy.deepcopy(VALID_ROWS[name])
    mutate(raw)
    _raises(name, raw, f"field {field!r}", "empty")


@pytest.mark.parametrize("name", ["arc_easy", "openbookqa", "commonsense_qa"])
def test_answer_key_not_among_choice_labels(name: str):
    raw = copy.deepcopy(VALID_ROWS[name])
    raw["answerKey"] = "F"
    _raises(name, raw, "field 'answerKey'", "'F'", "['A', 'B', 'C', 'D']")


def test_gold_string_not_among_choices():
    class PIQAByText(PIQA):
        def doc_to_gold(self, raw, index):
            return "Boil the jar."

    task = PIQAByText()
    task.name = "piqa_by_text"
    with pytest.raises(TaskDataError) as info:
        task.make_doc(VALID_ROWS["piqa"], DOC_INDEX)
    message = str(info.value)
    assert "'piqa_by_text'" in message and f"doc {DOC_INDEX}" in message and "'gold'" in message
    assert "'Boil the jar.'" in message


@pytest.mark.parametrize(
    ("name", "field", "mutate"),
    [
        ("piqa", "goal", lambda r: r.update(goal=None)),
        ("hellaswag", "endings", lambda r: r.update(endings="a b c d")),
        ("winogrande", "sentence", lambda r: r.update(sentence="No blank here.")),
        ("winogrande", "sentence", lambda r: r.update(sentence="Two _ blanks _ here.")),
        ("winogrande", "sentence", lambda r: r.update(sentence="The blank ends it _")),
        ("arc_easy", "choices", lambda r: r.update(choices=["iron", "wood"])),
        ("arc_easy", "choices", lambda r: r["choices"]["label"].pop()),
        ("arc_easy", "choices.label", lambda r: r["choices"].update(label=["A", "A", "B", "C"])),
        ("mmlu_anatomy_mc", "choices", lambda r: r.update(choices="femur")),
    ],
)
def test_malformed_field(name: str, field: str, mutate):
    raw = copy.deepcopy(VALID_ROWS[name])
    mutate(raw)
    _raises(name, raw, f"field {field!r}", "expected")


@pytest.mark.parametrize(
    ("name", "mutate"),
    [
        ("mmlu_anatomy_rc", lambda r: r.update(choices=[])),
        ("arc_easy", lambda r: r.update(choices={"text": [], "label": []})),
        ("hellaswag", lambda r: r.update(endings=[])),
    ],
)
def test_no_choices(name: str, mutate):
    raw = copy.deepcopy(VALID_ROWS[name])
    mutate(raw)
    _raises(name, raw, "choice")


# ---------------------------------------------------------------- letter-key twins


@pytest.mark.parametrize("family", TWIN_FAMILIES)
def test_letter_key_twin_lists_the_rc_choices(family: str, data_root: Path):
    rc, mc = get_task(f"{family}_rc"), get_task(f"{family}_mc")
    assert (rc.prompt_format, rc.metrics, mc.prompt_format, mc.metrics) == (
        "rc",
        RC_METRICS,
        "mc",
        MC_METRICS,
    )
    assert load_docs(rc, data_root, limit=30) == load_docs(get_task(family), data_root, limit=30)
    for r, m in zip(load_docs(rc, data_root, limit=30), load_docs(mc, data_root, limit=30), strict=True):
        letters = tuple("ABCDE"[: r.n_choices])
        assert m.continuations == letters and m.n_choices == r.n_choices
        listed = m.contexts[0].split("\n A. ", 1)[1].removesuffix("\nAnswer:")
        options = [line.split(". ", 1)[1] for line in ("A. " + listed).split("\n ")]
        assert sorted(options) == sorted(r.continuations)
        assert options[m.gold[0]] == r.continuations[r.gold[0]]
        if family != "sciq":
            assert options == list(r.continuations) and m.gold == r.gold
        stem = m.contexts[0].split("\n A. ", 1)[0]
        if family == "hellaswag":
            assert stem == r.contexts[0] + "\nChoose the best continuation:"
        else:
            assert stem + "\nAnswer:" == r.contexts[0]


def test_sciq_mc_gold_is_not_always_the_last_letter(all_docs):
    golds = [d.gold[0] for d in all_docs("sciq_mc")]
    assert {d.gold[0] for d in all_docs("sciq")} == {3}
    counts = np.bincount(golds, minlength=4)
    assert counts.min() > 200, counts


def test_letter_key_twin_first_document():
    raw = copy.deepcopy(ARC_ROW)
    raw["choices"]["label"] = ["1", "2", "3", "4"]
    raw["answerKey"] = "2"
    doc = get_task("arc_easy_mc").make_doc(raw, DOC_INDEX)
    assert doc.contexts[0] == "Question: Which is a metal?\n A. iron\n B. wood\n C. glass\n D. cloth\nAnswer:"
    assert (doc.continuations, doc.gold) == (("A", "B", "C", "D"), (1,))
