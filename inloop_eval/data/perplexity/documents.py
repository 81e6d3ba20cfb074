"""OLMo-core's padded documents: token files read as its `NumpyPaddedFSLDataset` reads them (format
`documents`), and the instances its evaluation data loader reaches.

A file's documents end at the EOS token (EOS included); tokens after the last EOS belong to no document and
are left out, as OLMo-core leaves them out (`segment_documents_into_instances`), with a warning. Each document
is one sequence of its first `seq_len` tokens: a longer one is cut, never split. OLMo-core's `LMEvaluator`
averages, per label, the loss at every one of a sequence's L positions, the last of which predicts nothing
(loss 0), so its CE loss is Σ nll / Σ L (`metrics.perplexity.olmo_core_perplexity`).

Its `NumpyFSLDataLoader` (epoch 1, as `deterministic=True` pins it) shuffles the sequences of all files
together and keeps whole global batches only; `loader_selection` picks the same sequences.
Legend: D documents, S sequences, N tokens of a file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.data.perplexity.domain_set import DomainSet, select_under_cap
from inloop_eval.data.perplexity.sources import open_token_file, resolve_paths
from inloop_eval.errors import LMDataError

log = logging.getLogger(__name__)


def document_spans(tokens_N: np.ndarray, eos_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each document [D] of a flat token array: each ends at an EOS token, included."""
    ends_D = np.flatnonzero(np.asarray(tokens_N) == eos_token_id).astype(np.int64) + 1
    starts_D = np.concatenate([[0], ends_D[:-1]]).astype(np.int64)[: len(ends_D)]
    return starts_D, ends_D - starts_D


def check_non_negative(label: str, path: Path, tokens_N: np.ndarray, starts_D: np.ndarray) -> None:
    """LMDataError naming the file, document and position of the first negative token id (a signed file:
    an id below 0 indexes nothing, and NumPy and torch would wrap or fail far from here)."""
    if tokens_N.dtype.kind != "i" or not len(tokens_N) or int(tokens_N.min()) >= 0:
        return
    at = int(np.argmax(np.asarray(tokens_N) < 0))
    document = max(int(np.searchsorted(starts_D, at, side="right")) - 1, 0)
    raise LMDataError(
        f"label {label!r} file {path} document {document}: token id {int(tokens_N[at])} at position {at} is "
        f"negative; token ids are 0 or more: the file holds {tokens_N.dtype} values that are not token ids "
        "(written with another dtype, or damaged)"
    )


def load_documents_domain(
    domain: LMDomainConfig,
    seq_len: int,
    byte_table: np.ndarray | None,
    max_tokens: int | None,
    eos_token_id: int,
) -> DomainSet:
    """A label's token files as OLMo-core's padded documents: one sequence per document, its first `seq_len`
    tokens, capped at `max_tokens` predicted tokens, token ids checked against the tokenizer's vocabulary and
    the bytes each sequence predicts counted."""
    files = resolve_paths(domain.label, domain.paths)
    parts = [open_token_file(domain.label, f, domain.dtype) for f in files]
    part_S, start_S, length_S, item_S = [], [], [], []
    for p, (path, tokens) in enumerate(zip(files, parts, strict=True)):
        starts_D, lengths_D = document_spans(tokens, eos_token_id)
        check_non_negative(domain.label, path, tokens, starts_D)
        if not len(starts_D):
            raise LMDataError(
                f"label {domain.label!r} file {path}: expected documents each ending with the EOS token "
                f"{eos_token_id} (the padded documents' numpy format), found {len(tokens)} {tokens.dtype} tokens and no "
                "EOS; check the tokenizer's EOS id and the domain's `dtype`"
            )
        trailing = len(tokens) - int(starts_D[-1] + lengths_D[-1])
        if trailing:
            log.warning(
                "label %r file %s: its last %d tokens follow the last EOS (%d) and belong to no document; "
                "they are left out, as the padded documents' loader leaves them out",
                domain.label,
                path,
                trailing,
                eos_token_id,
            )
        part_S.append(np.full(len(starts_D), p, dtype=np.int64))
        start_S.append(starts_D)
        length_S.append(np.minimum(lengths_D, seq_len))
        item_S.append(np.arange(len(starts_D), dtype=np.int64))
    full = DomainSet(
        domain.label,
        "document",
        parts,
        np.concatenate(part_S),
        np.concatenate(start_S),
        np.concatenate(length_S),
        np.zeros(sum(len(s) for s in start_S), dtype=np.int64),
        files,
        np.concatenate(part_S),
        np.concatenate(item_S),
        -1,
        -1,
    )
    return count_bytes(full.select(select_under_cap(full.length_S, max_tokens)), byte_table, domain.dtype)


def count_bytes(domain: DomainSet, byte_table: np.ndarray | None, dtype: str) -> DomainSet:
    """`domain` with the bytes each sequence predicts counted from the tokenizer's table (all 0 without one),
    after checking that the table holds its largest token id."""
    if byte_table is None or not len(domain):
        return domain
    if domain.max_token_id >= len(byte_table):
        raise LMDataError(
            f"{domain.describe(domain.max_token_seq)}: holds token id {domain.max_token_id}, beyond the "
            f"tokenizer's vocabulary of {len(byte_table)}; the file was written with another tokenizer or "
            f"another dtype (this domain reads {dtype})"
        )
    for p, tokens in enumerate(domain.parts):
        mine = np.flatnonzero(domain.part_S == p)
        if not len(mine):
            continue
        cumulative = np.concatenate([[0], np.cumsum(byte_table[np.asarray(tokens, dtype=np.int64)])])
        start, length = domain.start_S[mine], domain.length_S[mine]
        domain.bytes_S[mine] = cumulative[start + length] - cumulative[start + 1]
    return domain


@dataclass(frozen=True)
class LoaderSelection:
    """Which sequences OLMo-core's evaluation data loader reaches.

    batch_instances: sequences per global batch (OLMo-core: the eval batch in tokens over `seq_len`).
    seed: the loader's seed; its order is the shuffle of epoch 1 (`PCG64(seed + 1)`).
    max_batches: the batches an evaluation stops after (its `eval_duration`); None: every whole batch.
    """

    batch_instances: int
    seed: int = 0
    max_batches: int | None = None


def loader_selection(
    counts: Sequence[int], labels: Sequence[str], selection: LoaderSelection
) -> list[np.ndarray]:
    """The indices (sorted) of the sequences of each label that OLMo-core's loader reaches, the labels'
    sequences taken end to end in order (`counts` of each): all shuffled together and cut to whole batches."""
    total = int(sum(counts))
    order = np.arange(total, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed=selection.seed + 1)).shuffle(order)
    n_batches = total // selection.batch_instances
    if selection.max_batches is not None:
        n_batches = min(n_batches, selection.max_batches)
    if n_batches == 0:
        raise LMDataError(
            f"labels {list(labels)}: their {total} documents are fewer than one global batch of "
            f"{selection.batch_instances} sequences, so the evaluation data loader reaches none of them; add "
            "documents or make the eval batch smaller"
        )
    kept = np.sort(order[: n_batches * selection.batch_instances].astype(np.int64))
    bounds = np.cumsum([0, *counts])
    return [kept[(kept >= lo) & (kept < hi)] - lo for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
