"""Sharing prefixes never costs more than not sharing (`share_prefixes: false`): on random request sets,
budgets, context lengths and width multiples the plan forwards no more tokens, no batch of it is larger
(tokens, attention scores), and every request keeps the numbers of its own row. On a 5-shot task whose rows
are longer than the batch budget, tree rows share a document's context among its choices as rows without
sharing do, and at a large budget they are no wider than those rows' batches allow.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from inloop_eval.engine.adapter import TokenCount
from inloop_eval.engine.batching import Batch, BatchShape, plan_batches
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.scoring import run_batches
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.requests.table import PairSet, build_requests
from inloop_eval.tasks import get_task, load_docs

N_CASES = 400  # random request sets planned both ways
N_SCORED = 24  # of which scored both ways by a tiny model
VOCAB = 40  # few token ids: neighbours share prefixes by chance too
FIVE_SHOT = "olmo:hellaswag_rc_5shot"


def random_pairs(rng: np.random.Generator) -> PairSet:
    """Documents after zero, one or two shot blocks (long enough to be kept as prefixes), each with a few
    choices that may share their first tokens; some contexts cut at the left as a long context is."""
    shots = [rng.integers(0, VOCAB, size=rng.integers(0, 160)) for _ in range(rng.integers(1, 3))]
    contexts, ctx_start, ctx_id, conts = [], [], [], []
    for _ in range(rng.integers(1, 14)):
        ctx = np.concatenate(
            [shots[rng.integers(len(shots))], rng.integers(0, VOCAB, size=rng.integers(1, 50))]
        )
        start = int(rng.integers(0, len(ctx))) if rng.random() < 0.15 else 0
        contexts.append(ctx)
        stem = rng.integers(0, VOCAB, size=rng.integers(0, 4))
        for _ in range(rng.integers(1, 6)):
            conts.append(np.concatenate([stem, rng.integers(0, VOCAB, size=rng.integers(1, 24))])[:24])
            ctx_id.append(len(contexts) - 1)
            ctx_start.append(start)
    ctx_len = np.array([len(c) for c in contexts])
    return PairSet(
        ctx_tokens=np.concatenate(contexts).astype(np.int64),
        ctx_offsets=np.concatenate([[0], np.cumsum(ctx_len)]).astype(np.int64),
        ctx_id=np.array(ctx_id, dtype=np.int64),
        ctx_start=np.array(ctx_start, dtype=np.int64),
        ctx_end=ctx_len[np.array(ctx_id)].astype(np.int64),
        cont_tokens=np.concatenate(conts).astype(np.int64),
        cont_offsets=np.concatenate([[0], np.cumsum([len(c) for c in conts])]).astype(np.int64),
    )


def random_case(seed: int) -> tuple[PairSet, np.ndarray, BatchShape, dict]:
    """A request set, the pairs planned (a shuffled subset, as a rank's share), the batch shape and the
    planner's other settings."""
    rng = np.random.default_rng(seed)
    pairs = random_pairs(rng)
    ids = rng.permutation(len(pairs))[: rng.integers(1, len(pairs) + 1)]
    longest = int((pairs.ctx_len + pairs.cont_len - 1).max())
    plan = {
        "batch_tokens": int(np.exp(rng.uniform(0, np.log(4096)))),
        "max_length": None if rng.random() < 0.1 else longest + int(rng.integers(0, 300)),
    }
    shape = BatchShape(  # drawn after `plan`, field by field in this order: a seed names one case
        packing=True,
        width_multiple=int(rng.choice([1, 1, 2, 8])),
        attention_tokens=int(rng.choice([4, 64, 512, 8192])),
        keep_prefixes=bool(rng.random() < 0.5),
    )
    return pairs, ids, shape, plan


def tokens(batches: list[Batch]) -> int:
    return sum(b.n_tokens for b in batches)


def attention_area(batch: Batch) -> int:
    """Attention scores of one head and layer, the mask's size: rows x width x keys (its row's and a kept
    prefix's, which the prefix's own batch does not attend to again)."""
    rows, width = batch.input_ids_BT.shape
    return rows * width * (width + (0 if batch.keeps_prefix else batch.prefix_length))


def largest(batches: list[Batch]) -> tuple[int, int]:
    """The largest batch's tokens and the largest attention area."""
    return max(b.n_tokens for b in batches), max(attention_area(b) for b in batches)


def assert_every_target_read_once(batches: list[Batch], pairs: PairSet, ids: np.ndarray, where: str) -> None:
    read = np.concatenate([b.pair_N for b in batches])
    np.testing.assert_array_equal(np.bincount(read, minlength=len(ids)), pairs.cont_len[ids], err_msg=where)


@pytest.mark.parametrize("seed", range(N_CASES))
def test_sharing_forwards_no_more_tokens_and_no_larger_batches_than_not_sharing(seed):
    pairs, ids, shape, plan = random_case(seed)
    unshared = plan_batches(pairs, ids, shape=replace(shape, share_prefixes=False), **plan)
    shared = plan_batches(pairs, ids, shape=shape, **plan)
    where = f"seed {seed}: {shape} {plan}"
    assert tokens(shared) <= tokens(unshared), where
    assert_every_target_read_once(shared, pairs, ids, where)
    # The tree rows themselves, whatever the cost model would take, are bounded by the unshared batches.
    tree = plan_batches(pairs, ids, shape=shape, **plan, by_cost=False)
    assert_every_target_read_once(tree, pairs, ids, where)
    for batches in (shared, tree):
        most_tokens, most_area = largest(unshared)
        assert largest(batches)[0] <= most_tokens, where
        assert largest(batches)[1] <= most_area, where
        if plan["max_length"] is not None:
            assert all(b.input_ids_BT.shape[1] <= plan["max_length"] for b in batches), where


@pytest.fixture(scope="module")
def tiny_gpt():
    torch.manual_seed(0)
    return make_adapter(
        GPT(GPTConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, max_seq_len=1024)).eval()
    )


