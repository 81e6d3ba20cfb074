"""Loading tokenizers: the real GPT-NeoX JSON, Hugging Face directories, and the errors for bad paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers, processors

from inloop_eval.data.root import neox_tokenizer_path
from inloop_eval.data.tokenizer import Tokenizer, TokenizerLike, load_tokenizer
from inloop_eval.errors import TokenizerError


@pytest.fixture(scope="module")
def neox_json(data_root: Path) -> Path:
    return neox_tokenizer_path(data_root)


def test_neox_json(neox_json: Path) -> None:
    tok = load_tokenizer(neox_json)
    assert isinstance(tok, TokenizerLike)
    assert tok.bos_token_id is None
    assert tok.eos_token_id == 0
    assert tok.backend.id_to_token(0) == "<|endoftext|>"
    assert tok.prefix_token_id == 0
    assert tok.vocab_size == 50280  # 50254 BPE tokens + OLMo's added tokens (PII markers, runs of spaces)
    ids = tok.encode("The capital of France is Paris.")
    assert ids == [510, 5347, 273, 6181, 310, 7785, 15]  # no special tokens added
    assert tok.decode(ids) == "The capital of France is Paris."
    assert tok.encode_batch(["hello", " world"]) == [tok.encode("hello"), tok.encode(" world")]
    assert tok.name == str(neox_json)


def test_fingerprint_depends_on_vocabulary_and_special_tokens(neox_json: Path, data_root: Path) -> None:
    first = load_tokenizer(neox_json)
    assert load_tokenizer(neox_json).fingerprint == first.fingerprint
    assert load_tokenizer(neox_json, bos_token="<|endoftext|>").fingerprint != first.fingerprint
    dolma = load_tokenizer(data_root / "tokenizers" / "gpt-neox-olmo-dolma-v1_5.json")
    assert dolma.fingerprint != first.fingerprint


def test_overrides_name_special_tokens(neox_json: Path) -> None:
    tok = load_tokenizer(neox_json, bos_token="<|endoftext|>", eos_token="<|padding|>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.prefix_token_id) == (0, 1, 0)
    with pytest.raises(TokenizerError, match=r"'<s>' is not in the vocabulary") as info:
        load_tokenizer(neox_json, bos_token="<s>")
    assert str(neox_json) in str(info.value)


def _hf_dir(tmp_path: Path, neox_json: Path, **files: dict) -> Path:
    directory = tmp_path / "hf-tokenizer"
    directory.mkdir()
    shutil.copyfile(neox_json, directory / "tokenizer.json")
    for name, content in files.items():
        (directory / f"{name}.json").write_text(json.dumps(content))
    return directory


def test_hf_directory_config_names_bos_and_eos(tmp_path: Path, neox_json: Path) -> None:
    config = {"bos_token": "<|padding|>", "eos_token": "|||EMAIL_ADDRESS|||", "add_bos_token": True}
    directory = _hf_dir(tmp_path, neox_json, tokenizer_config=config)
    tok = load_tokenizer(directory)
    vocab = tok.backend
    assert tok.bos_token_id == vocab.token_to_id("<|padding|>") == 1
    assert tok.eos_token_id == vocab.token_to_id("|||EMAIL_ADDRESS|||")
    assert tok.eos_token_id not in (0, 1, None)
    assert tok.prefix_token_id == 1
    assert tok.encode("hello") == load_tokenizer(neox_json).encode("hello")  # BOS is added by us, not encode


def test_hf_directory_special_tokens_map_with_dict_entries(tmp_path: Path, neox_json: Path) -> None:
    special = {"eos_token": {"content": "|||PHONE_NUMBER|||", "lstrip": False}}
    config = {"bos_token": {"content": "<|padding|>"}, "add_bos_token": True}
    directory = _hf_dir(tmp_path, neox_json, special_tokens_map=special, tokenizer_config=config)
    tok = load_tokenizer(directory)
    assert tok.bos_token_id == 1
    assert tok.eos_token_id == tok.backend.token_to_id("|||PHONE_NUMBER|||")


def test_hf_directory_bos_named_but_not_added(tmp_path: Path, neox_json: Path) -> None:
    # As GPT-2's config: BOS is named but the tokenizer never puts it in front, so contexts get none.
    directory = _hf_dir(tmp_path, neox_json, tokenizer_config={"bos_token": "<|endoftext|>"})
    tok = load_tokenizer(directory)
    assert tok.bos_token_id is None
    assert tok.eos_token_id == 0


def test_hf_directory_with_bad_config(tmp_path: Path, neox_json: Path) -> None:
    directory = _hf_dir(tmp_path, neox_json)
    (directory / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not valid JSON") as info:
        load_tokenizer(directory)
    assert str(directory / "tokenizer_config.json") in str(info.value)
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(TokenizerError, match="'<nope>' is not in the vocabulary"):
        load_tokenizer(directory)


def _tiny_backend(template: str | None) -> Backend:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if template is not None:
        specials = [(t, vocab[t]) for t in ("<s>", "</s>") if t in template]
        backend.post_processor = processors.TemplateProcessing(single=template, special_tokens=specials)
    return backend


@pytest.mark.parametrize(
    ("template", "bos", "eos"),
    [
        (None, None, 2),
        ("<s> $A", 1, 2),
        ("$A </s>", None, 2),
        ("<s> $A </s>", 1, 2),
    ],
)
def test_bos_detected_from_post_processor(tmp_path: Path, template: str | None, bos: int, eos: int) -> None:
    path = tmp_path / "tiny.json"
    _tiny_backend(template).save(str(path))
    tok = load_tokenizer(path)
    assert (tok.bos_token_id, tok.eos_token_id) == (bos, eos)
    assert tok.encode("a b") == [3, 4]


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-tokenizer.json"
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(missing)
    assert str(missing) in str(info.value)


def test_directory_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(tmp_path)
    assert str(tmp_path / "tokenizer.json") in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"", b"hello, I am not a tokenizer\n", b'{"vocab": {"a": 0}}', b"[1, 2, 3]", b"\xff\xfe\x00binary"],
    ids=["empty", "text", "json-object", "json-list", "binary"],
)
def test_file_that_is_not_a_tokenizer(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    for where in (path, tmp_path):  # the file itself, and the directory holding it
        with pytest.raises(TokenizerError, match="could not load it") as info:
            load_tokenizer(where)
        assert str(path) in str(info.value)


def test_tokenizer_wraps_any_backend(neox_json: Path) -> None:
    backend = Backend.from_file(str(neox_json))
    tok = Tokenizer(backend, bos_token_id=None, eos_token_id=None, fingerprint="x")
    assert tok.prefix_token_id is None
    assert tok.encode(" Paris") == [7785]
