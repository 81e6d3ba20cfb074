"""The scoring engine's paths give the numbers of one unshared row per request, at the token minimum.

Paths: packed (a context once, its continuations after it under a block mask, positions restarting), plain
(one row per multi-token continuation), single-token (one row per letter-key document), and any callable
returning logits. Each is checked against an independent reference: one forward per request over
context + continuation[:-1], a float64 log-softmax over the full logits.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import numpy as np
import packing_reference
import pytest
import torch
from helpers import two_documents

from inloop_eval.engine import logprobs
from inloop_eval.engine import rows as engine_rows
from inloop_eval.engine.adapter import ForwardInputs, ModelAdapter, TokenCount
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.batching import (
    BatchShape,
    minimum_tokens,
    plan_batches,
    row_lengths,
)
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.outputs import projected_head
from inloop_eval.engine.scoring import PairScores, run_batches
from inloop_eval.engine.tree_attention import dense_mask
from inloop_eval.errors import ModelOutputError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations.hf.adapter import (
    HF_PACKING_TYPES,
    HF_PREFIX_REUSE_TYPES,
    HFCausalLMAdapter,
    SoftCappedHead,
)
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.requests.table import PairSet, RequestTable, build_requests
from inloop_eval.tasks import get_task, load_docs

transformers = importlib.import_module("transformers")

# rc, rc, letter keys, partial scoring; then 5-shot rc and letter keys, whose shared shots share rows
TASKS = ("hellaswag", "arc_easy", "mmlu_mc", "winogrande", "olmo:arc_easy_rc_5shot", "olmo:mmlu_stem_test_mc_5shot_fast")
MAX_LENGTH = 512
N_DOCS = 6  # documents scored by every model and path
N_PLANNED = 100  # documents planned (no forward) for the token counts


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: one thread beats two (no fork-join per op), and far more on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def hf_model(model_type: str, vocab_size: int = 50304, attn_implementation: str = "sdpa", **overrides):
    torch.manual_seed(0)
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_LENGTH,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if model_type != "gpt_neox":
        kwargs.update(num_key_value_heads=2, head_dim=8)
    kwargs.update(overrides)
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    return transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation
    ).eval()


def logits_fn(model):
    """The model's full logits [B, T, V] from input ids alone."""
    if isinstance(model, GPT):
        return lambda ids: model(ids)
    return lambda ids: model(input_ids=ids, use_cache=False).logits


@pytest.fixture(scope="module", params=["gpt", "gpt_neox", "llama"])
def model(request):
    if request.param == "gpt":
        torch.manual_seed(0)
        return GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=MAX_LENGTH)).eval()
    return hf_model(request.param)


@pytest.fixture(scope="module")
def tables(data_root, neox_tokenizer) -> dict[str, RequestTable]:
    """Each task's first N_PLANNED documents, with the unconditional (PMI) requests."""
    out = {}
    for name in TASKS:
        task = get_task(name)
        docs = load_docs(task, data_root, limit=N_PLANNED)
        out[name] = build_requests(task, docs, neox_tokenizer, MAX_LENGTH, with_uncond=True)
    return out


def scored_pairs(table: RequestTable, n_docs: int | None) -> tuple[PairSet, np.ndarray]:
    """Main pairs of the first `n_docs` documents followed by their unconditional pairs, as the evaluator
    concatenates them."""
    rows = np.arange(len(table)) if n_docs is None else table.rows_of_docs(np.unique(table.doc_id)[:n_docs])
    uncond = np.unique(table.uncond_id[rows])
    return table.pairs.concat(table.uncond), np.concatenate([rows, len(table) + uncond[uncond >= 0]])


def last_logits(model, ids, n: int):
    """The model's own logits [n, V] at the last n positions of one row (its standard forward)."""
    if isinstance(model, GPT):
        return model.lm_head(model.hidden_states(ids)[0, -n:])
    return model(input_ids=ids, use_cache=False, logits_to_keep=n).logits[0]