@pytest.mark.parametrize("seed", range(N_SCORED))
def test_shared_plans_give_every_request_the_numbers_of_the_unshared_plan(tiny_gpt, seed):
    pairs, ids, shape, plan = random_case(seed)
    plan["max_length"] = min(plan["max_length"] or 1024, 1024)
    shape = replace(shape, keep_prefixes=shape.keep_prefixes and tiny_gpt.needs.prefix_reuse)
    with torch.inference_mode():
        unshared = run_batches(
            tiny_gpt, plan_batches(pairs, ids, shape=replace(shape, share_prefixes=False), **plan), len(ids), TokenCount()
        )
        for by_cost in (True, False):
            found = run_batches(
                tiny_gpt, plan_batches(pairs, ids, shape=shape, **plan, by_cost=by_cost), len(ids), TokenCount()
            )
            np.testing.assert_allclose(
                found.ll, unshared.ll, atol=1e-5, rtol=0, err_msg=f"seed {seed} {by_cost}"
            )
            np.testing.assert_array_equal(found.greedy, unshared.greedy, err_msg=f"seed {seed} {by_cost}")


@pytest.fixture(scope="module")
def five_shot(data_root, neox_tokenizer) -> tuple[PairSet, np.ndarray]:
    task = get_task(FIVE_SHOT)
    table = build_requests(
        task, load_docs(task, data_root, limit=60), neox_tokenizer, 2048, with_uncond=False
    )
    return table.pairs, np.arange(len(table))


@pytest.mark.parametrize("batch_tokens", [128, 256, 512])
def test_tree_rows_below_the_budget_share_each_documents_context(five_shot, batch_tokens):
    """hellaswag 5-shot: every row (about 500 tokens) is longer than the budget. Tree rows without kept
    prefixes still hold a document's context once for all its choices, as rows without sharing do: fewer
    tokens than those rows (they forwarded 3.4x more where a tree row was capped at the budget)."""
    pairs, ids = five_shot
    shape = BatchShape(packing=True)
    unshared = plan_batches(pairs, ids, batch_tokens, replace(shape, share_prefixes=False), max_length=2048)
    tree = plan_batches(pairs, ids, batch_tokens, shape, max_length=2048, by_cost=False)
    assert not any(b.keeps_prefix for b in tree)
    assert tokens(tree) < 0.9 * tokens(unshared)
    assert len(tree) < len(unshared)


@pytest.mark.parametrize("batch_tokens", [2048, 8192])
def test_tree_rows_attend_over_no_more_than_the_unshared_batches(five_shot, batch_tokens):
    """hellaswag 5-shot at a budget of several rows: tree rows without kept prefixes grew to the model's
    2,048 positions, a batch attending over 4x the scores (the mask, and the attention per head) of any
    batch without sharing; bounded by those batches, they still forward far fewer tokens."""
    pairs, ids = five_shot
    shape = BatchShape(packing=True)
    unshared = plan_batches(pairs, ids, batch_tokens, replace(shape, share_prefixes=False), max_length=2048)
    tree = plan_batches(pairs, ids, batch_tokens, shape, max_length=2048, by_cost=False)
    assert largest(tree)[0] <= largest(unshared)[0]
    assert largest(tree)[1] <= largest(unshared)[1]
    assert tokens(tree) < 0.5 * tokens(unshared)
