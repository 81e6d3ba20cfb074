"""The tokens of a text domain (`jsonl` / `text`): its documents cut into windows, tokenized once and kept in a
checksummed cache.

A document starts from the tokenizer's BOS (else EOS) and is cut into windows of at most `seq_len` tokens
overlapping by one, so every token of the text is predicted exactly once; a document's bytes are the UTF-8
bytes of its text.

The cache is a folder entry of `inloop_eval.data.cache`: `<cache_dir>/<label>-<key>/` holding `tokens.bin`
(the windows' ids end to end), `sequences.npy` (where each window lies, its bytes, file and document) and the
record `meta.json`; the key is a hash of the source files' paths, sizes and mtimes, the tokenizer, the
windowing and `CACHE_VERSION`. A folder that does not match its record (cut short, overwritten, emptied) is
rebuilt with a warning, never trusted; where the cache location cannot be written the tokens are kept in
memory, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inloop_eval.data.cache import CacheMismatch, discard, read_folder, write_folder
from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.data.perplexity.sources import read_documents, resolve_paths
from inloop_eval.data.tokenizer import TokenizerLike, encode_texts, start_token_id
from inloop_eval.errors import LMDataError

log = logging.getLogger(__name__)

CACHE_VERSION = 3  # 3: the record of `inloop_eval.data.cache` (format, key, checks, info)
_TOKENS = "tokens.bin"
_SEQUENCES = "sequences.npy"


@dataclass
class TextSource:
    """A text domain's files, the key of their tokens, and the folder of its token cache
    (`<cache_dir>/<label>-<key>`)."""

    domain: LMDomainConfig
    files: list[Path]
    key: str
    target: Path


@dataclass
class TextTokens:
    """A text domain tokenized. tokens: the windows' ids end to end [N] (uint16 or uint32; a memmap when read
    from the cache); rows [S, 5] int64: start, length, bytes, file index and document number of each."""

    tokens: np.ndarray
    rows: np.ndarray


def locate_text_domain(
    domain: LMDomainConfig, seq_len: int, tokenizer: TokenizerLike, cache_dir: Path
) -> TextSource:
    """A label's JSONL or text files (each must exist) and where their tokens are cached."""
    files = resolve_paths(domain.label, domain.paths)
    key = cache_key(domain, files, tokenizer, seq_len, prefix_token(tokenizer, domain.label))
    return TextSource(domain, files, key, cache_dir / f"{domain.label}-{key}")


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


# --- tokenizing ----------------------------------------------------------------------------------------


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


def tokenize_text_domain(
    source: TextSource, tokenizer: TokenizerLike, seq_len: int, byte_table: np.ndarray | None
) -> TextTokens:
    """Every document of a label cut into windows (`document_windows`), in file and document order."""
    domain = source.domain
    prefix = prefix_token(tokenizer, domain.label)
    located: list[tuple[int, int, str]] = list(read_documents(domain, source.files))
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
            f"label {domain.label!r}: its files hold no text to score: {[str(f) for f in source.files]}; "
            "add documents or drop the label"
        )
    tokens = np.concatenate(windows)
    dtype = np.uint16 if int(tokens.max()) < 2**16 else np.uint32
    return TextTokens(tokens.astype(dtype), np.asarray(rows, dtype=np.int64))


# --- the cache -----------------------------------------------------------------------------------------


def write_token_cache(source: TextSource, text: TextTokens) -> None:
    """Write `text` to the cache folder, whole or not at all: `tokens.bin` (raw ids), `sequences.npy` and the
    record `meta.json` (the key, the checks of both files, the source files and a summary)."""
    rows = text.rows
    info = {
        "label": source.domain.label,
        "dtype": text.tokens.dtype.name,
        "files": [str(f) for f in source.files],
        "n_documents": len({(int(f), int(n)) for f, n in rows[:, 3:5]}),
        "n_sequences": len(rows),
        "n_tokens": int((rows[:, 1] - 1).sum()),
        "n_bytes": int(rows[:, 2].sum()),
    }

    def build(out: Path) -> None:
        text.tokens.tofile(out / _TOKENS)
        np.save(out / _SEQUENCES, rows)

    write_folder(
        source.target, build, version=CACHE_VERSION, key=source.key, files=(_TOKENS, _SEQUENCES), info=info
    )


def read_token_cache(source: TextSource) -> TextTokens | None:
    """The cached tokens of `source`, checked against their record; None when there is no cache folder.
    Raises CacheMismatch for a folder that is not exactly what was written."""
    target = source.target
    info = read_folder(target, version=CACHE_VERSION, key=source.key, files=(_TOKENS, _SEQUENCES))
    if info is None:
        return None
    try:
        rows = np.load(target / _SEQUENCES, allow_pickle=False)
        tokens = np.memmap(target / _TOKENS, dtype=np.dtype(info["dtype"]), mode="r")
    except (OSError, ValueError, KeyError, TypeError) as exc:  # changed since it was checked
        raise CacheMismatch(
            f"unreadable after its check ({type(exc).__name__}: {exc})", damaged=True
        ) from None
    return TextTokens(tokens, rows)


def cached_text_tokens(
    source: TextSource, tokenizer: TokenizerLike, seq_len: int, byte_table: np.ndarray | None
) -> TextTokens:
    """The tokens of a text domain: read from its cache folder; else tokenized and written there (a folder
    that does not match is replaced, with a warning). Where the cache location cannot be written they stay
    in memory, with a warning. Makes no collective."""
    mismatched = False
    try:
        cached = read_token_cache(source)
    except CacheMismatch as exc:
        log.warning(
            "label %r: the token cache %s is %s (%s); rebuilding it",
            source.domain.label,
            source.target,
            "damaged" if exc.damaged else "stale",
            exc,
        )
        cached, mismatched = None, True
    if cached is not None:
        return cached
    text = tokenize_text_domain(source, tokenizer, seq_len, byte_table)
    try:
        if mismatched:
            discard(source.target)
        write_token_cache(source, text)
    except OSError as exc:
        log.warning(
            "label %r: cannot write the token cache %s (%s: %s); working from memory, so each process "
            "tokenizes this label at each start; make `cache_dir` writable to keep the tokens",
            source.domain.label,
            source.target,
            type(exc).__name__,
            exc,
        )
    return text
