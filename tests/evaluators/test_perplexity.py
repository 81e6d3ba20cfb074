"""Perplexity per domain: the metric math against a NumPy reference, and the `lm` evaluator end to end."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from helpers import rng_draws, seed_all
from lm_helpers import (
    DOCS,
    SEQ_LEN,
    lm_entry,
    log_softmax_np,
    reference_memmap,
    reference_text,
    tiny_gpt,
    write_domains,
)

from inloop_eval.data.perplexity.token_bytes import token_byte_lengths
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.outputs.projected_head import token_logprobs
from inloop_eval.errors import ConfigError, LMDataError, ModelOutputError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.metrics.perplexity import perplexity_compute
from inloop_eval.metrics.perplexity_metric import PerplexityMetric

LABELS = ("code", "prose", "tiny")


def random_documents(seed: int) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Logits [T, V], targets [T] and bytes per token [T] of documents of very different lengths: the short
    ones poorly predicted, the long ones well, so a mean of per-document means is far from token-weighted."""
    rng = np.random.default_rng(seed)
    vocab = 37
    logits, targets, nbytes = [], [], []
    for length in (1, 3, 700, 9, 2500, 2):
        target = rng.integers(0, vocab, length)
        x = rng.normal(0, 3, (length, vocab)).astype(np.float32)
        if length > 100:
            x[np.arange(length), target] += 6.0
        logits.append(x)
        targets.append(target)
        nbytes.append(rng.integers(1, 7, length))
    return logits, targets, nbytes


def numpy_reference(logits, targets, nbytes) -> dict[str, float]:
    nll = [-log_softmax_np(x)[np.arange(len(t)), t] for x, t in zip(logits, targets, strict=True)]
    total = float(sum(n.sum() for n in nll))
    n_tokens = sum(len(t) for t in targets)
    n_bytes = int(sum(b.sum() for b in nbytes))
    ce = total / n_tokens
    return {"ce": ce, "ppl": math.exp(ce), "bpb": total / n_bytes / math.log(2)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metric_matches_numpy_reference_token_weighted(seed):
    logits, targets, nbytes = random_documents(seed)
    expected = numpy_reference(logits, targets, nbytes)
    metric = PerplexityMetric()
    for x, t, b in zip(logits, targets, nbytes, strict=True):
        logp, _ = token_logprobs(torch.from_numpy(x), lambda f: f, torch.from_numpy(t))
        nll = -logp.double().sum()
        metric.update(nll[None], torch.tensor([len(t)]), torch.tensor([int(b.sum())]))
    found = metric.compute()
    for key in ("ce", "ppl", "bpb"):
        assert found[key] == pytest.approx(expected[key], rel=1e-6), key
    assert found["n_tokens"] == sum(len(t) for t in targets)

    # The instance mean differs from the token-weighted figure: the test can tell them apart.
    per_doc = [-log_softmax_np(x)[np.arange(len(t)), t].mean() for x, t in zip(logits, targets, strict=True)]
    assert abs(float(np.mean(per_doc)) - expected["ce"]) > 1.0


def test_per_token_updates_equal_per_document_updates():
    logits, targets, nbytes = random_documents(3)
    per_doc, per_token = PerplexityMetric(), PerplexityMetric()
    for x, t, b in zip(logits, targets, nbytes, strict=True):
        nll_T = torch.from_numpy(-log_softmax_np(x)[np.arange(len(t)), t])
        per_doc.update(nll_T.sum()[None], torch.tensor([len(t)]), torch.tensor([int(b.sum())]))
        per_token.update(nll_T, torch.ones(len(t), dtype=torch.long), torch.from_numpy(b))
    a, b = per_doc.compute(), per_token.compute()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-12)


def test_compute_edge_cases():
    assert perplexity_compute(0.0, 0, 0) == {}  # never NaN: left out
    assert perplexity_compute(10.0, 5, 0) == {"ce": 2.0, "ppl": math.exp(2.0)}  # no bytes, no bpb
    assert perplexity_compute(1e6, 1, 1)["ppl"] == math.inf
    metric = PerplexityMetric()
    empty = torch.zeros(0)
    metric.update(empty, empty.long(), empty.long())
    assert metric.compute() == {"sum_nll": 0.0, "n_tokens": 0, "n_bytes": 0}
    with pytest.raises(ValueError, match="one length"):
        metric.update(torch.zeros(2), torch.zeros(3, dtype=torch.long), torch.zeros(2, dtype=torch.long))


