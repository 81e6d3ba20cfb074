"""Hugging Face models pack whatever attention implementation they train with: during an evaluation's forward
their attention runs the engine's (`integrations/hf/attention.py`), and each request gets the numbers of one
plain forward of its own row on the same weights run with sdpa.

The models here are marked `flash_attention_2`, which is not installed on the CPU: the test registers in its
place a stand-in kernel (causal SDPA, as flash-attn computes a row without padding) that training may call and
that raises while an evaluation runs, so every number below came through the engine's attention. The
registry is restored after each test.
"""

from __future__ import annotations

import copy
import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import packing_reference
import pytest
import torch
from helpers import two_documents
from hf_models import tiny_hf_model

from inloop_eval.engine.adapter import ForwardInputs, TokenCount
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.batching import BatchShape, plan_batches
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.scoring import PairScores, run_batches
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations.hf.adapter import HFCausalLMAdapter
from inloop_eval.integrations.hf.attention import ATTENTION_NAME, model_configs, routed_attention
from inloop_eval.requests.table import PairSet, build_requests
from inloop_eval.tasks import get_task, load_docs

transformers = importlib.import_module("transformers")
sdpa_attention_forward = importlib.import_module("transformers.integrations.sdpa_attention").sdpa_attention_forward
ALL_ATTENTION_FUNCTIONS = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS

MAX_LENGTH = 512
FLASH = "flash_attention_2"


