"""Evaluation leaves training untouched (docs/design.md, invariant 4), in one process: a seeded run with in-loop
eval trains bit for bit like one without; modes, requires_grad, gradients, RNG streams and autocast come
back as they were, even when the evaluation raises; compiled models are evaluated uncompiled.
(tests/test_distributed.py runs the same training comparison under DDP and FSDP2.)"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from helpers import rng_draws, seed_all
from torch import nn

from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.training_state import training_untouched
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.models.gpt import GPT, GPTConfig

TASKS = [{"task": "copa", "limit": 4, "batch_tokens": 64}]


def make_evaluator(data_root, tokenizer, **config) -> InLoopEvaluator:
    cfg = EvaluatorConfig(evaluators=TASKS, data_root=str(data_root), strict=True, **config)
    return InLoopEvaluator(cfg, tokenizer=tokenizer)


def draw_random_numbers(module: nn.Module, args) -> None:
    """Moves every RNG stream on each forward (as sampling layers do): only restoring them keeps training
    as it was."""
    torch.rand(1)
    np.random.rand()
    random.random()


def seeded_model() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, dropout=0.1))
    model.register_forward_pre_hook(draw_random_numbers)
    for block in model.blocks:
        block.register_forward_pre_hook(draw_random_numbers)
    return model


def train(evaluator: InLoopEvaluator | None, steps: int = 4, eval_every: int = 2, accumulate: int = 2):
    """Seeded training with dropout and gradient accumulation; evaluation (when given) at every
    `eval_every`-th step, once before the step's first micro-batch and once between micro-batches, when
    the gradients of the first are waiting in `.grad`."""
    model = seeded_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    seed_all(1)
    for step in range(steps):
        for micro in range(accumulate):
            if evaluator is not None and step % eval_every == 0:
                evaluator.run(model, step=step)
            ids = torch.randint(0, 50000, (2, 16 + int(np.random.randint(8)) + random.randrange(4)))
            logits = model(ids)
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
            (loss / accumulate).backward()
            del micro
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def test_training_with_in_loop_eval_is_bit_for_bit(data_root, neox_tokenizer):
    model_a, opt_a = train(make_evaluator(data_root, neox_tokenizer))
    model_b, opt_b = train(None)
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b), name
    state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state_a[key][name], state_b[key][name]), (key, name)


def test_state_is_restored_when_the_body_changes_it_or_raises():
    model = GPT(GPTConfig(vocab_size=100, d_model=16, n_layers=1, n_heads=2, dropout=0.1))
    model.train()
    model.blocks[0].eval()
    model.lm_head.weight.requires_grad_(False)  # a frozen part stays frozen
    model.tok_emb.weight.grad = torch.ones_like(model.tok_emb.weight)  # accumulated gradients survive
    grad = model.tok_emb.weight.grad
    modes = [m.training for m in model.modules()]
    flags = [p.requires_grad for p in model.parameters()]
    seed_all(3)
    expected = rng_draws()
    seed_all(3)
    with pytest.raises(RuntimeError, match="boom"), training_untouched(model):
        assert not model.training and not torch.is_grad_enabled()
        for p in model.parameters():
            p.requires_grad_(False)
            p.grad = None
        torch.set_autocast_enabled("cpu", True)
        random.random(), np.random.rand(), torch.rand(5)
        raise RuntimeError("boom")
    assert [m.training for m in model.modules()] == modes
    assert [p.requires_grad for p in model.parameters()] == flags
    assert model.tok_emb.weight.grad is grad and model.pos_emb.weight.grad is None
    assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()
    assert rng_draws() == expected


def test_eval_inside_autocast_leaves_it_as_it_was(data_root, neox_tokenizer):
    model = GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2))
    evaluator = make_evaluator(data_root, neox_tokenizer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        evaluator.run(model)
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


class LazyScale(nn.Module):
    """Creates and keeps a tensor on its first call, as rotary caches and FSDP2's unsharded buffers do."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model
        self.scale: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            self.scale = torch.ones(1)
        return self.model(input_ids) * self.scale


def test_tensors_created_during_eval_can_be_used_by_training(data_root, neox_tokenizer):
    """Under inference_mode the kept tensor would be an inference tensor and backward would fail."""
    wrapped = LazyScale(GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2)))
    make_evaluator(data_root, neox_tokenizer).run(LogitsAdapter(wrapped, max_length=512))
    assert wrapped.scale is not None and not wrapped.scale.is_inference()
    wrapped(torch.randint(0, 50000, (1, 8))).sum().backward()


def test_compiled_model_is_evaluated_uncompiled(data_root, neox_tokenizer):
    """torch.compile's wrapper is unwrapped: evaluation compiles nothing (a counting backend sees no new
    graph) and gives the uncompiled numbers; training's compiled graph still runs afterwards."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2))
    graphs: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(1)
        return gm.forward

    compiled = torch.compile(model, backend=counting_backend)
    ids = torch.randint(0, 50000, (2, 8))
    try:
        compiled(ids)
    except Exception as exc:  # torch.compile is not supported everywhere (Python versions, platforms)
        pytest.skip(f"torch.compile does not run here: {type(exc).__name__}: {exc}")
    assert len(graphs) == 1
    found = make_evaluator(data_root, neox_tokenizer).run(compiled)
    assert len(graphs) == 1, "evaluation went through the compiled module"
    assert found == make_evaluator(data_root, neox_tokenizer).run(model)
    compiled(ids)
    assert len(graphs) == 1, "evaluation made training recompile"


@pytest.mark.parametrize("flag", [True, False])
def test_compiler_reset_after_eval_only_when_asked(data_root, neox_tokenizer, monkeypatch, flag):
    calls: list[int] = []
    monkeypatch.setattr(torch.compiler, "reset", lambda: calls.append(1))
    model = GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2))
    make_evaluator(data_root, neox_tokenizer, compiler_reset=flag).run(model)
    assert calls == ([1] if flag else [])


def test_compiler_reset_config_check():
    with pytest.raises(ConfigError, match="compiler_reset must be true or false, found 'yes'"):
        EvaluatorConfig(compiler_reset="yes")
    assert EvaluatorConfig.from_dict({"compiler_reset": True, "evaluators": TASKS}).compiler_reset is True
