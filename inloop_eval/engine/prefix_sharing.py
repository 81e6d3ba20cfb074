"""Rows as prefix tries: every request's own row (`context + continuation[:-1]`) is a path from the root
of one trie over all the requests planned together, and each trie node's token is forwarded once wherever
the model lets it. Few-shot prompts put the same shots before every document of a task, a document's
choices share its context, and choices often share their first tokens: all of it is forwarded once.

Two mechanisms, both keeping every position's numbers those of its own unshared row (it sees exactly its
ancestors, at the same position ids):
- Tree rows: a row holds a subtree of the trie in depth-first order; a token is seen by the tokens of its
  own subtree, which follow it (`TrieRows.span_end_M`, `tree_attention.TreeMask`), and its position id
  is its depth. A subtree too large for one row is cut into several, each repeating the path above it.
- Kept prefixes (`stem`s, models with `AdapterNeeds.prefix_reuse`): a prefix shared by many rows (the shot
  block) is forwarded once as a row of its own, and its keys and values are attended to by every row below
  it, batch after batch (`adapter.SharedPrefix`). Only this helps where one document's context is longer
  than half a row (MMLU passages after their shots): its tree row holds one document.

How rows are chosen: requests sorted by their tokens, so that the trie is walked depth first. Runs of
neighbours all beginning with the same >= MIN_STEM tokens get that prefix as a stem, the runs chosen level
by level of the trie to save the most tokens (a run of c contexts sharing s tokens saves (c - 1) x s:
every member but one forwards them once less; `_best_runs`), neighbouring runs whose stems lie within
MIN_STEM tokens of the prefix they share made one.
Below its stem, neighbours join one tree row while the row and its stem fit `cap` (the keys its tokens
attend to) and joining costs less than a row of their own under the row cost model: a row of L tokens
after a stem of S costs L x (1 + (S + L) / A), its tokens plus attention over what they see, A
(`attention_tokens`) the row length at which attention costs as much as the rest of the forward, a
property of the device and the model.

The trie minimum (`trie_minimum_tokens`): the tokens of the trie over every row a request would have alone,
i.e. every distinct prefix once: the least any sharing of prefixes can forward.
Legend: P pairs planned, S the same sorted by their tokens, W rows, X stems, M tokens of all rows, N targets
(each pair's continuation tokens, pairs in planned order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# A stem shorter than this is not kept: its one extra forward costs more than it saves.
MIN_STEM = 64

# The row length at which attention over the row costs as much as the rest of the forward, by device type:
# the default of `attention_tokens`. CPU: chosen from `benchmarks/prefix_sharing.py --attention-tokens` on
# the reference GPT (width 256, 4 layers, 2 cores). CUDA: not measured here (no GPU was lent); attention
# there costs relatively less, so rows may grow longer; `python -m benchmarks.gpu` fits it on a GPU.
ATTENTION_COST_TOKENS = 512
ATTENTION_COST_TOKENS_BY_DEVICE = {"cpu": ATTENTION_COST_TOKENS, "cuda": 16 * ATTENTION_COST_TOKENS}


def attention_tokens_for(device_type: str, configured: int | None = None) -> int:
    """The cost model's constant: `configured` when set, else the default of the device type."""
    if configured is not None:
        return configured
    return ATTENTION_COST_TOKENS_BY_DEVICE.get(device_type, ATTENTION_COST_TOKENS)


def row_cost(length: int, attention_tokens: int, stem: int = 0) -> float:
    """The cost model of one row of `length` tokens after a kept stem of `stem`: its tokens, each attending
    over the stem and the row."""
    return length * (1.0 + (stem + length) / attention_tokens)


@dataclass
class TrieRows:
    """Every row's tokens and where every target is read.

    row_M, col_M: the row and column of each token; pair_M, depth_M: a pair whose row holds that token, and
        its index there (its position id); span_end_M: the column after its subtree (the tokens that see it).
    row_N, col_N: the position whose logits predict each target.
    length_W: tokens of each row (its stem not included); stem_W: the stem its rows begin with (-1: none).
    stem_pair_X, stem_length_X: stem x is the first `stem_length_X[x]` tokens of pair `stem_pair_X[x]`'s row.
    """

    row_M: np.ndarray
    col_M: np.ndarray
    pair_M: np.ndarray
    depth_M: np.ndarray
    span_end_M: np.ndarray
    row_N: np.ndarray
    col_N: np.ndarray
    length_W: np.ndarray
    stem_W: np.ndarray
    stem_pair_X: np.ndarray
    stem_length_X: np.ndarray


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The number of leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def sorted_by_tokens(sequences: list[np.ndarray]) -> np.ndarray:
    """The order of `sequences` sorted lexicographically by their tokens (non-negative ids)."""
    keys = [s.astype(">u4").tobytes() for s in sequences]
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


