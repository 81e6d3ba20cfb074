"""OLMo-core Transformers take packed rows: each request gets the numbers of its own unshared row on every call
path (logits_to_keep, full logits, one row per batch, kept prefixes, bfloat16 autocast, compiled blocks), the
model comes back exactly as it was, and the models it was not verified for go one request per row with one
log line.

The reference is independent of the planner: one plain forward per request over context + continuation[:-1]
and a float64 log-softmax over its full logits. (FSDP2 and tensor parallelism: tests/test_distributed.py,
checks `olmo_core_fsdp` and `olmo_core_tp`; what every framework's route shares:
tests/integrations/test_framework_conformance.py.)
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch
from flash_on_cpu import flash_kernel
from olmo_core.nn.attention import SlidingWindowAttentionConfig
from olmo_core.nn.attention.backend import TorchAttentionBackend
from olmo_core.nn.transformer import Transformer, TransformerBlockType, TransformerConfig
from olmo_core_models import VOCAB, olmo3_flash_model, olmo_core_model, torch_backend_twin
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
from torch._dynamo.utils import counters

from inloop_eval.engine.adapter import TokenCount
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.batching import BatchShape, plan_batches
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.scoring import run_batches
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations.olmo_core import attention as olmo_core_attention
from inloop_eval.integrations.olmo_core.adapter import OLMoCoreAdapter
from inloop_eval.requests.table import PairSet

# rc, rc, letter keys, partial scoring; then 5-shot rc and letter keys, whose shared shots share rows
TASKS = ("hellaswag", "arc_easy", "mmlu_mc", "winogrande", "olmo:arc_easy_rc_5shot", "olmo:mmlu_stem_test_mc_5shot_fast")
N_DOCS = 4
LETTER_KEYS = ("mmlu_mc", "olmo:mmlu_stem_test_mc_5shot_fast")
# 5-shot, its shots fit MAX_LENGTH: they are forwarded once and kept (MMLU's shots are cut to fit instead)
KEPT_SHOTS = "olmo:arc_easy_rc_5shot"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def requests(data_root, neox_tokenizer) -> dict[str, tuple[PairSet, np.ndarray]]:
    """Each task's first N_DOCS documents: their pairs, and the ids of the main then unconditional pairs."""
    return task_pairs(TASKS, data_root, neox_tokenizer, N_DOCS, MAX_LENGTH)


@pytest.mark.parametrize("shape", ["olmo2", "llama", "olmo3_window"])
def test_packed_rows_give_the_unshared_numbers(shape, requests):
    """Every path, every task: loglikelihoods within 1e-5 of one plain forward per request, the same
    greedy flags; packed batches forward fewer tokens than one request per row; the shots of KEPT_SHOTS
    are kept once."""
    model = olmo_core_model(shape)
    adapter = make_adapter(model, MAX_LENGTH)
    assert isinstance(adapter, OLMoCoreAdapter) and adapter.needs.packing and adapter.keeps_logits
    kept = adapter.needs.prefix_reuse
    assert kept
    full_logits = OLMoCoreAdapter(model, MAX_LENGTH)
    full_logits.keeps_logits = False  # OLMo-core without `logits_to_keep`: the whole [B, T, V] logits
    for task, (pairs, ids) in requests.items():
        ref_ll, ref_greedy = plain_reference(model, pairs, ids)
        paths = {
            "packed": score(adapter, pairs, ids, **packed_plan()),
            "packed, full logits": score(full_logits, pairs, ids, **packed_plan()),
            "packed, one row per batch": score(adapter, pairs, ids, **packed_plan(batch_tokens=1)),
            "kept prefixes": score(adapter, pairs, ids, **packed_plan(keep_prefixes=kept)),
            "kept prefixes, full logits": score(full_logits, pairs, ids, **packed_plan(keep_prefixes=kept)),
            "kept prefixes, one row per batch": score(adapter, pairs, ids, **packed_plan(kept, batch_tokens=1)),
            "one request per row": score(adapter, pairs, ids, batch_tokens=4096, shape=BatchShape(packing=False)),
        }
        for name, found in paths.items():
            np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0, err_msg=f"{task}: {name}")
            np.testing.assert_array_equal(found.greedy, ref_greedy, err_msg=f"{task}: {name}")
        if task not in LETTER_KEYS:  # letter keys take one context row per document either way
            assert paths["packed"].tokens_forwarded < paths["one request per row"].tokens_forwarded, task
        if task == KEPT_SHOTS:
            batches = plan_batches(pairs, ids, **packed_plan(keep_prefixes=kept))
            assert any(b.keeps_prefix for b in batches), "the shots are kept once"


