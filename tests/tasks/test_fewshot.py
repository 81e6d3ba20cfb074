"""Few-shot prompts: built per document, so identical whatever else is loaded, the world size and the run;
`first_n` is the split's first k documents; a document is never its own example."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inloop_eval.data.root import load_split
from inloop_eval.engine.sharding import ICLMultiChoiceTaskDataset, rank_rows, shard_documents
from inloop_eval.errors import TaskDataError, UnknownTaskError
from inloop_eval.requests.table import build_requests
from inloop_eval.tasks import Doc, get_task, load_docs
from inloop_eval.tasks.base import MultipleChoiceTask
from inloop_eval.tasks.fewshot import ExamplePool, add_fewshot, example_indices, render_example
from inloop_eval.tasks.native.mmlu import category_subjects


def split_rows(
    task: MultipleChoiceTask, data_root: Path, split: str | None = None, subset: str | None = None
):
    return load_split(
        task.dataset_path, subset or task.dataset_name, split or task.split, data_root=data_root
    )


def test_shot_suffix_sets_num_fewshot():
    assert get_task("arc_easy").num_fewshot == 0
    task = get_task("arc_easy_rc_5shot")
    assert (task.name, task.num_fewshot, task.prompt_format) == ("arc_easy_rc_5shot", 5, "rc")
    assert get_task("mmlu_stem_mc_5shot").num_fewshot == 5
    assert get_task("hellaswag_mc_0shot").num_fewshot == 0
    with pytest.raises(UnknownTaskError, match="arc_easy_rc_5shots"):
        get_task("arc_easy_rc_5shots")
    with pytest.raises(UnknownTaskError, match="nope_5shot"):
        get_task("nope_5shot")


def test_zero_shot_ids_render_as_the_plain_ids(data_root):
    for plain, zero in [("arc_easy", "arc_easy_rc_0shot"), ("mmlu_anatomy_mc", "mmlu_anatomy_mc_0shot")]:
        assert load_docs(get_task(plain), data_root, limit=5) == load_docs(get_task(zero), data_root, limit=5)


def test_first_n_is_the_dev_splits_first_k_documents(data_root):
    """mmlu_*_5shot: the MMLU instruction, then dev documents 0..4 solved, then the question."""
    k = 5
    zero = get_task("mmlu_anatomy_mc")
    dev = [zero.make_doc(row, j) for j, row in enumerate(split_rows(zero, data_root, "dev"))]
    assert len(dev) == k
    examples = "".join(f"{d.contexts[0]} {d.continuations[d.gold[0]]}\n\n" for d in dev[:k])
    assert examples.startswith("Question: What is the embryological origin of the hyoid bone?\n A. ")
    shot = load_docs(get_task("mmlu_anatomy_mc_5shot"), data_root, limit=20)
    plain = load_docs(zero, data_root, limit=20)
    head = "The following are multiple choice questions (with answers) about anatomy.\n\n"
    for s, p in zip(shot, plain, strict=True):
        assert s.contexts == tuple(head + examples + c for c in p.contexts)
        assert (s.continuations, s.gold) == (p.continuations, p.gold)
    # Fewer shots: the first k.
    three = load_docs(get_task("mmlu_anatomy_mc_3shot"), data_root, limit=1)[0]
    first3 = "".join(render_example(zero, d) + "\n\n" for d in dev[:3])
    assert three.contexts[0] == head + first3 + plain[0].contexts[0]


def test_group_takes_each_subjects_own_dev_examples(data_root):
    group = load_docs(get_task("mmlu_stem_mc_2shot"), data_root)
    parts = [
        d for s in category_subjects("stem") for d in load_docs(get_task(f"mmlu_{s}_mc_2shot"), data_root)
    ]
    assert [(d.contexts, d.continuations, d.gold) for d in group] == [
        (d.contexts, d.continuations, d.gold) for d in parts
    ]


def test_random_examples_are_pinned(data_root):
    """The generator is seeded by (seed, subset, document index): these indices must not move."""
    task = get_task("arc_easy_rc_5shot")
    rows = split_rows(task, data_root)
    pool = ExamplePool(task, rows, task.dataset_name, task.split)
    zero = get_task("arc_easy")
    assert example_indices(task, pool, zero.make_doc(rows[0], 0), 0, True) == [280, 279, 414, 237, 392]
    assert example_indices(task, pool, zero.make_doc(rows[7], 7), 7, True) == [422, 551, 368, 338, 562]
    doc0 = load_docs(task, data_root, limit=1)[0]
    examples = [render_example(zero, zero.make_doc(rows[j], j)) for j in (280, 279, 414, 237, 392)]
    assert doc0.contexts[0] == "\n\n".join(examples) + "\n\n" + zero.make_doc(rows[0], 0).contexts[0]


@pytest.mark.parametrize("name", ["arc_easy_rc_5shot", "winogrande_3shot", "copa_5shot"])
def test_no_document_is_its_own_example(name, data_root):
    task = get_task(name)
    zero = get_task(name.rsplit("_", 1)[0].removesuffix("_rc"))
    rows = split_rows(task, data_root)
    plain = load_docs(zero, data_root)
    pool = ExamplePool(task, rows, task.dataset_name, task.split)
    shot = load_docs(task, data_root)
    for p, s in zip(plain, shot, strict=True):
        chosen = example_indices(task, pool, p, p.index, True)
        assert p.index not in chosen and len(set(chosen)) == len(chosen) == task.num_fewshot
        prefix = s.contexts[0][: -len(p.contexts[0])]
        assert render_example(zero, p) + "\n\n" not in prefix


class _Toy(MultipleChoiceTask):
    """Rows {"q", "a"}: 'Q: {q}\\nA:' -> the answer among 'yes'/'no'."""

    name = "toy"

    def doc_to_context(self, raw, index):
        return f"Q: {raw['q']}\nA:"

    def doc_to_continuations(self, raw, index):
        return ["yes", "no"]

    def doc_to_gold(self, raw, index):
        return 0 if raw["a"] == "yes" else 1


def _toy_rows(n: int) -> list[dict]:
    return [{"q": f"question {i}", "a": "yes" if i % 3 else "no"} for i in range(n)]


def test_duplicate_of_the_document_is_never_its_example():
    """A pool row that renders like the document (a duplicate in the data) is skipped too."""
    task = _Toy()
    task.num_fewshot = 3
    rows = _toy_rows(6)
    rows[4] = dict(rows[1])  # row 4 duplicates row 1
    for sampler in ("first_n", "random"):
        task.fewshot_sampler = sampler
        docs = [task.make_doc(r, i) for i, r in enumerate(rows)]
        out = add_fewshot(task, docs, rows, range(6), rows, None, same_split=True)
        for doc in (out[1], out[4]):
            assert "question 1\nA:" in doc.contexts[0]  # its own prompt, once
            assert doc.contexts[0].count("question 1") == 1, (sampler, doc.contexts[0])
        if sampler == "first_n":  # rows 0, 2, 3: row 1 is the document, row 4 its duplicate
            assert (
                out[1].contexts[0]
                == "".join(f"Q: question {i}\nA: {rows[i]['a']}\n\n" for i in (0, 2, 3)) + "Q: question 1\nA:"
            )


def test_a_document_duplicated_in_a_small_fewshot_split_gets_the_others():
    """A separate few-shot split of exactly k rows, one of them the document itself: k-1 examples, the
    others in order (as lm-evaluation-harness does), recorded in `shots`; the other documents get k."""
    task = _Toy()
    task.num_fewshot = 3
    pool = _toy_rows(3)
    rows = [{"q": "question 7", "a": "no"}, dict(pool[1])]  # doc 1 is pool row 1
    docs = [task.make_doc(r, i) for i, r in enumerate(rows)]
    for sampler in ("first_n", "random"):
        task.fewshot_sampler = sampler
        out = add_fewshot(task, docs, rows, range(2), pool, None, same_split=False)
        assert [d.shots for d in out] == [3, 2]
        assert out[1].contexts[0].count("question 1") == 1, (sampler, out[1].contexts[0])
        assert sorted(out[0].contexts[0].count(f"question {i}") for i in range(3)) == [1, 1, 1]
    task.fewshot_sampler = "first_n"
    out = add_fewshot(task, docs, rows, range(2), pool, None, same_split=False)
    assert out[1].contexts[0] == "Q: question 0\nA: no\n\nQ: question 2\nA: yes\n\nQ: question 1\nA:"


def test_mmlu_test_question_that_is_a_dev_question(data_root):
    """college_physics validation doc 5 is also one of the subject's 5 dev questions: it gets the other 4
    dev questions in order; every other document gets all 5, and the whole of MMLU loads."""
    zero = get_task("mmlu_college_physics_mc")
    dev = [zero.make_doc(row, j) for j, row in enumerate(split_rows(zero, data_root, "dev"))]
    plain = load_docs(zero, data_root)
    rendered = (plain[5].contexts, plain[5].continuations)
    (same,) = [j for j, d in enumerate(dev) if (d.contexts, d.continuations) == rendered]
    shot = load_docs(get_task("mmlu_college_physics_mc_5shot"), data_root)
    assert [d.index for d in shot if d.shots < 5] == [5]
    head = "The following are multiple choice questions (with answers) about college physics.\n\n"
    others = "".join(render_example(zero, d) + "\n\n" for j, d in enumerate(dev) if j != same)
    assert shot[5].contexts[0] == head + others + plain[5].contexts[0]
    everything = load_docs(get_task("mmlu_rc_5shot"), data_root)
    assert len(everything) == len(load_docs(get_task("mmlu_rc"), data_root))
    assert sum(d.shots < 5 for d in everything) == 1


def test_too_few_examples_is_an_error_naming_the_document():
    task = _Toy()
    task.num_fewshot = 3
    rows = _toy_rows(3)
    docs = [task.make_doc(r, i) for i, r in enumerate(rows)]
    with pytest.raises(
        TaskDataError, match=r"task 'toy' doc 0: expected 3 few-shot examples .* found only 2"
    ):
        add_fewshot(task, docs, rows, range(3), rows, None, same_split=True)


def test_prompt_does_not_depend_on_the_other_documents_or_their_order(data_root):
    task = get_task("hellaswag_mc_4shot")
    zero = get_task("hellaswag_mc")
    rows = split_rows(task, data_root)
    picked = [5000, 3, 977, 12, 10041, 4]  # an arbitrary subset, out of order
    docs = [zero.make_doc(rows[i], i) for i in picked]
    raws = [rows[i] for i in picked]
    alone = add_fewshot(task, docs, raws, picked, rows, None, same_split=True)
    reverse = add_fewshot(task, docs[::-1], raws[::-1], picked[::-1], rows, None, same_split=True)[::-1]
    assert alone == reverse
    full = load_docs(task, data_root, limit=13)
    assert [full[i] for i in (3, 12, 4)] == [alone[1], alone[3], alone[5]]
    for d in alone:
        assert d.contexts[0].count("\nAnswer:") == 5  # four solved examples and the question


def _rank_contexts(name: str, data_root: Path, tokenizer, world_size: int) -> dict[tuple[int, int], str]:
    """Each rank loads and tokenizes the task itself, as under torchrun, and keeps its share's strings."""
    seen: dict[tuple[int, int], str] = {}
    for rank in range(world_size):
        task = get_task(name)
        table = build_requests(task, load_docs(task, data_root, limit=25), tokenizer, 4096, with_uncond=False)
        dataset = ICLMultiChoiceTaskDataset(table)
        for row in rank_rows(dataset, shard_documents(dataset, world_size, rank)).tolist():
            key = (int(table.doc_id[row]), int(table.cont_id[row]))
            assert seen.setdefault(key, table.context_text[row]) == table.context_text[row]
    return seen


