"""Planning forward passes: pairs to rows, rows to token-budget batches.

A row is context + continuation[:-1]; the logits at the last context position and at every continuation
position but the last predict the continuation tokens. Rows are sorted by length (longest first) and
packed into batches of at most `batch_tokens` padded tokens; nothing is padded to fixed multiples.
Legend: P pairs, B rows in a batch, T longest row, N continuation tokens in a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inloop_eval.requests import PairSet


@dataclass
class Batch:
    """One forward pass.

    input_ids_BT: right-padded token ids (padding is never attended to by a real position).
    rows_N, cols_N: the positions whose logits predict target_N.
    pair_N: index (into the scored pair list) of the pair each target belongs to.
    """

    input_ids_BT: np.ndarray
    rows_N: np.ndarray
    cols_N: np.ndarray
    target_N: np.ndarray
    pair_N: np.ndarray

    @property
    def n_tokens(self) -> int:
        """Tokens forwarded, padding included."""
        return int(self.input_ids_BT.size)


def row_lengths(pairs: PairSet, pair_ids: np.ndarray) -> np.ndarray:
    return (pairs.ctx_len[pair_ids] + pairs.cont_len[pair_ids] - 1).astype(np.int64)


def plan_batches(pairs: PairSet, pair_ids: np.ndarray, batch_tokens: int, pad_id: int = 0) -> list[Batch]:
    """Batches scoring `pairs[pair_ids]`; `Batch.pair_N` indexes into `pair_ids`."""
    lengths = row_lengths(pairs, pair_ids)
    order = np.argsort(-lengths, kind="stable")
    batches: list[Batch] = []
    start = 0
    while start < len(order):
        longest = int(lengths[order[start]])
        n_rows = max(1, batch_tokens // max(longest, 1))
        chunk = order[start : start + n_rows]
        batches.append(_make_batch(pairs, pair_ids, chunk, longest, pad_id))
        start += len(chunk)
    return batches


def _make_batch(pairs: PairSet, pair_ids: np.ndarray, chunk: np.ndarray, width: int, pad_id: int) -> Batch:
    input_ids = np.full((len(chunk), width), pad_id, dtype=np.int64)
    rows, cols, targets, owners = [], [], [], []
    for b, local in enumerate(chunk):
        p = int(pair_ids[local])
        ctx, cont = pairs.context(p), pairs.continuation(p)
        row = np.concatenate([ctx, cont[:-1]])
        input_ids[b, : len(row)] = row
        n = len(cont)
        rows.append(np.full(n, b, dtype=np.int64))
        cols.append(np.arange(len(ctx) - 1, len(ctx) - 1 + n, dtype=np.int64))
        targets.append(cont)
        owners.append(np.full(n, local, dtype=np.int64))
    return Batch(
        input_ids, np.concatenate(rows), np.concatenate(cols), np.concatenate(targets), np.concatenate(owners)
    )


def dummy_batch(pad_id: int = 0) -> Batch:
    """A one-token forward whose result is discarded: keeps ranks' forward counts equal."""
    empty = np.zeros(0, dtype=np.int64)
    return Batch(
        np.full((1, 1), pad_id, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.full(1, pad_id, dtype=np.int64),
        empty,
    )