def test_a_sliding_window_shorter_than_the_kept_prefix(requests):
    """A first layer whose window (16 tokens) is shorter than the kept shots: the first queries after them
    see the shots' last keys only, later ones none of them, as in their unshared rows, whose numbers they
    give."""
    window = 16
    sliding = SlidingWindowAttentionConfig(
        pattern=[window, -1],
        force_full_attention_on_first_layer=False,
        force_full_attention_on_last_layer=False,
    )
    model = olmo_core_model("olmo3_window", sliding_window=sliding)
    adapter = make_adapter(model, MAX_LENGTH)
    pairs, ids = requests[KEPT_SHOTS]
    plan = packed_plan(keep_prefixes=adapter.needs.prefix_reuse)
    after = [b for b in plan_batches(pairs, ids, **plan) if b.prefix_length and not b.keeps_prefix]
    assert after and all(b.prefix_length > window for b in after)
    assert any(b.position_ids_BT.max() >= b.prefix_length + window for b in after)  # past the shots' reach
    ref_ll, ref_greedy = plain_reference(model, pairs, ids)
    for batch_tokens in (4096, 1):
        found = score(adapter, pairs, ids, **{**plan, "batch_tokens": batch_tokens})
        np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0, err_msg=f"{batch_tokens=}")
        np.testing.assert_array_equal(found.greedy, ref_greedy, err_msg=f"{batch_tokens=}")


@pytest.mark.parametrize("shape", ["olmo2", "llama", "olmo3_window"])
def test_packed_rows_under_bfloat16_autocast(shape, requests):
    """Under bfloat16 autocast, packed rows give the numbers of one plain forward per request under the
    same autocast to within bfloat16's rounding (batching alone moves them by up to 3e-3 here), and the
    same greedy flags; the float32 numbers are not those."""
    model = olmo_core_model(shape)
    adapter = make_adapter(model, MAX_LENGTH)
    for task in ("hellaswag", "winogrande"):
        pairs, ids = requests[task]
        float32 = score(adapter, pairs, ids, **packed_plan())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref_ll, ref_greedy = plain_reference(model, pairs, ids)
            packed = score(adapter, pairs, ids, **packed_plan())
        np.testing.assert_allclose(packed.ll, ref_ll, atol=5e-3, rtol=0, err_msg=task)
        np.testing.assert_array_equal(packed.greedy, ref_greedy, err_msg=task)
        assert np.abs(float32.ll - ref_ll).max() > 1e-3, task  # autocast was on


@pytest.mark.parametrize("task", ["hellaswag", KEPT_SHOTS])
def test_the_model_comes_back_as_it_was(requests, task):
    """After packed forwards (kept prefixes too), and after one that raises inside the model (for the kept
    shots, while they are kept), no override is left, the model's own forward gives the same logits bit for
    bit, and its parameters, buffers and hooks are the same."""
    model = olmo_core_model("olmo2")
    ids = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        logits = model(ids)
    before = model_state(model)
    pairs, pair_ids = requests[task]
    plan = packed_plan(keep_prefixes=True)
    batches = plan_batches(pairs, pair_ids, **plan)
    first_kept = next((i for i, b in enumerate(batches) if b.keeps_prefix), 0)
    assert batches[first_kept].keeps_prefix == (task == KEPT_SHOTS)
    score(make_adapter(model, MAX_LENGTH), pairs, pair_ids, **plan)
    assert_same_state(before, model_state(model))

    def fail(module, args, output):
        assert "forward" in module.attention.backend.__dict__  # the override is on
        raise RuntimeError("boom")

    hook = model.blocks["1"].register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
        run_batches(make_adapter(model, MAX_LENGTH), batches[first_kept:], len(pair_ids), TokenCount())
    hook.remove()
    assert_same_state(before, model_state(model))
    with torch.no_grad():
        assert torch.equal(model(ids), logits)