def reference_scores(model, pairs: PairSet, pair_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One forward per request over its own row (`packing_reference`)."""
    return packing_reference.reference_scores(lambda ids, n: last_logits(model, ids, n), pairs, pair_ids)


def score(adapter: ModelAdapter, pairs: PairSet, pair_ids: np.ndarray, **plan) -> PairScores:
    with torch.inference_mode():
        return run_batches(adapter, plan_batches(pairs, pair_ids, **plan), len(pair_ids), TokenCount())


@pytest.mark.parametrize("task", TASKS)
def test_every_path_gives_the_unshared_numbers(model, tables, task):
    pairs, ids = scored_pairs(tables[task], N_DOCS)
    ref_ll, ref_greedy = reference_scores(model, pairs, ids)
    adapter = make_adapter(model)
    assert adapter.needs.packing
    shape = BatchShape(packing=True)
    packed = {"batch_tokens": 4096, "shape": shape, "max_length": MAX_LENGTH}
    alone = {**packed, "shape": replace(shape, share_prefixes=False)}
    kept = {**packed, "shape": replace(shape, keep_prefixes=adapter.needs.prefix_reuse), "by_cost": False}
    paths = {
        "packed": score(adapter, pairs, ids, **packed),
        "packed, each context alone": score(adapter, pairs, ids, **alone),
        "kept prefixes": score(adapter, pairs, ids, **kept),
        "kept prefixes, one row per batch": score(adapter, pairs, ids, **{**kept, "batch_tokens": 1}),
        "plain": score(adapter, pairs, ids, batch_tokens=4096, shape=BatchShape(packing=False)),
        "logits": score(LogitsAdapter(logits_fn(model)), pairs, ids, batch_tokens=700, shape=BatchShape(packing=False)),
        "one row per batch": score(adapter, pairs, ids, **{**packed, "batch_tokens": 1}),
    }
    for name, found in paths.items():
        np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0, err_msg=name)
        np.testing.assert_array_equal(found.greedy, ref_greedy, err_msg=name)
    if task == "olmo:arc_easy_rc_5shot":  # its shots fit MAX_LENGTH
        assert adapter.needs.prefix_reuse
        assert any(b.keeps_prefix for b in plan_batches(pairs, ids, **kept)), "the shots are kept once"


def test_long_groups_are_cut_into_rows_that_fit(tables, monkeypatch):
    """A group longer than max_length (or the pack span) is cut into several rows, each repeating the
    context and none longer than max_length; the numbers do not move."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=MAX_LENGTH)).eval()
    pairs, ids = scored_pairs(tables["hellaswag"], N_DOCS)
    max_length = int(row_lengths(pairs, ids).max()) + 8  # every request fits; no whole group does
    row_plan = engine_rows.plan_rows(pairs, ids, packing=True, max_length=max_length)
    assert row_plan.length_R.max() <= max_length
    n_groups = len(np.unique(pairs.context_groups(ids)))
    assert len(row_plan.length_R) > n_groups  # some groups were cut
    monkeypatch.setattr(engine_rows, "MIN_PACK_SPAN", 8)
    ref_ll, ref_greedy = reference_scores(model, pairs, ids)
    found = score(make_adapter(model), pairs, ids, batch_tokens=2048, shape=BatchShape(packing=True), max_length=max_length)
    np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(found.greedy, ref_greedy)


def test_letter_keys_take_one_row_per_document(tables):
    table = tables["mmlu_mc"]
    rows = np.arange(len(table))
    assert (table.pairs.cont_len == 1).all()
    for packing in (True, False):
        row_plan = engine_rows.plan_rows(table.pairs, rows, packing=packing, max_length=MAX_LENGTH)
        assert len(row_plan.length_R) == len(np.unique(table.doc_id))
        np.testing.assert_array_equal(row_plan.length_R, table.pairs.ctx_len[row_plan.ctx_pair_R])


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("batch_tokens", [4096, 1 << 20])
def test_tokens_forwarded_are_near_the_minimum(tables, task, batch_tokens):
    """Packed: tokens forwarded <= 1.10 x (each context once + every continuation). Plain: <= 1.10 x the
    requests' own rows. Padding included."""
    pairs, ids = scored_pairs(tables[task], None)
    packed = plan_batches(pairs, ids, batch_tokens, BatchShape(packing=True), max_length=MAX_LENGTH)
    plain = plan_batches(pairs, ids, batch_tokens, BatchShape(packing=False))
    assert sum(b.n_tokens for b in packed) <= 1.10 * minimum_tokens(pairs, ids)
    assert sum(b.n_tokens for b in plain) <= 1.10 * row_lengths(pairs, ids).sum()
    for batches in (packed, plain):
        assert all(b.n_tokens <= batch_tokens or len(b.input_ids_BT) == 1 for b in batches)
        targets = np.concatenate([b.pair_N for b in batches])
        np.testing.assert_array_equal(np.bincount(targets, minlength=len(ids)), pairs.cont_len[ids])


@pytest.mark.parametrize("share_prefixes", [True, False])
def test_a_packed_batch_literally(share_prefixes):
    """Both planners (a trie over every row, and each context shared by its own continuations) lay these
    two documents out alike."""
    pairs = two_documents()
    shape = BatchShape(packing=True, share_prefixes=share_prefixes)
    (batch,) = plan_batches(pairs, np.arange(5), 4096, shape, max_length=64)
    np.testing.assert_array_equal(batch.input_ids_BT, [[11, 12, 13, 21, 31, 32], [51, 52, 61, 62, 71, 0]])
    np.testing.assert_array_equal(batch.position_ids_BT, [[0, 1, 2, 3, 3, 4], [0, 1, 2, 3, 2, 0]])
    np.testing.assert_array_equal(batch.span_end_BT, [[6, 6, 6, 4, 6, 6], [5, 5, 4, 4, 5, 6]])
    mask = dense_mask(torch.from_numpy(batch.span_end_BT))
    expected_a = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],  # [21] sees the context and itself
        [1, 1, 1, 0, 1, 0],  # [31 32] sees the context and itself, not [21]
        [1, 1, 1, 0, 1, 1],
    ]
    expected_b = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],  # padding sees itself only: no empty softmax row
    ]
    np.testing.assert_array_equal(mask[:, 0].int().numpy(), [expected_a, expected_b])
    # (row, col) -> target, pair: every continuation token read where its predecessor sits.
    found = sorted(zip(batch.rows_N, batch.cols_N, batch.target_N, batch.pair_N, strict=True))
    expected = [
        (0, 2, 21, 0), (0, 2, 31, 1), (0, 2, 41, 2), (0, 3, 22, 0), (0, 4, 32, 1), (0, 5, 33, 1),
        (1, 1, 61, 3), (1, 1, 71, 4), (1, 2, 62, 3), (1, 3, 63, 3), (1, 4, 72, 4),
    ]  # fmt: skip
    assert [tuple(int(x) for x in t) for t in found] == expected


