"""Task kinds beyond multiple choice by accuracy: classification with F1, gold-only ce/bpb, LAMBADA by greedy
exact match, and `ece` on request; end to end with the seeded reference GPT, checked against the NumPy
reference on the evaluator's own scores."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pinned_scores as pin
import pytest
from reference import FIELDS, reference_icl

from inloop_eval.data.root import oe_eval_dir
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.metrics.formats import CLASSIFICATION_METRICS, GOLD_ONLY_METRICS, GREEDY_METRICS
from inloop_eval.tasks import Doc, get_task, load_docs

LIMIT = 16


@pytest.fixture(scope="module")
def model():
    return pin.pinned_model()


@pytest.fixture(scope="module")
def evaluated(data_root, neox_tokenizer, model) -> InLoopEvaluator:
    """One run over every kind (a few documents each)."""
    evaluators = [
        {"task": t, "limit": LIMIT}
        for t in (
            "rte",
            "commitment_bank",
            "arc_easy_bpb",
            "nq_open_bpb",
            "lambada",
            "arc_easy",
        )
    ]
    evaluators.append(
        {"task": "arc_easy", "label": "arc_easy_ece", "limit": LIMIT, "metrics": ["acc", "ece", "f1"]}
    )
    config = EvaluatorConfig(evaluators=evaluators, data_root=str(data_root), strict=True)
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    evaluator.metrics_out = evaluator.run(model)
    return evaluator


def reference_from_run(evaluator: InLoopEvaluator, label: str, metrics: tuple[str, ...]) -> dict[str, float]:
    """The NumPy reference on the request rows and scores the evaluator produced for one task."""
    result = evaluator.detail(label)
    table, rows, n = result.prepared.table, result.rows, len(result.rows)
    columns = {
        "doc_id": table.doc_id[rows],
        "cont_id": table.cont_id[rows],
        "n_choices": table.n_choices[rows],
        "is_gold": table.is_gold[rows],
        "ll": result.scores.ll[:n],
        "uncond_id": table.uncond_id[rows],
        "n_tokens": table.pairs.cont_len[rows],
        "n_chars": table.n_chars[rows],
        "n_bytes": table.n_bytes[rows],
        "is_greedy": result.scores.greedy[:n],
    }
    assert set(columns) == set(FIELDS)
    return reference_icl(columns, result.uncond_ids, result.scores.ll[n:], metrics)


def figures(evaluator: InLoopEvaluator, label: str) -> dict[str, float]:
    prefix = f"eval/downstream/{label}/"
    return {k[len(prefix) :]: v for k, v in evaluator.metrics_out.items() if k.startswith(prefix)}


# ---------------------------------------------------------------- classification

FIRST = {
    "rte": (
        "Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44, according to the "
        "Christopher Reeve Foundation.\nQuestion: Christopher Reeve had an accident. True or False?\nAnswer:",
        ("True", "False"),
        (1,),
    ),
    "sst2": (
        "it 's a charming and often affecting journey . \nQuestion: Is this sentence positive or negative?\nAnswer:",
        ("negative", "positive"),
        (1,),
    ),
}


@pytest.mark.parametrize(
    ("name", "count"), [("rte", 277), ("commitment_bank", 56), ("mrpc", 408), ("sst2", 872)]
)
def test_classification_tasks_load(name, count, data_root):
    task = get_task(name)
    assert task.metrics == CLASSIFICATION_METRICS == ("acc", "f1")
    docs = load_docs(task, data_root)
    assert len(docs) == count
    assert {d.continuations for d in docs} == {task.choices}
    if name in FIRST:
        context, choices, gold = FIRST[name]
        assert docs[0] == Doc(0, (context,) * len(choices), choices, gold)
    golds = np.bincount([d.gold[0] for d in docs])
    assert len(golds) == len(task.choices) and golds.min() > 0


@pytest.mark.parametrize("label", ["rte", "commitment_bank"])  # binary F1 and macro F1
def test_classification_f1_matches_reference(label, evaluated):
    found = figures(evaluated, label)
    assert set(found) == {"n_docs", "n_skipped_docs", "n_nonfinite_docs", "acc", "acc_stderr", "f1"}
    assert found["n_docs"] == LIMIT
    expected = reference_from_run(evaluated, label, CLASSIFICATION_METRICS)
    assert found["f1"] == pytest.approx(expected["f1"], abs=1e-12)
    assert found["acc"] == expected["acc"]


# ---------------------------------------------------------------- gold-only


def test_gold_only_answers(data_root):
    arc = load_docs(get_task("arc_easy"), data_root, limit=50)
    answers = load_docs(get_task("arc_easy_bpb"), data_root, limit=50)
    for a, d in zip(answers, arc, strict=True):
        assert a == Doc(d.index, d.contexts[:1], (d.continuations[d.gold[0]],), (0,))
    (trivia,) = load_docs(get_task("trivia_qa_bpb"), data_root, limit=1)
    assert trivia.contexts == (
        "Question: Which Lloyd Webber musical premiered in the US on 10th December 1993?\nAnswer:",
    )
    assert trivia.continuations == ("Sunset Boulevard",)
    for name in ("arc_easy_bpb", "trivia_qa_bpb", "nq_open_bpb"):
        assert get_task(name).metrics == GOLD_ONLY_METRICS


def test_nq_answers_are_olmos_naturalqs_requests(data_root):
    """OLMo's naturalqs_open bpb requests end with our prompt and continue with our answer."""
    ours = {d.contexts[0]: d.continuations[0] for d in load_docs(get_task("nq_open_bpb"), data_root)}
    path = oe_eval_dir(data_root) / "naturalqs_open" / "bpb_5shot" / "requests.jsonl.gz"
    checked = 0
    with gzip.open(path, "rt") as lines:
        for line in list(lines)[:100]:
            request = json.loads(line)["request"]
            prompt = request["context"].rsplit("\n\n", 1)[1]
            assert ours[prompt] == request["continuation"][1:]
            checked += 1
    assert checked == 100


