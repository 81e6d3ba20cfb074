"""The engine's own attention for packed rows: the one function each framework's core attention call is routed
through during an evaluation, whatever kernel the model trains with, and the plan's mask in the two forms
it is rendered in.

A packed batch's mask is held compactly, as the planner made it (`TreeMask`): for each row and column j the
end of j's subtree in the row's trie (`span_end_BT`: j is seen by columns j..span_end - 1), the length S of
a kept prefix every real position sees, and each token's position (for sliding windows). It is rendered
- dense: a boolean [B, 1, T, S + T] mask for `F.scaled_dot_product_attention` (T x T per row; the CPU's);
- block: a FlexAttention `BlockMask` (`torch.nn.attention.flex_attention`) whose block table is computed
  from `span_end_BT` without any T x T tensor, and whose mask function reads `span_end_BT` as data: memory
  proportional to blocks, and the kernel skips the blocks no query sees. On CUDA `flex_attention` is
  compiled once, and recompiles per width bucket only, the mask being an input.
`mask_rendering(device, configured)` is the one place the rendering is chosen: `configured` ("dense" or
"block") when given, else block on CUDA and dense elsewhere.

Padding sees itself and the kept prefix only, so no query's softmax
is over nothing; no real position sees padding.
Legend: B rows, T time, S a kept prefix's length, K keys (S + T), H query heads, G key/value heads, D head
width.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

MASK_RENDERINGS = ("dense", "block")
# FlexAttention's block: each side of a block of queries x keys the kernel skips or computes whole.
BLOCK_SIZE = 128
# A window (keys at most `window[0]` positions back; -1: none), as OLMo-core and flash-attn write it.
NO_WINDOW = (-1, -1)


def mask_rendering(device: torch.device, configured: str | None = None) -> str:
    """How a packed batch's mask is rendered on `device`: `configured` when given, else "block" on CUDA
    (no T x T mask; the kernel skips empty blocks) and "dense" elsewhere."""
    if configured is not None and configured != "auto":
        if configured not in MASK_RENDERINGS:
            raise ValueError(f"mask rendering: expected one of {MASK_RENDERINGS} or 'auto', found {configured!r}")
        return configured
    return "block" if device.type == "cuda" else "dense"


@dataclass
class TreeMask:
    """The mask of one packed batch, compact: `span_end_BT` (column j is seen by columns j..span_end - 1),
    `prefix_length` S (a kept prefix every position sees, keys 0..S-1, positions 0..S-1) and
    `position_ids_BT` (each token's position, read for sliding windows). Renderings are made on first use
    and kept for the batch, one per window."""

    span_end_BT: Tensor
    position_ids_BT: Tensor
    prefix_length: int = 0
    rendering: str = "dense"
    _dense: dict[tuple[int, int], Tensor] = field(default_factory=dict, repr=False)
    _block: dict[tuple[int, int], BlockMask] = field(default_factory=dict, repr=False)

    @property
    def keys(self) -> int:
        """K: the keys each query is scored against, the kept prefix's and the row's own."""
        return self.prefix_length + self.span_end_BT.shape[1]

    def dense(self, window: tuple[int, int] = NO_WINDOW) -> Tensor:
        """The boolean mask [B, 1, T, S + T] (True = may attend), narrowed to `window` where one is set."""
        window = tuple(window)
        if window not in self._dense:
            if window == NO_WINDOW:
                self._dense[window] = dense_mask(self.span_end_BT, self.prefix_length)
            else:
                within_KT = _within_window(self.position_ids_BT, self.prefix_length, window)
                self._dense[window] = self.dense() & within_KT[:, None]
        return self._dense[window]

    def block(self, window: tuple[int, int] = NO_WINDOW) -> BlockMask:
        """The FlexAttention `BlockMask` of the same mask, narrowed to `window` where one is set."""
        window = tuple(window)
        if window not in self._block:
            self._block[window] = _block_mask(self, window)
        return self._block[window]


def causal_tree(rows: int, width: int, device: torch.device, rendering: str = "dense") -> TreeMask:
    """The `TreeMask` of plain causal rows [rows, width] at positions 0..width-1: each column seen by every
    later one (right padding follows the real positions, so none sees it)."""
    span_end_BT = torch.full((rows, width), width, dtype=torch.long, device=device)
    position_ids_BT = torch.arange(width, device=device).expand(rows, width)
    return TreeMask(span_end_BT, position_ids_BT, 0, rendering)


def tree_attention(
    q_BHTD: Tensor,
    k_BGKD: Tensor,
    v_BGKD: Tensor,
    mask: TreeMask,
    scale: float | None = None,
    window: tuple[int, int] = NO_WINDOW,
) -> Tensor:
    """Attention [B, H, T, D] of queries over keys and values under `mask` in its rendering: each query
    sees its own trie path and the kept prefix (keys 0..S-1 of `k_BGKD`, `v_BGKD`, where S > 0), within
    `window`. Grouped-query attention: query head h reads key/value head h // (H / G), as every framework
    here repeats them."""
    H, G = q_BHTD.shape[1], k_BGKD.shape[1]
    if H % G:
        raise ValueError(f"tree attention: {H} query heads are not a multiple of {G} key/value heads")
    if k_BGKD.shape[2] != mask.keys:
        raise ValueError(f"tree attention: {k_BGKD.shape[2]} keys for a mask of {mask.keys} (S + T)")
    if mask.rendering == "block":
        return _flex_attention(q_BHTD.device.type)(
            q_BHTD, k_BGKD, v_BGKD, block_mask=mask.block(window), scale=scale, enable_gqa=G != H
        )
    if G != H:
        k_BGKD, v_BGKD = repeat_heads(k_BGKD, H // G), repeat_heads(v_BGKD, H // G)
    return F.scaled_dot_product_attention(q_BHTD, k_BGKD, v_BGKD, attn_mask=mask.dense(window), scale=scale)


def repeat_heads(x_BGKD: Tensor, n_rep: int) -> Tensor:
    """Each of G key or value heads repeated `n_rep` times in place ([B, G * n_rep, K, D])."""
    if n_rep == 1:
        return x_BGKD
    B, G, K, D = x_BGKD.shape
    return x_BGKD[:, :, None].expand(B, G, n_rep, K, D).reshape(B, G * n_rep, K, D)


def dense_mask(span_end_BT: Tensor, prefix_length: int = 0) -> Tensor:
    """Boolean mask [B, 1, T, S + T] (True = may attend): column j is seen by columns j..span_end_BT[b, j] - 1
    (its subtree in the row's trie), and every position sees the first `prefix_length` keys, a kept prefix.
    Padding sees itself, so no row of the mask is empty (no NaN from a softmax over nothing), and no real
    position sees padding."""
    B, T = span_end_BT.shape
    col_T = torch.arange(T, device=span_end_BT.device)
    later_TT = col_T[None, :] <= col_T[:, None]  # [query, key]: the key comes no later than the query
    mask_BTT = later_TT & (col_T[None, :, None] < span_end_BT[:, None, :])
    if prefix_length:
        mask_BTT = torch.cat([mask_BTT.new_ones(B, T, prefix_length), mask_BTT], dim=2)
    return mask_BTT[:, None]


def _key_positions(position_ids_BT: Tensor, prefix_length: int) -> Tensor:
    """Each key's position [B, K]: 0..S-1 for a kept prefix, then the rows' own."""
    B = position_ids_BT.shape[0]
    prefix_BS = torch.arange(prefix_length, device=position_ids_BT.device).expand(B, prefix_length)
    return torch.cat([prefix_BS, position_ids_BT], dim=1)


def _within_window(position_ids_BT: Tensor, prefix_length: int, window: tuple[int, int]) -> Tensor:
    """[B, T, K]: the key is at most `window[0]` positions before the query, as OLMo-core's torch backend
    and flash-attn narrow an unshared row's causal mask."""
    back_BTK = position_ids_BT[:, :, None] - _key_positions(position_ids_BT, prefix_length)[:, None, :]
    return back_BTK <= window[0]


def _block_mask(mask: TreeMask, window: tuple[int, int]) -> BlockMask:
    """The `BlockMask` of `mask`: its table lists, for each block of queries, the blocks of keys some query
    of it sees (the kept prefix's, and each key j's whose queries j..span_end - 1 reach into the block),
    found from `span_end_BT` in [B, T, T / BLOCK_SIZE] steps; its mask function decides within a block."""
    span_end_BT, S = mask.span_end_BT, mask.prefix_length
    B, T = span_end_BT.shape
    K = S + T
    device = span_end_BT.device
    n_q, n_k = -(-T // BLOCK_SIZE), -(-K // BLOCK_SIZE)
    # seen_BKQ[b, key, query block]: some query of the block sees the key (before the window narrows it)
    q0_Q = torch.arange(n_q, device=device) * BLOCK_SIZE
    q1_Q = (q0_Q + BLOCK_SIZE).clamp(max=T)
    col_T = torch.arange(T, device=device)
    own_BTQ = (col_T[None, :, None] < q1_Q) & (span_end_BT[:, :, None] > q0_Q)
    seen_BKQ = torch.cat([own_BTQ.new_ones(B, S, n_q), own_BTQ], dim=1)
    seen_BKQ = F.pad(seen_BKQ, (0, 0, 0, n_k * BLOCK_SIZE - K))
    seen_BQK = seen_BKQ.view(B, n_k, BLOCK_SIZE, n_q).any(dim=2).transpose(1, 2)
    kv_num_blocks = seen_BQK.sum(-1, dtype=torch.int32)[:, None]
    kv_indices = torch.argsort(~seen_BQK, dim=-1, stable=True).to(torch.int32)[:, None]
    return BlockMask.from_kv_blocks(
        kv_num_blocks, kv_indices, BLOCK_SIZE=BLOCK_SIZE, mask_mod=_mask_mod(mask, window), seq_lengths=(T, K)
    )


def _mask_mod(mask: TreeMask, window: tuple[int, int]) -> Any:
    """FlexAttention's mask function of `mask`: the dense rendering's entry (b, query, key), read from
    `span_end_BT` and the positions."""
    span_end_BT, position_ids_BT, S = mask.span_end_BT, mask.position_ids_BT, mask.prefix_length
    key_position_BK = _key_positions(position_ids_BT, S)

    def tree(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        own = (kv - S).clamp(min=0)
        seen = (kv < S) | ((own <= q) & (q < span_end_BT[b, own]))
        if window != NO_WINDOW:
            seen = seen & (position_ids_BT[b, q] - key_position_BK[b, kv] <= window[0])
        return seen

    return tree


@functools.cache
def _flex_attention(device_type: str) -> Any:
    """`flex_attention`, compiled on CUDA, where it runs fused; as is elsewhere (an unfused reference that
    gives the same numbers, used on CPU to check the block rendering)."""
    if device_type == "cuda":
        return torch.compile(flex_attention, dynamic=False)
    return flex_attention
