"""FlexAttention over a packed batch's block rendering, as an evaluation runs it: compiled once per length of a
fixed ladder (on CUDA, and wherever configured), or eager (an unfused reference), and never unfused unseen.

What it promises (`tree_attention.tree_attention` relies on it):
- The numbers of the dense rendering: each query attends to exactly the keys `tree_attention.dense_mask`
  lets it see, within the window.
- Shapes decided before the data. A batch of B rows of width T after a kept prefix of S keys is arranged as
  one sequence (`arrange`) of L = `sequence_length(S + B * T)` positions, a power of two of at least
  MIN_LENGTH, and flex_attention sees queries, keys and values [1, heads, L, D] and block tables
  [1, 1, L / 128, L / 128]. Everything else (where each key's subtree ends, the positions, the window) is
  data the mask function reads, not a constant of the graph. So a model compiles at most one graph per
  ladder length it reaches (for its heads, head width and dtype), the lengths follow from the plan before
  the first batch (`evaluation.attention_lengths`), and a later evaluation compiles nothing.
- A call it cannot run compiled (torch refuses to compile its shape, or the graph would pass torch's
  recompile limit) is not run unfused: `FlexKernel.attend` returns None, the caller runs the dense rendering
  through SDPA, and the kernel counts the call (`fallback_calls`) and logs each reason once.
- It does not promise that every rank compiles the same lengths: each rank reaches the lengths of its own
  batches (a rank that compiles one more waits once, at the next agreement point).

The sequence: position i < S holds the kept prefix's key i (its query slot sees nothing); S <= i < S + B*T
holds row (i - S) // T, column (i - S) % T, as a query and as a key; the rest is padding that sees nothing.
Key j is seen by the queries start_L[j] <= i < end_L[j] whose position is at most `back` past the key's
(pos_L[i] - pos_L[j] <= back). Blocks of BLOCK_SIZE x BLOCK_SIZE are listed full (every query of the block
sees every key of it: the mask function is not run there) or partial; blocks no query sees are not listed.
Legend: L sequence length, B rows, T time, S kept prefix, N = B * T, H query heads, G key/value heads, D head
width, Q query blocks, K key blocks.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

log = logging.getLogger(__name__)

# FlexAttention's block: each side of a block of queries x keys the kernel skips or computes whole.
BLOCK_SIZE = 128
# The shortest sequence a batch is arranged in: shorter batches share its graph (their padding's query
# blocks list no keys, and the kernel leaves them at once).
MIN_LENGTH = 1024
# A window reaching this many positions back never binds: the mask function's `back` when there is none.
NO_BACK = 1 << 30
# Graphs torch may hold for flex_attention while the kernel calls it (torch's own default is 8): one per
# ladder length, for every model evaluated in the process.
RECOMPILE_LIMIT = 64


def sequence_length(tokens: int) -> int:
    """The ladder length a batch of `tokens` keys (S + B * T) is arranged in: the least power of two of at
    least MIN_LENGTH that holds them."""
    length = MIN_LENGTH
    while length < tokens:
        length *= 2
    return length


@dataclass(frozen=True)
class Sequence:
    """One batch set end to end (see the module docstring): for each position j of the sequence, the queries
    start_L[j] <= i < end_L[j] see it as a key, and pos_L[j] is its position (int32 [L] each)."""

    start_L: Tensor
    end_L: Tensor
    pos_L: Tensor
    prefix: int
    rows: int
    width: int

    @property
    def length(self) -> int:
        return int(self.start_L.shape[0])


def arrange(span_end_BT: Tensor, position_ids_BT: Tensor, prefix: int) -> Sequence:
    """The `Sequence` of a batch whose column j of row b is seen by its columns j..span_end_BT[b, j] - 1,
    at positions `position_ids_BT`, after a kept prefix of `prefix` keys every real query sees."""
    B, T = span_end_BT.shape
    S, N = prefix, B * T
    L = sequence_length(S + N)
    device = span_end_BT.device
    start_L = torch.zeros(L, dtype=torch.int32, device=device)
    end_L = torch.zeros(L, dtype=torch.int32, device=device)
    pos_L = torch.zeros(L, dtype=torch.int32, device=device)
    start_L[:S] = S
    end_L[:S] = S + N
    pos_L[:S] = torch.arange(S, dtype=torch.int32, device=device)
    row_start_B1 = S + torch.arange(B, device=device)[:, None] * T
    start_L[S : S + N] = (row_start_B1 + torch.arange(T, device=device)).flatten().to(torch.int32)
    end_L[S : S + N] = (row_start_B1 + span_end_BT).flatten().to(torch.int32)
    pos_L[S : S + N] = position_ids_BT.flatten().to(torch.int32)
    return Sequence(start_L, end_L, pos_L, S, B, T)


def block_mask(seq: Sequence, back: int = NO_BACK) -> BlockMask:
    """The `BlockMask` of `seq` with a window `back` positions deep: its tables list each query block's
    partial and full key blocks, from per-key ranges in O(L + Q x K) (no L x L tensor)."""
    L, device = seq.length, seq.start_L.device
    n = L // BLOCK_SIZE
    q0_Q = torch.arange(n, device=device) * BLOCK_SIZE
    seen_KQ = _reached_blocks(seq.start_L, seq.end_L, n)
    start_KX, end_KX = seq.start_L.view(n, BLOCK_SIZE), seq.end_L.view(n, BLOCK_SIZE)
    full_KQ = (start_KX.amax(1)[:, None] <= q0_Q) & (end_KX.amin(1)[:, None] >= q0_Q + BLOCK_SIZE)
    if back < NO_BACK:
        pos_BX = seq.pos_L.view(n, BLOCK_SIZE)
        lo_Q, hi_Q = pos_BX.amin(1), pos_BX.amax(1)  # query blocks' positions
        seen_KQ &= lo_Q[None, :] - hi_Q[:, None] <= back  # some pair of the block within the window
        full_KQ &= hi_Q[None, :] - lo_Q[:, None] <= back  # every pair within it
    full_QK = (full_KQ & seen_KQ).T.contiguous()
    partial_QK = (seen_KQ.T & ~full_QK).contiguous()
    kv_num, kv_indices = _block_table(partial_QK)
    full_num, full_indices = _block_table(full_QK)
    return BlockMask.from_kv_blocks(
        kv_num, kv_indices, full_num, full_indices,
        BLOCK_SIZE=BLOCK_SIZE, mask_mod=_mask_mod(seq, back), seq_lengths=(L, L), compute_q_blocks=False,
    )  # fmt: skip


def _reached_blocks(start_L: Tensor, end_L: Tensor, n: int) -> Tensor:
    """[K, Q]: some key of key block k is seen by some query of query block q. Each key reaches one run of
    query blocks, marked with +1 at its first and -1 past its last (0 for a key no query sees: no boolean
    indexing, so no wait for the device), summed along the query blocks."""
    seen_L = (end_L > start_L).to(torch.int32)
    key_block_L = torch.arange(start_L.shape[0], device=start_L.device) // BLOCK_SIZE
    first_L = (start_L // BLOCK_SIZE).long().clamp(0, n)
    past_L = ((end_L - 1) // BLOCK_SIZE + 1).long().clamp(0, n)
    marks_KQ = torch.zeros(n, n + 1, dtype=torch.int32, device=start_L.device)
    marks_KQ.index_put_((key_block_L, first_L), seen_L, accumulate=True)
    marks_KQ.index_put_((key_block_L, past_L), -seen_L, accumulate=True)
    return marks_KQ.cumsum(1)[:, :n] > 0


def _block_table(listed_QK: Tensor) -> tuple[Tensor, Tensor]:
    """FlexAttention's table of `listed_QK`: the number of key blocks listed per query block [1, 1, Q] and
    their indices first [1, 1, Q, K], contiguous (the compiled kernel reads the indices row by row)."""
    num_Q = listed_QK.sum(-1, dtype=torch.int32)
    indices_QK = torch.argsort((~listed_QK).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num_Q[None, None].contiguous(), indices_QK[None, None].contiguous()


def _mask_mod(seq: Sequence, back: int) -> Any:
    """The mask function of `seq`: every value it reads is a tensor, so that one compiled graph serves every
    batch of a ladder length, whatever its rows, prefix and window."""
    start_L, end_L, pos_L = seq.start_L, seq.end_L, seq.pos_L
    back_ = torch.tensor(back, dtype=torch.int32, device=start_L.device)

    def sees(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (start_L[kv] <= q) & (q < end_L[kv]) & (pos_L[q] - pos_L[kv] <= back_)

    return sees


@functools.cache
def compiled_flex_attention() -> Any:
    """`flex_attention` compiled by inductor with static shapes and no graph break: one graph per shape."""
    return torch.compile(flex_attention, dynamic=False, fullgraph=True)


@dataclass
class FlexKernel:
    """flex_attention as one evaluation runs it, and what it did.

    compiled: run it compiled (fused; on CPU through inductor's CPU template, as CUDA compiles it), else
        eager (an unfused reference: it materialises every score).
    calls: calls run by flex_attention; shapes: the distinct (length, heads, key/value heads, head width,
        dtype, device) they had, one compiled graph each.
    fallback_calls: calls refused (returned None, for the dense rendering); refused: each refused shape
        and why.
    """

    compiled: bool
    calls: int = 0
    shapes: set[tuple[Any, ...]] = field(default_factory=set)
    fallback_calls: int = 0
    refused: dict[tuple[Any, ...], str] = field(default_factory=dict)

    def attend(
        self, q_BHTD: Tensor, k_BGKD: Tensor, v_BGKD: Tensor, seq: Sequence, mask: BlockMask, scale: float | None
    ) -> Tensor | None:
        """Attention [B, H, T, D] of the batch arranged as `seq` (keys 0..S-1 of every row the kept
        prefix's), under its block `mask`; None where the compiled kernel cannot run it."""
        (B, H, T, D), G = q_BHTD.shape, k_BGKD.shape[1]
        S, N, L = seq.prefix, B * T, seq.length
        shape = (L, H, G, D, q_BHTD.dtype, q_BHTD.device.type)
        if shape in self.refused:
            self.fallback_calls += 1
            return None
        q_1HLD = _arranged(q_BHTD, None, L, S)
        k_1GLD, v_1GLD = _arranged(k_BGKD, S, L, S), _arranged(v_BGKD, S, L, S)
        try:
            out_1HLD = self._run(q_1HLD, k_1GLD, v_1GLD, mask, scale, G != H)
        except Exception as exc:  # torch refused to compile this shape: never a shape that ran before
            if not self.compiled or shape in self.shapes:
                raise
            self.refused[shape] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.fallback_calls += 1
            log.warning(
                "attention: flex_attention could not be compiled for a sequence of %d (%d heads of %d, %s); "
                "such batches run the dense mask through SDPA instead (%s)",
                L, H, D, q_BHTD.dtype, self.refused[shape],
            )  # fmt: skip
            return None
        self.calls += 1
        self.shapes.add(shape)
        return out_1HLD[0, :, S : S + N].reshape(H, B, T, D).transpose(0, 1).contiguous()

    def _run(self, q: Tensor, k: Tensor, v: Tensor, mask: BlockMask, scale: float | None, gqa: bool) -> Tensor:
        if not self.compiled:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # eager flex_attention says it is unfused: here it is meant to be
                return flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)
        limits = {"recompile_limit": RECOMPILE_LIMIT, "fail_on_recompile_limit_hit": True}
        with torch._dynamo.config.patch(limits):
            return compiled_flex_attention()(q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)

    def summary(self) -> str:
        """One line: the calls run, the graphs' shapes, and the calls refused with why."""
        lengths = sorted({shape[0] for shape in self.shapes})
        line = f"flex_attention {'compiled' if self.compiled else 'eager'}: {self.calls} calls over sequences of {lengths}"
        if self.fallback_calls:
            line += f"; {self.fallback_calls} calls ran the dense mask instead ({'; '.join(self.refused.values())})"
        return line


def _arranged(x_BXTD: Tensor, prefix: int | None, L: int, S: int) -> Tensor:
    """Queries (prefix None: [B, H, T, D]) or keys and values ([B, G, S + T, D], their first `prefix` the
    kept prefix's, alike in every row) arranged as one sequence [1, heads, L, D]: the prefix's keys at 0..S-1,
    row b's own at S + b*T.., zeros elsewhere."""
    B, X, K, D = x_BXTD.shape
    own = x_BXTD if prefix is None else x_BXTD[:, :, prefix:]
    T = own.shape[2]
    out_1XLD = x_BXTD.new_zeros(1, X, L, D)
    if prefix:
        out_1XLD[0, :, :S] = x_BXTD[0, :, :S]
    out_1XLD[0, :, S : S + B * T] = own.transpose(0, 1).reshape(X, B * T, D)
    return out_1XLD
