"""Rows as paths of one prefix trie (engine/prefix_sharing.py): tree rows and kept prefixes the planner
builds, literally; the trie minimum against a trie built by hand; the tokens a real few-shot task forwards
against that minimum; the cap and the cost model. That every request keeps the numbers of its own row is
checked with the other packed paths (tests/engine/test_scoring_paths.py and
tests/integrations/test_olmo_core_packing.py, whose tasks include 5-shot ones).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import packing_reference
import pytest
import torch

from inloop_eval.engine import batching, prefix_sharing
from inloop_eval.engine.adapter import AdapterNeeds, TokenCount
from inloop_eval.engine.batching import BatchShape, minimum_tokens, plan_batches
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.prefix_sharing import trie_minimum_tokens
from inloop_eval.engine.scoring import run_batches
from inloop_eval.engine.tree_attention import dense_mask
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.requests.table import PairSet, build_requests
from inloop_eval.tasks import get_task, load_docs

FEW_SHOT = "olmo:arc_easy_rc_5shot"


def shared_shots() -> PairSet:
    """Document A: context [1 2 3 4 10], continuations [21 22], [31]; document B: context [1 2 3 4 50 51],
    continuation [61 62]; document C: context [9 9], continuation [71 72] (shares nothing)."""
    return PairSet(
        ctx_tokens=np.array([1, 2, 3, 4, 10, 1, 2, 3, 4, 50, 51, 9, 9]),
        ctx_offsets=np.array([0, 5, 11, 13]),
        ctx_id=np.array([0, 0, 1, 2]),
        ctx_start=np.zeros(4, dtype=np.int64),
        ctx_end=np.array([5, 5, 6, 2]),
        cont_tokens=np.array([21, 22, 31, 61, 62, 71, 72]),
        cont_offsets=np.array([0, 2, 3, 5, 7]),
    )


def test_a_tree_row_literally():
    """One trie over every pair's row: A's context once, its two continuations below its last token, B's
    rest below the four tokens it shares with A; C, which shares nothing, in a row of its own (the tree rows
    as planned: on so few requests the cost model takes one forward of the rows without sharing)."""
    shape = BatchShape(packing=True, attention_tokens=1 << 20)
    batches = plan_batches(shared_shots(), np.arange(4), 4096, shape, max_length=64, by_cost=False)
    (tree,) = [b for b in batches if b.input_ids_BT.shape[1] == 9]
    row = int(np.flatnonzero(tree.input_ids_BT[:, 0] == 1)[0])
    np.testing.assert_array_equal(tree.input_ids_BT[row], [1, 2, 3, 4, 10, 21, 50, 51, 61])
    np.testing.assert_array_equal(tree.position_ids_BT[row], [0, 1, 2, 3, 4, 5, 4, 5, 6])
    np.testing.assert_array_equal(tree.span_end_BT[row], [9, 9, 9, 9, 6, 6, 9, 9, 9])
    mask = dense_mask(torch.from_numpy(tree.span_end_BT))[row, 0]
    # B's first own token (column 6) sees the prefix and itself, not A's tokens.
    assert mask[6].tolist() == [True, True, True, True, False, False, True, False, False]
    # A's piece (column 5) sees the prefix, A's context token and itself.
    assert mask[5].tolist() == [True] * 6 + [False] * 3
    # Every pair's targets are read where its own row would read them: A's first continuation token after
    # its context's last token (column 4), B's after column 7; 31 (one token) at column 4 too.
    picked = {
        (int(p), int(c)) for p, r, c in zip(tree.pair_N, tree.rows_N, tree.cols_N, strict=True) if r == row
    }
    assert picked == {(0, 4), (0, 5), (1, 4), (2, 7), (2, 8)}


def test_a_kept_prefix_literally(monkeypatch):
    """With kept prefixes, the four tokens A and B begin with are forwarded once as a row of their own,
    before the batch whose rows follow them (position ids from 4 on, the prefix's columns seen by all)."""
    monkeypatch.setattr(prefix_sharing, "MIN_STEM", 2)
    shape = BatchShape(packing=True, attention_tokens=1 << 20, keep_prefixes=True)
    batches = plan_batches(shared_shots(), np.arange(4), 4096, shape, max_length=64, by_cost=False)
    alone, kept, after = batches
    np.testing.assert_array_equal(alone.input_ids_BT, [[9, 9, 71]])
    assert kept.keeps_prefix and kept.prefix_length == 4 and kept.pair_N.size == 0
    np.testing.assert_array_equal(kept.input_ids_BT, [[1, 2, 3, 4]])
    assert after.prefix_length == 4 and not after.keeps_prefix
    np.testing.assert_array_equal(after.input_ids_BT, [[50, 51, 61], [10, 21, 0]])
    np.testing.assert_array_equal(after.position_ids_BT, [[4, 5, 6], [4, 5, 0]])
    mask = dense_mask(torch.from_numpy(after.span_end_BT), after.prefix_length)
    assert mask.shape == (2, 1, 3, 7)
    assert mask[1, 0, 1].tolist() == [True] * 4 + [True, True, False]  # A's piece: the prefix, 10, itself
    picked = sorted(zip(after.pair_N.tolist(), after.rows_N.tolist(), after.cols_N.tolist(), strict=True))
    assert picked == [(0, 1, 0), (0, 1, 1), (1, 1, 0), (2, 0, 1), (2, 0, 2)]


def test_a_kept_prefix_row_is_padded_to_the_adapters_width_multiple(monkeypatch):
    """An adapter whose sequence is split over ranks declares its width multiple; the planner pads the kept
    prefix's row to it on the right (the padding after the prefix, never seen by it), so no adapter pads."""
    monkeypatch.setattr(prefix_sharing, "MIN_STEM", 2)
    needs = AdapterNeeds(width_multiple=8, packing=True, prefix_reuse=True)
    shape = BatchShape.of(needs, attention_tokens=1 << 20)
    batches = plan_batches(shared_shots(), np.arange(4), 4096, shape, pad_id=7, max_length=64, by_cost=False)
    (kept,) = [b for b in batches if b.keeps_prefix]
    np.testing.assert_array_equal(kept.input_ids_BT, [[1, 2, 3, 4, 7, 7, 7, 7]])
    assert kept.prefix_length == 4 and all(b.input_ids_BT.shape[1] % 8 == 0 for b in batches)


@pytest.mark.parametrize("attention_tokens", [4, 512, 1 << 20])
def test_the_plan_taken_is_the_cheapest_of_those_forwarding_no_more_than_without_sharing(
    monkeypatch, few_shot, attention_tokens
):
    """Below kept prefixes rows share only below them, and tree rows may take more forwards than rows
    without sharing: the planner takes whichever plan the cost model finds cheapest among those that forward
    no more tokens than the rows without sharing (which are always among them)."""
    monkeypatch.setattr(prefix_sharing, "MIN_STEM", 2)
    cases = [(shared_shots(), np.arange(4), 64), (*few_shot[:2], 2048)]
    for pairs, ids, max_length in cases:
        shape = BatchShape(packing=True, attention_tokens=attention_tokens)
        kept = replace(shape, keep_prefixes=True)
        chosen = plan_batches(pairs, ids, 4096, kept, max_length=max_length)
        unshared = plan_batches(pairs, ids, 4096, replace(shape, share_prefixes=False), max_length=max_length)
        plans = [plan_batches(pairs, ids, 4096, s, max_length=max_length, by_cost=False) for s in (shape, kept)]
        most = sum(b.n_tokens for b in unshared)
        plans = [p for p in plans if sum(b.n_tokens for b in p) <= most] + [unshared]
        costs = [batching.plan_cost(p, attention_tokens) for p in plans]
        assert batching.plan_cost(chosen, attention_tokens) == min(costs)


def test_a_run_of_one_context_keeps_no_prefix():
    """A letter-key document's choices all read its context: they share it in one row, never as a kept
    prefix (which would cost a forward of its own and save nothing)."""
    pairs = PairSet(
        ctx_tokens=np.arange(100, 200),
        ctx_offsets=np.array([0, 100]),
        ctx_id=np.zeros(4, dtype=np.int64),
        ctx_start=np.zeros(4, dtype=np.int64),
        ctx_end=np.full(4, 100),
        cont_tokens=np.array([1, 2, 3, 4]),
        cont_offsets=np.arange(5),
    )
    shape = BatchShape(packing=True, keep_prefixes=True)
    (batch,) = plan_batches(pairs, np.arange(4), 4096, shape, max_length=128, by_cost=False)
    assert batch.input_ids_BT.shape == (1, 100) and batch.prefix_length == 0


def test_the_trie_minimum_counts_every_distinct_prefix_once():
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, 4, size=rng.integers(1, 12)) for _ in range(200)]
    by_hand = {tuple(s[: i + 1]) for s in sequences for i in range(len(s))}
    assert trie_minimum_tokens(sequences) == len(by_hand)
    assert trie_minimum_tokens([]) == 0


