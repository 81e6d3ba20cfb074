"""Planning forward passes: pairs to rows, rows to token-budget batches, at the token minimum.

Pairs that read the same context tokens (same `ctx_id`, `ctx_start`, `ctx_end`) form a group. A row holds
a group's context once, followed by *pieces*: a piece is `continuation[:-1]` of one pair (its last token is
only predicted, never fed). The logits at the context's last position predict every pair's first
continuation token, those at a piece's positions the rest. So a one-token continuation adds nothing to a
row: all choices of a letter-key document are read off the last position of one context-only row.

- Packed rows (models that take an attention mask and position ids): the context once and every piece of
  its group after it. Each piece sees the context and itself, causally, not the other pieces
  (`tree_attention.TreeMask`), and its position ids restart after the context, so every pair gets the numbers
  of its own unshared row. A group too long for one row (`max_length`) is cut into several rows, each
  repeating the context; a piece always fits alone (requests.py truncates contexts so that it does).
- Plain rows (models that take `input_ids` only): at most one piece per row, i.e. context +
  continuation[:-1] as lm-evaluation-harness builds it; one-token continuations ride on a row of their group.
- Tree rows (packed models, `share_prefixes`): every pair's own row is a path of one prefix trie over all
  the pairs planned together, laid out depth first in rows, each token forwarded once per row it is in
  (`prefix_sharing`): a task's few-shot examples, a document's context and its choices' common first tokens
  once. A prefix many rows begin with may be forwarded once for all of them and kept (`keep_prefixes`).
  Tree rows and their batches grow no larger than the packed rows' batches (`TreeBound`), and a plan of
  them is taken only where it forwards no more tokens than those rows: sharing never costs more.
  Packed and plain rows are laid out in `rows`.

Rows are cut into batches of at most `batch_tokens` padded tokens (`batch_cuts`), padded to fixed
multiples only where `BatchShape.width_multiple` asks (a sequence split over ranks, or the config's
`pad_to_multiple` for bucketed shapes under torch.compile).
Batch arrays are built with NumPy over all tokens at once; Python loops run per batch, never per token.

Legend: P pairs scored, Q the same pairs in group order, G context groups, R rows, K pieces, S spans of
rows (contexts and pieces), M tokens of all rows, B rows in a batch, T its longest row, N continuation tokens (targets).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from inloop_eval.distributed import AgreedSequence, TaskAgreement
from inloop_eval.engine import prefix_sharing
from inloop_eval.engine.adapter import AdapterNeeds
from inloop_eval.engine.batch_cuts import FORWARD_COST_TOKENS, cut_batches, round_widths
from inloop_eval.engine.prefix_sharing import ATTENTION_COST_TOKENS, TrieRows, TrieWalk, row_cost
from inloop_eval.engine.rows import Flat, pair_rows, plan_rows, row_targets, row_tokens
from inloop_eval.requests.table import PairSet


@dataclass(frozen=True)
class BatchShape:
    """What every batch of one evaluation must be, as the model's adapter needs it and the config asks.

    packing: rows may be packed (the model takes an attention mask and position ids).
    width_multiple: every width is a multiple of this: the adapter's own (a sequence split over ranks)
        times what the config's `pad_to_multiple` adds (bucketed shapes for torch.compile), their lcm.
    share_prefixes: with packing, rows are paths of one prefix trie (`prefix_sharing`).
    attention_tokens: the row cost model's constant (`prefix_sharing.row_cost`).
    keep_prefixes: with sharing, prefixes many rows begin with are forwarded once and kept (the adapter's
        `prefix_reuse`).
    prefix_multiple: a kept prefix's row is padded on the right to a multiple of this, the adapter's own
        `width_multiple` (a sequence split over ranks; the padding follows the prefix, unseen by it).
    """

    packing: bool = False
    width_multiple: int = 1
    share_prefixes: bool = True
    attention_tokens: int = ATTENTION_COST_TOKENS
    keep_prefixes: bool = False
    prefix_multiple: int = 1

    @classmethod
    def of(
        cls,
        needs: AdapterNeeds,
        pad_to_multiple: int = 1,
        *,
        share_prefixes: bool = True,
        keep_prefixes: bool = True,
        attention_tokens: int = ATTENTION_COST_TOKENS,
    ) -> BatchShape:
        """The shape honouring both the adapter's `needs` and the config's `pad_to_multiple`, `share_prefixes`
        and `keep_prefixes` (where the adapter has `prefix_reuse`)."""
        return cls(
            needs.packing,
            math.lcm(needs.width_multiple, pad_to_multiple),
            share_prefixes,
            attention_tokens,
            needs.packing and share_prefixes and keep_prefixes and needs.prefix_reuse,
            needs.width_multiple,
        )


@dataclass
class Batch:
    """One forward pass.

    input_ids_BT: right-padded token ids (padding is never attended to by a real position).
    rows_N, cols_N: the positions whose logits predict target_N.
    pair_N: index (into the scored pair list) of the pair each target belongs to.
    position_ids_BT, span_end_BT: set for packed batches only (None: plain causal rows, positions 0..T-1).
        Every row is laid out as a prefix trie in depth-first order, so a token is seen by the tokens of
        its own subtree, which follow it: the one at column j is seen by columns j..span_end_BT[b, j] - 1
        (`tree_attention.TreeMask`); padding sees itself only.
    prefix_length: the rows begin with a kept prefix of this many tokens (`adapter.SharedPrefix`), not in
        the batch; their position ids start there. 0: none.
    keeps_prefix: this batch is that prefix: one causal row without targets, padded on the right to the
        adapter's width multiple (`BatchShape.prefix_multiple`), whose first `prefix_length` positions' states
        the batches after it (with the same `prefix_length`) read.
    """

    input_ids_BT: np.ndarray
    rows_N: np.ndarray
    cols_N: np.ndarray
    target_N: np.ndarray
    pair_N: np.ndarray
    position_ids_BT: np.ndarray | None = None
    span_end_BT: np.ndarray | None = None
    prefix_length: int = 0
    keeps_prefix: bool = False

    @property
    def n_tokens(self) -> int:
        """Tokens forwarded, padding included."""
        return int(self.input_ids_BT.size)

    @property
    def attention_area(self) -> int:
        """Attention scores of one head and layer (the mask's size): rows x width x the keys a query may
        see, its row's and those of a kept prefix before it."""
        rows, width = self.input_ids_BT.shape
        return rows * width * (width + (0 if self.keeps_prefix else self.prefix_length))


def row_lengths(pairs: PairSet, pair_ids: np.ndarray) -> np.ndarray:
    """Length of each pair's own unshared row: context + continuation[:-1]."""
    return (pairs.ctx_len[pair_ids] + pairs.cont_len[pair_ids] - 1).astype(np.int64)


def minimum_tokens(pairs: PairSet, pair_ids: np.ndarray) -> int:
    """The token minimum: each distinct context once plus every continuation."""
    group_P = pairs.context_groups(pair_ids)
    ctx_len_P = pairs.ctx_len[pair_ids]
    first_G = np.unique(group_P, return_index=True)[1]
    return int(ctx_len_P[first_G].sum() + pairs.cont_len[pair_ids].sum())


def plan_batches(
    pairs: PairSet,
    pair_ids: np.ndarray,
    batch_tokens: int,
    shape: BatchShape = BatchShape(),
    *,
    pad_id: int = 0,
    max_length: int | None = None,
    by_cost: bool = True,
) -> list[Batch]:
    """Batches scoring `pairs[pair_ids]`; `Batch.pair_N` indexes into `pair_ids`.

    shape: what every batch must be (`BatchShape`): `packing` shares each context among its continuations
        (the model must accept a mask and position ids); `width_multiple` rounds every batch's width up to
        a multiple, not past `max_length` (`round_widths`); `share_prefixes` makes, with packing, every
        pair's row a path of one prefix trie, forwarded in tree rows (`prefix_sharing`, its cost model's
        `attention_tokens`) bounded as the rows without sharing are (off, each context is shared among its
        own continuations only); `keep_prefixes` lets, with sharing, prefixes many rows begin with be
        forwarded once and kept (the model has `AdapterNeeds.prefix_reuse`): a batch with `keeps_prefix`
        before the batches that read it.
    pad_id: the token padding rows out to their batch's width.
    max_length: longest row a packed group may form (the model's context length).
    by_cost: with sharing, take the plan the cost model (`plan_cost`) finds cheapest among those that
        forward no more tokens than the rows without sharing (those rows included); off, the tree rows
        asked for (below kept prefixes with `keep_prefixes`), as they are.
    """
    pair_ids = np.asarray(pair_ids, dtype=np.int64)
    row_plan = plan_rows(pairs, pair_ids, packing=shape.packing, max_length=max_length)
    width_R = round_widths(row_plan.length_R, shape.width_multiple, max_length)
    batch_R, slot_R, widths = cut_batches(width_R, batch_tokens)
    tokens = row_tokens(pairs, pair_ids, row_plan, batch_R, len(widths))
    targets = row_targets(pairs, pair_ids, row_plan, batch_R, len(widths))
    packed_R = row_plan.n_pieces_R > 1
    unshared = _assemble(tokens, targets, packed_R, batch_R, slot_R, widths, shape.packing, pad_id)
    if not (shape.packing and shape.share_prefixes and len(pair_ids)):
        return unshared
    sequence = pair_rows(pairs, pair_ids)
    walk = prefix_sharing.walk_trie(sequence, len(pair_ids))  # sorted once for every plan
    bound = TreeBound.of(unshared, batch_tokens, max_length, shape.width_multiple)
    trie_args = (bound, pad_id, max_length, shape.width_multiple, shape.attention_tokens, shape.prefix_multiple)

    def tree(keep: bool) -> list[Batch]:
        return _plan_trie_rows(pairs, pair_ids, walk, sequence, *trie_args, keep)

    if not by_cost:
        return tree(shape.keep_prefixes)
    most = sum(b.n_tokens for b in unshared)
    keeps = dict.fromkeys((False, shape.keep_prefixes))
    plans = [p for p in map(tree, keeps) if sum(b.n_tokens for b in p) <= most]
    return min([*plans, unshared], key=lambda p: plan_cost(p, shape.attention_tokens))


@dataclass(frozen=True)
class TreeBound:
    """How large tree rows and their batches may grow: as large as the rows without sharing do, so that
    sharing never costs more memory than not sharing (a row of the trie would otherwise grow to the
    model's context, and attention over it grows with its square).

    batch_tokens: padded tokens of a batch, a kept prefix's included: the budget, and no more than the
        largest batch without sharing.
    area: attention scores of a batch (`Batch.attention_area`): no more than the largest without sharing.
    cap: tokens of a row with its kept prefix: the most a row alone may have within both.
    """

    batch_tokens: int
    area: int
    cap: int

    @classmethod
    def of(
        cls, unshared: list[Batch], batch_tokens: int, max_length: int | None, width_multiple: int
    ) -> TreeBound:
        """The bound of the batches `unshared` (not empty), planned as the arguments say."""
        tokens = max(b.n_tokens for b in unshared)
        area = max(b.attention_area for b in unshared)
        cap = min(tokens, math.isqrt(area), max_length or tokens)
        if round_widths(np.array([cap]), width_multiple, max_length)[0] > cap:
            cap -= cap % width_multiple  # rounded up, a row of `cap` tokens would outgrow the bound
        return cls(min(batch_tokens, tokens), area, cap)


def plan_cost(batches: list[Batch], attention_tokens: int) -> float:
    """The cost model of a plan: each batch's padded tokens, each attending over its row and the kept
    prefix before it (`prefix_sharing.row_cost`), plus FORWARD_COST_TOKENS per forward. Below kept
    prefixes rows share less with each other (only below the prefix), so their plan is kept only where this
    says it is cheaper."""
    total = 0.0
    for batch in batches:
        rows, width = batch.input_ids_BT.shape
        stem = 0 if batch.keeps_prefix else batch.prefix_length
        total += rows * row_cost(width, attention_tokens, stem) + FORWARD_COST_TOKENS
    return total


def _plan_trie_rows(
    pairs: PairSet,
    pair_ids: np.ndarray,
    walk: TrieWalk,
    sequence: Callable[[int], np.ndarray],
    bound: TreeBound,
    pad_id: int,
    max_length: int | None,
    width_multiple: int,
    attention_tokens: int,
    prefix_multiple: int,
    keep_prefixes: bool,
) -> list[Batch]:
    """`plan_batches` with every row (`sequence`) a path of one prefix trie, walked in `walk`
    (`prefix_sharing.plan_trie_rows`): rows and batches within `bound`, cut into batches within each kept
    prefix's group, the prefix's own batch (padded to `prefix_multiple`) before them."""
    ids = pair_ids
    ctx_start_P = pairs.ctx_offsets[pairs.ctx_id[ids]] + pairs.ctx_start[ids]
    ctx_len_P = pairs.ctx_len[ids].astype(np.int64)
    cont_len_P = pairs.cont_len[ids].astype(np.int64)
    cont_start_P = pairs.cont_offsets[ids]
    trie = prefix_sharing.plan_trie_rows(
        walk, ctx_len_P, cont_len_P, cap=bound.cap, attention_tokens=attention_tokens, keep_stems=keep_prefixes
    )
    width_W = round_widths(trie.length_W, width_multiple, max_length)
    batch_W = np.zeros(len(width_W), dtype=np.int64)
    slot_W = np.zeros(len(width_W), dtype=np.int64)
    widths: list[int] = []
    stem_B: list[int] = []
    for x in np.unique(trie.stem_W).tolist():  # rows without a kept prefix (-1) first
        rows = np.flatnonzero(trie.stem_W == x)
        # A row after a kept prefix attends to it too: its keys count in the batch's budget, so that no
        # batch's keys, values and mask outgrow the bound.
        stem = int(trie.stem_length_X[x]) if x >= 0 else 0
        cut = cut_batches(width_W[rows] + stem, bound.batch_tokens, bound.area, stem)
        batch_w, slot_W[rows], group_widths = cut
        batch_W[rows] = batch_w + len(widths)
        widths += [w - stem for w in group_widths]
        stem_B += [x] * len(group_widths)
    depth_M, pair_M = trie.depth_M, trie.pair_M
    in_ctx_M = depth_M < ctx_len_P[pair_M]
    src_M = np.where(
        in_ctx_M,
        ctx_start_P[pair_M] + depth_M,
        len(pairs.ctx_tokens) + cont_start_P[pair_M] + depth_M - ctx_len_P[pair_M],
    )
    pool = np.concatenate([pairs.ctx_tokens, pairs.cont_tokens])
    pair_N = np.repeat(np.arange(len(ids)), cont_len_P)
    j_N = np.arange(len(pair_N)) - np.repeat(np.cumsum(cont_len_P) - cont_len_P, cont_len_P)
    tokens = _in_batch_order(
        trie.row_M,
        trie.col_M,
        {"input_ids": pool[src_M], "position_ids": depth_M, "span_end": trie.span_end_M},
        batch_W,
        len(widths),
    )
    targets = _in_batch_order(
        trie.row_N,
        trie.col_N,
        {"target": pairs.cont_tokens[cont_start_P[pair_N] + j_N], "pair": pair_N},
        batch_W,
        len(widths),
    )
    nested_M = trie.span_end_M < trie.length_W[trie.row_M]
    packed_W = (np.bincount(trie.row_M, weights=nested_M, minlength=len(width_W)) > 0) | (trie.stem_W >= 0)
    batches = _assemble(tokens, targets, packed_W, batch_W, slot_W, widths, True, pad_id)
    return _after_kept_prefixes(batches, stem_B, trie, sequence, (prefix_multiple, max_length, pad_id))


def _in_batch_order(
    row: np.ndarray, col: np.ndarray, values: dict[str, np.ndarray], batch_W: np.ndarray, n_batches: int
) -> Flat:
    """Elements at (row, col) sorted by their row's batch (stable), with each batch's bounds."""
    batch = batch_W[row]
    order = np.argsort(batch, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(batch, minlength=n_batches))])
    return Flat(row[order], col[order], {k: v[order] for k, v in values.items()}, bounds)


