"""The engine's own attention for packed rows: the one function each framework's core attention call is routed
through during an evaluation, whatever kernel the model trains with, and the plan's mask in the two forms
it is rendered in.

A packed batch's mask is held compactly, as the planner made it (`TreeMask`): for each row and column j the
end of j's subtree in the row's trie (`span_end_BT`: j is seen by columns j..span_end - 1), the length S of
a kept prefix every real position sees, and each token's position (for sliding windows). It is rendered
- dense: a boolean [B, 1, T, S + T] mask for `F.scaled_dot_product_attention` (T x T per row; the CPU's);
- block: the batch arranged as one sequence of a ladder length and a FlexAttention `BlockMask` over it
  (`flex_kernel`), its tables computed without any T x T tensor and its mask function reading the sequence
  as data: memory proportional to blocks, the kernel skips the blocks no query sees and runs the mask
  function only in partial ones, and a compiled `flex_attention` makes one graph per ladder length.
`mask_rendering(device, configured)` is the one place the rendering is chosen: `configured` ("dense" or
"block") when given, else block on CUDA and dense elsewhere; `block_kernel` makes what runs a block
rendering, compiled on CUDA unless configured otherwise.

Padding sees itself and the kept prefix only, so no query's softmax
is over nothing; no real position sees padding.
Legend: B rows, T time, S a kept prefix's length, K keys (S + T), H query heads, G key/value heads, D head
width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from inloop_eval.engine.flex_kernel import NO_BACK, FlexKernel, Sequence, arrange, block_mask

MASK_RENDERINGS = ("dense", "block")
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


def block_kernel(rendering: str, device: torch.device, compiled: bool | None = None) -> FlexKernel | None:
    """What runs the `rendering` of one evaluation's masks on `device`: for "block" a `FlexKernel`, compiled
    where `compiled` says (None: on CUDA only); None for "dense"."""
    if rendering != "block":
        return None
    return FlexKernel(compiled=device.type == "cuda" if compiled is None else compiled)


@dataclass
class TreeMask:
    """The mask of one packed batch, compact: `span_end_BT` (column j is seen by columns j..span_end - 1),
    `prefix_length` S (a kept prefix every position sees, keys 0..S-1, positions 0..S-1) and
    `position_ids_BT` (each token's position, read for sliding windows). Renderings are made on first use
    and kept for the batch, one per window that can bind in it; `kernel` runs the block rendering (None: an
    eager `flex_kernel.FlexKernel` of the mask's own)."""

    span_end_BT: Tensor
    position_ids_BT: Tensor
    prefix_length: int = 0
    rendering: str = "dense"
    kernel: FlexKernel | None = None
    _dense: dict[tuple[int, int], Tensor] = field(default_factory=dict, repr=False)
    _block: dict[int, BlockMask] = field(default_factory=dict, repr=False)
    _sequence: list[Sequence] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.rendering == "block" and self.kernel is None:
            self.kernel = FlexKernel(compiled=False)

    @property
    def keys(self) -> int:
        """K: the keys each query is scored against, the kept prefix's and the row's own."""
        return self.prefix_length + self.span_end_BT.shape[1]

    def binds(self, window: tuple[int, int]) -> bool:
        """Whether `window` can narrow this batch's mask: some query lies more than `window[0]` positions
        past a key (no position in it reaches S + T)."""
        return tuple(window) != NO_WINDOW and window[0] < self.keys - 1

    def dense(self, window: tuple[int, int] = NO_WINDOW) -> Tensor:
        """The boolean mask [B, 1, T, S + T] (True = may attend), narrowed to `window` where it binds."""
        window = tuple(window) if self.binds(window) else NO_WINDOW
        if window not in self._dense:
            if window == NO_WINDOW:
                self._dense[window] = dense_mask(self.span_end_BT, self.prefix_length)
            else:
                within_KT = _within_window(self.position_ids_BT, self.prefix_length, window)
                self._dense[window] = self.dense() & within_KT[:, None]
        return self._dense[window]

    @property
    def sequence(self) -> Sequence:
        """The batch arranged as one sequence of a ladder length, for the block rendering (`flex_kernel`)."""
        if not self._sequence:
            self._sequence.append(arrange(self.span_end_BT, self.position_ids_BT, self.prefix_length))
        return self._sequence[0]

    def block(self, window: tuple[int, int] = NO_WINDOW) -> BlockMask:
        """The FlexAttention `BlockMask` of the same mask over `sequence`, narrowed to `window` where it
        binds."""
        back = window[0] if self.binds(window) else NO_BACK
        if back not in self._block:
            self._block[back] = block_mask(self.sequence, back)
        return self._block[back]


def causal_tree(
    rows: int, width: int, device: torch.device, rendering: str = "dense", kernel: FlexKernel | None = None
) -> TreeMask:
    """The `TreeMask` of plain causal rows [rows, width] at positions 0..width-1: each column seen by every
    later one (right padding follows the real positions, so none sees it)."""
    span_end_BT = torch.full((rows, width), width, dtype=torch.long, device=device)
    position_ids_BT = torch.arange(width, device=device).expand(rows, width)
    return TreeMask(span_end_BT, position_ids_BT, 0, rendering, kernel)


def tree_attention(
    q_BHTD: Tensor,
    k_BGKD: Tensor,
    v_BGKD: Tensor,
    mask: TreeMask,
    scale: float | None = None,
    window: tuple[int, int] = NO_WINDOW,
) -> Tensor:
    """Attention [B, H, T, D] of queries over keys and values under `mask` in its rendering: each query
    sees its own trie path and the kept prefix (keys 0..S-1 of `k_BGKD`, `v_BGKD`, where S > 0: one prefix,
    the same in every row), within
    `window`. Grouped-query attention: query head h reads key/value head h // (H / G), as every framework
    here repeats them. A block rendering its kernel cannot run compiled runs dense (`FlexKernel.attend`)."""
    H, G = q_BHTD.shape[1], k_BGKD.shape[1]
    if H % G:
        raise ValueError(f"tree attention: {H} query heads are not a multiple of {G} key/value heads")
    if k_BGKD.shape[2] != mask.keys:
        raise ValueError(f"tree attention: {k_BGKD.shape[2]} keys for a mask of {mask.keys} (S + T)")
    if mask.rendering == "block" and mask.kernel is not None:
        out_BHTD = mask.kernel.attend(q_BHTD, k_BGKD, v_BGKD, mask.sequence, mask.block(window), scale)
        if out_BHTD is not None:
            return out_BHTD
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
