"""Pairs to rows, before rows are cut into batches (`batching`): which row holds each pair and at which column
(`plan_rows`), and, once each row has its batch, every row token and every target in batch order
(`row_tokens`, `row_targets`, as `Flat` arrays); rows that share prefixes across contexts are laid out by
`prefix_sharing` instead.

Pairs that read the same context tokens form a group; packed, a group's row holds its context once and its
pieces (`continuation[:-1]` of each pair) after it, cut into several rows past MIN_PACK_SPAN; plain, one
piece per row (`batching` describes both).
Legend: P pairs scored, Q the same pairs in group order, G context groups, R rows, K pieces, S spans of rows
(contexts and pieces), M tokens of all rows, N targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from inloop_eval.requests.table import PairSet

# A packed row's pieces may span at least this many tokens (or the context's length, if longer) before the
# group is cut into another row: attention over one long row costs more than repeating a short context.
MIN_PACK_SPAN = 256


@dataclass
class RowPlan:
    """Where every pair is read: rows (a context and its pieces) before they are cut into batches.

    ctx_pair_R: a pair (index into the scored list) whose context row r holds.
    length_R: tokens of row r.
    n_pieces_R: pieces in row r (a row with at most one is a plain causal row).
    row_P: the row of each pair.
    col_P: the column where a pair's piece starts (-1 for one-token continuations, which have none).
    """

    ctx_pair_R: np.ndarray
    length_R: np.ndarray
    n_pieces_R: np.ndarray
    row_P: np.ndarray
    col_P: np.ndarray


def pair_rows(pairs: PairSet, pair_ids: np.ndarray) -> Callable[[int], np.ndarray]:
    """Each planned pair's own row, context + continuation[:-1], by its index into `pair_ids`."""
    ctx_start_P = pairs.ctx_offsets[pairs.ctx_id[pair_ids]] + pairs.ctx_start[pair_ids]
    ctx_len_P, cont_len_P = pairs.ctx_len[pair_ids], pairs.cont_len[pair_ids]
    cont_start_P = pairs.cont_offsets[pair_ids]

    def sequence(p: int) -> np.ndarray:
        ctx = pairs.ctx_tokens[ctx_start_P[p] : ctx_start_P[p] + ctx_len_P[p]]
        return np.concatenate([ctx, pairs.cont_tokens[cont_start_P[p] : cont_start_P[p] + cont_len_P[p] - 1]])

    return sequence


def plan_rows(pairs: PairSet, pair_ids: np.ndarray, *, packing: bool, max_length: int | None) -> RowPlan:
    """Assign every pair a row and, if it has a piece, a column (see the module docstring)."""
    n_pairs = len(pair_ids)
    ctx_len_P = pairs.ctx_len[pair_ids].astype(np.int64)
    extra_P = pairs.cont_len[pair_ids].astype(np.int64) - 1  # a piece's length (0: no piece)
    group_P = pairs.context_groups(pair_ids)
    order = np.argsort(group_P, kind="stable")  # pairs by group, then by scored order
    group_Q = group_P[order]
    n_groups = int(group_Q[-1]) + 1 if n_pairs else 0
    first_G = np.searchsorted(group_Q, np.arange(n_groups))
    ctx_len_G = ctx_len_P[order[first_G]] if n_pairs else np.zeros(0, dtype=np.int64)
    extra_Q = extra_P[order]
    has_piece_Q = extra_Q > 0

    # Rank of each piece within its group, and the tokens of the pieces before it.
    piece_rank_Q = _exclusive_cumsum_by_group(has_piece_Q.astype(np.int64), first_G, group_Q)
    before_Q = _exclusive_cumsum_by_group(extra_Q, first_G, group_Q)
    n_pieces_G = np.bincount(group_Q, weights=has_piece_Q, minlength=n_groups).astype(np.int64)

    sub_row_Q = np.zeros(n_pairs, dtype=np.int64)
    col_Q = np.full(n_pairs, -1, dtype=np.int64)
    if packing:
        sub_rows_G = np.ones(n_groups, dtype=np.int64)
        col_Q[has_piece_Q] = ctx_len_G[group_Q[has_piece_Q]] + before_Q[has_piece_Q]
        span_G = _pack_span(ctx_len_G, extra_Q, group_Q, n_groups, max_length)
        total_G = np.bincount(group_Q, weights=extra_Q, minlength=n_groups).astype(np.int64)
        for g in np.flatnonzero(total_G > span_G):
            sub_rows_G[g] = _cut_group(
                slice(first_G[g], first_G[g] + _group_size(first_G, g, n_pairs)),
                extra_Q,
                int(span_G[g]),
                int(ctx_len_G[g]),
                sub_row_Q,
                col_Q,
            )
    else:
        # One piece per row; pairs without a piece ride on the group's first row.
        sub_row_Q[has_piece_Q] = piece_rank_Q[has_piece_Q]
        col_Q[has_piece_Q] = ctx_len_G[group_Q[has_piece_Q]]
        sub_rows_G = np.maximum(n_pieces_G, 1)

    row_base_G = np.concatenate([[0], np.cumsum(sub_rows_G)[:-1]]).astype(np.int64)
    row_Q = row_base_G[group_Q] + sub_row_Q
    n_rows = int(sub_rows_G.sum())
    group_R = np.repeat(np.arange(n_groups), sub_rows_G)
    length_R = ctx_len_G[group_R] + np.bincount(row_Q, weights=extra_Q, minlength=n_rows).astype(np.int64)
    n_pieces_R = np.bincount(row_Q, weights=has_piece_Q, minlength=n_rows).astype(np.int64)
    row_P = np.empty(n_pairs, dtype=np.int64)
    col_P = np.empty(n_pairs, dtype=np.int64)
    row_P[order] = row_Q
    col_P[order] = col_Q
    return RowPlan(order[first_G][group_R] if n_pairs else group_R, length_R, n_pieces_R, row_P, col_P)


