"""Rows that share a prefix: few-shot prompts put the same shots before every document of a task, so the
contexts of many rows begin with the same tokens. A *tree row* holds that prefix once and, after it, the rest
of each of its rows (their *branches*): a branch's tokens see the shared prefix and their own branch, never
another branch, at the positions they have in their own row, so every position computes exactly what it would
in the row alone (`batching.attention_mask_B1TT` with branch ids).

Which rows share: rows sorted by their context tokens, so that rows with a common prefix are neighbours; a
run of neighbours joins one tree row while the prefix they all share is at least MIN_SHARED_PREFIX tokens,
the tree row fits the cap (the model's context length, and a batch's token budget), and adding a row costs
less than forwarding it alone under the row cost model: a row of L tokens costs L x (1 + L / A), its tokens
plus attention over the row, A (`attention_tokens`) the row length at which attention costs as much as the
rest of the forward. A is a property of the device and the model: on CPU with small models a few hundred
tokens, on a GPU with large models far more (longer tree rows pay off there).

The trie minimum (`trie_minimum_tokens`): the tokens a prefix trie over every row a request would have alone
holds, i.e. every distinct prefix once: the least any sharing of prefixes can forward.
Legend: R rows of the layout (branches), S of them sorted by context, W tree rows, P pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# A shared prefix shorter than this is not worth a tree row: it saves little and lengthens the row.
MIN_SHARED_PREFIX = 32

# The row length at which attention over the row costs as much as the rest of the forward, by device type:
# the default of `attention_tokens`. CPU: chosen from `benchmarks/prefix_sharing.py --attention-tokens` on
# the reference GPT (width 256, 4 layers, 2 cores): 512 gave the shortest wall time (1.53x against no
# sharing, 1.39x at 1,024 and at 2,048) at 1.20x the trie minimum, and no more peak memory than rows without
# sharing (2,048: 1.4x). CUDA: not measured here (no GPU was lent); attention there costs relatively less,
# so rows may grow longer.
ATTENTION_COST_TOKENS = 512
ATTENTION_COST_TOKENS_BY_DEVICE = {"cpu": ATTENTION_COST_TOKENS, "cuda": 16 * ATTENTION_COST_TOKENS}


def attention_tokens_for(device_type: str, configured: int | None = None) -> int:
    """The cost model's constant: `configured` when set, else the default of the device type."""
    if configured is not None:
        return configured
    return ATTENTION_COST_TOKENS_BY_DEVICE.get(device_type, ATTENTION_COST_TOKENS)


@dataclass
class TreeRows:
    """Where every row of a layout goes.

    tree_R: the tree row each row is a branch of.
    prefix_R: the shared prefix length of that tree row (0 for a row alone).
    offset_R: the column where the row's tokens from `prefix_R` on start in its tree row.
    holds_prefix_R: the row whose tokens [0, prefix) stand for the tree row's shared prefix.
    slot_R: the branch number of the row within its tree row (1, 2, ...).
    length_W: tokens of each tree row.
    """

    tree_R: np.ndarray
    prefix_R: np.ndarray
    offset_R: np.ndarray
    holds_prefix_R: np.ndarray
    slot_R: np.ndarray
    length_W: np.ndarray


def row_cost(length: int, attention_tokens: int) -> float:
    """The cost model of one row of `length` tokens: its tokens, each attending over the row."""
    return length * (1.0 + length / attention_tokens)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The number of leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def sorted_by_tokens(sequences: list[np.ndarray]) -> np.ndarray:
    """The order of `sequences` sorted lexicographically by their tokens (non-negative ids)."""
    keys = [s.astype(">u4").tobytes() for s in sequences]
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


def share_prefixes(
    context_R: Callable[[int], np.ndarray],
    length_R: np.ndarray,
    shareable_R: np.ndarray,
    *,
    cap: int,
    attention_tokens: int = ATTENTION_COST_TOKENS,
) -> TreeRows:
    """Tree rows for rows of `length_R` tokens whose contexts are `context_R(r)` (each row begins with its
    context). Only rows with `shareable_R` join others; the rest stay alone. A tree row never exceeds `cap`
    tokens; each branch keeps at least its context's last token (which predicts its first continuation
    token) after the prefix."""
    n_rows = len(length_R)
    tree_R = np.full(n_rows, -1, dtype=np.int64)
    prefix_R = np.zeros(n_rows, dtype=np.int64)
    candidates = np.flatnonzero(shareable_R)
    contexts = {int(r): context_R(int(r)) for r in candidates}
    runs: list[tuple[list[int], int]] = []
    members: list[int] = []
    prefix, total = 0, 0
    for r in candidates[sorted_by_tokens([contexts[int(r)] for r in candidates])].tolist():
        length = int(length_R[r])
        if members:
            shared = min(prefix, common_prefix(contexts[members[-1]], contexts[r]), len(contexts[r]) - 1)
            joined = total + length - len(members) * shared
            alone = total - (len(members) - 1) * prefix
            gain = row_cost(alone, attention_tokens) + row_cost(length, attention_tokens)
            if shared >= MIN_SHARED_PREFIX and joined <= cap and row_cost(joined, attention_tokens) < gain:
                members.append(r)
                prefix, total = shared, total + length
                continue
            runs.append((members, prefix))
        members, prefix, total = [r], len(contexts[r]) - 1, length
    if members:
        runs.append((members, prefix))
    for w, (run, shared) in enumerate(runs):
        tree_R[run] = w
        prefix_R[run] = shared if len(run) > 1 else 0
    alone = np.flatnonzero(tree_R < 0)
    tree_R[alone] = len(runs) + np.arange(len(alone))
    return _place(tree_R, prefix_R, length_R, len(runs) + len(alone))


def _place(tree_R: np.ndarray, prefix_R: np.ndarray, length_R: np.ndarray, n_tree: int) -> TreeRows:
    """Columns of every branch: the shared prefix once, then each branch's own tokens in row order."""
    order = np.argsort(tree_R, kind="stable")
    own_S = (length_R - prefix_R)[order]
    tree_S = tree_R[order]
    first_W = np.searchsorted(tree_S, np.arange(n_tree))
    before_S = np.cumsum(own_S) - own_S
    before_S -= before_S[first_W][tree_S]
    offset_R = np.empty_like(length_R)
    offset_R[order] = prefix_R[order] + before_S
    slot_R = np.empty_like(length_R)
    slot_R[order] = np.arange(len(order)) - first_W[tree_S] + 1
    holds_prefix_R = slot_R == 1
    length_W = np.bincount(tree_R, weights=length_R - prefix_R, minlength=n_tree).astype(np.int64)
    length_W += np.bincount(tree_R, weights=np.where(holds_prefix_R, prefix_R, 0), minlength=n_tree).astype(
        np.int64
    )
    return TreeRows(tree_R, prefix_R, offset_R, holds_prefix_R, slot_R, length_W)


def trie_minimum_tokens(sequences: list[np.ndarray]) -> int:
    """The tokens of a prefix trie over `sequences` (every distinct prefix once): their total length less the
    prefix each shares with its predecessor in sorted order."""
    if not sequences:
        return 0
    ordered = [sequences[i] for i in sorted_by_tokens(sequences)]
    shared = sum(common_prefix(a, b) for a, b in zip(ordered[:-1], ordered[1:], strict=True))
    return int(sum(len(s) for s in sequences) - shared)
