"""Finding a tokenizer identifier's file on this machine: a local path, the fetched root, the local Hugging Face
hub cache (a real cache layout built in tmp_path), never the network; and the error when none holds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hub_cache_folders import COMMIT, add_to_hub_cache

from inloop_eval.data.fetch import COMPLETE_MARKER
from inloop_eval.data.hub_cache import cached_hub_file, hub_cache_dir
from inloop_eval.data.root import TOKENIZER_DIR
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.data.tokenizer_lookup import find_tokenizer_file
from inloop_eval.errors import TokenizerError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator

DOLMA2 = "allenai/dolma2-tokenizer"
NEOX = "allenai/gpt-neox-olmo-dolma-v1_5"
HUB_VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network used: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def hub_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No hub cache variable set, whatever this machine sets."""
    for var in HUB_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_the_cache_folder_follows_the_environment_at_each_call(
    hub_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hub_env.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    hub_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    hub_env.setenv("HF_HOME", str(tmp_path / "hf_home"))
    assert hub_cache_dir() == tmp_path / "hf_home" / "hub"
    hub_env.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert hub_cache_dir() == tmp_path / "legacy"
    hub_env.setenv("HF_HUB_CACHE", "~/hub_cache")
    assert hub_cache_dir() == tmp_path / "home" / "hub_cache"


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_cached_tokenizer_is_found_through_its_snapshot_symlink(
    hub_env: pytest.MonkeyPatch, tmp_path: Path, no_network: None, variable: str
) -> None:
    cache = tmp_path / "hub"
    hub_env.setenv(variable, str(cache if variable == "HF_HUB_CACHE" else tmp_path))
    snapshot = add_to_hub_cache(cache, DOLMA2, "tokenizer.json", b'{"cached": true}')
    found = find_tokenizer_file(DOLMA2, tmp_path / "empty_root")
    assert (
        found
        == snapshot
        == cache / "models--allenai--dolma2-tokenizer" / "snapshots" / COMMIT / "tokenizer.json"
    )
    assert found.is_symlink() and found.resolve().parent.name == "blobs"
    assert found.read_bytes() == b'{"cached": true}'


def test_only_the_revision_main_points_to_counts(tmp_path: Path, no_network: None) -> None:
    cache = tmp_path / "hub"
    add_to_hub_cache(cache, DOLMA2, "tokenizer.json", b"{}")
    (cache / "models--allenai--dolma2-tokenizer" / "refs" / "main").write_text("f" * 40)  # main moved on
    assert cached_hub_file(DOLMA2, "tokenizer.json", cache_dir=cache) is None
    assert cached_hub_file(DOLMA2, "vocab.json", cache_dir=cache) is None
    assert cached_hub_file("allenai/other", "tokenizer.json", cache_dir=cache) is None
    assert cached_hub_file("/not/a repo/id", "tokenizer.json", cache_dir=cache) is None  # a path, not a name


def test_a_local_path_then_the_fetched_root_come_before_the_cache(
    hub_env: pytest.MonkeyPatch, data_root: Path, tmp_path: Path, no_network: None
) -> None:
    hub_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    add_to_hub_cache(tmp_path / "hub", NEOX, "tokenizer.json", b"{}")
    fetched = data_root / TOKENIZER_DIR / "gpt-neox-olmo-dolma-v1_5.json"
    assert find_tokenizer_file(NEOX, data_root) == fetched
    assert find_tokenizer_file(str(fetched), tmp_path / "empty_root") == fetched
    assert find_tokenizer_file(NEOX, tmp_path / "empty_root").parent.parent.name == "snapshots"


def test_a_fetched_tokenizer_found_nowhere_names_both_remedies(
    hub_env: pytest.MonkeyPatch, tmp_path: Path, no_network: None
) -> None:
    hub_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    root = tmp_path / "root"
    with pytest.raises(TokenizerError) as info:
        find_tokenizer_file(DOLMA2, root)
    message = str(info.value)
    assert f"no {root / TOKENIZER_DIR / 'dolma2-tokenizer.json'}" in message
    assert f"local Hugging Face hub cache ({tmp_path / 'hub'}" in message
    assert f"run `inloop-eval data fetch --root {root}` once with the Hugging Face hub reachable" in message
    assert f"`hf download {DOLMA2} tokenizer.json`" in message
    assert "a local tokenizer.json" in message
    # A complete root is never fetched into again: fetching it once more would not help.
    root.mkdir()
    (root / COMPLETE_MARKER).write_text("{}")
    with pytest.raises(TokenizerError, match=rf"fetch a new data root .*{root} is complete.*hf download"):
        find_tokenizer_file(DOLMA2, root)


def test_another_identifier_found_nowhere_says_how_to_download_it(
    hub_env: pytest.MonkeyPatch, tmp_path: Path, no_network: None
) -> None:
    hub_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(TokenizerError) as info:
        find_tokenizer_file("allenai/OLMo-2-0425-1B", tmp_path / "root")
    message = str(info.value)
    assert "not one that `inloop-eval data fetch` fetches" in message and DOLMA2 in message
    assert "`hf download allenai/OLMo-2-0425-1B tokenizer.json`" in message
    assert "run `inloop-eval data fetch" not in message
    with pytest.raises(TokenizerError, match="identifier is empty"):
        find_tokenizer_file("", tmp_path / "root")


def test_an_evaluator_config_names_its_tokenizer_as_the_olmo_core_callback_does(
    hub_env: pytest.MonkeyPatch, data_root: Path, tmp_path: Path, no_network: None
) -> None:
    """`tokenizer:` in an evaluator config is looked up like OLMo's identifiers: the hub cache, the fetched
    root, a path; the tokenizer built from the hub cache encodes as the file it was copied from."""
    fetched = data_root / TOKENIZER_DIR / "gpt-neox-olmo-dolma-v1_5.json"
    hub_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    add_to_hub_cache(tmp_path / "hub", "acme/tokenizer", "tokenizer.json", fetched.read_bytes())
    text = "Evaluating inside the training loop."
    expected = load_tokenizer(fetched).encode(text)
    for identifier, root in (("acme/tokenizer", tmp_path / "empty_root"), (NEOX, data_root)):
        config = EvaluatorConfig.from_dict(
            {"tokenizer": identifier, "data_root": str(root), "evaluators": [{"task": "piqa", "limit": 1}]},
            "test",
        )
        assert InLoopEvaluator(config).tokenizer.encode(text) == expected
    config = EvaluatorConfig.from_dict(
        {"tokenizer": "acme/missing", "data_root": str(data_root), "evaluators": [{"task": "piqa"}]}, "test"
    )
    with pytest.raises(TokenizerError, match="`hf download acme/missing tokenizer.json`"):
        InLoopEvaluator(config)