def _after_kept_prefixes(
    batches: list[Batch],
    stem_B: list[int],
    trie: TrieRows,
    sequence: Callable[[int], np.ndarray],
    padding: tuple[int, int | None, int],
) -> list[Batch]:
    """The batches with each kept prefix's own batch (one causal row, padded as `padding` says: to a
    multiple, not past a length, with a token) before the first batch reading it, and `prefix_length` set
    on those that do."""
    out: list[Batch] = []
    for b, (batch, x) in enumerate(zip(batches, stem_B, strict=True)):
        if x < 0:
            out.append(batch)
            continue
        length = int(trie.stem_length_X[x])
        if b == 0 or stem_B[b - 1] != x:
            multiple, max_length, pad_id = padding
            ids_1T = np.full((1, round_widths(np.array([length]), multiple, max_length)[0]), pad_id, dtype=np.int64)
            ids_1T[0, :length] = sequence(int(trie.stem_pair_X[x]))[:length]
            empty = np.zeros(0, dtype=np.int64)
            out.append(Batch(ids_1T, empty, empty, empty, empty, prefix_length=length, keeps_prefix=True))
        batch.prefix_length = length
        out.append(batch)
    return out


def plan_sequence_batches(
    length_S: np.ndarray,
    sequence: Callable[[int], np.ndarray],
    batch_tokens: int,
    *,
    max_length: int | None = None,
    pad_to_multiple: int = 1,
) -> list[Batch]:
    """Batches of whole sequences (perplexity): one row per sequence, every position but the last of a row
    predicting the next token; `Batch.pair_N` indexes the sequences. Widths rounded and rows cut into
    batches as `plan_batches` does (`round_widths`, `cut_batches`); never packed.

    length_S: each sequence's length; sequence(s): its tokens [L].
    """
    width_S = round_widths(np.asarray(length_S, dtype=np.int64), pad_to_multiple, max_length)
    batch_S, slot_S, widths = cut_batches(width_S, batch_tokens)
    order_S = np.argsort(batch_S, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(batch_S, minlength=len(widths)))])
    batches: list[Batch] = []
    for b, width in enumerate(widths):
        members = order_S[bounds[b] : bounds[b + 1]]
        input_ids_BT = np.zeros((len(members), width), dtype=np.int64)
        rows, cols, targets, owners = [], [], [], []
        for s in members.tolist():
            ids = sequence(s)
            row, n = int(slot_S[s]), len(ids) - 1
            input_ids_BT[row, : len(ids)] = ids
            rows.append(np.full(n, row, dtype=np.int64))
            cols.append(np.arange(n, dtype=np.int64))
            targets.append(ids[1:])
            owners.append(np.full(n, s, dtype=np.int64))
        batches.append(Batch(input_ids_BT, *(np.concatenate(x) for x in (rows, cols, targets, owners))))
    return batches