@pytest.fixture(scope="module")
def model():
    return tiny_gpt()


@pytest.fixture(scope="module")
def domain_files(tmp_path_factory, neox_tokenizer):
    return write_domains(tmp_path_factory.mktemp("lm"), neox_tokenizer)


def lm_evaluator(files, tokenizer, cache_dir, strict=True, extra=(), **overrides) -> InLoopEvaluator:
    config = EvaluatorConfig(evaluators=[*extra, lm_entry(files, cache_dir, **overrides)], strict=strict)
    return InLoopEvaluator(config, tokenizer=tokenizer)


def test_evaluator_matches_numpy_reference(model, domain_files, neox_tokenizer, tmp_path):
    out = lm_evaluator(domain_files, neox_tokenizer, tmp_path).run(model)
    table = token_byte_lengths(neox_tokenizer)
    expected = {
        "code": reference_memmap(model, sorted(domain_files["code"].glob("*.npy")), SEQ_LEN, table),
        "prose": reference_text(model, DOCS, neox_tokenizer, SEQ_LEN),
        "tiny": reference_memmap(model, [domain_files["tiny"]], SEQ_LEN, table),
    }
    assert sorted(out) == sorted(f"eval/lm/{label}/{k}" for label in LABELS for k in ("ce", "ppl", "bpb"))
    for label, figures in expected.items():
        for key, value in figures.items():
            assert out[f"eval/lm/{label}/{key}"] == pytest.approx(value, rel=1e-5), (label, key)


@pytest.mark.parametrize("batch_tokens", [SEQ_LEN, 10_000])
def test_batch_size_and_model_wrapper_do_not_change_figures(
    model, domain_files, neox_tokenizer, tmp_path, batch_tokens
):
    base = lm_evaluator(domain_files, neox_tokenizer, tmp_path).run(model)
    other = lm_evaluator(domain_files, neox_tokenizer, tmp_path, batch_tokens=batch_tokens)
    as_callable = other.run(LogitsAdapter(lambda ids: model(ids)))  # vocabulary found by a probe forward
    assert as_callable.keys() == base.keys()
    for key in base:
        assert as_callable[key] == pytest.approx(base[key], rel=1e-5), key


def test_cap_on_tokens(model, domain_files, neox_tokenizer, tmp_path):
    evaluator = lm_evaluator(domain_files, neox_tokenizer, tmp_path, max_tokens=5 * (SEQ_LEN - 1))
    first = evaluator.run(model)
    totals = evaluator.detail(next(n for n in evaluator.evaluators if n.startswith("lm:"))).totals
    assert totals["code"][1] == 5 * (SEQ_LEN - 1)
    assert totals["tiny"][1] == SEQ_LEN - 1
    assert 0 < totals["prose"][1] <= 5 * (SEQ_LEN - 1)
    again = lm_evaluator(domain_files, neox_tokenizer, tmp_path, max_tokens=5 * (SEQ_LEN - 1)).run(model)
    assert again == first  # the same sequences every time


def test_training_state_is_restored(domain_files, neox_tokenizer, tmp_path):
    model = tiny_gpt().train()
    model.blocks[0].mlp[0].weight.requires_grad_(False)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    seed_all(1)
    expected = rng_draws()
    seed_all(1)
    lm_evaluator(domain_files, neox_tokenizer, tmp_path).run(model)
    assert rng_draws() == expected
    assert all(m.training for m in model.modules())
    assert not model.blocks[0].mlp[0].weight.requires_grad and model.lm_head.weight.requires_grad
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())