def test_plain_rows_literally():
    pairs = two_documents()
    batches = plan_batches(pairs, np.arange(5), 4096, BatchShape(packing=False))
    rows = sorted(tuple(int(t) for t in row if t) for b in batches for row in b.input_ids_BT)
    assert rows == [(11, 12, 13, 21), (11, 12, 13, 31, 32), (51, 52, 61, 62), (51, 52, 71)]
    assert all(b.span_end_BT is None and b.position_ids_BT is None for b in batches)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", sorted(HF_PACKING_TYPES))
def test_hugging_face_types_that_pack(model_type, attn):
    """Every model type the HF adapter packs for takes the packed batch and gives the unshared numbers."""
    model = hf_model(model_type, vocab_size=128, attn_implementation=attn)
    adapter = make_adapter(model)
    assert isinstance(adapter, HFCausalLMAdapter) and adapter.needs.packing
    pairs, ids = two_documents(), np.arange(5)
    ref_ll, ref_greedy = reference_scores(model, pairs, ids)
    found = score(adapter, pairs, ids, batch_tokens=4096, shape=BatchShape(packing=True), max_length=64)
    np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(found.greedy, ref_greedy)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", sorted(HF_PREFIX_REUSE_TYPES))
@pytest.mark.parametrize("full_logits", [False, True])
def test_hugging_face_types_that_keep_prefixes(tables, model_type, attn, full_logits):
    """Every model type the HF adapter keeps prefixes for gives the unshared numbers on a 5-shot task, its
    shots forwarded once and read through a fresh cache by one batch or by several, by its hidden states and
    head or by its full logits."""
    # Weights 10x the default scale: attention sharp enough that a 1% error in the kept keys moves 5e-2.
    model = hf_model(model_type, attn_implementation=attn, initializer_range=0.2)
    adapter = make_adapter(model)
    assert isinstance(adapter, HFCausalLMAdapter) and adapter.needs.prefix_reuse
    adapter.plain_head = adapter.plain_head and not full_logits
    pairs, ids = scored_pairs(tables["olmo:arc_easy_rc_5shot"], 2)
    ref_ll, ref_greedy = reference_scores(model, pairs, ids)
    for batch_tokens in (4096, 1):
        shape = BatchShape(packing=True, keep_prefixes=True)
        plan = {"batch_tokens": batch_tokens, "shape": shape, "max_length": MAX_LENGTH}
        plan["by_cost"] = False  # the plan below kept prefixes, whatever the cost model would take
        assert any(b.keeps_prefix for b in plan_batches(pairs, ids, **plan)), "the shots are kept once"
        found = score(adapter, pairs, ids, **plan)
        np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0, err_msg=f"batch_tokens={batch_tokens}")
        np.testing.assert_array_equal(found.greedy, ref_greedy, err_msg=f"batch_tokens={batch_tokens}")


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_soft_capped_heads_project_only_the_selected_positions(model_type):
    """Gemma 2/3 soft-cap their logits: the adapter projects the selected positions and caps them as the
    model does (a cap of 0.5 bends every logit), giving the model's own numbers."""
    model = hf_model(model_type, 128, "eager", final_logit_softcapping=0.5)  # gemma2 has no sdpa
    adapter = make_adapter(model)
    assert isinstance(adapter, HFCausalLMAdapter) and adapter.plain_head and adapter.softcap == 0.5
    pairs, ids = two_documents(), np.arange(5)
    ref_ll, ref_greedy = reference_scores(model, pairs, ids)
    shape = BatchShape(packing=adapter.needs.packing)
    found = score(adapter, pairs, ids, batch_tokens=4096, shape=shape, max_length=64)
    np.testing.assert_allclose(found.ll, ref_ll, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(found.greedy, ref_greedy)
    adapter.softcap = None  # the uncapped projection is not the model's numbers
    assert not np.allclose(score(adapter, pairs, ids, batch_tokens=4096).ll, ref_ll, atol=1e-3)
    zero = torch.zeros(1, dtype=torch.long)
    outputs = make_adapter(model).forward(ForwardInputs(torch.ones(1, 3, dtype=torch.long), zero, zero, zero, zero))
    head = outputs.head
    assert isinstance(head, SoftCappedHead) and projected_head.head_width(outputs.features_UX, head) == 128


def test_unverified_hf_models_take_the_plain_path():
    model = hf_model("gemma2", 128, "eager")  # attention logit soft-capping: not verified routed
    assert not make_adapter(model).needs.packing


def test_a_packed_batch_needs_an_adapter_that_packs():
    (batch,) = plan_batches(two_documents(), np.arange(2), 4096, BatchShape(packing=True), max_length=64)
    adapter = LogitsAdapter(lambda ids: torch.zeros(*ids.shape, 128))
    with pytest.raises(ValueError, match="the adapter's needs.packing"):
        run_batches(adapter, [batch], 2, TokenCount())


def test_bucketed_widths_give_the_same_numbers(tables):
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=MAX_LENGTH)).eval()
    pairs, ids = scored_pairs(tables["arc_easy"], N_DOCS)
    adapter = make_adapter(model)
    plan = dict(batch_tokens=4096, shape=BatchShape(packing=True), max_length=MAX_LENGTH)
    bucketed = plan_batches(pairs, ids, 4096, BatchShape(packing=True, width_multiple=64), max_length=MAX_LENGTH)
    assert all(b.input_ids_BT.shape[1] % 64 == 0 for b in bucketed)
    assert len({b.input_ids_BT.shape[1] for b in bucketed}) <= 2
    with torch.inference_mode():
        found = run_batches(adapter, bucketed, len(ids), TokenCount())
    np.testing.assert_allclose(found.ll, score(adapter, pairs, ids, **plan).ll, atol=1e-5, rtol=0)


