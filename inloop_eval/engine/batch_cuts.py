"""Rows of known widths into batches: each width rounded up for bucketed shapes (`round_widths`), and the
rows, longest first, cut into token-budget batches where padding plus a fixed cost per forward pass is least
(`cut_batches`). `batching` plans the rows; perplexity's whole sequences are cut the same way.
Legend: R rows.
"""

from __future__ import annotations

import numpy as np

# What one forward pass costs beyond its tokens, in padded tokens: batches are cut where padding plus this
# per batch is least, so a few rows of different lengths share a pass rather than each taking its own.
# Tuned for CPU; it only trades padding against the number of passes, never changes a score.
FORWARD_COST_TOKENS = 64


def round_widths(length_R: np.ndarray, multiple: int, max_length: int | None) -> np.ndarray:
    """Each row's width: its length rounded up to `multiple`, but not past `max_length` (a row never gets
    positions the model does not have) unless it is that long already."""
    if multiple < 1:
        raise ValueError(f"round_widths: the width multiple must be >= 1 (1 = off), found {multiple}")
    width_R = -(-length_R // multiple) * multiple
    if max_length is not None:
        width_R = np.maximum(length_R, np.minimum(width_R, max_length))
    return width_R


def cut_batches(
    width_R: np.ndarray, batch_tokens: int, max_area: int | None = None, stem: int = 0
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Rows, longest first, into batches of at most `batch_tokens` padded tokens and, with `max_area`, at
    most that many attention scores, rows x (width - stem) x width (a row beyond either goes alone), cut
    where padded tokens + FORWARD_COST_TOKENS per batch is least (dynamic programming over the sorted rows).
    stem: a kept prefix counted in every width. Returns (batch of each row, its slot in it, batch widths)."""
    order_R = np.argsort(-width_R, kind="stable")
    sorted_R = width_R[order_R].astype(np.int64)
    n_rows = len(sorted_R)
    cost = np.full(n_rows + 1, np.inf)  # cost[j]: least cost of batching the first j sorted rows
    cost[0] = 0.0
    start = np.zeros(n_rows + 1, dtype=np.int64)  # start[j]: first row of the batch that ends at j
    for i in range(n_rows):
        width = int(sorted_R[i])
        stop = min(n_rows, i + max(1, batch_tokens // max(width, 1)))
        if max_area is not None:
            stop = min(stop, i + max(1, max_area // max(width * (width - stem), 1)))
        candidate = cost[i] + FORWARD_COST_TOKENS + width * np.arange(1, stop - i + 1)
        better = candidate < cost[i + 1 : stop + 1]
        cost[i + 1 : stop + 1][better] = candidate[better]
        start[i + 1 : stop + 1][better] = i
    bounds = [n_rows]
    while bounds[-1] > 0:
        bounds.append(int(start[bounds[-1]]))
    bounds.reverse()
    batch_R = np.empty(n_rows, dtype=np.int64)
    slot_R = np.empty(n_rows, dtype=np.int64)
    widths: list[int] = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        batch_R[order_R[lo:hi]] = len(widths)
        slot_R[order_R[lo:hi]] = np.arange(hi - lo)
        widths.append(int(sorted_R[lo]))
    return batch_R, slot_R, widths