def test_compiled_blocks_run_uncompiled_and_training_does_not_recompile(requests):
    """Blocks compiled as OLMo-core's `apply_compile` compiles them (`Module.compile`): a packed evaluation,
    kept prefixes too, compiles no graph (a counting backend sees none) and gives the uncompiled numbers;
    afterwards the training-shaped call runs the graph compiled before, without recompiling."""
    model, twin = olmo_core_model("olmo2"), olmo_core_model("olmo2")
    graphs: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(1)
        return gm.forward

    for block in model.blocks.values():
        block.compile(backend=counting_backend)
    ids = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        try:
            logits = model(ids)
        except Exception as exc:  # torch.compile is not supported everywhere (Python versions, platforms)
            pytest.skip(f"torch.compile does not run here: {type(exc).__name__}: {exc}")
    compiled = len(graphs)
    assert compiled > 0
    pairs, pair_ids = requests["hellaswag"]  # every batch packed: four continuations per context
    batches = plan_batches(pairs, pair_ids, **packed_plan())
    assert all(b.span_end_BT is not None for b in batches)
    for task, plan in (("hellaswag", packed_plan()), (KEPT_SHOTS, packed_plan(keep_prefixes=True))):
        pairs, pair_ids = requests[task]
        found = score(make_adapter(model, MAX_LENGTH), pairs, pair_ids, **plan)
        assert len(graphs) == compiled, f"{task}: the packed forward went through a compiled block"
        expected = score(make_adapter(twin, MAX_LENGTH), pairs, pair_ids, **plan)
        np.testing.assert_array_equal(found.ll, expected.ll, err_msg=task)
    with torch.no_grad():
        assert torch.equal(model(ids), logits)
    assert len(graphs) == compiled, "training recompiled after the evaluation"


def test_an_olmo3_flash_model_packs_through_the_engines_attention(requests):
    """OLMo 3 on flash-attention 2 (sliding windows, QK norms, GQA): packed rows and kept prefixes in both
    mask renderings give every request, letter keys and unconditional (PMI) requests included, the numbers
    of one plain forward per request on the same weights (1e-5, the same greedy flags), flash-attention's
    kernel never called (`flash_on_cpu.stand_in_kernel` raises in a forward without gradient); fewer tokens
    than one request per row."""
    model = olmo3_flash_model()
    twin = torch_backend_twin(model)
    adapter = make_adapter(model, MAX_LENGTH)
    assert adapter.needs.packing and adapter.needs.prefix_reuse
    with flash_kernel():
        for task, (pairs, ids) in requests.items():
            ref_ll, ref_greedy = plain_reference(twin, pairs, ids)
            plain = score(adapter, pairs, ids, batch_tokens=4096, shape=BatchShape(packing=False))
            for rendering in ("dense", "block"):
                for keep in (False, True):
                    batches = plan_batches(pairs, ids, **packed_plan(keep_prefixes=keep))
                    with torch.no_grad(), warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # flex_attention unfused on CPU says so
                        found = run_batches(adapter, batches, len(ids), TokenCount(), mask_rendering=rendering)
                    name = f"{task}: {rendering}, {'kept prefixes' if keep else 'packed'}"
                    np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0, err_msg=name)
                    np.testing.assert_array_equal(found.greedy, ref_greedy, err_msg=name)
            np.testing.assert_allclose(plain.ll, ref_ll, atol=1e-5, rtol=0, err_msg=f"{task}: one request per row")
            if task not in LETTER_KEYS:
                assert found.tokens_forwarded < plain.tokens_forwarded, task
    with torch.no_grad(), flash_kernel(), pytest.raises(AssertionError, match="kernel was called during an evaluation"):
        model(torch.zeros(1, 4, dtype=torch.long))  # the stand-in would have told