@dataclass
class TrieWalk:
    """The trie's depth-first walk: the pairs sorted by their rows' tokens (`order_S`) and how many leading
    tokens each shares with the one before it (`lcp_S`, 0 for the first). Made once for every plan."""

    order_S: np.ndarray
    lcp_S: np.ndarray


def walk_trie(sequence_P: Callable[[int], np.ndarray], n_pairs: int) -> TrieWalk:
    """The walk over the rows `sequence_P(p)` of `n_pairs` pairs."""
    seqs = [sequence_P(p) for p in range(n_pairs)]
    order_S = sorted_by_tokens(seqs) if n_pairs else np.zeros(0, dtype=np.int64)
    lcp_S = np.zeros(n_pairs, dtype=np.int64)
    for i in range(1, n_pairs):
        lcp_S[i] = common_prefix(seqs[order_S[i - 1]], seqs[order_S[i]])
    return TrieWalk(order_S, lcp_S)


def plan_trie_rows(
    walk: TrieWalk,
    ctx_len_P: np.ndarray,
    cont_len_P: np.ndarray,
    *,
    cap: int,
    attention_tokens: int = ATTENTION_COST_TOKENS,
    keep_stems: bool = False,
) -> TrieRows:
    """Rows for pairs whose own rows (context + continuation[:-1], of length ctx_len + cont_len - 1) the
    `walk` sorted: tree rows of at most `cap` tokens with their stem (a pair's own row is never cut), below
    kept stems when `keep_stems`. A stem always ends before a member's last context token, whose logits
    predict its first continuation token."""
    len_P = (ctx_len_P + cont_len_P - 1).astype(np.int64)
    order_S, lcp_S = walk.order_S, walk.lcp_S
    stem_len_S, group_S = _stems(lcp_S, ctx_len_P[order_S].astype(np.int64), keep_stems)
    return _lay_out(order_S, lcp_S, len_P, ctx_len_P, cont_len_P, stem_len_S, group_S, cap, attention_tokens)


