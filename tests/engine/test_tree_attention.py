"""The engine's attention for packed rows (`engine/tree_attention.py`): the dense and block renderings of one
planned batch's mask are the same mask and give the same attention; the block rendering is built without a
T x T tensor and skips the blocks no query sees; the rendering is chosen by device unless configured.

The reference is independent of both renderings: each query's softmax over exactly the keys of its own row
that it may see (its trie path at positions within the window, and a kept prefix), computed in a loop in
float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask
from workers.parallel_checks import LargestTensor

from inloop_eval.engine.flex_kernel import BLOCK_SIZE
from inloop_eval.engine.tree_attention import (
    TreeMask,
    causal_tree,
    dense_mask,
    mask_rendering,
    tree_attention,
)
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig


def planned_tree(rows: int, width: int, prefix: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Span ends and positions of `rows` random depth-first trie rows `width` wide: a context, then
    continuations one below another (some nested), then right padding; positions after a kept prefix of
    `prefix` tokens, restarting below each node at its parent's end."""
    rng = np.random.default_rng(seed)
    span_end = np.zeros((rows, width), dtype=np.int64)
    positions = np.zeros((rows, width), dtype=np.int64)
    for b in range(rows):
        used = int(rng.integers(width // 2, width))
        context = int(rng.integers(1, used // 2))
        span_end[b, :context] = used
        positions[b, :context] = prefix + np.arange(context)
        col = context
        while col < used:
            piece = min(int(rng.integers(1, 40)), used - col)
            nested = min(int(rng.integers(0, 20)), used - col - piece)
            span_end[b, col : col + piece] = col + piece + nested  # the next `nested` tokens sit below it
            positions[b, col : col + piece] = prefix + context + np.arange(piece)
            tail = prefix + context + piece
            span_end[b, col + piece : col + piece + nested] = col + piece + nested
            positions[b, col + piece : col + piece + nested] = tail + np.arange(nested)
            col += piece + nested
        span_end[b, used:] = np.arange(used, width) + 1  # padding sees itself
    return torch.from_numpy(span_end), torch.from_numpy(positions)


def reference_attention(q, k, v, span_end, positions, prefix, window, scale):
    """Float64, one query at a time: softmax over the keys it may see, as the module docstring defines."""
    B, H, T, D = q.shape
    G = k.shape[1]
    out = torch.zeros(B, H, T, D, dtype=torch.float64)
    key_positions = torch.cat([torch.arange(prefix).expand(B, prefix), positions], dim=1)
    for b in range(B):
        for i in range(T):
            seen = [j for j in range(prefix)]
            seen += [prefix + j for j in range(i + 1) if i < span_end[b, j]]
            if window is not None:
                seen = [j for j in seen if positions[b, i] - key_positions[b, j] <= window]
            for h in range(H):
                g = h // (H // G)
                scores = (k[b, g, seen].double() @ q[b, h, i].double()) * scale
                out[b, h, i] = torch.softmax(scores, 0) @ v[b, g, seen].double()
    return out


@pytest.mark.parametrize("prefix", [0, 70])
@pytest.mark.parametrize("window", [None, 25])
def test_both_renderings_are_the_reference_attention(prefix, window):
    """Random trie rows wider than a block, GQA (4 query heads on 2 key/value heads), with and without a
    kept prefix and a sliding window: dense and block give the reference within 1e-5, and the dense mask is
    exactly what the span ends say."""
    span_end, positions = planned_tree(rows=2, width=180, prefix=prefix, seed=prefix + (window or 0))
    torch.manual_seed(0)
    B, T, K = 2, 180, prefix + 180
    q, k, v = torch.randn(B, 4, T, 8), torch.randn(B, 2, K, 8), torch.randn(B, 2, K, 8)
    k[:, :, :prefix], v[:, :, :prefix] = k[:1, :, :prefix], v[:1, :, :prefix]  # one kept prefix for every row
    expected = reference_attention(q, k, v, span_end, positions, prefix, window, 8**-0.5)
    win = (-1, -1) if window is None else (window, 0)
    found = {}
    for rendering in ("dense", "block"):
        mask = TreeMask(span_end, positions, prefix, rendering)
        found[rendering] = tree_attention(q, k, v, mask, window=win)
        torch.testing.assert_close(found[rendering].double(), expected, atol=1e-5, rtol=0, msg=rendering)
    assert torch.equal(dense_mask(span_end, prefix), TreeMask(span_end, positions, prefix).dense())


def arranged_dense(mask: TreeMask, window: int | None) -> torch.Tensor:
    """The dense rendering [B, 1, T, S + T] moved onto the arranged sequence [L, L] (query i, key j), the
    reference for the block tables: the kept prefix's keys once at 0..S-1, row b's own at S + b*T.."""
    B, T = mask.span_end_BT.shape
    S, L = mask.prefix_length, mask.sequence.length
    win = (-1, -1) if window is None else (window, 0)
    dense = mask.dense(win)[:, 0]
    out = torch.zeros(L, L, dtype=torch.bool)
    for b in range(B):
        rows = slice(S + b * T, S + (b + 1) * T)
        out[rows, :S] = dense[b, :, :S]
        out[rows, rows] = dense[b, :, S:]
    return out


@pytest.mark.parametrize("window", [None, 200])
def test_the_block_mask_lists_exactly_the_blocks_that_hold_a_visible_pair(window):
    """A batch of 4 rows 2048 wide after a kept prefix of 300, arranged as one sequence of 16384: the tables
    are the only thing made, the largest tensor far below T x T; a block is listed full exactly when every
    pair in it is visible and partial when some but not all are, so blocks no query sees (padding's, a
    finished subtree's, those out of the window) are skipped; the tables are contiguous, as the compiled
    kernel reads them; the dense rendering is never made."""
    T, prefix = 2048, 300
    span_end, positions = planned_tree(rows=4, width=T, prefix=prefix, seed=3)
    mask = TreeMask(span_end, positions, prefix, "block")
    win = (-1, -1) if window is None else (window, 0)
    with LargestTensor() as largest:
        block = mask.block(win)
    assert isinstance(block, BlockMask)
    L = mask.sequence.length
    n = L // BLOCK_SIZE
    assert L == 16384 and largest.largest < T * T
    for table in (block.kv_num_blocks, block.kv_indices, block.full_kv_num_blocks, block.full_kv_indices):
        assert table.is_contiguous()
    assert block.kv_indices.shape == (1, 1, n, n)
    visible = arranged_dense(mask, window).view(n, BLOCK_SIZE, n, BLOCK_SIZE)
    any_QK, all_QK = visible.any(dim=(1, 3)), visible.all(dim=(1, 3))
    listed = {"partial": torch.zeros(n, n, dtype=torch.bool), "full": torch.zeros(n, n, dtype=torch.bool)}
    for name, num, idx in (
        ("partial", block.kv_num_blocks, block.kv_indices),
        ("full", block.full_kv_num_blocks, block.full_kv_indices),
    ):
        for q in range(n):
            listed[name][q, idx[0, 0, q, : num[0, 0, q]].long()] = True
    assert torch.equal(listed["full"], all_QK)
    if window is None:
        assert torch.equal(listed["partial"], any_QK & ~all_QK)
    else:  # the window's pruning is by each block's lowest and highest position: never drops a visible pair
        assert not (any_QK & ~all_QK & ~listed["partial"]).any()
        assert not (listed["partial"] & listed["full"]).any()
    assert (listed["partial"] | listed["full"]).sum() < n * n // 4


def test_a_window_that_cannot_bind_is_dropped():
    """A window reaching further back than any query lies past a key renders the mask without it: the same
    dense tensor and the same block mask as no window."""
    span_end, positions = planned_tree(rows=2, width=180, prefix=70, seed=1)
    mask = TreeMask(span_end, positions, 70, "block")
    assert not mask.binds((4095, 0)) and mask.binds((100, 0))
    assert mask.dense((4095, 0)) is mask.dense()
    assert mask.block((4095, 0)) is mask.block()


def test_an_unpacked_forward_is_plain_causal_rows():
    mask = causal_tree(2, 5, torch.device("cpu"), "dense")
    assert torch.equal(mask.dense()[0, 0], torch.ones(5, 5, dtype=torch.bool).tril())
    assert torch.equal(mask.position_ids_BT[1], torch.arange(5))


def test_the_rendering_follows_the_device_unless_configured():
    assert mask_rendering(torch.device("cuda")) == "block"
    assert mask_rendering(torch.device("cpu")) == "dense"
    assert mask_rendering(torch.device("cpu"), "block") == "block"
    assert mask_rendering(torch.device("cuda"), "dense") == "dense"
    assert mask_rendering(torch.device("cuda"), "auto") == "block"
    with pytest.raises(ValueError, match="expected one of"):
        mask_rendering(torch.device("cpu"), "sparse")
    with pytest.raises(ConfigError, match="attention_mask"):
        EvaluatorConfig(evaluators=[{"task": "piqa"}], attention_mask="sparse")
