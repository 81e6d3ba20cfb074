"""Domain sets for perplexity evaluation: token sequences per label, with the bytes they cover.

Two kinds of source, one `DomainSet` for both:
- `memmap`: OLMo-style raw arrays of uint16/uint32 token ids (a file written by `np.save` works too),
  several files per label, each read as consecutive sequences of `seq_len` tokens; a file's last tokens that
  do not fill a sequence are not used. Bytes come from a per-token byte-length table built from the
  tokenizer (special tokens count 0).
- `jsonl` / `text`: documents tokenized once and cached as one memmap token file plus an index with the
  bytes of each sequence. A document starts from the tokenizer's BOS (else EOS) and is cut into windows of at
  most `seq_len` tokens overlapping by one, so every token of the text is predicted exactly once; a
  document's bytes are the UTF-8 bytes of its text.

A sequence of L tokens predicts its last L - 1; `n_tokens` and `n_bytes` count those.
Legend: S sequences, L tokens in a sequence, V tokenizer vocabulary.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from inloop_eval.config import LMDomainConfig
from inloop_eval.distributed import all_reduce_max, world
from inloop_eval.errors import LMDataError
from inloop_eval.files import build_directory_atomically
from inloop_eval.tokenizer import TokenizerLike, start_token_id

log = logging.getLogger(__name__)

CACHE_VERSION = 1
# Rows of a memmap file scanned at once when checking token ids and counting bytes.
_SCAN_ROWS = 4096
_NPY_MAGIC = b"\x93NUMPY"
_SENTENCEPIECE_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass
class DomainSet:
    """The sequences of one label.

    parts: flat token arrays (memmaps) that the sequences index into.
    part_S, start_S, length_S: where each sequence lies (length >= 2 tokens).
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


# --- Files ---------------------------------------------------------------------------------------------


def resolve_paths(label: str, patterns: Iterable[str]) -> list[Path]:
    """The files that `patterns` name, in order (each glob's matches sorted), without repeats."""
    files: dict[Path, None] = {}
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if glob.has_magic(expanded):
            matches = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
            if not matches:
                raise LMDataError(
                    f"label {label!r}: the pattern {pattern!r} matches no file; make the domain set first "
                    "(`inloop-eval data make-lm`) or fix `paths`"
                )
        else:
            path = Path(expanded)
            if path.is_dir():
                raise LMDataError(
                    f"label {label!r}: {path} is a folder; expected a file, or a pattern for the folder's "
                    f"files in `paths`, e.g. {str(path / '*.npy')!r}"
                )
            if not path.is_file():
                raise LMDataError(
                    f"label {label!r}: file {path} does not exist; make the domain set first "
                    "(`inloop-eval data make-lm`) or fix `paths`"
                )
            matches = [path]
        files.update(dict.fromkeys(m.absolute() for m in matches))
    return list(files)


def open_token_file(label: str, path: Path, dtype: str) -> np.ndarray:
    """A memmap token file as a flat read-only array: raw `dtype` ids, or an `np.save` file's own dtype."""
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(len(_NPY_MAGIC))
    if magic == _NPY_MAGIC:
        tokens = np.load(path, mmap_mode="r")
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise LMDataError(
                f"label {label!r} file {path}: expected a 1-D array of integer token ids, found "
                f"shape {tokens.shape} of {tokens.dtype}"
            )
        return tokens
    itemsize = np.dtype(dtype).itemsize
    if size % itemsize:
        raise LMDataError(
            f"label {label!r} file {path}: {size} bytes is not a whole number of {dtype} tokens "
            f"({itemsize} bytes each); set the domain's `dtype` to the one the file was written with, or "
            "remake a file that was cut short"
        )
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


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


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def read_documents(domain: LMDomainConfig, files: list[Path]) -> Iterator[tuple[int, int, str]]:
    """(file index, document number, text) of every non-empty document: JSONL lines or whole files."""
    for f, path in enumerate(files):
        try:
            with _open_text(path) as handle:
                if domain.format == "text":
                    text = handle.read()
                    if text:
                        yield f, 0, text
                    continue
                for n, line in enumerate(handle):
                    if not line.strip():
                        continue
                    yield f, n, _jsonl_text(domain, path, n, line)
        except UnicodeDecodeError as exc:
            raise LMDataError(
                f"label {domain.label!r} file {path}: not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                "convert it to UTF-8 or drop it from `paths`"
            ) from None