class FlashStandIn:
    """The `flash_attention_2` kernel of these tests: causal SDPA, raising while `forbidden()` is open."""

    def __init__(self) -> None:
        self.open = False
        self.calls = 0

    def __call__(self, module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN003, ANN204
        if self.open:
            raise AssertionError(f"the model's own {FLASH} kernel was called during an evaluation")
        self.calls += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    @contextmanager
    def forbidden(self) -> Iterator[None]:
        self.open = True
        try:
            yield
        finally:
            self.open = False


@pytest.fixture
def flash() -> Iterator[FlashStandIn]:
    """`flash_attention_2` replaced by a `FlashStandIn` for the test's duration; the registry restored."""
    registry = type(ALL_ATTENTION_FUNCTIONS)._global_mapping
    saved = dict(registry)
    stand_in = FlashStandIn()
    transformers.AttentionInterface.register(FLASH, stand_in)
    yield stand_in
    registry.clear()
    registry.update(saved)


def hf_pair(model_type: str, vocab_size: int = 50304, **overrides):
    """The same random weights twice: run with sdpa (the reference) and marked `flash_attention_2`."""
    sdpa = tiny_hf_model(model_type, vocab_size, **overrides)
    marked = copy.deepcopy(sdpa)
    marked.config._attn_implementation_internal = FLASH  # flash-attn is not installed on the CPU
    return sdpa, marked


def reference_scores(model, pairs: PairSet, pair_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One forward per request over its own row (`packing_reference`)."""
    return packing_reference.reference_scores(
        lambda ids, n: model(input_ids=ids, use_cache=False, logits_to_keep=n).logits[0], pairs, pair_ids
    )


def score(adapter, pairs: PairSet, pair_ids: np.ndarray, rendering: str, **plan) -> PairScores:
    with torch.inference_mode():
        batches = plan_batches(pairs, pair_ids, **plan)
        return run_batches(adapter, batches, len(pair_ids), TokenCount(), mask_rendering=rendering)


@pytest.fixture(scope="module")
def shots(data_root, neox_tokenizer) -> tuple[PairSet, np.ndarray]:
    """Two documents of a 5-shot task, main pairs then unconditional pairs, as the evaluator scores them."""
    task = get_task("olmo:arc_easy_rc_5shot")
    table = build_requests(task, load_docs(task, data_root, limit=2), neox_tokenizer, MAX_LENGTH, with_uncond=True)
    uncond = np.unique(table.uncond_id[table.uncond_id >= 0])
    return table.pairs.concat(table.uncond), np.concatenate([np.arange(len(table)), len(table) + uncond])


def plans(shots: tuple[PairSet, np.ndarray]) -> dict[str, tuple[PairSet, np.ndarray, dict]]:
    """The two paths checked: packed rows of `two_documents`, and a 5-shot task's shots kept once."""
    packed = {"shape": BatchShape(packing=True), "max_length": 64}
    kept = {"shape": BatchShape(packing=True, keep_prefixes=True), "by_cost": False}
    return {"packed": (two_documents(), np.arange(5), packed), "kept prefixes": (*shots, kept)}


def assert_routed_as_plain_rows(flash: FlashStandIn, sdpa, marked, shots) -> dict[str, np.ndarray]:
    """Packed rows and kept prefixes, dense and block renderings, on the flash-marked model: per request the
    numbers of one plain forward on the model run with sdpa, and the two renderings the same; the flash
    kernel never called. Returns each path's reference log-likelihoods."""
    adapter = make_adapter(marked)
    assert isinstance(adapter, HFCausalLMAdapter) and adapter.needs.packing and adapter.needs.prefix_reuse
    references = {}
    for path, (pairs, ids, plan) in plans(shots).items():
        plan = {"batch_tokens": 4096, "max_length": MAX_LENGTH, **plan}
        if path == "kept prefixes":
            assert any(b.keeps_prefix for b in plan_batches(pairs, ids, **plan)), "the shots are kept once"
        ref_ll, ref_greedy = reference_scores(sdpa, pairs, ids)
        with flash.forbidden():
            found = {r: score(adapter, pairs, ids, r, **plan) for r in ("dense", "block")}
        for rendering, scores in found.items():
            where = f"{path}, {rendering}"
            np.testing.assert_allclose(scores.ll, ref_ll, atol=1e-5, rtol=0, err_msg=where)
            np.testing.assert_array_equal(scores.greedy, ref_greedy, err_msg=where)
        np.testing.assert_allclose(found["dense"].ll, found["block"].ll, atol=1e-5, rtol=0, err_msg=path)
        np.testing.assert_array_equal(found["dense"].greedy, found["block"].greedy, err_msg=path)
        references[path] = ref_ll
    assert marked.config._attn_implementation == FLASH and flash.calls == 0
    return references


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt_neox"])
def test_flash_marked_models_pack_and_keep_prefixes(flash, shots, model_type):
    """Packed rows and kept prefixes, dense and block renderings: per request the numbers of one plain forward
    on the model run with sdpa, and the two renderings the same; the flash kernel never called."""
    assert_routed_as_plain_rows(flash, *hf_pair(model_type), shots)


# A window of 3 tokens (each query sees itself and the 2 before it) binds in both paths: in the packed rows
# of `two_documents` (positions up to 4, columns up to 6: a window on columns would differ) and in the shots.
WINDOW = 3
SLIDING = {
    "mistral": {"sliding_window": WINDOW},  # every layer sliding
    "qwen2": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},  # full, sliding
}


@pytest.mark.parametrize("model_type", sorted(SLIDING))
def test_flash_marked_sliding_window_models_pack_and_keep_prefixes(flash, shots, model_type):
    """Models with a sliding window, on every layer (mistral) or on the layers `layer_types` names (qwen2):
    packed and with kept prefixes, dense and block, the numbers of one plain sdpa forward per request, whose
    mask is transformers' own; the window binds (the same weights without it give other numbers)."""
    sdpa, marked = hf_pair(model_type, **SLIDING[model_type])
    assert sdpa.config.sliding_window == WINDOW
    if model_type == "qwen2":
        assert sdpa.config.layer_types == ["full_attention", "sliding_attention"]
    references = assert_routed_as_plain_rows(flash, sdpa, marked, shots)
    unwindowed, _ = hf_pair(model_type, sliding_window=None)
    for a, b in zip(unwindowed.parameters(), sdpa.parameters(), strict=True):
        assert torch.equal(a, b)
    for path, (pairs, ids, _plan) in plans(shots).items():
        assert not np.allclose(reference_scores(unwindowed, pairs, ids)[0], references[path], atol=1e-3), path


def test_the_evaluator_scores_letter_keys_and_pmi_through_the_engines_attention(flash, data_root, neox_tokenizer):
    """Through `InLoopEvaluator`: a letter-key task and a task with PMI (unconditional requests), packed, on a
    flash-marked llama, give the figures and per-request numbers of plain rows on the model run with sdpa."""
    sdpa, marked = hf_pair("llama")
    tasks = ("arc_easy_mc", "arc_easy")
    config = EvaluatorConfig(
        evaluators=[{"task": t, "limit": 4} for t in tasks], data_root=str(data_root), strict=True
    )
    routed, plain = (InLoopEvaluator(config, tokenizer=neox_tokenizer) for _ in range(2))
    with flash.forbidden():
        found = routed.run(marked)
    expected = plain.run(LogitsAdapter(lambda ids: sdpa(input_ids=ids, use_cache=False).logits, max_length=MAX_LENGTH))
    assert "eval/downstream/arc_easy/acc_pmi" in found and "eval/downstream/arc_easy_mc/acc" in found
    for task in tasks:
        result, reference = routed.detail(task), plain.detail(task)
        if task == "arc_easy":  # letter keys take one row per document, packed or not
            assert len(result.uncond_ids) > 0
            assert result.scores.tokens_forwarded < reference.scores.tokens_forwarded, "packed"
        np.testing.assert_allclose(result.scores.ll, reference.scores.ll, atol=1e-5, rtol=0, err_msg=task)
        np.testing.assert_array_equal(result.scores.greedy, reference.scores.greedy, err_msg=task)
    for key, value in expected.items():
        if "/acc" in key and "stderr" not in key:
            assert found[key] == value, key
    assert marked.config._attn_implementation == FLASH and flash.calls == 0


def test_a_flash_marked_llama_through_the_evaluator_with_the_compiled_block_mask(
    flash, data_root, neox_tokenizer, caplog
):
    """Through `InLoopEvaluator` with the block mask and flex_attention compiled (inductor on CPU, as on a GPU):
    a letter-key 5-shot task (its shots kept), a task with PMI and a 5-shot rc task on a flash-marked llama
    give every request the numbers of one request per row on the model run with sdpa (1e-5, the same
    greedy flags), the flash kernel never called and no call falling back to the dense mask."""
    sdpa, marked = hf_pair("llama")
    tasks = ("arc_easy", "olmo:arc_easy_rc_5shot", "olmo:mmlu_stem_test_mc_5shot_fast")
    entries = [{"task": t, "limit": 4, "batch_tokens": 2048} for t in tasks]
    common = {"evaluators": entries, "data_root": str(data_root), "strict": True, "max_length": MAX_LENGTH}
    routed = InLoopEvaluator(
        EvaluatorConfig(**common, attention_mask="block", compile_attention=True), tokenizer=neox_tokenizer
    )
    plain = InLoopEvaluator(EvaluatorConfig(**common), tokenizer=neox_tokenizer)
    with flash.forbidden(), caplog.at_level(logging.INFO, logger="inloop_eval.evaluators.orchestrator"):
        found = routed.run(marked)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("flex_attention ")]
    assert lines and lines[0].startswith("flex_attention compiled") and "dense mask instead" not in lines[0]
    expected = plain.run(LogitsAdapter(lambda ids: sdpa(input_ids=ids, use_cache=False).logits, max_length=MAX_LENGTH))
    assert found == pytest.approx(expected, abs=1e-5)
    for task in tasks:
        result, reference = routed.detail(task), plain.detail(task)
        np.testing.assert_allclose(result.scores.ll, reference.scores.ll, atol=1e-5, rtol=0, err_msg=task)
        np.testing.assert_array_equal(result.scores.greedy, reference.scores.greedy, err_msg=task)
    assert routed.tokens_forwarded < plain.tokens_forwarded and flash.calls == 0


