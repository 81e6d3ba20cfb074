"""The block rendering as a GPU runs it (`engine/flex_kernel.py`): flex_attention compiled by inductor (on CPU,
as CUDA compiles it), on batches the engine's own planner makes (tree rows, kept prefixes of several lengths,
windows binding and not): equal to dense SDPA and to one float64 causal attention over each request's own
row; one compiled graph per ladder length and none the second time; a shape torch refuses runs the dense
mask, counted and logged.

The reference is independent of the planner and of both renderings: a one-layer attention probe whose queries,
keys and values are fixed functions of each token's id and position, run over each request's own row
(context + continuation[:-1], positions 0..) with a causal mask in float64. Before the block tables were made
contiguous, the compiled kernel read their indices with the wrong strides and every query block after the
first was wrong (4.4 off in the output of a 1024-wide row): `test_compiled_block_attention_is_the_reference`
fails on that build.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from inloop_eval.engine import flex_kernel
from inloop_eval.engine.batching import Batch, BatchShape, plan_batches
from inloop_eval.engine.evaluation import attention_lengths
from inloop_eval.engine.flex_kernel import FlexKernel, sequence_length
from inloop_eval.engine.tree_attention import NO_WINDOW, TreeMask, tree_attention
from inloop_eval.requests.table import PairSet

VOCAB, H, G, D = 50, 4, 2, 16
SCALE = D**-0.5


class AttentionProbe:
    """One attention layer whose queries [B, H, T, D] and keys and values [B, G, T, D] are a fixed random
    table of each token's id plus one of its position."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.by_token = torch.randn(VOCAB, 3, H, D, generator=g)
        self.by_position = 0.5 * torch.randn(4096, 3, H, D, generator=g)

    def qkv(self, ids_BT: torch.Tensor, positions_BT: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.by_token[ids_BT] + self.by_position[positions_BT]  # [B, T, 3, H, D]
        return x[:, :, 0].transpose(1, 2), x[:, :, 1, :G].transpose(1, 2), x[:, :, 2, :G].transpose(1, 2)


def shot_pairs(seed: int) -> PairSet:
    """Documents after one of two few-shot blocks (150 to 400 tokens, kept as prefixes), each with two to
    four continuations of 1 to 12 tokens, some sharing their first tokens."""
    rng = np.random.default_rng(seed)
    shots = [rng.integers(0, VOCAB, size=rng.integers(150, 400)) for _ in range(2)]
    contexts, ctx_id, conts = [], [], []
    for _ in range(14):
        contexts.append(np.concatenate([shots[rng.integers(2)], rng.integers(0, VOCAB, size=rng.integers(5, 40))]))
        stem = rng.integers(0, VOCAB, size=rng.integers(0, 3))
        for _ in range(rng.integers(2, 5)):
            conts.append(np.concatenate([stem, rng.integers(0, VOCAB, size=rng.integers(1, 10))]))
            ctx_id.append(len(contexts) - 1)
    ctx_len = np.array([len(c) for c in contexts])
    return PairSet(
        ctx_tokens=np.concatenate(contexts).astype(np.int64),
        ctx_offsets=np.concatenate([[0], np.cumsum(ctx_len)]).astype(np.int64),
        ctx_id=np.array(ctx_id, dtype=np.int64),
        ctx_start=np.zeros(len(ctx_id), dtype=np.int64),
        ctx_end=ctx_len[np.array(ctx_id)].astype(np.int64),
        cont_tokens=np.concatenate(conts).astype(np.int64),
        cont_offsets=np.concatenate([[0], np.cumsum([len(c) for c in conts])]).astype(np.int64),
    )


def reference(probe: AttentionProbe, pairs: PairSet, window: int | None) -> dict[tuple[int, int], torch.Tensor]:
    """(pair, position) -> attention output [H, D] at each position of the pair's own row that predicts a
    continuation token: causal, within `window`, in float64."""
    out = {}
    for p in range(len(pairs)):
        ctx, cont = pairs.context(p), pairs.continuation(p)
        ids = torch.from_numpy(np.concatenate([ctx, cont[:-1]]))[None]
        T = ids.shape[1]
        q, k, v = (x.double() for x in probe.qkv(ids, torch.arange(T)[None]))
        back = torch.arange(T)[:, None] - torch.arange(T)[None, :]
        seen = (back >= 0) & (back <= (window if window is not None else T))
        k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
        att = torch.softmax((q @ k.transpose(-1, -2) * SCALE).masked_fill(~seen, -torch.inf), -1) @ v
        for position in range(len(ctx) - 1, T):
            out[(p, position)] = att[0, :, position]
    return out


def attend_plan(
    probe: AttentionProbe, batches: list[Batch], rendering: str, kernel: FlexKernel | None, window: int | None
) -> dict[tuple[int, int], torch.Tensor]:
    """(pair, position) -> the attention output at each target's position, the plan's batches forwarded
    through `tree_attention` in `rendering` (a kept prefix's keys and values carried to the batches after
    it, as the adapters keep them)."""
    win = NO_WINDOW if window is None else (window, 0)
    kept: tuple[torch.Tensor, torch.Tensor] | None = None
    out = {}
    for batch in batches:
        ids = torch.from_numpy(batch.input_ids_BT)
        B, T = ids.shape
        if batch.keeps_prefix:
            _, k, v = probe.qkv(ids, torch.arange(T)[None])
            kept = (k[:, :, : batch.prefix_length], v[:, :, : batch.prefix_length])
            continue
        S = batch.prefix_length
        if batch.span_end_BT is None:
            positions = torch.arange(T).expand(B, T)
            span_end = torch.full((B, T), T)
        else:
            positions, span_end = torch.from_numpy(batch.position_ids_BT), torch.from_numpy(batch.span_end_BT)
        q, k, v = probe.qkv(ids, positions)
        if S:
            k = torch.cat([kept[0].expand(B, G, S, D), k], dim=2)
            v = torch.cat([kept[1].expand(B, G, S, D), v], dim=2)
        att = tree_attention(q, k, v, TreeMask(span_end, positions, S, rendering, kernel), SCALE, win)
        for row, col, pair in zip(batch.rows_N, batch.cols_N, batch.pair_N, strict=True):
            out[(int(pair), int(positions[row, col]))] = att[row, :, col]
    return out


PLANS = [  # (batch tokens, keep prefixes): several widths, rows and prefix lengths; lengths 1024 to 4096
    (300, True),
    (1500, True),
    (3000, False),
]


@pytest.fixture(scope="module")
def planned() -> tuple[AttentionProbe, PairSet, list[list[Batch]]]:
    pairs = shot_pairs(0)
    plans = []
    for batch_tokens, keep in PLANS:
        shape = BatchShape(packing=True, keep_prefixes=keep, attention_tokens=64)
        plans.append(plan_batches(pairs, np.arange(len(pairs)), batch_tokens, shape, max_length=1024, by_cost=False))
    return AttentionProbe(0), pairs, plans


@pytest.mark.parametrize("window", [None, 60, 5000])
def test_compiled_block_attention_is_the_reference(planned, window):
    """Every target position of every plan, compiled block and dense both within 1e-5 of the float64 reference
    (float32), a window binding (60) or not (5000, dropped); no call falls back."""
    probe, pairs, plans = planned
    expected = reference(probe, pairs, window)
    kernel = FlexKernel(compiled=True)
    for plan in plans:
        assert any(b.keeps_prefix for b in plan) or plan is plans[2]
        for rendering, k in (("block", kernel), ("dense", None)):
            found = attend_plan(probe, plan, rendering, k, window)
            assert found.keys() == expected.keys()
            for key, value in found.items():
                torch.testing.assert_close(value.double(), expected[key], atol=1e-5, rtol=0, msg=f"{rendering} {key}")
    assert kernel.fallback_calls == 0 and kernel.calls > 0


def test_one_graph_per_ladder_length_known_from_the_plan_and_none_the_second_time(planned):
    """The graphs compiled are the ladder lengths the plans reach, listed before the first forward
    (`attention_lengths`); a second evaluation of the same plans, with a window and new masks, compiles
    nothing."""
    probe, _, plans = planned
    lengths = set().union(*(attention_lengths(plan) for plan in plans))
    assert lengths <= {1024, 2048, 4096}
    first = FlexKernel(compiled=True)
    before = counters["stats"]["unique_graphs"]
    for plan in plans:
        attend_plan(probe, plan, "block", first, None)
    assert counters["stats"]["unique_graphs"] - before <= len(lengths)  # fewer where another test compiled one
    assert {shape[0] for shape in first.shapes} == lengths
    second = FlexKernel(compiled=True)
    before = counters["stats"]["unique_graphs"]
    for plan in plans:
        attend_plan(probe, plan, "block", second, 60)
    assert counters["stats"]["unique_graphs"] == before
    assert second.shapes == first.shapes and second.fallback_calls == 0


def test_the_ladder():
    assert [sequence_length(n) for n in (1, 1024, 1025, 2048, 5000, 9000)] == [1024, 1024, 2048, 2048, 8192, 16384]


def test_a_shape_torch_refuses_runs_the_dense_mask_counted_and_logged(planned, monkeypatch, caplog):
    """With torch's recompile limit reached (the kernel raises it only to what this test allows), a batch
    of a new length is not run unfused: it runs the dense mask through SDPA (the same numbers), the call is
    counted, the reason logged once, and the next call of that length goes to SDPA without trying again."""
    probe, pairs, plans = planned
    kernel = FlexKernel(compiled=True)
    attend_plan(probe, plans[0], "block", kernel, None)  # at least one graph held
    monkeypatch.setattr(flex_kernel, "RECOMPILE_LIMIT", 1)
    B, T = 5, 1000  # 5000 keys: a length no other test reaches, 8192
    span_end = torch.full((B, T), T)
    positions = torch.arange(T).expand(B, T)
    q, k, v = probe.qkv(torch.randint(0, VOCAB, (B, T)), positions)
    with caplog.at_level(logging.WARNING, logger=flex_kernel.__name__):
        found = [tree_attention(q, k, v, TreeMask(span_end, positions, 0, "block", kernel), SCALE) for _ in range(2)]
    dense = tree_attention(q, k, v, TreeMask(span_end, positions, 0, "dense"), SCALE)
    assert torch.equal(found[0], dense) and torch.equal(found[1], dense)
    assert kernel.fallback_calls == 2 and [s[0] for s in kernel.refused] == [8192]
    assert "recompile" in next(iter(kernel.refused.values())).lower()
    assert len([r for r in caplog.records if "could not be compiled" in r.getMessage()]) == 1
    assert "2 calls ran the dense mask instead" in kernel.summary()
