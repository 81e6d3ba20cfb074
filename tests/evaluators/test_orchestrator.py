"""The evaluator end to end on real task data with a seeded reference GPT."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pinned_scores as pin
import pytest
import torch
from helpers import REPO, rng_draws, seed_all

from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.errors import ConfigError, ModelOutputError, RequestError, TaskDataError, UnknownTaskError
from inloop_eval.evaluators import downstream as downstream_module
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.models.gpt import GPT, GPTConfig


@pytest.fixture(scope="module")
def model() -> GPT:
    return pin.pinned_model()


def make_evaluator(data_root, neox_tokenizer, tasks, **overrides) -> InLoopEvaluator:
    strict = overrides.pop("strict", True)
    evaluators = [{"task": t, "limit": overrides.pop("limit", 20), **overrides} for t in tasks]
    config = EvaluatorConfig(evaluators=evaluators, data_root=str(data_root), strict=strict)
    return InLoopEvaluator(config, tokenizer=neox_tokenizer)


def test_pinned_scores(data_root, model):
    """A refactor must not move these numbers; regenerate with tests/support/pinned_scores.py only on purpose."""
    expected = json.loads((REPO / "tests" / "support" / "pinned" / "icl_scores.json").read_text())
    found = pin.pinned_evaluator(data_root).run(model)
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        if key.endswith(("/acc", "/acc_norm", "/acc_bytes", "/acc_per_token", "/acc_pmi", "/n_docs")):
            assert found[key] == value, key
        else:
            assert found[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    for task in pin.PINNED_TASKS:
        assert found[f"eval/downstream/{task}/n_docs"] == pin.N_DOCS


def test_letter_key_task_reports_no_length_normalisation(data_root, neox_tokenizer, model):
    out = make_evaluator(data_root, neox_tokenizer, ["mmlu_mc"]).run(model)
    assert "eval/downstream/mmlu_mc/acc" in out
    assert not any(k.endswith(("/acc_norm", "/acc_bytes", "/acc_per_token")) for k in out)


@pytest.mark.parametrize("batch_tokens", [64, 700, 100_000])
def test_batch_size_does_not_change_scores(data_root, neox_tokenizer, model, batch_tokens):
    tasks = ["hellaswag", "winogrande", "arc_challenge"]
    base = make_evaluator(data_root, neox_tokenizer, tasks, batch_tokens=4096)
    other = make_evaluator(data_root, neox_tokenizer, tasks, batch_tokens=batch_tokens)
    a, b = base.run(model), other.run(model)
    for key in a:
        if "/acc" in key and "stderr" not in key:
            assert a[key] == b[key], key
    for task in tasks:
        np.testing.assert_allclose(base.detail(task).scores.ll, other.detail(task).scores.ll, atol=1e-5)


def test_documents_with_fewer_shots_are_reported(data_root, neox_tokenizer, model):
    """college_physics doc 5 is one of its dev questions, so it has 4 examples: counted among the evaluated
    documents only, on few-shot tasks only."""
    tasks = ["mmlu_college_physics_mc_5shot", "mmlu_college_physics_mc"]
    out = make_evaluator(data_root, neox_tokenizer, tasks, limit=None).run(model)
    assert out["eval/downstream/mmlu_college_physics_mc_5shot/n_fewshot_short_docs"] == 1
    assert out["eval/downstream/mmlu_college_physics_mc_5shot/n_docs"] == 11
    assert "eval/downstream/mmlu_college_physics_mc/n_fewshot_short_docs" not in out
    head = make_evaluator(data_root, neox_tokenizer, tasks[:1], limit=5).run(model)
    assert head["eval/downstream/mmlu_college_physics_mc_5shot/n_fewshot_short_docs"] == 0


def test_pad_to_multiple_buckets_widths_without_moving_scores(data_root, neox_tokenizer, model):
    """`pad_to_multiple: 64` from the config: every forward is a multiple of 64 wide or, for rows near the
    context length, exactly `max_length` (never past it); the scores do not move."""
    widths: list[int] = []

    def recording(ids):  # noqa: ANN001, ANN202
        widths.append(ids.shape[1])
        return model(ids)

    tasks = ["hellaswag", "mmlu_mc_5shot"]
    evaluators = [{"task": t, "limit": 12, "batch_tokens": 2048} for t in tasks]
    plain = EvaluatorConfig(evaluators=evaluators, data_root=str(data_root), strict=True, max_length=300)
    bucketed = EvaluatorConfig(**{**vars(plain), "pad_to_multiple": 64})
    a, b = (
        InLoopEvaluator(plain, tokenizer=neox_tokenizer),
        InLoopEvaluator(bucketed, tokenizer=neox_tokenizer),
    )
    a.run(LogitsAdapter(recording, max_length=300))
    assert any(w % 64 for w in widths)
    widths.clear()
    b.run(LogitsAdapter(recording, max_length=300))
    assert widths and all(w % 64 == 0 or w == 300 for w in widths) and 300 in widths, widths
    # Float32 forwards of other shapes (and the first forwards of a process, with other buffer alignments)
    # round differently in BLAS: a few 1e-6 of a long continuation's sum.
    for task in tasks:
        found, expected = b.detail(task).scores.ll, a.detail(task).scores.ll
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="pad_to_multiple must be an integer >= 1"):
        EvaluatorConfig(pad_to_multiple=0)


def test_batches_are_planned_once_per_task(data_root, neox_tokenizer, model, monkeypatch):
    """A later evaluation reuses the first one's plan (the same scores); other bucketing plans anew."""
    calls: list[int] = []
    plan = downstream_module.plan_batches

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return plan(*args, **kwargs)

    monkeypatch.setattr(downstream_module, "plan_batches", counted)
    evaluator = make_evaluator(data_root, neox_tokenizer, ["hellaswag", "arc_easy"])
    first = evaluator.run(model)
    assert len(calls) == 2
    assert evaluator.run(model) == first and len(calls) == 2
    evaluator.run(LogitsAdapter(model, max_length=model.config.max_seq_len))  # no packing: a new plan
    assert len(calls) == 4