@pytest.mark.parametrize("interrupt", [RuntimeError, KeyboardInterrupt])
def test_the_implementation_is_restored_when_a_forward_raises(flash, interrupt):
    """A forward that raises inside the model leaves every config on its own implementation."""
    _, marked = hf_pair("llama", vocab_size=128)
    adapter = make_adapter(marked)

    def fail(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        assert marked.config._attn_implementation == ATTENTION_NAME  # the forward runs routed
        raise interrupt("stopped mid-forward")

    marked.model.layers[1].mlp.forward = fail
    zero = torch.zeros(1, dtype=torch.long)
    with pytest.raises(interrupt, match="stopped mid-forward"):
        adapter.forward(ForwardInputs(torch.ones(2, 5, dtype=torch.long), zero, zero, zero, zero))
    assert [c._attn_implementation for c in model_configs(marked)] == [FLASH]


def test_every_config_of_a_composite_model_is_routed_and_restored():
    """A model of sub-models (llava: a CLIP vision tower, a llama language model): each config, sub-configs
    included, runs the engine's attention in the body and its own implementation after it, also when the
    body is interrupted."""
    text = dict(model_type="llama", vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=64)  # fmt: skip
    vision = dict(model_type="clip_vision_model", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                  intermediate_size=64, image_size=32, patch_size=16)  # fmt: skip
    config = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_id=5)
    own = {"": "sdpa", "text_config": "sdpa", "vision_config": "eager"}
    model = transformers.LlavaForConditionalGeneration._from_config(config, attn_implementation=own)
    model.config.text_config._attn_implementation_internal = FLASH
    configs = model_configs(model)
    assert {id(c) for c in configs} == {id(model.config), id(model.config.text_config), id(model.config.vision_config)}
    before = [c._attn_implementation for c in configs]
    assert sorted(before) == sorted([FLASH, "sdpa", "eager"])
    with pytest.raises(KeyboardInterrupt), routed_attention(model):
        assert [c._attn_implementation for c in configs] == [ATTENTION_NAME] * 3
        raise KeyboardInterrupt
    assert [c._attn_implementation for c in configs] == before


def test_training_is_untouched(flash, data_root, neox_tokenizer):
    """Training steps (dropout on, the flash kernel in use) after an evaluation are bit for bit those without
    it; the config is as it was and the model's own kernel ran every training forward."""
    _, trained = hf_pair("llama", attention_dropout=0.3)
    evaluated = copy.deepcopy(trained)
    config = EvaluatorConfig(evaluators=[{"task": "arc_easy", "limit": 2}], data_root=str(data_root), strict=True)
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    before = evaluated.config.to_dict()
    ids = torch.randint(3, 1000, (2, 16), generator=torch.Generator().manual_seed(1))
    losses = {}
    for name, model in (("trained", trained), ("evaluated", evaluated)):
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(2)
        steps = []
        for step in range(2):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.append(loss.item())
            if name == "evaluated" and step == 0:
                with flash.forbidden():
                    evaluator.run(model)
                assert model.training
        losses[name] = steps
    assert losses["trained"] == losses["evaluated"]
    for (name, a), b in zip(trained.named_parameters(), evaluated.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert evaluated.config.to_dict() == before and evaluated.config._attn_implementation == FLASH
    assert flash.calls == 4 * trained.config.num_hidden_layers