@pytest.fixture(scope="module")
def few_shot(data_root, neox_tokenizer):
    task = get_task(FEW_SHOT)
    table = build_requests(task, load_docs(task, data_root, limit=100), neox_tokenizer, 2048, with_uncond=False)
    pairs, ids = table.pairs, np.arange(len(table))
    rows = [np.concatenate([pairs.context(int(p)), pairs.continuation(int(p))[:-1]]) for p in ids]
    return pairs, ids, trie_minimum_tokens(rows)


def test_a_few_shot_task_forwards_near_the_trie_minimum(few_shot):
    """arc_easy 5-shot: its shots are most of every context; in tree rows (no larger than the batches of
    rows without sharing) the task forwards within 1.25x of the trie minimum, below kept prefixes fewer
    still, never below it, and under a third of the rows without sharing."""
    pairs, ids, trie = few_shot
    shape = BatchShape(packing=True)
    plan = {"batch_tokens": 8192, "max_length": 2048}
    tree = sum(b.n_tokens for b in plan_batches(pairs, ids, shape=shape, **plan))
    kept_shape = replace(shape, keep_prefixes=True)
    kept = sum(b.n_tokens for b in plan_batches(pairs, ids, shape=kept_shape, **plan, by_cost=False))
    alone = plan_batches(pairs, ids, shape=replace(shape, share_prefixes=False), **plan)
    assert trie <= kept < tree <= 1.25 * trie
    assert 3 * tree < sum(b.n_tokens for b in alone) <= 1.02 * minimum_tokens(pairs, ids)


