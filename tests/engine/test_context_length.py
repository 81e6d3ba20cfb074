"""A configured `max_length` longer than the model's own context is refused before any forward, naming both
lengths and the fix; one within it is taken as it is."""

from __future__ import annotations

import pytest
from helpers import tiny_neox

from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.families import make_adapter
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.models.gpt import GPT, GPTConfig


def small_gpt() -> GPT:
    return GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=16)).eval()


def test_a_max_length_past_learned_positions_is_refused():
    with pytest.raises(ConfigError, match=r"max_length 4096 is longer than the 16 positions the model GPT"):
        make_adapter(small_gpt(), 4096)
    assert make_adapter(small_gpt(), 16).max_length == 16
    assert make_adapter(small_gpt(), 8).max_length == 8
    assert make_adapter(small_gpt()).max_length == 16


def test_a_max_length_past_a_hugging_face_models_positions_is_refused():
    model = tiny_neox(max_positions=2048)
    with pytest.raises(ConfigError, match=r"max_length 100000 is longer than the 2048 positions .* at most 2048"):
        make_adapter(model, 100000)
    assert make_adapter(model, 1024).max_length == 1024


def test_the_evaluator_refuses_it_before_any_forward(data_root, neox_tokenizer):
    calls = []
    model = small_gpt()
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    config = EvaluatorConfig(evaluators=[{"task": "copa", "limit": 2}], data_root=str(data_root), max_length=4096)
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    with pytest.raises(ConfigError, match="at most 16"):
        evaluator.run(model)
    assert calls == []


def test_an_adapter_passed_in_is_held_to_the_configured_max_length(data_root, neox_tokenizer):
    """An adapter that knows a shorter context (a pipeline's seq_len 32) than the config's `max_length: 64` is
    refused, not cut to 32 without a word; a shorter configured length is what the requests are cut to."""
    adapter = LogitsAdapter(small_gpt(), max_length=16)
    with pytest.raises(ConfigError, match=r"max_length 64 is longer than the 16 positions the model LogitsAdapter"):
        make_adapter(adapter, 64)
    assert make_adapter(adapter, 8) is adapter
    config = EvaluatorConfig(evaluators=[{"task": "copa", "limit": 2}], data_root=str(data_root), max_length=8)
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    evaluator.run(adapter)
    assert evaluator.detail("copa").prepared.max_length == 8
