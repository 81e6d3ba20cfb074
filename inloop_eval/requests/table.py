"""Request tables: every (context, continuation) pair of a task tokenized into flat arrays, contexts shared by
a document's choices stored once (`PairSet`), with each request's document, choice and unconditional pair
(`RequestTable`); `build_requests` makes one from a task's documents.

Legend: R requests of a task, C unique contexts, P pairs to score (requests or unconditional requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.errors import RequestError
from inloop_eval.requests.tokenize import (
    finish_context,
    move_trailing_whitespace,
    olmo_uncond_context,
    split_at_common_prefix,
    tokenize_pair,
    tokenize_pair_olmo,
    truncation_start,
)
from inloop_eval.tasks.base import Doc, MultipleChoiceTask


@dataclass
class PairSet:
    """Pairs to score, with contexts stored once: pair p reads context `ctx_id[p]` tokens
    `[ctx_start[p], ctx_end[p])` followed by its continuation tokens."""

    ctx_tokens: np.ndarray  # [sum of context lengths] int64
    ctx_offsets: np.ndarray  # [C+1] int64
    ctx_id: np.ndarray  # [P] int64
    ctx_start: np.ndarray  # [P] int64
    ctx_end: np.ndarray  # [P] int64
    cont_tokens: np.ndarray  # [sum of continuation lengths] int64
    cont_offsets: np.ndarray  # [P+1] int64

    def __len__(self) -> int:
        return len(self.ctx_id)

    def context(self, p: int) -> np.ndarray:
        base = self.ctx_offsets[self.ctx_id[p]]
        return self.ctx_tokens[base + self.ctx_start[p] : base + self.ctx_end[p]]

    def continuation(self, p: int) -> np.ndarray:
        return self.cont_tokens[self.cont_offsets[p] : self.cont_offsets[p + 1]]

    @property
    def ctx_len(self) -> np.ndarray:
        return self.ctx_end - self.ctx_start

    @property
    def cont_len(self) -> np.ndarray:
        return np.diff(self.cont_offsets)

    def context_groups(self, pair_ids: np.ndarray) -> np.ndarray:
        """Group [len(pair_ids)] of each of the given pairs, numbered 0..G-1 in order of first appearance:
        pairs reading the same context tokens (same ctx_id, ctx_start, ctx_end) share a group."""
        if len(pair_ids) == 0:
            return np.zeros(0, dtype=np.int64)
        keys = (self.ctx_end[pair_ids], self.ctx_start[pair_ids], self.ctx_id[pair_ids])
        order = np.lexsort(keys)
        new = np.ones(len(order), dtype=bool)
        new[1:] = np.any([k[order][1:] != k[order][:-1] for k in keys], axis=0)
        group = np.empty(len(order), dtype=np.int64)
        group[order] = np.cumsum(new) - 1
        # Renumber by first appearance, so the numbering does not depend on context ids.
        _, first, inverse = np.unique(group, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        return rank[inverse]

    def concat(self, other: PairSet) -> PairSet:
        """This set's pairs followed by `other`'s (indices of `other` shift by len(self))."""
        return PairSet(
            ctx_tokens=np.concatenate([self.ctx_tokens, other.ctx_tokens]),
            ctx_offsets=np.concatenate([self.ctx_offsets[:-1], other.ctx_offsets + len(self.ctx_tokens)]),
            ctx_id=np.concatenate([self.ctx_id, other.ctx_id + len(self.ctx_offsets) - 1]),
            ctx_start=np.concatenate([self.ctx_start, other.ctx_start]),
            ctx_end=np.concatenate([self.ctx_end, other.ctx_end]),
            cont_tokens=np.concatenate([self.cont_tokens, other.cont_tokens]),
            cont_offsets=np.concatenate([self.cont_offsets[:-1], other.cont_offsets + len(self.cont_tokens)]),
        )

    def max_token_id(self) -> int:
        highs = [a.max() for a in (self.ctx_tokens, self.cont_tokens) if a.size]
        return int(max(highs)) if highs else -1


class _PairBuilder:
    """Accumulates pairs, storing each distinct context token sequence once."""

    def __init__(self) -> None:
        self.contexts: dict[tuple[int, ...], int] = {}
        self.ctx_id: list[int] = []
        self.ctx_start: list[int] = []
        self.ctx_end: list[int] = []
        self.conts: list[list[int]] = []

    def add(self, ctx_ids: list[int], split: int, cont_ids: list[int], max_length: int, where: str) -> int:
        key = tuple(ctx_ids)
        cid = self.contexts.setdefault(key, len(self.contexts))
        self.ctx_id.append(cid)
        self.ctx_start.append(truncation_start(split, len(cont_ids), max_length, where))
        self.ctx_end.append(split)
        self.conts.append(cont_ids)
        return len(self.conts) - 1

    def build(self) -> PairSet:
        ctx_list = list(self.contexts)
        return PairSet(
            ctx_tokens=_flat(ctx_list),
            ctx_offsets=_offsets(ctx_list),
            ctx_id=np.asarray(self.ctx_id, dtype=np.int64),
            ctx_start=np.asarray(self.ctx_start, dtype=np.int64),
            ctx_end=np.asarray(self.ctx_end, dtype=np.int64),
            cont_tokens=_flat(self.conts),
            cont_offsets=_offsets(self.conts),
        )


def _flat(seqs: Sequence[Sequence[int]]) -> np.ndarray:
    if not seqs:
        return np.zeros(0, dtype=np.int64)
    return np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=sum(len(s) for s in seqs))


def _offsets(seqs: Sequence[Sequence[int]]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(s) for s in seqs], dtype=np.int64)]).astype(np.int64)


@dataclass
class RequestTable:
    """Every request of a task, tokenized: one row per (doc_id, cont_id), plus the deduplicated
    unconditional requests that PMI needs (`uncond_id[r]` indexes `uncond`, -1 when not scored)."""

    task: str
    pairs: PairSet
    doc_id: np.ndarray  # [R] int64, the document's index in the task
    cont_id: np.ndarray  # [R] int64
    n_choices: np.ndarray  # [R] int64
    is_gold: np.ndarray  # [R] bool
    n_chars: np.ndarray  # [R] int64, continuation length without the target delimiter
    n_bytes: np.ndarray  # [R] int64, UTF-8 bytes of the same
    uncond_id: np.ndarray  # [R] int64
    uncond: PairSet
    # The strings exactly as scored (after moving whitespace), for samples files.
    context_text: list[str] = field(repr=False, default_factory=list)
    continuation_text: list[str] = field(repr=False, default_factory=list)

    def __len__(self) -> int:
        return len(self.doc_id)

    def rows_of_docs(self, doc_ids: np.ndarray) -> np.ndarray:
        """Request rows belonging to the given documents, in table order."""
        return np.flatnonzero(np.isin(self.doc_id, doc_ids))


PAIR_ENCODINGS: tuple[str, ...] = ("harness", "olmo")


class _Encoded(NamedTuple):
    """One request tokenized: the strings as scored, the context ids (`n_before` of them precede the
    continuation), the continuation ids, and the text whose length normalises it."""

    ctx_text: str
    cont_text: str
    ctx_ids: list[int]
    n_before: int
    cont_ids: list[int]
    length_text: str


def _encode_request(
    task: MultipleChoiceTask, tokenizer: TokenizerLike, context: str, choice: str, where: str
) -> _Encoded:
    """A (context, choice) pair as the task's pair encoding tokenizes it. OLMo normalises by the
    continuation as scored, delimiter included (its `cont_str_len`); the harness by the choice alone."""
    if task.pair_encoding == "olmo":
        cont_text = task.target_delimiter + choice
        ctx_ids, cont_ids = tokenize_pair_olmo(tokenizer, context, cont_text, where)
        return _Encoded(context, cont_text, ctx_ids, len(ctx_ids), cont_ids, cont_text)
    ctx_text, cont_text = move_trailing_whitespace(context, task.target_delimiter + choice)
    ctx_ids, n_before, cont_ids = tokenize_pair(tokenizer, ctx_text, cont_text, where)
    return _Encoded(ctx_text, cont_text, ctx_ids, n_before, cont_ids, choice)


def build_requests(
    task: MultipleChoiceTask,
    docs: Sequence[Doc],
    tokenizer: TokenizerLike,
    max_length: int,
    *,
    with_uncond: bool | None = None,
) -> RequestTable:
    """Tokenize every (doc, choice) of `docs`. `with_uncond` defaults to whether the task reports PMI.

    With `task.pair_encoding == "olmo"` every pair is encoded as OLMo's in-loop tasks do
    (`tokenize_pair_olmo`), the unconditional request is OLMo's domain-conditional context followed by the
    same continuation tokens, and `n_chars` / `n_bytes` count the continuation as scored, target delimiter
    included (OLMo's `cont_str_len` / `cont_byte_len`); otherwise the choice without the delimiter.
    """
    if task.pair_encoding not in PAIR_ENCODINGS:
        raise RequestError(
            f"task {task.name!r}: pair_encoding expected one of {PAIR_ENCODINGS}, found {task.pair_encoding!r}"
        )
    if with_uncond is None:
        with_uncond = "acc_pmi" in task.metrics
    main = _PairBuilder()
    uncond = _UncondRequests(task, tokenizer, max_length)
    rows = _RequestRows()
    for doc in docs:
        uncond_texts = _doc_uncond_contexts(task, doc)
        for i, (context, choice) in enumerate(zip(doc.contexts, doc.continuations, strict=True)):
            where = f"task {task.name!r} doc {doc.index} choice {i}"
            request = _encode_request(task, tokenizer, context, choice, where)
            main.add(request.ctx_ids, request.n_before, request.cont_ids, max_length, where)
            uncond_id = uncond.add(uncond_texts[i], request, where) if with_uncond else -1
            rows.add(doc, i, request, uncond_id)
    return rows.table(task.name, main.build(), uncond.pairs.build())


class _UncondRequests:
    """The unconditional requests of a task, each distinct (context, continuation) once."""

    def __init__(self, task: MultipleChoiceTask, tokenizer: TokenizerLike, max_length: int) -> None:
        self.task, self.tokenizer, self.max_length = task, tokenizer, max_length
        self.pairs = _PairBuilder()
        self.index: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        self.contexts: dict[str, tuple[list[int], str]] = {}

    def add(self, text: str, request: _Encoded, where: str) -> int:
        """The unconditional pair id of `request` after the unconditional context `text`."""
        if text not in self.contexts:
            self.contexts[text] = _uncond_context(self.task, self.tokenizer, text, where)
        u_ctx, u_prefix = self.contexts[text]
        if self.task.pair_encoding == "olmo":  # the very continuation tokens, after the domain conditional
            u_cont = request.cont_ids
        else:
            u_cont = _uncond_continuation(self.tokenizer, u_ctx, u_prefix, request.cont_text, where)
        key = (tuple(u_ctx), tuple(u_cont))
        if key not in self.index:
            self.index[key] = self.pairs.add(u_ctx, len(u_ctx), u_cont, self.max_length, where)
        return self.index[key]


class _RequestRows:
    """The per-request columns of a `RequestTable`, one row appended per (doc, choice)."""

    def __init__(self) -> None:
        self.cols: dict[str, list[int]] = {
            k: [] for k in ("doc_id", "cont_id", "n_choices", "n_chars", "n_bytes")
        }
        self.is_gold: list[bool] = []
        self.uncond_ids: list[int] = []
        self.ctx_texts: list[str] = []
        self.cont_texts: list[str] = []

    def add(self, doc: Doc, i: int, request: _Encoded, uncond_id: int) -> None:
        self.cols["doc_id"].append(doc.index)
        self.cols["cont_id"].append(i)
        self.cols["n_choices"].append(doc.n_choices)
        self.cols["n_chars"].append(len(request.length_text))
        self.cols["n_bytes"].append(len(request.length_text.encode("utf-8")))
        self.is_gold.append(i in doc.gold)
        self.uncond_ids.append(uncond_id)
        self.ctx_texts.append(request.ctx_text)
        self.cont_texts.append(request.cont_text)

    def table(self, task: str, pairs: PairSet, uncond: PairSet) -> RequestTable:
        arrays = {k: np.asarray(v, dtype=np.int64) for k, v in self.cols.items()}
        return RequestTable(
            task=task,
            pairs=pairs,
            is_gold=np.asarray(self.is_gold, dtype=bool),
            uncond_id=np.asarray(self.uncond_ids, dtype=np.int64),
            uncond=uncond,
            context_text=self.ctx_texts,
            continuation_text=self.cont_texts,
            **arrays,
        )


def _doc_uncond_contexts(task: MultipleChoiceTask, doc: Doc) -> tuple[str, ...]:
    """The unconditional context of each choice: the document's own, else the task's."""
    if not doc.uncond_contexts:
        return (task.uncond_context,) * doc.n_choices
    if len(doc.uncond_contexts) != doc.n_choices:
        raise RequestError(
            f"task {task.name!r} doc {doc.index}: expected one unconditional context per choice "
            f"({doc.n_choices}), found {len(doc.uncond_contexts)}"
        )
    return doc.uncond_contexts


def _uncond_context(
    task: MultipleChoiceTask, tokenizer: TokenizerLike, text: str, where: str
) -> tuple[list[int], str]:
    """Tokens of an unconditional context, and the text a continuation is joined to (harness encoding);
    OLMo's encoding takes the text as given, without BOS."""
    if task.pair_encoding == "olmo":
        return olmo_uncond_context(tokenizer, text, where), text
    text, _ = move_trailing_whitespace(text, "")
    ids = list(tokenizer.encode(text)) if text else []
    return finish_context(tokenizer, ids, f"task {task.name!r} unconditional context"), text


def _uncond_continuation(
    tokenizer: TokenizerLike, ctx_ids: list[int], ctx_text: str, cont_text: str, where: str
) -> list[int]:
    if not ctx_text:
        return list(tokenizer.encode(cont_text))
    raw_ctx = list(tokenizer.encode(ctx_text))
    whole = list(tokenizer.encode(ctx_text + cont_text))
    return whole[split_at_common_prefix(raw_ctx, whole) :]