@pytest.mark.parametrize("name", ["arc_easy_rc_5shot", "mmlu_stem_mc_5shot"])
def test_identical_prompts_at_world_sizes_1_and_3(name, data_root, neox_tokenizer):
    one = _rank_contexts(name, data_root, neox_tokenizer, 1)
    three = _rank_contexts(name, data_root, neox_tokenizer, 3)
    assert len(one) > 25 and one == three


def _digest(names: list[str], data_root: str) -> str:
    h = hashlib.sha256()
    for name in names:
        for doc in load_docs(get_task(name), data_root, limit=30):
            h.update(json.dumps([doc.index, doc.contexts, doc.continuations, doc.gold]).encode())
    return h.hexdigest()


def test_identical_prompts_across_runs(data_root):
    """Another interpreter, with another hash seed, renders the same prompts."""
    names = ["arc_easy_rc_5shot", "winogrande_5shot", "sciq_mc_5shot", "mmlu_stem_mc_5shot"]
    code = "import sys, json; from test_fewshot import _digest; print(_digest(json.loads(sys.argv[1]), sys.argv[2]))"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(names), str(data_root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == _digest(names, str(data_root))


def test_partial_scoring_examples_use_the_gold_option(data_root):
    """WinoGrande: an example is the sentence with its gold option filled in, as the harness writes it."""
    zero = get_task("winogrande")
    rows = split_rows(zero, data_root)
    doc = load_docs(get_task("winogrande_1shot"), data_root, limit=1)[0]
    plain = zero.make_doc(rows[0], 0)
    example = doc.contexts[0][: -len(plain.contexts[0])]
    assert doc.contexts[1][: -len(plain.contexts[1])] == example
    candidates = {render_example(zero, zero.make_doc(r, j)) + "\n\n" for j, r in enumerate(rows) if j}
    assert example in candidates and "_" not in example


def test_examples_are_spread_over_the_split(data_root):
    """Seeded per document, not one fixed set: across documents the examples vary."""
    task = get_task("arc_easy_rc_5shot")
    rows = split_rows(task, data_root)
    pool = ExamplePool(task, rows, task.dataset_name, task.split)
    zero = get_task("arc_easy")
    used = {j for i in range(40) for j in example_indices(task, pool, zero.make_doc(rows[i], i), i, True)}
    assert len(used) > 100
    assert np.mean(sorted(used)) == pytest.approx(len(rows) / 2, rel=0.25)


def test_docs_equal_with_and_without_limit(data_root):
    full = load_docs(get_task("piqa_mc_5shot"), data_root)
    assert load_docs(get_task("piqa_mc_5shot"), data_root, limit=7) == full[:7]
    assert all(isinstance(d, Doc) for d in full)