@pytest.mark.parametrize("keep_prefixes", [False, True])
@pytest.mark.parametrize(("batch_tokens", "max_length"), [(8192, 1024), (700, 2048)])
def test_tree_rows_fit_the_context_and_the_batch_budget(few_shot, batch_tokens, max_length, keep_prefixes):
    """Every row fits the batch budget and the context, with the kept prefix it attends to; every position
    id is one the model has; every target is read once."""
    pairs, ids, _ = few_shot
    shape = BatchShape(packing=True, keep_prefixes=keep_prefixes)
    batches = plan_batches(pairs, ids, batch_tokens, shape, max_length=max_length, by_cost=False)
    assert all(b.input_ids_BT.shape[1] <= min(batch_tokens, max_length) for b in batches)
    assert all(b.prefix_length + b.input_ids_BT.shape[1] <= max_length for b in batches if b.keeps_prefix)
    after = [b for b in batches if b.prefix_length and not b.keeps_prefix]
    # Keys (the kept prefix's and the rows' own) within the budget: the mask and the keys stay bounded.
    assert all(len(b.input_ids_BT) == 1 or b.input_ids_BT.size + len(b.input_ids_BT) * b.prefix_length <= batch_tokens for b in after)
    assert all(b.position_ids_BT.max() < max_length for b in batches if b.position_ids_BT is not None)
    assert any(b.keeps_prefix for b in batches) == keep_prefixes
    targets = np.concatenate([b.pair_N for b in batches])
    np.testing.assert_array_equal(np.bincount(targets, minlength=len(ids)), pairs.cont_len[ids])