def test_callable_model_gives_the_same_scores(data_root, neox_tokenizer, model):
    """The plain-logits path (any callable) agrees with the reference GPT's sliced-head path."""
    ev_gpt = make_evaluator(data_root, neox_tokenizer, ["piqa"])
    ev_fn = make_evaluator(data_root, neox_tokenizer, ["piqa"])
    ev_gpt.run(model)
    ev_fn.run(LogitsAdapter(lambda ids: model(ids), max_length=model.config.max_seq_len))
    np.testing.assert_allclose(ev_gpt.detail("piqa").scores.ll, ev_fn.detail("piqa").scores.ll, atol=1e-5)


def test_training_state_is_restored(data_root, neox_tokenizer):
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2, dropout=0.1))
    model.train()
    model.blocks[0].eval()  # a mixed state must come back as it was
    modes = [m.training for m in model.modules()]
    seed_all(1)
    expected = rng_draws()
    seed_all(1)
    make_evaluator(data_root, neox_tokenizer, ["copa"], limit=4).run(model)
    assert [m.training for m in model.modules()] == modes
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    assert rng_draws() == expected


@pytest.mark.parametrize("task", ["hellaswg", "olmo:hellaswg", "oe_eval:arc_easy"])
def test_an_unknown_task_id_stops_the_build(data_root, neox_tokenizer, task):
    """Refused when the evaluator is built (the same on every rank, the registry reads no file), not at the
    first evaluation thousands of steps in; the message names the closest ids."""
    with pytest.raises(UnknownTaskError, match=f"unknown task '{task}'"):
        make_evaluator(data_root, neox_tokenizer, [task])
    with pytest.raises(UnknownTaskError, match="did you mean hellaswag"):
        make_evaluator(data_root, neox_tokenizer, ["hellaswg"])


def test_failure_is_reported_when_not_strict(data_root, neox_tokenizer, model, caplog, tmp_path):
    missing = tmp_path / "missing.yaml"  # a task file is checked when it is loaded: a failure of that task
    config = EvaluatorConfig(
        evaluators=[{"task": f"harness:{missing}", "label": "broken"}, {"task": "copa", "limit": 4}],
        data_root=str(data_root),
    )
    out = InLoopEvaluator(config, tokenizer=neox_tokenizer).run(model)
    assert out["eval/downstream/broken/failed"] == 1.0
    assert out["eval/downstream/copa/n_docs"] == 4
    assert "missing.yaml" in caplog.text