def _exclusive_cumsum_by_group(values_Q: np.ndarray, first_G: np.ndarray, group_Q: np.ndarray) -> np.ndarray:
    """Exclusive prefix sum of `values_Q` restarting at each group."""
    if values_Q.size == 0:
        return values_Q.copy()
    inclusive = np.cumsum(values_Q)
    exclusive = inclusive - values_Q
    return exclusive - exclusive[first_G][group_Q]


def _group_size(first_G: np.ndarray, g: int, n_pairs: int) -> int:
    return int((first_G[g + 1] if g + 1 < len(first_G) else n_pairs) - first_G[g])


def _pack_span(
    ctx_len_G: np.ndarray, extra_Q: np.ndarray, group_Q: np.ndarray, n_groups: int, max_length: int | None
) -> np.ndarray:
    """Most piece tokens one packed row of each group may hold: at least MIN_PACK_SPAN (or the context's
    length), at most what `max_length` leaves after the context, never less than the longest piece."""
    longest_G = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(longest_G, group_Q, extra_Q)
    span_G = np.maximum(ctx_len_G, MIN_PACK_SPAN)
    if max_length is not None:
        span_G = np.minimum(span_G, max_length - ctx_len_G)
    return np.maximum(span_G, longest_G)


def _cut_group(
    members: slice, extra_Q: np.ndarray, span: int, ctx_len: int, sub_row_Q: np.ndarray, col_Q: np.ndarray
) -> int:
    """Greedily cut one group's pieces into rows of at most `span` piece tokens; returns the row count."""
    row, used = 0, 0
    for q in range(members.start, members.stop):
        extra = int(extra_Q[q])
        if extra == 0:
            continue  # read off the first row's context
        if used + extra > span:
            row, used = row + 1, 0
        sub_row_Q[q] = row
        col_Q[q] = ctx_len + used
        used += extra
    return row + 1


@dataclass
class Flat:
    """Values at (row, col) positions, in batch order: batch b owns elements [bounds[b], bounds[b + 1])."""

    row: np.ndarray
    col: np.ndarray
    values: dict[str, np.ndarray]
    bounds: np.ndarray


def _expand(
    lengths: np.ndarray, batch_of_span: np.ndarray, n_batches: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spans of `lengths` elements, laid out batch by batch: (span of each element, offset of each element in
    its span, bounds [n_batches + 1] of each batch's elements)."""
    per_batch = np.bincount(batch_of_span, weights=lengths, minlength=n_batches).astype(np.int64)
    order = np.argsort(batch_of_span, kind="stable")
    lengths = lengths[order]
    span_M = np.repeat(order, lengths)
    offset_M = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return span_M, offset_M, np.concatenate([[0], np.cumsum(per_batch)])


def row_tokens(
    pairs: PairSet, pair_ids: np.ndarray, row_plan: RowPlan, batch_R: np.ndarray, n_batches: int
) -> Flat:
    """Every token of every row: contexts at column 0, pieces at their columns, positions restarting; a
    context is seen by its whole row, a piece by itself."""
    ctx_pair_R = pair_ids[row_plan.ctx_pair_R]
    ctx_len_R = pairs.ctx_len[ctx_pair_R]
    piece_K = np.flatnonzero(row_plan.col_P >= 0)
    row_K = row_plan.row_P[piece_K]
    pool = np.concatenate([pairs.ctx_tokens, pairs.cont_tokens])
    n_rows = len(ctx_len_R)
    src_S = np.concatenate(
        [
            pairs.ctx_offsets[pairs.ctx_id[ctx_pair_R]] + pairs.ctx_start[ctx_pair_R],
            len(pairs.ctx_tokens) + pairs.cont_offsets[pair_ids[piece_K]],
        ]
    )
    len_S = np.concatenate([ctx_len_R, pairs.cont_len[pair_ids[piece_K]] - 1])
    row_S = np.concatenate([np.arange(n_rows), row_K])
    col_S = np.concatenate([np.zeros(n_rows, dtype=np.int64), row_plan.col_P[piece_K]])
    pos_S = np.concatenate([np.zeros(n_rows, dtype=np.int64), ctx_len_R[row_K]])
    end_S = np.concatenate([row_plan.length_R, col_S[n_rows:] + len_S[n_rows:]])  # a context is seen by its row
    span_M, offset_M, bounds = _expand(len_S, batch_R[row_S], n_batches)
    return Flat(
        row=row_S[span_M],
        col=col_S[span_M] + offset_M,
        values={
            "input_ids": pool[src_S[span_M] + offset_M],
            "position_ids": pos_S[span_M] + offset_M,
            "span_end": end_S[span_M],
        },
        bounds=bounds,
    )


def row_targets(
    pairs: PairSet, pair_ids: np.ndarray, row_plan: RowPlan, batch_R: np.ndarray, n_batches: int
) -> Flat:
    """Every continuation token, with the position whose logits predict it."""
    n_P = pairs.cont_len[pair_ids].astype(np.int64)
    pair_N, j_N, bounds = _expand(n_P, batch_R[row_plan.row_P], n_batches)
    row_N = row_plan.row_P[pair_N]
    ctx_len_R = pairs.ctx_len[pair_ids[row_plan.ctx_pair_R]]
    col_N = np.where(j_N == 0, ctx_len_R[row_N] - 1, row_plan.col_P[pair_N] + j_N - 1)
    return Flat(
        row=row_N,
        col=col_N,
        values={"target": pairs.cont_tokens[pairs.cont_offsets[pair_ids][pair_N] + j_N], "pair": pair_N},
        bounds=bounds,
    )
