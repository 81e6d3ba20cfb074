"""oe-eval request files (OLMo's precomputed prompts) as tasks: they load, agree with the built-in tasks where
the formats are the same, and score with a tiny reference GPT."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pinned_scores as pin
import pytest

from inloop_eval.errors import TaskDataError, UnknownTaskError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.metrics.formats import GOLD_ONLY_METRICS, MC_METRICS, PARTIAL_METRICS, RC_METRICS
from inloop_eval.tasks import get_task, load_docs
from inloop_eval.tasks.oe_eval import OEEvalRequestsTask

# oe-eval rc 0-shot variant -> the built-in task that renders the same requests.
SAME_AS_BUILT_IN = {
    "arc_easy:rc_0shot": "arc_easy",
    "arc_challenge:rc_0shot": "arc_challenge",
    "openbookqa:rc_0shot": "openbookqa",
    "csqa:rc_0shot": "commonsense_qa",
    "socialiqa:rc_0shot": "social_iqa",
    "winogrande:rc_0shot": "winogrande",
}
# oe-eval mc variant over the whole split -> our letter-key twin (OLMES mc), whose prompt ends each context.
MC_TWINS = {
    "arc_easy:val_mc_5shot": "arc_easy_mc",
    "arc_challenge:val_mc_5shot": "arc_challenge_mc",
    "openbookqa:val_mc_5shot": "openbookqa_mc",
    "csqa:val_mc_5shot": "commonsense_qa_mc",
    "socialiqa:val_mc_5shot": "social_iqa_mc",
}


def test_ids_and_formats():
    cases = {
        "oe_eval:arc_easy:rc_5shot": ("rc", RC_METRICS),
        "oe_eval:arc_easy:mc_5shot": ("mc", MC_METRICS),
        "oe_eval:copycolors:10way": ("mc", MC_METRICS),
        "oe_eval:winogrande:rc_5shot": ("partial", PARTIAL_METRICS),
        "oe_eval:naturalqs_open:bpb_5shot": ("gold", GOLD_ONLY_METRICS),
    }
    for name, (fmt, metrics) in cases.items():
        task = get_task(name)
        assert (task.name, task.prompt_format, task.metrics) == (name, fmt, metrics)
    with pytest.raises(UnknownTaskError, match="oe_eval:<task>:<variant>"):
        get_task("oe_eval:arc_easy")
    with pytest.raises(UnknownTaskError, match="'mc', 'rc', 'bpb'"):
        get_task("oe_eval:arc_easy:fancy")
    assert not get_task("oe_eval:arc_easy:rc_5shot").supports_fewshot  # the shots are in the file


@pytest.mark.parametrize("variant", sorted(SAME_AS_BUILT_IN))
def test_rc_0shot_requests_are_the_built_in_tasks(variant: str, data_root: Path):
    task = get_task(f"oe_eval:{variant}")
    ours = load_docs(get_task(SAME_AS_BUILT_IN[variant]), data_root)
    theirs = load_docs(task, data_root)
    assert len(theirs) == len(ours)
    assert theirs == ours
    assert task.target_delimiter == " "
    assert task.uncond_context == ("" if variant.startswith("winogrande") else "Answer:")


@pytest.mark.parametrize("variant", sorted(MC_TWINS))
def test_mc_prompts_are_our_letter_key_twins(variant: str, data_root: Path):
    theirs = load_docs(get_task(f"oe_eval:{variant}"), data_root)
    ours = load_docs(get_task(MC_TWINS[variant]), data_root)
    assert len(theirs) == len(ours)
    for t, o in zip(theirs, ours, strict=True):
        assert t.contexts[0].endswith("\n\n" + o.contexts[0])
        assert t.contexts[0].count("\nAnswer:") == 6  # five solved examples and the question
        assert (t.continuations, t.gold) == (o.continuations, o.gold)


def test_rc_5shot_and_gold_only(data_root: Path):
    (doc,) = load_docs(get_task("oe_eval:arc_easy:rc_5shot"), data_root, limit=1)
    assert doc.contexts[0].startswith("Question: Lichens are symbiotic organisms")
    assert doc.contexts[0].endswith("\n\nQuestion: Which technology was developed most recently?\nAnswer:")
    assert doc.continuations == ("cellular telephone", "television", "refrigerator", "airplane")
    assert doc.gold == (0,)
    nq = load_docs(get_task("oe_eval:naturalqs_open:bpb_5shot"), data_root)
    assert len(nq) == 1000 and all(d.n_choices == 1 and d.gold == (0,) for d in nq)
    assert nq[0].continuations == ("Justin Timberlake",)


def _evaluate(data_root: Path, tokenizer, model, tasks: list[str], limit: int) -> InLoopEvaluator:
    config = EvaluatorConfig(
        evaluators=[{"task": t, "limit": limit} for t in tasks], data_root=str(data_root), strict=True
    )
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    evaluator.metrics_out = evaluator.run(model)
    return evaluator


def test_loads_and_scores_with_a_reference_gpt(data_root: Path, neox_tokenizer):
    model = pin.pinned_model()
    tasks = [
        "oe_eval:arc_easy:rc_5shot",
        "oe_eval:arc_easy:rc_0shot",
        "arc_easy",
        "oe_eval:arc_easy:mc_5shot",
    ]
    evaluator = _evaluate(data_root, neox_tokenizer, model, tasks, limit=8)
    out = evaluator.metrics_out
    for task in tasks:
        assert out[f"eval/downstream/{task}/n_docs"] == 8
        assert 0.0 <= out[f"eval/downstream/{task}/acc"] <= 1.0
    assert "eval/downstream/oe_eval:arc_easy:rc_5shot/acc_pmi" in out
    assert "eval/downstream/oe_eval:arc_easy:mc_5shot/acc_norm" not in out
    # The oe-eval 0-shot file and the built-in task are the same requests: the same scores.
    for key in ("acc", "acc_norm", "acc_pmi", "ce_gold"):
        assert (
            out[f"eval/downstream/oe_eval:arc_easy:rc_0shot/{key}"] == out[f"eval/downstream/arc_easy/{key}"]
        )
    a, b = evaluator.detail("oe_eval:arc_easy:rc_0shot"), evaluator.detail("arc_easy")
    np.testing.assert_array_equal(a.scores.ll, b.scores.ll)


def _write(folder: Path, rows: list[dict], config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "requests.jsonl.gz", "wt") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (folder / "config.json").write_text(json.dumps(config or {"task_config": {"num_shots": 0}}))
    return folder


def _row(doc_id: int, idx: int, cont: str, label, context: str = "Q: 1+1?\nA:") -> dict:  # noqa: ANN001
    return {
        "request_type": "loglikelihood",
        "doc_id": doc_id,
        "idx": idx,
        "label": label,
        "request": {"context": context, "continuation": cont},
    }


def test_own_request_directory(tmp_path: Path):
    rows = [_row(0, 0, " 2", 0), _row(0, 1, " 3", 0), _row(1, 1, " no", 1), _row(1, 0, " yes", 1)]
    rows.append(_row(1_000_000, 0, " 2", None, context="A:"))
    task = OEEvalRequestsTask("mine", "rc_0shot", directory=_write(tmp_path / "mine", rows))
    docs = load_docs(task)
    assert [(d.contexts[0], d.continuations, d.gold) for d in docs] == [
        ("Q: 1+1?\nA:", ("2", "3"), (0,)),
        ("Q: 1+1?\nA:", ("yes", "no"), (1,)),
    ]
    assert task.uncond_context == "A:" and task.target_delimiter == " "


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        (
            [_row(0, 0, " 2", 5), _row(0, 1, " 3", 5)],
            "doc 0 (doc_id 0): field 'label': expected an integer from 0 to 1, found 5",
        ),
        ([_row(0, 0, " 2", 0), _row(0, 2, " 3", 0)], "field 'idx': expected 0..1, found [0, 2]"),
        ([_row(0, 0, " 2", 0), _row(0, 1, " 3", 1)], "field 'label': expected one label per document"),
        ([{**_row(0, 0, " 2", 0), "request_type": "generate_until"}], "line 1: field 'request_type'"),
        (
            [{**_row(0, 0, " 2", 0), "request": {"context": 3, "continuation": " 2"}}],
            "line 1: field 'request.context': expected a string, found 3",
        ),
        ([_row(-1, 0, " 2", 0)], "line 1: field 'doc_id': expected an integer >= 0, found -1"),
    ],
)
def test_bad_request_files_name_the_document_and_field(tmp_path: Path, rows: list[dict], fragment: str):
    task = OEEvalRequestsTask("mine", "rc_0shot", directory=_write(tmp_path / "bad", rows))
    with pytest.raises(TaskDataError) as info:
        load_docs(task)
    assert "task 'oe_eval:mine:rc_0shot'" in str(info.value)
    assert fragment in str(info.value)


def test_mc_variant_requires_letter_keys(tmp_path: Path):
    rows = [_row(0, 0, " two", 0), _row(0, 1, " three", 0)]
    task = OEEvalRequestsTask("mine", "mc_0shot", directory=_write(tmp_path / "mc", rows))
    with pytest.raises(TaskDataError, match="expected letter keys, found 'two'"):
        load_docs(task)


def test_missing_files_say_how_to_fix(tmp_path: Path):
    with pytest.raises(
        TaskDataError, match="expected requests.jsonl.gz .* and config.json .*inloop-eval data fetch"
    ):
        load_docs(get_task("oe_eval:arc_easy:rc_5shot"), tmp_path)