def test_missing_data_root(tmp_path, neox_tokenizer, model):
    with pytest.raises(TaskDataError, match="task 'piqa'.*inloop-eval data fetch"):
        make_evaluator(tmp_path / "nowhere", neox_tokenizer, ["piqa"]).run(model)


def test_continuation_that_cannot_fit(data_root, neox_tokenizer, model):
    ev = make_evaluator(data_root, neox_tokenizer, ["piqa"])
    ev.config.max_length = 8
    with pytest.raises(
        RequestError, match=r"task 'piqa' doc \d+ choice \d: the continuation has \d+ tokens .* 8"
    ):
        ev.run(model)


def test_contexts_are_cut_from_the_left(data_root, neox_tokenizer, model):
    ev = make_evaluator(data_root, neox_tokenizer, ["boolq"], limit=10)
    ev.config.max_length = 64
    out = ev.run(model)
    assert out["eval/downstream/boolq/n_docs"] == 10
    pairs = ev.detail("boolq")
    table = pairs.prepared.table
    assert (table.pairs.ctx_len + table.pairs.cont_len - 1).max() <= 64
    assert len(pairs.rows) == 20


def test_logits_of_the_wrong_vocabulary(data_root, neox_tokenizer):
    small = LogitsAdapter(lambda ids: torch.zeros(*ids.shape, 1000), max_length=512)
    with pytest.raises(
        ModelOutputError, match=r"task 'copa' doc \d+ choice \d: expected logits over at least 50280"
    ):
        make_evaluator(data_root, neox_tokenizer, ["copa"], limit=4).run(small)


def test_model_that_cannot_embed_the_tokens(data_root, neox_tokenizer):
    torch.manual_seed(0)
    tiny_vocab = GPT(GPTConfig(vocab_size=1000, d_model=16, n_layers=1, n_heads=2))
    with pytest.raises(ModelOutputError, match=r"task 'copa' doc 0 choice 0: token id \d+ is beyond .* 1000"):
        make_evaluator(data_root, neox_tokenizer, ["copa"], limit=4).run(tiny_vocab)


def poisoned_logits(model):
    """The model's logits with NaN in every row whose first context token is odd: some documents, not all."""

    def poisoned(ids: torch.Tensor) -> torch.Tensor:
        logits = model(ids)
        return torch.where((ids[:, :1] % 2 == 1)[:, :, None], torch.full_like(logits, math.nan), logits)

    return LogitsAdapter(poisoned, max_length=1024)


def test_nan_logits_are_counted_not_averaged(data_root, neox_tokenizer, model, caplog):
    """Documents whose scores are NaN are skipped, counted and said in the log; the rest are still scored."""
    ev = make_evaluator(data_root, neox_tokenizer, ["hellaswag"], limit=30, strict=False)
    out = ev.run(poisoned_logits(model))
    n_bad = out["eval/downstream/hellaswag/n_nonfinite_docs"]
    assert 0 < n_bad < 30
    assert out["eval/downstream/hellaswag/n_skipped_docs"] == n_bad
    assert out["eval/downstream/hellaswag/n_docs"] == 30 - n_bad
    assert all(math.isfinite(v) for v in out.values())
    assert f"task 'hellaswag': {n_bad:.0f} documents had scores that are not finite" in caplog.text
    assert f"over the other {30 - n_bad:.0f} documents only" in caplog.text


def test_nan_documents_fail_the_task_under_strict(data_root, neox_tokenizer, model):
    ev = make_evaluator(data_root, neox_tokenizer, ["hellaswag"], limit=30, strict=True)
    with pytest.raises(ModelOutputError, match=r"task 'hellaswag': \d+ documents had scores that are not finite"):
        ev.run(poisoned_logits(model))


def test_each_evaluation_logs_one_short_line(data_root, neox_tokenizer, model, caplog):
    """The figures go to the loggers; the log gets one short line per evaluation, naming failures."""
    caplog.set_level(logging.INFO, logger="inloop_eval.evaluators.orchestrator")
    out = make_evaluator(data_root, neox_tokenizer, ["copa", "piqa"], limit=4).run(model, step=12)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "inloop_eval.evaluators.orchestrator"]
    assert line.startswith(f"step 12: {len(out)} figures, ") and len(line) < 120