class UnverifiedBackend(TorchAttentionBackend):
    """A user's own attention backend: what its forward does was never seen."""


def unverified_backend_model() -> torch.nn.Module:
    """The llama shape with a user's backend in its first block."""
    model = olmo_core_model("llama")
    attention = model.blocks["0"].attention
    attention.backend = UnverifiedBackend(head_dim=attention.head_dim, n_heads=attention.n_heads)
    return model


class SubclassedTransformer(Transformer):
    """A user's subclass: its forward may differ from the verified one."""


def refused_models() -> dict[str, tuple[torch.nn.Module, str]]:
    """Model -> the words its log line must hold."""
    dropout = olmo_core_model("llama")
    dropout.blocks["1"].attention.backend.dropout_p = 0.1
    moe = TransformerConfig.llama_like_moe(
        d_model=32, vocab_size=VOCAB, n_layers=1, n_heads=2, num_experts=2, top_k=1, expert_hidden_size=32
    ).build(init_device="cpu")
    scaled = olmo_core_model("llama", block_name=TransformerBlockType.default_scaled)
    sub = olmo_core_model("llama")
    sub.__class__ = SubclassedTransformer
    ngpt = TransformerConfig.ngpt_like(d_model=32, vocab_size=VOCAB, n_layers=1, n_heads=2).build()
    return {
        "backend": (
            unverified_backend_model(),
            f"attention backend {__name__}.UnverifiedBackend (not verified) at 'blocks.0.attention'",
        ),
        "dropout": (dropout, "attention dropout 0.1 (applied in eval mode too) at 'blocks.1.attention'"),
        "moe": (moe, "model type MoETransformer (only Transformer is verified)"),
        "block": (scaled, "block type LayerNormScaledTransformerBlock at 'blocks.0'"),
        "subclass": (sub, "model type SubclassedTransformer (only Transformer is verified)"),
        "ngpt": (ngpt, "model type NormalizedTransformer (only Transformer is verified)"),
    }


def test_unverified_models_go_one_request_per_row_said_once(monkeypatch, caplog):
    """Each refused model: no packing, one INFO line naming the model and why (however many adapters are
    made for it), and a packed batch handed to its adapter anyway is refused."""
    batch = one_packed_batch()
    for name, (model, why) in refused_models().items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=olmo_core_attention.__name__):
            adapters = [make_adapter(model, MAX_LENGTH) for _ in range(3)]
        assert not any(a.needs.packing for a in adapters), name
        assert len(caplog.records) == 1, name
        message = caplog.records[0].getMessage()
        assert message.startswith(f"OLMo-core model {type(model).__name__}: scoring one request per row"), (
            message
        )
        assert message.endswith(why), message
        with pytest.raises(ValueError, match="plan with the adapter's needs.packing"):
            run_batches(adapters[0], [batch], 2, TokenCount())


def test_a_refused_model_gives_its_unpacked_numbers(data_root, neox_tokenizer):
    """End to end through the evaluator: a model left to one request per row (nGPT) gives the numbers of
    its own forward over full logits, and forwards what the plain plan forwards."""
    model = TransformerConfig.ngpt_like(d_model=32, vocab_size=VOCAB, n_layers=1, n_heads=2).build()
    ours, plain = against_full_logits(model, {"task": "hellaswag", "limit": 3}, data_root, neox_tokenizer)
    assert ours.tokens_forwarded == plain.tokens_forwarded


def test_the_evaluator_packs_olmo_core_models(data_root, neox_tokenizer):
    """Through the evaluator: the OLMo-core model is packed (fewer tokens) and its figures are those of
    full logits one request per row."""
    model = olmo_core_model("olmo2")
    ours, plain = against_full_logits(model, {"task": "arc_easy", "limit": 5}, data_root, neox_tokenizer)
    assert ours.tokens_forwarded < plain.tokens_forwarded