def _jsonl_text(domain: LMDomainConfig, path: Path, n: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LMDataError(
            f"label {domain.label!r} file {path} line {n + 1}: not valid JSON ({exc})"
        ) from None
    text = record.get(domain.text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise LMDataError(
            f"label {domain.label!r} file {path} line {n + 1}: expected a string field "
            f"{domain.text_field!r} (set `text_field`), found {type(text).__name__}"
        )
    return text


def encode_texts(tokenizer: TokenizerLike, texts: list[str]) -> list[list[int]]:
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:
        return [list(ids) for ids in encode_batch(texts)]
    return [list(tokenizer.encode(t)) for t in texts]


def prefix_token(tokenizer: TokenizerLike, label: str) -> int:
    """The token each document starts from: BOS, else EOS."""
    token = start_token_id(tokenizer)
    if token is not None:
        return token
    raise LMDataError(
        f"label {label!r}: text domains start every document from the tokenizer's BOS or EOS token, and this "
        "tokenizer has neither; pass a tokenizer with an EOS token or use memmap files"
    )


def document_windows(
    ids: list[int], prefix: int, seq_len: int, n_bytes: int, byte_table: np.ndarray | None
) -> tuple[list[np.ndarray], list[int]]:
    """A document as windows of at most `seq_len` tokens overlapping by one (every text token predicted
    once), and each window's bytes: the table's count of its predicted tokens, the last window taking the
    rest of the text's `n_bytes` so that the windows sum to it exactly (a share by tokens without a table)."""
    full = np.asarray([prefix, *ids], dtype=np.int64)
    step = seq_len - 1
    windows = [full[k : k + seq_len] for k in range(0, len(ids), step)]
    counts: list[int] = []
    for w in windows[:-1]:
        if byte_table is not None:
            counts.append(int(byte_table[w[1:]].sum()))
        else:
            counts.append(n_bytes * (len(w) - 1) // max(len(ids), 1))
    counts.append(max(0, n_bytes - sum(counts)))
    return windows, counts


def cache_key(
    domain: LMDomainConfig, files: list[Path], tokenizer: TokenizerLike, seq_len: int, prefix: int
) -> str:
    """Changes when the files (path, size, mtime), the tokenizer, the windowing or the format change."""
    fingerprint = getattr(tokenizer, "fingerprint", None) or (
        f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}:{tokenizer.encode('The quick fox, 1 2 3.')}"
    )
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    key = {
        "version": CACHE_VERSION,
        "format": domain.format,
        "text_field": domain.text_field,
        "seq_len": seq_len,
        "prefix": prefix,
        "tokenizer": fingerprint,
        "files": stats,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def build_text_cache(
    domain: LMDomainConfig,
    files: list[Path],
    tokenizer: TokenizerLike,
    seq_len: int,
    byte_table: np.ndarray | None,
    out: Path,
) -> None:
    """Tokenize a label's documents into `out`: `tokens.bin` (raw ids), `sequences.npy` [S, 5] int64
    (start, length, bytes, file index, document number) and `meta.json`."""
    prefix = prefix_token(tokenizer, domain.label)
    located: list[tuple[int, int, str]] = list(read_documents(domain, files))
    encoded = encode_texts(tokenizer, [text for _, _, text in located])
    windows: list[np.ndarray] = []
    rows: list[tuple[int, int, int, int, int]] = []
    start = 0
    for (f, n, text), ids in zip(located, encoded, strict=True):
        if not ids:
            continue
        doc_windows, doc_bytes = document_windows(ids, prefix, seq_len, len(text.encode("utf-8")), byte_table)
        for w, b in zip(doc_windows, doc_bytes, strict=True):
            rows.append((start, len(w), b, f, n))
            windows.append(w)
            start += len(w)
    if not rows:
        raise LMDataError(
            f"label {domain.label!r}: its files hold no text to score: {[str(f) for f in files]}; "
            "add documents or drop the label"
        )
    tokens = np.concatenate(windows)
    dtype = np.uint16 if int(tokens.max()) < 2**16 else np.uint32
    tokens.astype(dtype).tofile(out / "tokens.bin")
    np.save(out / "sequences.npy", np.asarray(rows, dtype=np.int64))
    meta = {
        "label": domain.label,
        "dtype": np.dtype(dtype).name,
        "files": [str(f) for f in files],
        "n_documents": len({(f, n) for _, _, _, f, n in rows}),
        "n_sequences": len(rows),
        "n_tokens": int(sum(r[1] - 1 for r in rows)),
        "n_bytes": int(sum(r[2] for r in rows)),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def build_once(target: Path, build: Callable[[Path], None], label: str) -> None:
    """Make the directory `target` with `build` unless it exists: rank 0 builds while the others wait on
    one collective (every rank calls this); a rank that then cannot see it (a node-local disk) builds its
    own copy. Each build fills a staging directory that is renamed into place whole."""
    world_size, rank = world()
    error: BaseException | None = None
    if rank == 0 and not target.is_dir():
        try:
            build_directory_atomically(target, build)
        except Exception as exc:  # re-raised after the collective so no rank waits forever
            error = exc
    if world_size > 1 and all_reduce_max(int(error is not None)) and error is None:
        raise LMDataError(f"label {label!r}: rank 0 failed to build the token cache {target}; see its log")
    if error is not None:
        raise error
    if not target.is_dir():
        build_directory_atomically(target, build)


def load_text_domain(
    domain: LMDomainConfig,
    seq_len: int,
    tokenizer: TokenizerLike,
    byte_table: np.ndarray | None,
    max_tokens: int | None,
    cache_dir: Path,
) -> DomainSet:
    """A label's JSONL or text files, tokenized once into `cache_dir` and read back as a DomainSet."""
    files = resolve_paths(domain.label, domain.paths)
    prefix = prefix_token(tokenizer, domain.label)
    target = cache_dir / f"{domain.label}-{cache_key(domain, files, tokenizer, seq_len, prefix)}"
    build_once(
        target,
        lambda out: build_text_cache(domain, files, tokenizer, seq_len, byte_table, out),
        domain.label,
    )
    meta = json.loads((target / "meta.json").read_text())
    rows = np.load(target / "sequences.npy")
    tokens = np.memmap(target / "tokens.bin", dtype=meta["dtype"], mode="r")
    full = DomainSet(
        domain.label,
        "document",
        [tokens],
        np.zeros(len(rows), dtype=np.int64),
        rows[:, 0],
        rows[:, 1],
        rows[:, 2],
        files,
        rows[:, 3],
        rows[:, 4],
        -1,
        -1,
    )
    return full.select(select_under_cap(full.length_S, max_tokens))