def test_costlier_attention_shortens_the_tree_rows(few_shot):
    """The row cost model: where attention over a long row costs more (a smaller `attention_tokens`), tree
    rows hold fewer branches and more tokens are forwarded."""
    pairs, ids, _ = few_shot

    def plan(attention_tokens: int) -> tuple[int, int]:
        shape = BatchShape(packing=True, attention_tokens=attention_tokens)
        batches = plan_batches(pairs, ids, 8192, shape, max_length=2048)
        return max(b.input_ids_BT.shape[1] for b in batches), sum(b.n_tokens for b in batches)

    (long_width, long_tokens), (short_width, short_tokens) = plan(1 << 20), plan(128)
    assert short_width < long_width and short_tokens > long_tokens


def shots_at_several_levels() -> PairSet:
    """Requests whose contexts share prefixes at three levels, as a few-shot task's do where the documents
    that are themselves shots get other shots: every context begins with the same 100 tokens (the first
    shot); 24 of them go on with the same 120 (the second shot) and one of two third shots of 90, then a
    question of their own; the first and the last in sorted order share the first shot only. Two
    continuations per context."""
    rng = np.random.default_rng(0)

    def tokens(n: int, low: int = 1, high: int = 250) -> np.ndarray:
        return rng.integers(low, high, size=n)

    first, second, thirds = tokens(100), tokens(120, 100), (tokens(90), tokens(90))
    contexts = [np.concatenate([first, tokens(80, 1, 50), tokens(30)])]  # sorts before the 24
    for d in range(24):
        question = tokens(int(rng.integers(20, 60)))
        contexts.append(np.concatenate([first, second, thirds[d % 3 == 0], question]))
    contexts.append(np.concatenate([first, tokens(80, 250, 256), tokens(30)]))  # sorts after them
    continuations = [tokens(int(rng.integers(2, 8))) for _ in range(2 * len(contexts))]
    ctx_len = [len(c) for c in contexts]
    return PairSet(
        ctx_tokens=np.concatenate(contexts),
        ctx_offsets=np.concatenate([[0], np.cumsum(ctx_len)]),
        ctx_id=np.repeat(np.arange(len(contexts)), 2),
        ctx_start=np.zeros(2 * len(contexts), dtype=np.int64),
        ctx_end=np.repeat(ctx_len, 2),
        cont_tokens=np.concatenate(continuations),
        cont_offsets=np.concatenate([[0], np.cumsum([len(c) for c in continuations])]),
    )


def test_prefixes_shared_at_several_levels_are_kept_at_the_level_most_rows_share():
    """The deepest level many contexts share is kept (the three shots, 310 tokens, once for each third
    shot), not the first shot that all share, so that the second and third shots are not repeated in every
    tree row below it: the plan the cost model takes forwards within 1.3x the trie minimum (counted here
    as every distinct prefix of the requests' own rows; kept at the first shot, 1.64x), and every request's
    loglikelihood and greedy flag are those of one forward of its own row."""
    pairs = shots_at_several_levels()
    ids = np.arange(len(pairs.ctx_id))
    rows = [np.concatenate([pairs.context(int(p)), pairs.continuation(int(p))[:-1]]) for p in ids]
    trie = len({tuple(row[: i + 1]) for row in rows for i in range(len(row))})
    shape = BatchShape(packing=True, keep_prefixes=True)
    batches = plan_batches(pairs, ids, 1024, shape, max_length=512)
    assert sorted(b.prefix_length for b in batches if b.keeps_prefix) == [310, 310]
    assert trie <= sum(b.n_tokens for b in batches) <= 1.3 * trie
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, max_seq_len=512)).eval()
    adapter = make_adapter(model)
    assert adapter.needs.prefix_reuse
    with torch.no_grad():
        found = run_batches(adapter, batches, len(ids), TokenCount())
    ll, greedy = packing_reference.reference_scores(
        lambda ids_1T, n: model(ids_1T)[0, -n:], pairs, ids
    )
    np.testing.assert_allclose(found.ll, ll, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(found.greedy, greedy)