def _assemble(
    tokens: Flat,
    targets: Flat,
    packed_R: np.ndarray,
    batch_R: np.ndarray,
    slot_R: np.ndarray,
    widths: list[int],
    packing: bool,
    pad_id: int,
) -> list[Batch]:
    """One Batch per width: scatter each batch's tokens into [B, T] arrays; `packed_R`: rows that need the
    packed mask (several pieces, a subtree of a trie, or a kept prefix before them)."""
    n_batches = len(widths)
    n_rows_B = np.bincount(batch_R, minlength=n_batches)
    packed_B = np.bincount(batch_R, weights=packed_R, minlength=n_batches) > 0
    tok_slot, tgt_slot = slot_R[tokens.row], slot_R[targets.row]
    batches: list[Batch] = []
    for b, width in enumerate(widths):
        mine = slice(tokens.bounds[b], tokens.bounds[b + 1])
        slot, col = tok_slot[mine], tokens.col[mine]
        shape = (int(n_rows_B[b]), width)
        input_ids_BT = np.full(shape, pad_id, dtype=np.int64)
        input_ids_BT[slot, col] = tokens.values["input_ids"][mine]
        position_ids_BT = span_end_BT = None
        if packing and packed_B[b]:
            position_ids_BT = np.zeros(shape, dtype=np.int64)
            position_ids_BT[slot, col] = tokens.values["position_ids"][mine]
            span_end_BT = np.broadcast_to(np.arange(1, width + 1), shape).copy()  # padding sees itself
            span_end_BT[slot, col] = tokens.values["span_end"][mine]
        picked = slice(targets.bounds[b], targets.bounds[b + 1])
        batches.append(
            Batch(
                input_ids_BT,
                tgt_slot[picked],
                targets.col[picked],
                targets.values["target"][picked],
                targets.values["pair"][picked],
                position_ids_BT,
                span_end_BT,
            )
        )
    return batches


def dummy_batch(pad_id: int = 0, width: int = 1) -> Batch:
    """A one-row forward of `width` tokens whose result is discarded: keeps ranks' forward counts equal."""
    empty = np.zeros(0, dtype=np.int64)
    return Batch(
        np.full((1, width), pad_id, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.full(1, pad_id, dtype=np.int64),
        empty,
    )


def equalize_forward_calls(
    batches: list[Batch], agreement: TaskAgreement, width: int = 1
) -> AgreedSequence[Batch]:
    """Pad with dummy forwards so every rank makes the same number of model calls. The count is agreed at
    the planning point, where a failure on any rank so far stops every rank before its first forward;
    iterating the result joins a point between forward passes. width: of each dummy row (the adapter's
    `pad_to_multiple`: a model splitting the sequence over ranks needs a multiple of their number)."""
    n = agreement.agree(len(batches))
    return AgreedSequence(batches + [dummy_batch(width=width) for _ in range(n - len(batches))], agreement)
