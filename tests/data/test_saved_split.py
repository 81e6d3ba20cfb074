"""Reading saved splits with pyarrow alone: the rows `datasets` gives, and no `datasets` import to evaluate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest

from inloop_eval.data.root import split_rows
from inloop_eval.data.saved_split import SplitRows, read_saved_split
from inloop_eval.errors import TaskDataError


def rows_of(dataset: datasets.Dataset) -> list[dict]:
    return [dataset[i] for i in range(len(dataset))]


def test_every_fetched_split_reads_as_datasets_reads_it(data_root: Path) -> None:
    folders = sorted(p.parent for p in data_root.rglob("state.json"))
    assert len(folders) >= 150, (
        f"expected the fetched standard splits under {data_root}, found {len(folders)}"
    )
    for folder in folders:
        ours = read_saved_split(folder)
        assert isinstance(ours, SplitRows), f"{folder} was not read as a plain split"
        theirs = datasets.load_from_disk(str(folder))
        assert len(ours) == len(theirs), folder
        assert list(ours) == rows_of(theirs), folder
        assert ours[-1] == theirs[len(theirs) - 1] and ours[np.int64(0)] == theirs[0], folder


def save(tmp_path: Path, dataset: datasets.Dataset) -> Path:
    folder = tmp_path / "made" / "none" / "validation"
    dataset.save_to_disk(str(folder))
    return folder


def test_nested_features_and_labels_read_as_datasets_reads_them(tmp_path: Path) -> None:
    features = datasets.Features({
        "question": datasets.Value("string"),
        "choices": datasets.Sequence({"text": datasets.Value("string"), "label": datasets.Value("string")}),
        "answers": datasets.Sequence(datasets.Value("int32")),
        "label": datasets.ClassLabel(names=["no", "yes"]),
        "score": datasets.Value("float32"),
    })  # fmt: skip
    data = {
        "question": ["é?", "b", ""],
        "choices": [{"text": ["x", "y"], "label": ["A", "B"]}, {"text": [], "label": []}, {"text": ["z"], "label": ["C"]}],
        "answers": [[1, 2], [], [3]],
        "label": [1, 0, 1],
        "score": [0.1, -2.5, 3.0],
    }  # fmt: skip
    folder = save(tmp_path, datasets.Dataset.from_dict(data, features=features))
    rows = split_rows("made", None, "validation", data_root=tmp_path, task="made")
    assert isinstance(rows, SplitRows)
    assert list(rows) == rows_of(datasets.load_from_disk(str(folder)))
    assert rows[0]["choices"] == {"text": ["x", "y"], "label": ["A", "B"]} and rows[2]["label"] == 1
    assert rows[1:] == list(rows)[1:]
    with pytest.raises(IndexError, match="row 3 of a split of 3 rows"):
        rows[3]


def test_a_split_with_an_output_format_is_loaded_through_datasets(tmp_path: Path) -> None:
    dataset = datasets.Dataset.from_dict({"n": [1, 2, 3]}).with_format("numpy")
    folder = save(tmp_path, dataset)
    assert read_saved_split(folder) is None
    rows = split_rows("made", None, "validation", data_root=tmp_path, task="made")
    assert isinstance(rows, datasets.Dataset) and rows.format["type"] == "numpy"
    assert list(rows["n"]) == [1, 2, 3]


def test_a_damaged_arrow_file_names_the_task_and_its_files(tmp_path: Path) -> None:
    folder = save(tmp_path, datasets.Dataset.from_dict({"text": ["a" * 100] * 50}))
    arrow = next(folder.glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:200])
    with pytest.raises(TaskDataError) as raised:
        split_rows("made", None, "validation", data_root=tmp_path, task="made")
    message = str(raised.value)
    assert "task 'made'" in message and str(folder) in message and arrow.name in message
    assert "damaged or incomplete" in message


def test_evaluating_native_tasks_imports_no_datasets(data_root: Path) -> None:
    """A fresh process renders documents of plain, few-shot and MMLU tasks without importing `datasets`
    (nor pandas, which it brings): what every evaluating process, each sidecar rank included, is spared."""
    code = (
        "import sys\n"
        "from inloop_eval.tasks.loading import load_docs\n"
        "from inloop_eval.tasks.registry import get_task\n"
        "for name in ('piqa', 'hellaswag', 'arc_challenge_rc_5shot', 'mmlu_abstract_algebra_mc_5shot'):\n"
        f"    assert load_docs(get_task(name), {str(data_root)!r}, limit=7, spread=True), name\n"
        "loaded = sorted(m for m in ('datasets', 'pandas') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
