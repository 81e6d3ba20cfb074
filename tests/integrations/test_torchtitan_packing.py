"""torchtitan decoders take packed rows and kept prefixes: each request gets the numbers of its own unshared row
(llama3 and qwen3 shapes, dense and block mask renderings, SDPA and FlexAttention as core attention, a
sequence-parallel width multiple), the model comes back exactly as it was, compiled blocks run uncompiled,
training is bit for bit as without the evaluation, and the models it was not verified for go one request per
row with one log line. (Tensor parallelism: tests/integrations/test_torchtitan.py, whose validator packs.)

The reference is independent of the planner: one plain forward per request over context + continuation[:-1]
and a float64 log-softmax over its full logits, by the same weights with causal SDPA as core attention.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torchtitan_cpu
from packing_reference import (
    MAX_LENGTH,
    assert_same_state,
    model_state,
    one_packed_batch,
    packed_plan,
    plain_reference,
    score,
    task_pairs,
)
from torchtitan.models.llama3 import Llama3Model
from torchtitan_cpu import VOCAB, tiny_decoder

from inloop_eval.engine.adapter import TokenCount
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.batching import BatchShape, plan_batches
from inloop_eval.engine.prefix_sharing import trie_minimum_tokens
from inloop_eval.engine.scoring import run_batches
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations.torchtitan import attention as torchtitan_attention
from inloop_eval.integrations.torchtitan.adapter import TorchTitanAdapter
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.requests.table import PairSet

torchtitan_cpu.use_cpu()

# rc with four choices, rc with unconditional requests (PMI), letter keys, and 5-shot rc whose shots are kept
TASKS = ("hellaswag", "arc_easy", "mmlu_mc", "olmo:arc_easy_rc_5shot")
N_DOCS = 4
KEPT_SHOTS = "olmo:arc_easy_rc_5shot"
# Tokens forwarded by the packed plans at most this many times the trie minimum of the requests.
TRIE_FACTOR = 1.2


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def requests(data_root, neox_tokenizer) -> dict[str, tuple[PairSet, np.ndarray]]:
    """Each task's first N_DOCS documents: their pairs, and the ids of the main then unconditional pairs."""
    return task_pairs(TASKS, data_root, neox_tokenizer, N_DOCS, MAX_LENGTH)


def adapter_of(model, seq_multiple: int = 1, widths: list[int] | None = None) -> TorchTitanAdapter:
    """The adapter as the validator makes it, the model called on the token ids alone; each forward's width
    appended to `widths` where given."""

    def forward(ids_BT: torch.Tensor) -> torch.Tensor:
        if widths is not None:
            widths.append(ids_BT.shape[1])
        return model(ids_BT)

    return TorchTitanAdapter(model, forward=forward, max_length=MAX_LENGTH, seq_multiple=seq_multiple)