def test_head_runs_on_bounded_chunks_of_continuation_positions(tables, monkeypatch):
    """The vocabulary projection sees only continuation positions, a bounded number at a time: memory does
    not grow with batch x sequence x vocabulary. Smaller chunks give the same numbers."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=MAX_LENGTH)).eval()
    pairs, ids = scored_pairs(tables["hellaswag"], N_DOCS)
    adapter = make_adapter(model)
    plan = dict(batch_tokens=4096, shape=BatchShape(packing=True), max_length=MAX_LENGTH)
    expected = score(adapter, pairs, ids, **plan)
    seen: list[tuple[int, ...]] = []
    project = projected_head._project

    def recorded(head, linear, x_CX, workspace):
        assert linear is model.lm_head  # the workspace path
        seen.append(tuple(x_CX.shape))
        return project(head, linear, x_CX, workspace)

    monkeypatch.setattr(projected_head, "_project", recorded)
    monkeypatch.setattr(GPT, "forward", lambda *a, **k: pytest.fail("full [B, T, V] logits computed"))
    monkeypatch.setattr(logprobs, "HEAD_ELEMENTS", 50304 * 64)
    found = score(adapter, pairs, ids, **plan)
    assert seen and all(len(shape) == 2 and shape[0] <= 64 for shape in seen)
    # Each position projected once, though it predicts the first token of every choice after a context.
    batches = plan_batches(pairs, ids, **plan)
    positions = sum(len(np.unique(b.rows_N * b.input_ids_BT.shape[1] + b.cols_N)) for b in batches)
    assert sum(shape[0] for shape in seen) == positions < int(pairs.cont_len[ids].sum())
    np.testing.assert_allclose(found.ll, expected.ll, atol=1e-5, rtol=0)


def test_a_head_without_weight_is_chunked_by_its_logits_width(monkeypatch):
    """A head that is any callable (here D=8 -> V=1000) is chunked by the width of its logits, not by its
    input's: at most HEAD_ELEMENTS // V positions a call, after one probing call of one position."""
    torch.manual_seed(0)
    weight = torch.randn(1000, 8)
    rows: list[int] = []

    def head(x):  # noqa: ANN001, ANN202
        rows.append(x.shape[0])
        return x @ weight.t()

    features, target = torch.randn(50, 8), torch.randint(0, 1000, (50,))
    monkeypatch.setattr(logprobs, "HEAD_ELEMENTS", 1000 * 16)
    logp, _ = projected_head.token_logprobs(features, head, target)
    assert rows[0] == 1 and max(rows[1:]) == 16 and sum(rows[1:]) == 50
    expected = torch.log_softmax(features.double() @ weight.double().t(), -1)[torch.arange(50), target]
    np.testing.assert_allclose(logp.numpy(), expected.numpy(), atol=1e-5, rtol=0)
    with pytest.raises(ModelOutputError, match="at least 1001 tokens"):
        projected_head.token_logprobs(features, head, torch.full((50,), 1000))