def against_full_logits(model, entry: dict, data_root, tokenizer) -> tuple[InLoopEvaluator, InLoopEvaluator]:
    """The evaluator run on `model` as it is and on its full logits one request per row (`LogitsAdapter`);
    their figures checked equal within 1e-5; (the evaluator on the model, the one on its full logits)."""
    config = EvaluatorConfig(evaluators=[entry], data_root=str(data_root), strict=True, max_length=MAX_LENGTH)
    ours, plain = InLoopEvaluator(config, tokenizer=tokenizer), InLoopEvaluator(config, tokenizer=tokenizer)
    found = ours.run(model)
    expected = plain.run(LogitsAdapter(model, MAX_LENGTH))
    assert found == pytest.approx(expected, abs=1e-5)
    return ours, plain


def compiled_block_config(data_root, tasks: tuple[str, ...]) -> dict:
    """An evaluation of `tasks` (4 documents each) as a GPU runs it: the block mask, flex_attention compiled
    (inductor on CPU)."""
    return {
        "evaluators": [{"task": t, "limit": N_DOCS, "batch_tokens": 2048} for t in tasks],
        "data_root": str(data_root),
        "strict": True,
        "max_length": MAX_LENGTH,
        "attention_mask": "block",
        "compile_attention": True,
    }


def assert_compiled_without_fallback(records: list[logging.LogRecord]) -> None:
    """The evaluation's kernel line says it ran compiled and no call fell back to the dense mask."""
    lines = [r.getMessage() for r in records if r.getMessage().startswith("flex_attention ")]
    assert lines and all(line.startswith("flex_attention compiled") for line in lines), lines
    assert not any("dense mask instead" in line for line in lines), lines


def test_an_olmo3_flash_model_through_the_evaluator_with_the_compiled_block_mask(data_root, neox_tokenizer, caplog):
    """OLMo 3 on flash-attention 2 (sliding windows binding, GQA) through `InLoopEvaluator` with the block mask
    and flex_attention compiled, as on a GPU: every request of a letter-key 5-shot task (kept prefix), a
    task with PMI and a 5-shot rc task equals one request per row on the torch-backend twin (1e-5, the same
    greedy flags), with fewer tokens; a second evaluation compiles nothing and gives the same numbers."""
    model = olmo3_flash_model()
    twin = torch_backend_twin(model)
    tasks = ("arc_easy", "olmo:arc_easy_rc_5shot", "olmo:mmlu_stem_test_mc_5shot_fast")
    ours = InLoopEvaluator(EvaluatorConfig(**compiled_block_config(data_root, tasks)), tokenizer=neox_tokenizer)
    plain = InLoopEvaluator(
        EvaluatorConfig(**compiled_block_config(data_root, tasks)), tokenizer=neox_tokenizer
    )
    with flash_kernel(), caplog.at_level(logging.INFO, logger="inloop_eval.evaluators.orchestrator"):
        found = ours.run(model)
        graphs = counters["stats"]["unique_graphs"]
        again = ours.run(model)
    assert counters["stats"]["unique_graphs"] == graphs, "the second evaluation compiled a graph"
    assert_compiled_without_fallback(caplog.records)
    expected = plain.run(LogitsAdapter(twin, MAX_LENGTH))
    assert found == pytest.approx(expected, abs=1e-5) and again == found
    assert "eval/downstream/arc_easy/acc_pmi" in found
    for task in tasks:
        result, reference = ours.detail(task), plain.detail(task)
        np.testing.assert_allclose(result.scores.ll, reference.scores.ll, atol=1e-5, rtol=0, err_msg=task)
        np.testing.assert_array_equal(result.scores.greedy, reference.scores.greedy, err_msg=task)
    assert ours.tokens_forwarded < plain.tokens_forwarded
