"""Bytes per token: how many UTF-8 bytes each token id adds to decoded text (for bits per byte).

Legend: V tokenizer vocabulary.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from inloop_eval.data.tokenizer import TokenizerLike

_SENTENCEPIECE_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# Byte tables by tokenizer fingerprint: built once per process (half a second for a 50k vocabulary).
_BYTE_TABLES: dict[str, np.ndarray] = {}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _decoder_types(spec: dict[str, Any] | None) -> set[str]:
    if not spec:
        return set()
    if spec.get("type") == "Sequence":
        return {t for d in spec.get("decoders", []) for t in _decoder_types(d)}
    return {str(spec.get("type"))}


def token_byte_lengths(tokenizer: TokenizerLike) -> np.ndarray | None:
    """UTF-8 bytes of every token id [V] (int64): what the token adds to decoded text; special tokens 0.

    Byte-level BPE (GPT-2, GPT-NeoX, Llama 3) maps each vocabulary character back to one byte; SentencePiece
    vocabularies count `▁` as a space and `<0xNN>` as one byte; other `tokenizers` models and tokenizers with
    `decode` and `vocab_size` decode each token alone. None when the tokenizer offers neither.
    """
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "to_str"):
        fingerprint = getattr(tokenizer, "fingerprint", None)
        if fingerprint is None:
            return _tokenizers_byte_lengths(backend)
        if fingerprint not in _BYTE_TABLES:
            _BYTE_TABLES[fingerprint] = _tokenizers_byte_lengths(backend)
            _BYTE_TABLES[fingerprint].flags.writeable = False
        return _BYTE_TABLES[fingerprint]
    decode = getattr(tokenizer, "decode", None)
    vocab_size = getattr(tokenizer, "vocab_size", None)
    if decode is None or not vocab_size:
        return None
    return np.array([len(decode([i]).encode("utf-8")) for i in range(int(vocab_size))], dtype=np.int64)


def _tokenizers_byte_lengths(backend: Any) -> np.ndarray:
    spec = json.loads(backend.to_str())
    kinds = _decoder_types(spec.get("decoder"))
    byte_level = "ByteLevel" in kinds
    sentencepiece = bool(kinds & {"Metaspace", "ByteFallback", "Replace"})
    byte_chars = set(bytes_to_unicode().values())
    table = np.zeros(int(backend.get_vocab_size(with_added_tokens=True)), dtype=np.int64)
    for token, i in backend.get_vocab(with_added_tokens=True).items():
        if i >= len(table):
            continue
        if byte_level and all(c in byte_chars for c in token):
            table[i] = len(token)
        elif sentencepiece:
            table[i] = 1 if _SENTENCEPIECE_BYTE.fullmatch(token) else len(token.replace("▁", " ").encode())
        else:
            table[i] = len(backend.decode([i], skip_special_tokens=False).encode("utf-8"))
    for added in spec.get("added_tokens", []):
        if added["id"] < len(table):
            table[added["id"]] = 0 if added.get("special") else len(added["content"].encode("utf-8"))
    return table
