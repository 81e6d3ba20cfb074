"""Loading a tokenizer: any object with `encode(str) -> list[int]` works; this wraps `tokenizers` files.

`load_tokenizer` accepts a `tokenizers` JSON file or a Hugging Face tokenizer directory (holding
`tokenizer.json`, and optionally `tokenizer_config.json` / `special_tokens_map.json` naming BOS and EOS).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tokenizers import Tokenizer as Backend

from inloop_eval.errors import TokenizerError

# Tokens that mean "end of text" in common vocabularies, tried in order when none is named.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>")


@runtime_checkable
class TokenizerLike(Protocol):
    """The least a tokenizer must offer: encode text without adding special tokens."""

    def encode(self, text: str) -> list[int]: ...


class Tokenizer:
    """A `tokenizers.Tokenizer` with the special tokens the evaluator needs.

    bos_token_id: prepended to every context when not None.
    eos_token_id: the unconditional prefix when there is no BOS (as lm-evaluation-harness does).
    fingerprint: a hash of the vocabulary and settings, used in cache keys.
    """

    def __init__(
        self,
        backend: Any,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        fingerprint: str,
        name: str = "",
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.fingerprint = fingerprint
        self.name = name

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return str(self.backend.decode(ids, skip_special_tokens=False))

    @property
    def prefix_token_id(self) -> int | None:
        """The token an empty context starts from: BOS, else EOS."""
        return start_token_id(self)


def start_token_id(tokenizer: TokenizerLike) -> int | None:
    """The one rule for where text starts: the tokenizer's BOS, else its EOS (as lm-evaluation-harness
    does); None when it has neither. Empty contexts, unconditional contexts and text-domain documents
    start from it."""
    for name in ("bos_token_id", "eos_token_id"):
        token = getattr(tokenizer, name, None)
        if token is not None:
            return int(token)
    return None


def encode_texts(tokenizer: TokenizerLike, texts: list[str]) -> list[list[int]]:
    """The ids of each text: one `encode_batch` call where the tokenizer has it (much faster), else `encode`
    text by text."""
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:
        return [list(ids) for ids in encode_batch(texts)]
    return [list(tokenizer.encode(t)) for t in texts]


def load_tokenizer(
    path: str | Path, *, bos_token: str | None = None, eos_token: str | None = None
) -> Tokenizer:
    """Load a `tokenizers` JSON file or a Hugging Face tokenizer directory.

    bos_token / eos_token: override the special tokens found in the files.
    """
    path = Path(path).expanduser()
    json_path = path / "tokenizer.json" if path.is_dir() else path
    if not json_path.is_file():
        raise TokenizerError(
            f"tokenizer: expected a tokenizers JSON file or a directory holding tokenizer.json, "
            f"found no file at {json_path}"
        )
    raw = json_path.read_bytes()
    try:
        backend = Backend.from_str(raw.decode("utf-8"))
    except Exception as exc:  # the tokenizers library raises plain Exception subclasses
        raise TokenizerError(
            f"tokenizer {json_path}: could not load it as a `tokenizers` JSON file ({exc}); "
            "pass a tokenizer.json or a Hugging Face tokenizer directory"
        ) from None
    config = _special_tokens_from_dir(path) if path.is_dir() else {}
    bos = _token_id(backend, bos_token, json_path) if bos_token else _detect_bos(backend, config)
    eos_name = eos_token or config.get("eos_token")
    eos = _token_id(backend, eos_name, json_path) if eos_name else _detect_eos(backend)
    digest = hashlib.sha256(raw + json.dumps([bos, eos]).encode()).hexdigest()[:16]
    return Tokenizer(backend, bos_token_id=bos, eos_token_id=eos, fingerprint=digest, name=str(path))


def with_special_ids(
    base: Tokenizer, *, bos_token_id: int | None, eos_token_id: int | None, name: str
) -> Tokenizer:
    """`base` with the BOS and EOS ids a training config gives (used as given, None included), checked to lie
    inside its vocabulary; its fingerprint tells it apart from `base` in cache keys.

    name: what the config calls the tokenizer, for messages and `Tokenizer.name`.
    """
    for field, token in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
        if token is not None and not 0 <= token < base.vocab_size:
            raise TokenizerError(
                f"tokenizer {name!r}: {field} {token} is outside the vocabulary of {base.name} "
                f"({base.vocab_size} tokens); the config and the tokenizer file do not match"
            )
    special = json.dumps([bos_token_id, eos_token_id]).encode()
    return Tokenizer(
        base.backend,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        fingerprint=hashlib.sha256(base.fingerprint.encode() + special).hexdigest()[:16],
        name=name,
    )


def _special_tokens_from_dir(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        file = path / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise TokenizerError(f"tokenizer {file}: not valid JSON ({exc})") from None
        for key in ("bos_token", "eos_token", "add_bos_token"):
            value = data.get(key)
            if isinstance(value, dict):  # {"content": "<s>", ...}
                value = value.get("content")
            if value is not None:
                found[key] = value
    return found


def _token_id(backend: Any, token: str, where: Path) -> int:
    token_id = backend.token_to_id(token)
    if token_id is None:
        raise TokenizerError(f"tokenizer {where}: special token {token!r} is not in the vocabulary")
    return int(token_id)


def _detect_bos(backend: Any, config: dict[str, Any]) -> int | None:
    """BOS is the token the post-processor puts first, or one the config asks to add."""
    with_special = backend.encode("a", add_special_tokens=True).ids
    without = backend.encode("a", add_special_tokens=False).ids
    if len(with_special) > len(without) and with_special[1 : 1 + len(without)] == without:
        return int(with_special[0])
    if config.get("add_bos_token") and config.get("bos_token"):
        token_id = backend.token_to_id(config["bos_token"])
        return None if token_id is None else int(token_id)
    return None


def _detect_eos(backend: Any) -> int | None:
    for token in _EOS_CANDIDATES:
        token_id = backend.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    return None