def _stems(lcp_S: np.ndarray, ctx_len_S: np.ndarray, keep: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each sorted row's stem length (0: none) and its stem group (the runs of neighbours that keep one
    stem; rows without one form groups too): with `keep`, the runs `_best_runs` finds. A run of one context
    keeps no stem."""
    n = len(lcp_S)
    stem_S = np.zeros(n, dtype=np.int64)
    group_S = np.zeros(n, dtype=np.int64)
    if n == 0:
        return stem_S, group_S
    # Between rows i - 1 and i: the prefix a run across them may keep (it ends before either row's last
    # context token), and whether row i starts a new context (it does unless it shares its neighbour's).
    level_S = np.zeros(n, dtype=np.int64)
    level_S[1:] = np.minimum(lcp_S[1:], np.minimum(ctx_len_S[1:], ctx_len_S[:-1]) - 1)
    new_context_S = np.ones(n, dtype=bool)
    new_context_S[1:] = lcp_S[1:] < np.minimum(ctx_len_S[1:], ctx_len_S[:-1])
    run_S = np.arange(n)  # the first row of each row's run
    if keep:
        for first, last, stem in _best_runs(level_S, new_context_S):
            run_S[first : last + 1] = first
            stem_S[first : last + 1] = stem
    key_S = np.where(stem_S > 0, run_S, -1)  # neighbours without a stem share a group
    group_S[1:] = np.cumsum(key_S[1:] != key_S[:-1])
    return stem_S, group_S


def _best_runs(level_S: np.ndarray, new_context_S: np.ndarray) -> list[tuple[int, int, int]]:
    """The runs of sorted rows (first, last, stem) that save the most tokens: a run of c contexts whose rows
    all begin with the same s >= MIN_STEM tokens saves (c - 1) x s (every context but one forwards them once
    less). Chosen over the tree of the trie's levels between neighbours (a Cartesian tree of `level_S[1:]`,
    boundary i lying between rows i - 1 and i): each node, the boundaries of a range whose lowest level is
    its own, either keeps that level as one run over its whole range or leaves its two sides to choose
    alone, whichever saves more. So where a few rows share only the shots' first tokens and many share all
    of them, the many keep them all (a greedy walk would lower the stem for the few first)."""
    n = len(level_S)
    left = np.full(n, -1, dtype=np.int64)
    right = np.full(n, -1, dtype=np.int64)
    stack: list[int] = []
    for b in range(1, n):  # the Cartesian tree, its root the lowest boundary
        last = -1
        while stack and level_S[stack[-1]] > level_S[b]:
            last = stack.pop()
        left[b] = last
        if stack:
            right[stack[-1]] = b
        stack.append(b)
    if not stack:
        return []
    contexts_S = np.cumsum(new_context_S)  # new contexts at boundaries 1..i: contexts_S[i] - 1
    lo, hi = np.arange(n), np.arange(n)
    saved = np.zeros(n, dtype=np.int64)
    whole = np.zeros(n, dtype=bool)
    for b in _post_order(stack[0], left, right):
        children = [c for c in (left[b], right[b]) if c >= 0]
        lo[b] = lo[left[b]] if left[b] >= 0 else b
        hi[b] = hi[right[b]] if right[b] >= 0 else b
        split = sum(int(saved[c]) for c in children)
        level = int(level_S[b])
        one_run = level * int(contexts_S[hi[b]] - contexts_S[lo[b] - 1]) if level >= MIN_STEM else 0
        whole[b] = one_run > 0 and one_run >= split
        saved[b] = one_run if whole[b] else split
    runs: list[tuple[int, int, int]] = []
    todo = [stack[0]]
    while todo:
        b = todo.pop()
        if whole[b]:
            runs.append((int(lo[b]) - 1, int(hi[b]), int(level_S[b])))
        else:
            todo += [c for c in (int(right[b]), int(left[b])) if c >= 0]  # left first: runs in row order
    return _merged_close_runs(runs, level_S)


def _merged_close_runs(runs: list[tuple[int, int, int]], level_S: np.ndarray) -> list[tuple[int, int, int]]:
    """`runs` (in row order) with neighbouring runs whose stems are both within MIN_STEM tokens of the
    prefix they share made one run at that prefix: a kept prefix that few tokens deeper is not worth a
    forward of its own and the batches it splits off (tree rows below the shared one share the few tokens)."""
    merged: list[tuple[int, int, int]] = []
    for first, last, stem in runs:
        if merged and merged[-1][1] + 1 == first:
            shared = int(level_S[first])
            if shared >= MIN_STEM and max(merged[-1][2], stem) - shared < MIN_STEM:
                merged[-1] = (merged[-1][0], last, min(merged[-1][2], stem, shared))
                continue
        merged.append((first, last, stem))
    return merged


def _post_order(root: int, left: np.ndarray, right: np.ndarray) -> list[int]:
    """The nodes of a binary tree, children before their parent."""
    order, todo = [], [root]
    while todo:
        b = todo.pop()
        order.append(b)
        todo += [c for c in (int(left[b]), int(right[b])) if c >= 0]
    return order[::-1]


def _lay_out(
    order_S: np.ndarray,
    lcp_S: np.ndarray,
    len_P: np.ndarray,
    ctx_len_P: np.ndarray,
    cont_len_P: np.ndarray,
    stem_len_S: np.ndarray,
    group_S: np.ndarray,
    cap: int,
    attention_tokens: int,
) -> TrieRows:
    """Walk the sorted rows once: each row's tokens below the deepest node it shares with the row before it
    (or below its stem) get new columns; the path of columns by depth gives every target's column and closes
    the subtrees the walk leaves (their span ends)."""
    n_pairs = len(order_S)
    total = int(len_P.sum())
    span_end_M = np.zeros(total, dtype=np.int64)
    target_M = np.zeros(int(cont_len_P.sum()), dtype=np.int64)
    target_base_P = np.concatenate([[0], np.cumsum(cont_len_P)[:-1]]).astype(np.int64)
    path = np.zeros(int(len_P.max()) if n_pairs else 0, dtype=np.int64)  # token index at each depth
    new_first_S = np.zeros(n_pairs, dtype=np.int64)  # first depth each sorted row adds
    row_S = np.zeros(n_pairs, dtype=np.int64)
    row_first_W: list[int] = []  # token index of each row's first token
    stem_W: list[int] = []
    stem_pair_X: list[int] = []
    stem_length_X: list[int] = []
    used, row_tokens, prev_len, stem, row_stem = 0, 0, 0, 0, 0
    for i in range(n_pairs):
        p = int(order_S[i])
        length = int(len_P[p])
        if i == 0 or group_S[i] != group_S[i - 1]:  # a new stem group
            stem = int(stem_len_S[i])
            if stem:
                stem_pair_X.append(p)
                stem_length_X.append(stem)
            joined = False
        else:
            shared = max(stem, int(lcp_S[i]))
            grown = row_tokens + length - shared
            alone = length - stem
            joined = stem + grown <= cap and row_cost(grown, attention_tokens, stem) < row_cost(
                row_tokens, attention_tokens, stem
            ) + row_cost(alone, attention_tokens, stem)
        if joined:
            first = max(stem, int(lcp_S[i]))
            span_end_M[path[first:prev_len]] = used  # the subtrees the walk leaves end here
        else:
            span_end_M[path[row_stem:prev_len]] = used  # the row before ends here
            first = row_stem = stem
            row_first_W.append(used)
            stem_W.append(len(stem_pair_X) - 1 if stem else -1)
            row_tokens = 0
        new = length - first
        path[first:length] = used + np.arange(new)
        new_first_S[i] = first
        row_S[i] = len(row_first_W) - 1
        row_tokens += new
        used += new
        prev_len = length
        ctx_len = int(ctx_len_P[p])
        target_M[target_base_P[p] : target_base_P[p] + cont_len_P[p]] = path[ctx_len - 1 : length]
    span_end_M[path[row_stem:prev_len]] = used
    return _rows(
        order_S, new_first_S, row_S, len_P, span_end_M, target_M, row_first_W, stem_W, stem_pair_X, stem_length_X
    )


def _rows(
    order_S: np.ndarray,
    new_first_S: np.ndarray,
    row_S: np.ndarray,
    len_P: np.ndarray,
    span_end_M: np.ndarray,
    target_M: np.ndarray,
    row_first_W: list[int],
    stem_W: list[int],
    stem_pair_X: list[int],
    stem_length_X: list[int],
) -> TrieRows:
    """The walk's token indices as rows and columns."""
    n_new_S = len_P[order_S] - new_first_S
    used = int(n_new_S.sum())
    span_S = np.repeat(np.arange(len(order_S)), n_new_S)
    depth_M = new_first_S[span_S] + np.arange(used) - np.repeat(np.cumsum(n_new_S) - n_new_S, n_new_S)
    row_M = row_S[span_S]
    first_W = np.asarray(row_first_W, dtype=np.int64)
    length_W = np.diff(np.concatenate([first_W, [used]])).astype(np.int64)
    col_M = np.arange(used) - first_W[row_M]
    return TrieRows(
        row_M=row_M,
        col_M=col_M,
        pair_M=order_S[span_S],
        depth_M=depth_M,
        span_end_M=span_end_M[:used] - first_W[row_M],
        row_N=row_M[target_M] if used else np.zeros(len(target_M), dtype=np.int64),
        col_N=col_M[target_M] if used else np.zeros(len(target_M), dtype=np.int64),
        length_W=length_W,
        stem_W=np.asarray(stem_W, dtype=np.int64),
        stem_pair_X=np.asarray(stem_pair_X, dtype=np.int64),
        stem_length_X=np.asarray(stem_length_X, dtype=np.int64),
    )


def trie_minimum_tokens(sequences: list[np.ndarray]) -> int:
    """The tokens of a prefix trie over `sequences` (every distinct prefix once): their total length less the
    prefix each shares with its predecessor in sorted order."""
    if not sequences:
        return 0
    ordered = [sequences[i] for i in sorted_by_tokens(sequences)]
    shared = sum(common_prefix(a, b) for a, b in zip(ordered[:-1], ordered[1:], strict=True))
    return int(sum(len(s) for s in sequences) - shared)