def trie_minimum(pairs: PairSet, pair_ids: np.ndarray) -> int:
    """Every distinct prefix of the requests' own rows (context + continuation[:-1]) once."""
    rows = [np.concatenate([pairs.context(int(p)), pairs.continuation(int(p))[:-1]]) for p in pair_ids]
    return trie_minimum_tokens(rows)


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_packed_rows_give_the_unshared_numbers(family, requests):
    """Every task: packed rows and kept prefixes in both mask renderings, kept prefixes on a FlexAttention
    twin and with a sequence-parallel width multiple of 8 (the kept shots' row padded to it), and one
    request per row: loglikelihoods within 1e-5 of one plain forward per request, the same greedy flags.
    The cost model's plans, with and without kept prefixes, forward at most TRIE_FACTOR x the trie minimum
    of all these requests (measured: 1.12 x; 1.10 x for HellaSwag, 1.44 x for MMLU's letter keys, whose
    short unconditional rows are padded to their contexts' width)."""
    model = tiny_decoder(family)
    flex = tiny_decoder(family, core="flex")  # the same seeded weights: its own kernel is never called
    adapter, widths = adapter_of(model), []
    assert adapter.needs.packing and adapter.needs.prefix_reuse
    adapters = {"sdpa": adapter, "flex": adapter_of(flex), "width multiple 8": adapter_of(model, 8, widths)}
    least, forwarded = 0, {False: 0, True: 0}
    for task, (pairs, ids) in requests.items():
        ref_ll, ref_greedy = plain_reference(model, pairs, ids)
        paths = {
            f"{'kept prefixes' if keep else 'packed'}, {rendering}": score(
                adapter, pairs, ids, rendering, **packed_plan(keep)
            )
            for keep in (False, True)
            for rendering in ("dense", "block")
        }
        paths["kept prefixes, flex"] = score(adapters["flex"], pairs, ids, **packed_plan(True))
        split = packed_plan(True, width_multiple=8)
        paths["kept prefixes, width multiple 8"] = score(adapters["width multiple 8"], pairs, ids, **split)
        paths["one request per row"] = score(adapter, pairs, ids, batch_tokens=4096, shape=BatchShape())
        for name, found in paths.items():
            np.testing.assert_allclose(
                found.ll, ref_ll, atol=1e-5, rtol=0, err_msg=f"{family} {task}: {name}"
            )
            np.testing.assert_array_equal(found.greedy, ref_greedy, err_msg=f"{family} {task}: {name}")
        if task == KEPT_SHOTS:
            kept = [b.prefix_length for b in plan_batches(pairs, ids, **split) if b.keeps_prefix]
            assert kept and any(length % 8 for length in kept), kept  # the shots are kept, their row padded
        least += trie_minimum(pairs, ids)
        for keep in forwarded:
            forwarded[keep] += sum(
                b.n_tokens for b in plan_batches(pairs, ids, **packed_plan(keep, by_cost=True))
            )
    assert widths and all(w % 8 == 0 for w in widths), sorted(set(widths))
    assert max(forwarded.values()) <= TRIE_FACTOR * least, (forwarded, least)


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_the_model_comes_back_as_it_was(family, requests):
    """After packed forwards with kept prefixes, and after a KeyboardInterrupt inside the model while the
    shots are kept, no override is left, the model's own forward gives the same logits bit for bit, and its
    parameters, buffers and hooks are the same."""
    model = tiny_decoder(family)
    ids = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        logits = model(ids)
    before = model_state(model)
    pairs, pair_ids = requests[KEPT_SHOTS]
    batches = plan_batches(pairs, pair_ids, **packed_plan(keep_prefixes=True))
    first_kept = next(i for i, b in enumerate(batches) if b.keeps_prefix)
    score(adapter_of(model), pairs, pair_ids, **packed_plan(keep_prefixes=True))
    assert_same_state(before, model_state(model))

    def interrupt(module, args, output):
        assert "forward" in module.attention.inner_attention.__dict__  # the override is on
        raise KeyboardInterrupt

    hook = model.layers["1"].register_forward_hook(interrupt)
    with pytest.raises(KeyboardInterrupt), torch.no_grad():
        run_batches(adapter_of(model), batches[first_kept:], len(pair_ids), TokenCount())
    hook.remove()
    assert_same_state(before, model_state(model))
    with torch.no_grad():
        assert torch.equal(model(ids), logits)


def test_compiled_blocks_run_uncompiled_and_training_does_not_recompile(requests):
    """Blocks compiled as torchtitan's `apply_compile` compiles them (`Module.compile`): a packed evaluation
    with kept prefixes compiles no graph (a counting backend sees none) and gives the uncompiled numbers;
    afterwards the training-shaped call runs the graph compiled before, without recompiling."""
    model, twin = tiny_decoder("llama3"), tiny_decoder("llama3")
    graphs: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(1)
        return gm.forward

    for block in model.layers.values():
        block.compile(backend=counting_backend, fullgraph=True)
    ids = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        try:
            logits = model(ids)
        except Exception as exc:  # torch.compile is not supported everywhere (Python versions, platforms)
            pytest.skip(f"torch.compile does not run here: {type(exc).__name__}: {exc}")
    compiled = len(graphs)
    assert compiled > 0
    pairs, pair_ids = requests[KEPT_SHOTS]
    found = score(adapter_of(model), pairs, pair_ids, **packed_plan(keep_prefixes=True))
    assert len(graphs) == compiled, "the packed forward went through a compiled block"
    expected = score(adapter_of(twin), pairs, pair_ids, **packed_plan(keep_prefixes=True))
    np.testing.assert_array_equal(found.ll, expected.ll)
    with torch.no_grad():
        assert torch.equal(model(ids), logits)
    assert len(graphs) == compiled, "training recompiled after the evaluation"