def test_gold_only_scores_are_the_gold_choices(evaluated):
    """arc_easy_bpb scores exactly arc_easy's gold requests: the same ce and bpb."""
    found, full = figures(evaluated, "arc_easy_bpb"), figures(evaluated, "arc_easy")
    assert set(found) == {"n_docs", "n_skipped_docs", "n_nonfinite_docs", "ce_gold", "bpb_gold"}
    assert found["ce_gold"] == pytest.approx(full["ce_gold"], rel=1e-6)
    assert found["bpb_gold"] == pytest.approx(full["bpb_gold"], rel=1e-6)
    nq = figures(evaluated, "nq_open_bpb")
    expected = reference_from_run(evaluated, "nq_open_bpb", GOLD_ONLY_METRICS)
    assert nq["ce_gold"] == pytest.approx(expected["ce_gold"], rel=1e-12) and nq["ce_gold"] > 0


# ---------------------------------------------------------------- LAMBADA


def test_lambada_loads(data_root):
    task = get_task("lambada")
    docs = load_docs(task, data_root)
    assert len(docs) == 5153 and task.metrics == GREEDY_METRICS
    assert all(d.n_choices == 1 and d.gold == (0,) for d in docs)
    assert docs[0].continuations == ("signs",) and docs[0].contexts[0].endswith("I don't care about")
    assert task.target_delimiter == " "


def test_lambada_greedy_exact_match(evaluated):
    found = figures(evaluated, "lambada")
    result = evaluated.detail("lambada")
    n = len(result.rows)
    assert found["acc_greedy"] == pytest.approx(float(np.mean(result.scores.greedy[:n])))
    assert found["ppl_gold"] == pytest.approx(math.exp(-float(np.mean(result.scores.ll[:n]))), rel=1e-9)
    expected = reference_from_run(evaluated, "lambada", GREEDY_METRICS)
    for key in ("acc_greedy", "acc_greedy_stderr", "ppl_gold", "ce_gold", "bpb_gold"):
        assert found[key] == pytest.approx(expected[key], rel=1e-12), key


# ---------------------------------------------------------------- ece (and f1) on request


def test_ece_on_request(evaluated):
    found = figures(evaluated, "arc_easy_ece")
    assert set(found) == {"n_docs", "n_skipped_docs", "n_nonfinite_docs", "acc", "acc_stderr", "ece", "f1"}
    expected = reference_from_run(evaluated, "arc_easy_ece", ("acc", "ece", "f1"))
    assert 0.0 <= found["ece"] <= 1.0
    assert found["ece"] == pytest.approx(expected["ece"], abs=1e-12)
    assert found["f1"] == pytest.approx(expected["f1"], abs=1e-12)
    assert "ece" not in figures(evaluated, "arc_easy")  # not a default figure
