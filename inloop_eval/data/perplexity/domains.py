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

The token cache (`<cache_dir>/<label>-<key>/`, the key a hash of the source files' paths, sizes and mtimes,
the tokenizer and the windowing) is checked whenever it is opened: `meta.json` records the key and the size
and SHA-256 of `tokens.bin` and `sequences.npy`. A folder that does not match (cut short, overwritten,
emptied) is rebuilt with a warning, never trusted; where the cache location cannot be written the tokens are
kept in memory, with a warning.

Under torch.distributed, `load_domains` makes every rank end with the same labels: a label that fails on
any rank (a file missing on one node, an I/O error) is dropped on every rank, agreed by one all-reduce of a
failure flag per label, before any forward pass.

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
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from inloop_eval.data.files import build_directory_atomically
from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.data.tokenizer import TokenizerLike, start_token_id
from inloop_eval.distributed import TaskFailedOnAnotherRank, agree_failures, world
from inloop_eval.errors import LMDataError

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: meta.json records the key and the size and SHA-256 of each file
_CACHE_FILES = ("tokens.bin", "sequences.npy")
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


def unreadable(label: str, path: Path | str, exc: BaseException) -> LMDataError:
    """The error for a file that the operating system would not read (gone, no permission, an I/O error)."""
    reason = getattr(exc, "strerror", None) or exc
    return LMDataError(
        f"label {label!r} file {path}: cannot be read ({type(exc).__name__}: {reason}); check that it exists "
        "and is readable on every node"
    )


def open_token_file(label: str, path: Path, dtype: str) -> np.ndarray:
    """A memmap token file as a flat read-only array: raw `dtype` ids, or an `np.save` file's own dtype."""
    try:
        return _token_array(label, path, dtype)
    except OSError as exc:
        raise unreadable(label, path, exc) from exc


def _token_array(label: str, path: Path, dtype: str) -> np.ndarray:
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(len(_NPY_MAGIC))
    if magic == _NPY_MAGIC:
        try:
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:  # NumPy's own words for a cut or garbled header
            raise LMDataError(
                f"label {label!r} file {path}: not a readable .npy file ({exc}); remake it (`np.save`) or "
                "drop it from `paths`"
            ) from None
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
        except (OSError, EOFError) as exc:  # gone, unreadable, an I/O error, a damaged .gz
            raise unreadable(domain.label, path, exc) from exc


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


class TokenCacheError(LMDataError):
    """A text domain's token cache folder is unreadable, cut short or not what its `meta.json` records (it is
    rebuilt, never trusted)."""


@dataclass
class TextSource:
    """A text domain's files, and the folder of its token cache (`<cache_dir>/<label>-<key>`)."""

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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_token_cache(source: TextSource, text: TextTokens) -> None:
    """Write `text` to the cache folder, whole or not at all: `tokens.bin` (raw ids), `sequences.npy` and
    `meta.json` (the key, the source files, and the size and SHA-256 of the other two files)."""

    def build(out: Path) -> None:
        text.tokens.tofile(out / "tokens.bin")
        np.save(out / "sequences.npy", text.rows)
        rows = text.rows
        meta = {
            "version": CACHE_VERSION,
            "key": source.key,
            "label": source.domain.label,
            "dtype": text.tokens.dtype.name,
            "files": [str(f) for f in source.files],
            "n_documents": len({(int(f), int(n)) for f, n in rows[:, 3:5]}),
            "n_sequences": len(rows),
            "n_tokens": int((rows[:, 1] - 1).sum()),
            "n_bytes": int(rows[:, 2].sum()),
            "checks": {
                name: {"bytes": (out / name).stat().st_size, "sha256": _sha256(out / name)}
                for name in _CACHE_FILES
            },
        }
        (out / "meta.json").write_text(json.dumps(meta, indent=1))

    build_directory_atomically(source.target, build)


def read_token_cache(source: TextSource) -> TextTokens | None:
    """The cached tokens of `source`, checked against `meta.json`; None when there is no cache folder.
    Raises TokenCacheError for a folder that is not exactly what was written."""
    target = source.target
    if not target.exists():
        return None
    try:
        meta = json.loads((target / "meta.json").read_text())
        if not isinstance(meta, dict) or (meta.get("version"), meta.get("key")) != (
            CACHE_VERSION,
            source.key,
        ):
            raise ValueError(f"meta.json is not the record of version {CACHE_VERSION} and key {source.key!r}")
        for name in _CACHE_FILES:
            size, expected = (target / name).stat().st_size, meta["checks"][name]
            if size != expected["bytes"]:
                raise ValueError(f"{name} holds {size} bytes, meta.json records {expected['bytes']}")
            if _sha256(target / name) != expected["sha256"]:
                raise ValueError(f"{name} is not the file that was written (its SHA-256 differs)")
        rows = np.load(target / "sequences.npy", allow_pickle=False)
        tokens = np.memmap(target / "tokens.bin", dtype=np.dtype(meta["dtype"]), mode="r")
        if rows.ndim != 2 or rows.shape[1] != 5 or rows.dtype != np.int64 or not len(rows):
            raise ValueError(f"sequences.npy holds {rows.shape} of {rows.dtype}, expected [S, 5] int64")
    except (OSError, ValueError, KeyError, TypeError) as exc:  # each means "not the cache that was written"
        raise TokenCacheError(
            f"label {source.domain.label!r}: the token cache {target} is damaged ({type(exc).__name__}: {exc})"
        ) from None
    return TextTokens(tokens, rows)