def test_no_pairs_no_batches():
    assert plan_batches(two_documents(), np.zeros(0, dtype=np.int64), 4096, BatchShape(packing=True)) == []


def test_the_evaluator_packs_when_the_model_allows(data_root, neox_tokenizer):
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=MAX_LENGTH)).eval()
    config = EvaluatorConfig(
        evaluators=[{"task": "hellaswag", "limit": 5}], data_root=str(data_root), strict=True
    )
    packed, plain = (
        InLoopEvaluator(config, tokenizer=neox_tokenizer),
        InLoopEvaluator(config, tokenizer=neox_tokenizer),
    )
    packed.run(model)
    plain.run(LogitsAdapter(logits_fn(model), max_length=MAX_LENGTH))
    result, plain_result = packed.detail("hellaswag"), plain.detail("hellaswag")
    prepared = result.prepared
    ids = np.concatenate([result.rows, len(prepared.table) + result.uncond_ids])
    assert result.scores.tokens_forwarded <= 1.10 * minimum_tokens(prepared.pairs, ids)
    assert plain_result.scores.tokens_forwarded > result.scores.tokens_forwarded
    np.testing.assert_allclose(result.scores.ll, plain_result.scores.ll, atol=1e-5, rtol=0)


def test_greedy_is_the_argmax_ties_to_the_lowest_index():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 1.0, 2.0, 5.0]])
    features = logits[[0, 0, 0, 1, 1]]
    logp, greedy = projected_head.token_logprobs(features, lambda f: f, torch.tensor([1, 2, 0, 3, 2]))
    assert greedy.tolist() == [True, False, False, True, False]
    expected = torch.log_softmax(features, -1)[range(5), [1, 2, 0, 3, 2]]
    np.testing.assert_allclose(logp.numpy(), expected.numpy(), atol=1e-6, rtol=0)
    shared, shared_greedy = projected_head.token_logprobs(
        logits, lambda f: f, torch.tensor([1, 2, 0, 3, 2]), position_N=torch.tensor([0, 0, 0, 1, 1])
    )
    np.testing.assert_allclose(shared.numpy(), logp.numpy(), atol=1e-6, rtol=0)
    assert shared_greedy.tolist() == greedy.tolist()


def test_a_hooked_head_is_called_as_a_module(tables):
    """Hooks on the output head (sharding, quantisation, user probes) run: the head is then called, not
    bypassed by the workspace's matrix product; the numbers are the same."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=MAX_LENGTH)).eval()
    pairs, ids = scored_pairs(tables["arc_easy"], N_DOCS)
    adapter = make_adapter(model)
    plan = dict(batch_tokens=4096, shape=BatchShape(packing=True), max_length=MAX_LENGTH)
    expected = score(adapter, pairs, ids, **plan)
    calls: list[int] = []
    model.lm_head.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    found = score(adapter, pairs, ids, **plan)
    assert sum(calls) > 0
    np.testing.assert_allclose(found.ll, expected.ll, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(found.greedy, expected.greedy)