def test_downstream_and_lm_in_one_run(model, domain_files, neox_tokenizer, data_root, tmp_path):
    task = {"task": "arc_easy", "limit": 6, "batch_tokens": 2048}
    config = EvaluatorConfig(
        evaluators=[task, lm_entry(domain_files, tmp_path)], data_root=str(data_root), strict=True
    )
    out = InLoopEvaluator(config, tokenizer=neox_tokenizer).run(model)
    assert out["eval/downstream/arc_easy/n_docs"] == 6
    assert {k for k in out if k.startswith("eval/lm/")} == {
        f"eval/lm/{label}/{k}" for label in LABELS for k in ("ce", "ppl", "bpb")
    }


def test_a_failing_domain_is_reported_and_the_others_run(model, domain_files, neox_tokenizer, tmp_path):
    files = {**domain_files, "tiny": tmp_path / "missing.npy"}
    out = lm_evaluator(files, neox_tokenizer, tmp_path, strict=False).run(model)
    assert out["eval/lm/tiny/failed"] == 1.0
    assert not any(k.startswith("eval/lm/tiny/") and not k.endswith("failed") for k in out)
    assert math.isfinite(out["eval/lm/code/ce"]) and math.isfinite(out["eval/lm/prose/bpb"])
    with pytest.raises(LMDataError, match=r"label 'tiny': file .*missing.npy does not exist"):
        lm_evaluator(files, neox_tokenizer, tmp_path, strict=True).run(model)


def test_token_beyond_the_models_vocabulary(domain_files, neox_tokenizer, tmp_path):
    small = tiny_gpt(vocab_size=1000)  # the code tokens go far beyond 1000
    with pytest.raises(
        LMDataError, match=r"label 'code' file .*part-0.npy sequence \d+: token id \d+ is beyond"
    ):
        lm_evaluator(domain_files, neox_tokenizer, tmp_path).run(small)
    callable_model = LogitsAdapter(lambda ids: small(ids))
    with pytest.raises(LMDataError, match="beyond the model's vocabulary of 1000"):
        lm_evaluator(domain_files, neox_tokenizer, tmp_path).run(callable_model)

    # Not strict: only the labels the model cannot take fail.
    np.random.default_rng(0).integers(0, 1000, 3 * SEQ_LEN).astype(np.uint16).tofile(tmp_path / "low.npy")
    entry = lm_entry(domain_files, tmp_path)
    entry["domains"].append({"label": "low", "paths": [str(tmp_path / "low.npy")]})
    out = InLoopEvaluator(EvaluatorConfig(evaluators=[entry]), tokenizer=neox_tokenizer).run(small)
    assert {k for k in out if k.endswith("/failed")} == {f"eval/lm/{label}/failed" for label in LABELS}
    assert math.isfinite(out["eval/lm/low/ce"]) and math.isfinite(out["eval/lm/low/bpb"])


def test_sequences_longer_than_the_model(domain_files, neox_tokenizer, tmp_path):
    short = tiny_gpt()
    short.config.max_seq_len = SEQ_LEN - 1
    with pytest.raises(ConfigError, match=f"seq_len {SEQ_LEN} is longer than the model's context"):
        lm_evaluator(domain_files, neox_tokenizer, tmp_path).run(short)


def test_a_sequence_of_nan_logits_is_said_in_the_log_and_fails_under_strict(
    model, domain_files, neox_tokenizer, tmp_path, caplog
):
    """Logits NaN for every sequence starting with an odd token: the labels holding one have figures that
    are not finite, said in the log naming the label and the count; with `strict` the evaluation fails."""

    def poisoned(ids: torch.Tensor) -> torch.Tensor:
        logits = model(ids)
        return torch.where((ids[:, :1] % 2 == 1)[:, :, None], torch.full_like(logits, math.nan), logits)

    out = lm_evaluator(domain_files, neox_tokenizer, tmp_path, strict=False).run(LogitsAdapter(poisoned))
    bad = [label for label in LABELS if not math.isfinite(out[f"eval/lm/{label}/ce"])]
    assert bad, out
    for label in bad:
        assert re.search(rf"label '{label}': the NLL of [1-9]\d* of this rank's sequences is not finite", caplog.text)
    with pytest.raises(ModelOutputError, match=r"the NLL of \d+ of this rank's sequences is not finite"):
        lm_evaluator(domain_files, neox_tokenizer, tmp_path, strict=True).run(LogitsAdapter(poisoned))