def _discard(target: Path) -> None:
    """Delete a damaged cache folder: first moved aside whole, so that no reader finds half of it."""
    trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.damaged-", dir=target.parent))
    try:
        os.rename(target, trash / "old")
    except FileNotFoundError:  # another process moved it first
        pass
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def cached_text_tokens(
    source: TextSource, tokenizer: TokenizerLike, seq_len: int, byte_table: np.ndarray | None
) -> TextTokens:
    """The tokens of a text domain: read from its cache folder; else tokenized and written there (a damaged
    folder is replaced, with a warning). Where the cache location cannot be written they stay in memory,
    with a warning. Makes no collective."""
    damaged = False
    try:
        cached = read_token_cache(source)
    except TokenCacheError as exc:
        log.warning("%s; rebuilding it", exc)
        cached, damaged = None, True
    if cached is not None:
        return cached
    text = tokenize_text_domain(source, tokenizer, seq_len, byte_table)
    try:
        if damaged:
            _discard(source.target)
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
    process alone (`load_domains` coordinates the ranks)."""
    source = locate_text_domain(domain, seq_len, tokenizer, cache_dir)
    return text_domain(source, cached_text_tokens(source, tokenizer, seq_len, byte_table), max_tokens)


# --- every rank alike ----------------------------------------------------------------------------------


@dataclass
class LoadedDomains:
    """Labels loaded on every rank. domains: label -> its sequences, in config order. errors: label -> why it
    is not loaded: this rank's own error, or TaskFailedOnAnotherRank where it failed on another rank only."""

    domains: dict[str, DomainSet]
    errors: dict[str, Exception]


def domain_error(label: str, exc: Exception) -> LMDataError:
    """`exc`, raised while loading `label`, as an LMDataError that names the label (and the file, where the
    operating system named one)."""
    if isinstance(exc, LMDataError):
        return exc
    if isinstance(exc, OSError) and exc.filename is not None:
        error = unreadable(label, exc.filename, exc)
    else:
        error = LMDataError(f"label {label!r}: loading failed ({type(exc).__name__}: {exc})")
    error.__cause__ = exc
    return error


def load_domains(
    configs: Sequence[LMDomainConfig],
    seq_len: int,
    cap: Callable[[LMDomainConfig], int | None],
    tokenizer: TokenizerLike,
    byte_table: np.ndarray | None,
    cache_dir: Path,
) -> LoadedDomains:
    """Load the domains `configs` (every rank passes the same), sequences of `seq_len`, each under its token
    `cap`, so that every rank ends with
    the same ones. Every rank calls this and makes the same collectives whatever fails where: one all-reduce
    of a failure flag per label after reading the files (while rank 0 also reads or builds the text caches),
    and, when text domains remain, one more after every rank has opened their caches."""
    _, rank = world()
    domains: dict[str, DomainSet] = {}
    texts: dict[str, tuple[TextSource, TextTokens | None]] = {}
    errors: dict[str, Exception] = {}
    for d in configs:
        try:
            if d.format == "memmap":
                domains[d.label] = load_memmap_domain(d, seq_len, byte_table, cap(d))
            else:
                source = locate_text_domain(d, seq_len, tokenizer, cache_dir)
                # Rank 0 reads or builds the cache while the others wait in the agreement below.
                text = cached_text_tokens(source, tokenizer, seq_len, byte_table) if rank == 0 else None
                texts[d.label] = (source, text)
        except Exception as exc:  # agreed below: a rank that raised here must still join every collective
            errors[d.label] = domain_error(d.label, exc)
    _agree([d.label for d in configs], errors, domains, texts)
    if texts:  # the same labels on every rank once the failures are agreed
        opened = list(texts)
        for label, (source, text) in texts.items():
            try:
                if text is None:  # rank 0's cache, or this rank's own where it cannot see rank 0's
                    text = cached_text_tokens(source, tokenizer, seq_len, byte_table)
                domains[label] = text_domain(source, text, cap(source.domain))
            except Exception as exc:
                errors[label] = domain_error(label, exc)
        _agree(opened, errors, domains, {})
    ordered = {d.label: domains[d.label] for d in configs if d.label in domains}
    return LoadedDomains(ordered, {d.label: errors[d.label] for d in configs if d.label in errors})


def _agree(
    labels: list[str],
    errors: dict[str, Exception],
    domains: dict[str, DomainSet],
    texts: dict[str, tuple[TextSource, TextTokens | None]],
) -> None:
    """Agree which of `labels` failed on some rank; drop those from `domains` and `texts`, and record the
    ones that failed elsewhere only in `errors`."""
    for label, rank in zip(labels, agree_failures([label in errors for label in labels]), strict=True):
        if rank is None:
            continue
        domains.pop(label, None)
        texts.pop(label, None)
        errors.setdefault(
            label,
            TaskFailedOnAnotherRank(
                f"label {label!r}: could not be loaded on rank {rank} (its log has the reason); every rank "
                "leaves it out of this evaluation and tries it again at the next"
            ),
        )
