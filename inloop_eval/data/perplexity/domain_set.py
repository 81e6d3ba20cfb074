"""Domain sets for perplexity evaluation: the token sequences of one label, with the bytes they cover.

Two kinds of source, one `DomainSet` for both:
- `memmap`: OLMo-style raw arrays of uint16/uint32 token ids (a file written by `np.save` works too),
  several files per label, each read as consecutive sequences of `seq_len` tokens; a file's last tokens that
  do not fill a sequence are not used. Bytes come from a per-token byte-length table built from the
  tokenizer (special tokens count 0).
- `jsonl` / `text`: the windows of the label's documents (`token_cache`).
- `documents`: OLMo-core's padded documents, one sequence per document (`documents`).
A label holding more than its token cap is cut to a fixed seeded choice of whole sequences
(`select_under_cap`), so every evaluation of a run scores the same ones.

A sequence of L tokens predicts its last L - 1; `n_tokens` and `n_bytes` count those.
Legend: S sequences, L tokens in a sequence, B sequences in a block.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.data.perplexity.sources import open_token_file, resolve_paths
from inloop_eval.data.perplexity.token_cache import (
    TextSource,
    TextTokens,
    cached_text_tokens,
    locate_text_domain,
)
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.errors import LMDataError

# Rows of a memmap file scanned at once when checking token ids and counting bytes.
_SCAN_ROWS = 4096


@dataclass
class DomainSet:
    """The sequences of one label.

    parts: flat token arrays (memmaps) that the sequences index into.
    part_S, start_S, length_S: where each sequence lies (length >= 2 tokens; >= 1 for `documents`).
    bytes_S: UTF-8 bytes of the tokens each sequence predicts (all 0 when unknown).
    sources, source_S, item_S: the file each sequence comes from and its number there (a sequence of a
        memmap file, a document of a text file), for messages.
    max_token_id, max_token_seq: the largest token id over the sequences and the first sequence holding it.
    """

    label: str
    unit: str
    parts: list[np.ndarray]
    part_S: np.ndarray
    start_S: np.ndarray
    length_S: np.ndarray
    bytes_S: np.ndarray
    sources: list[Path]
    source_S: np.ndarray
    item_S: np.ndarray
    max_token_id: int
    max_token_seq: int

    def __len__(self) -> int:
        return len(self.length_S)

    @property
    def n_tokens(self) -> int:
        """Tokens predicted over all sequences."""
        return int((self.length_S - 1).sum())

    def sequence(self, s: int) -> np.ndarray:
        """The tokens of sequence `s` [L] (int64)."""
        start = int(self.start_S[s])
        return np.asarray(self.parts[int(self.part_S[s])][start : start + int(self.length_S[s])], np.int64)

    def describe(self, s: int) -> str:
        """Where sequence `s` comes from, for messages: label, file and number there."""
        return f"label {self.label!r} file {self.sources[int(self.source_S[s])]} {self.unit} {int(self.item_S[s])}"

    def select(self, keep_S: np.ndarray) -> DomainSet:
        """The sequences `keep_S` (sorted indices); the largest token id is looked up again."""
        out = DomainSet(
            self.label,
            self.unit,
            self.parts,
            self.part_S[keep_S],
            self.start_S[keep_S],
            self.length_S[keep_S],
            self.bytes_S[keep_S],
            self.sources,
            self.source_S[keep_S],
            self.item_S[keep_S],
            -1,
            -1,
        )
        for s in range(len(out)):
            top = int(out.sequence(s).max())
            if top > out.max_token_id:
                out.max_token_id, out.max_token_seq = top, s
        return out


def select_under_cap(length_S: np.ndarray, max_tokens: int | None) -> np.ndarray:
    """Indices (sorted) of whole sequences predicting at most `max_tokens` tokens in all: a fixed seeded
    choice spread over the files, so every evaluation of a run scores the same sequences."""
    if max_tokens is None or int((length_S - 1).sum()) <= max_tokens:
        return np.arange(len(length_S))
    order = np.random.default_rng(0).permutation(len(length_S))
    taken = np.cumsum(length_S[order] - 1) <= max_tokens
    return np.sort(order[taken])


# --- memmap domains ------------------------------------------------------------------------------------


def load_memmap_domain(
    domain: LMDomainConfig, seq_len: int, byte_table: np.ndarray | None, max_tokens: int | None
) -> DomainSet:
    """Sequences of `seq_len` tokens from a label's memmap files, capped, with token ids checked against
    the tokenizer's vocabulary and the bytes of each sequence counted."""
    files = resolve_paths(domain.label, domain.paths)
    parts = [open_token_file(domain.label, f, domain.dtype) for f in files]
    counts = [len(p) // seq_len for p in parts]
    if sum(counts) == 0:
        sizes = ", ".join(f"{f} ({len(p)} tokens)" for f, p in zip(files, parts, strict=True))
        raise LMDataError(
            f"label {domain.label!r}: no sequence of seq_len={seq_len} tokens in its files: {sizes}; "
            "add data or lower seq_len"
        )
    part_S = np.repeat(np.arange(len(parts)), counts)
    item_S = np.concatenate([np.arange(n) for n in counts])
    length_S = np.full(len(part_S), seq_len, dtype=np.int64)
    keep = select_under_cap(length_S, max_tokens)
    part_S, item_S, length_S = part_S[keep], item_S[keep], length_S[keep]
    bytes_S = np.zeros(len(keep), dtype=np.int64)
    max_id, max_seq = -1, -1
    for p, tokens in enumerate(parts):
        mine = np.flatnonzero(part_S == p)
        if not len(mine):
            continue
        rows = np.asarray(tokens[: counts[p] * seq_len]).reshape(counts[p], seq_len)
        for lo in range(0, len(mine), _SCAN_ROWS):
            block = mine[lo : lo + _SCAN_ROWS]
            ids_BL = np.asarray(rows[item_S[block]], dtype=np.int64)
            top_B = ids_BL.max(axis=1)
            if int(top_B.max()) > max_id:
                first = int(np.argmax(top_B))
                max_id, max_seq = int(top_B[first]), int(block[first])
            if byte_table is not None:
                if max_id >= len(byte_table):
                    raise LMDataError(
                        f"label {domain.label!r} file {files[p]}: sequence {int(item_S[max_seq])} holds token "
                        f"id {max_id}, beyond the tokenizer's vocabulary of {len(byte_table)}; the file was "
                        f"written with another tokenizer or another dtype (this domain reads {domain.dtype})"
                    )
                bytes_S[block] = byte_table[ids_BL[:, 1:]].sum(axis=1)
    return DomainSet(
        domain.label,
        "sequence",
        parts,
        part_S,
        item_S * seq_len,
        length_S,
        bytes_S,
        files,
        part_S.copy(),
        item_S,
        max_id,
        max_seq,
    )


# --- text domains --------------------------------------------------------------------------------------


def text_domain(source: TextSource, text: TextTokens, max_tokens: int | None) -> DomainSet:
    """A text domain's sequences (capped) over its tokens."""
    rows = text.rows
    full = DomainSet(
        source.domain.label,
        "document",
        [text.tokens],
        np.zeros(len(rows), dtype=np.int64),
        rows[:, 0],
        rows[:, 1],
        rows[:, 2],
        source.files,
        rows[:, 3],
        rows[:, 4],
        -1,
        -1,
    )
    return full.select(select_under_cap(full.length_S, max_tokens))


def load_text_domain(
    domain: LMDomainConfig,
    seq_len: int,
    tokenizer: TokenizerLike,
    byte_table: np.ndarray | None,
    max_tokens: int | None,
    cache_dir: Path,
) -> DomainSet:
    """A label's JSONL or text files, tokenized once into `cache_dir` and read back as a DomainSet, by this
    process alone (`loading.load_domains` coordinates the ranks)."""
    source = locate_text_domain(domain, seq_len, tokenizer, cache_dir)
    return text_domain(source, cached_text_tokens(source, tokenizer, seq_len, byte_table), max_tokens)