def evaluator(data_root, neox_tokenizer) -> InLoopEvaluator:
    config = EvaluatorConfig(
        evaluators=[{"task": "arc_easy", "limit": 5, "metrics": ["acc", "acc_norm", "acc_pmi"]}],
        data_root=str(data_root),
        strict=True,
        max_length=MAX_LENGTH,
    )
    return InLoopEvaluator(config, tokenizer=neox_tokenizer)


def train(family: str, evaluate: InLoopEvaluator | None, steps: int = 4) -> list[torch.Tensor]:
    """Seeded AdamW steps on random tokens drawn from torch's global generator after each step's
    evaluation (when given), so an evaluation that moved the generator or left anything of itself in the
    model changes the parameters; the parameters after the last step."""
    model = tiny_decoder(family).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1)
    for step in range(steps):
        if evaluate is not None and step % 2 == 1:
            adapter = adapter_of(model)
            assert adapter.needs.packing
            evaluate.run(adapter, step=step)
        ids = torch.randint(0, 50000, (2, 33))
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_training_is_bit_identical_with_a_packed_evaluation_in_between(family, data_root, neox_tokenizer):
    """torchtitan's decoders have no dropout: the check is the parameters after four steps, bit for bit,
    with packed evaluations (kept prefixes among them) after the first and third steps and without; the
    evaluation's figures are those of full logits one request per row, with fewer tokens."""
    ours = evaluator(data_root, neox_tokenizer)
    after_evaluations, after_none = train(family, ours), train(family, None)
    for p, q in zip(after_evaluations, after_none, strict=True):
        assert torch.equal(p, q)
    model = tiny_decoder(family)
    found, plain = evaluator(data_root, neox_tokenizer), evaluator(data_root, neox_tokenizer)
    figures = found.run(adapter_of(model))
    assert figures == pytest.approx(plain.run(LogitsAdapter(model, MAX_LENGTH)), abs=1e-5)
    assert found.tokens_forwarded < plain.tokens_forwarded


class SubclassedLlama3(Llama3Model):
    """A user's subclass: its forward may differ from the verified one."""


def refused_models() -> dict[str, tuple[torch.nn.Module, str]]:
    """Model -> the words its log line must hold."""
    sub = tiny_decoder("llama3")
    sub.__class__ = SubclassedLlama3
    return {
        "varlen": (
            tiny_decoder("llama3", core="varlen"),
            "core attention VarlenAttention at 'layers.0.attention'",
        ),
        "subclass": (sub, "model type SubclassedLlama3 (only Llama3Model and Qwen3Model are verified)"),
        "gpt": (GPT(GPTConfig(d_model=32, n_layers=1, n_heads=2)), "model type GPT (only Llama3Model"),
        "moe": (tiny_decoder("qwen3", moe=True), "mixture of experts at 'layers.0'"),
    }


def test_unverified_models_go_one_request_per_row_said_once(caplog):
    """Each refused model: no packing, one INFO line naming the model, what was not verified and where
    (however many adapters are made for it), and a packed batch handed to its adapter anyway is refused."""
    batch = one_packed_batch()
    for name, (model, why) in refused_models().items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=torchtitan_attention.__name__):
            adapters = [adapter_of(model) for _ in range(3)]
        assert not any(a.needs.packing or a.needs.prefix_reuse for a in adapters), name
        assert len(caplog.records) == 1, name
        message = caplog.records[0].getMessage()
        assert message.startswith(f"torchtitan model {type(model).__name__}: scoring one request per row"), (
            message
        )
        assert why in message, message
        with pytest.raises(ValueError, match="plan with the adapter's needs.packing"):
            run_batches(adapters[0], [batch], 2, TokenCount())
