"""Outcome files for the fault tests: a good step file's arrays, and every way the probes damaged one (cut,
emptied, bytes flipped, parts missing or of the wrong shape, meta JSON nested or mistyped), each with the
words the reader's one-line error must hold."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from inloop_eval.loggers.outcomes import outcome_arrays
from inloop_eval.metrics.icl import DocumentOutcomes


def task_outcomes(seed: int, n: int = 30, first_id: int = 0) -> DocumentOutcomes:
    """A task of `n` documents (ids from `first_id`, 2 choices) with a 0/1 `acc` and a continuous `ce_gold`."""
    rng = np.random.default_rng(seed)
    return DocumentOutcomes(
        doc_id=np.arange(first_id, first_id + n, dtype=np.int64),
        n_choices=np.full(n, 2, dtype=np.int64),
        values={"acc": (rng.random(n) < 0.5).astype(np.float64), "ce_gold": rng.random(n)},
        binary=frozenset({"acc"}),
        left_out={"f1": "whole"},
    )


def good_arrays(step: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """The arrays of a good step file holding one task, `piqa`."""
    return outcome_arrays({"piqa": task_outcomes(seed)}, step)


def save(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """`arrays` saved as an npz at `path` (no suffix added), the directory made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def with_meta(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    """A damage: the good file with its meta replaced by `edit(meta)` (JSON)."""

    def damage(path: Path) -> None:
        arrays = good_arrays()
        meta = json.loads(str(arrays["meta"]))
        arrays["meta"] = np.array(json.dumps(edit(meta)))
        save(path, arrays)

    return damage


def with_arrays(edit: Callable[[dict[str, np.ndarray]], None]) -> Callable[[Path], None]:
    """A damage: the good file with its arrays changed in place by `edit`."""

    def damage(path: Path) -> None:
        arrays = good_arrays()
        edit(arrays)
        save(path, arrays)

    return damage


def with_bytes(edit: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    """A damage: the good file's bytes changed by `edit`."""

    def damage(path: Path) -> None:
        save(path, good_arrays())
        path.write_bytes(edit(path.read_bytes()))

    return damage


def flip_data_byte(data: bytes) -> bytes:
    """One byte flipped inside the compressed data of the `t0.ce_gold` member (the zip structure intact)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = archive.getinfo("t0.ce_gold.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    at = start + info.compress_size // 2
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def lying_header(path: Path) -> None:
    """A damage: the `t0.ce_gold` member's `.npy` header claims 10^9 values (8 GB) over 30 values' bytes."""
    save(path, good_arrays())
    data = path.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            member = source.read(info)
            if info.filename == "t0.ce_gold.npy":
                header = io.BytesIO()
                np.lib.format.write_array_header_1_0(
                    header, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)}
                )
                member = header.getvalue() + member[-30 * 8 :]
            target.writestr(info.filename, member)


def npy_file(path: Path) -> None:
    """A damage: a plain `.npy` saved under a step file's name."""
    with path.open("wb") as f:
        np.save(f, np.arange(10))


def nested_meta(depth: int) -> np.ndarray:
    """A meta whose `tasks` is a list nested `depth` deep (written as text: json.dumps itself would recurse)."""
    return np.array('{"format": "inloop_eval.outcomes", "version": 2, "step": 10, "tasks": ' + "[" * depth + "]" * depth + "}")


def drop(*names: str) -> Callable[[dict[str, np.ndarray]], None]:
    def edit(arrays: dict[str, np.ndarray]) -> None:
        for name in names:
            del arrays[name]

    return edit


def put(name: str, value: np.ndarray) -> Callable[[dict[str, np.ndarray]], None]:
    def edit(arrays: dict[str, np.ndarray]) -> None:
        arrays[name] = value

    return edit


def doubled_label(meta: dict) -> dict:
    return {**meta, "tasks": [meta["tasks"][0], meta["tasks"][0]]}


def task_without(key: str) -> Callable[[dict], dict]:
    def edit(meta: dict) -> dict:
        task = {k: v for k, v in meta["tasks"][0].items() if k != key}
        return {**meta, "tasks": [task]}

    return edit


def without(key: str) -> Callable[[dict], dict]:
    return lambda meta: {k: v for k, v in meta.items() if k != key}


# name -> (how the file is damaged, words the error must hold)
DAMAGED: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (with_bytes(lambda b: b[: len(b) // 2]), "not a readable .npz archive"),
    "zero bytes": (with_bytes(lambda b: b""), "not a readable .npz archive"),
    "flipped bytes": (with_bytes(flip_data_byte), "member 't0.ce_gold': "),
    "an .npy file": (npy_file, "not a readable .npz archive"),
    "no meta": (with_arrays(drop("meta")), "has no 'meta' member"),
    "meta not JSON": (with_arrays(put("meta", np.array("{not json"))), "its meta is not JSON"),
    "meta nested deeply": (with_arrays(put("meta", nested_meta(100_000))), "nested too deeply"),
    "meta a number array": (with_arrays(put("meta", np.arange(3))), "expected a 0-d string array"),
    "no tasks": (with_meta(without("tasks")), "its `tasks`: expected a list of tasks, found null"),
    "tasks not a list": (with_meta(lambda m: {**m, "tasks": {"piqa": 1}}), "expected a list of tasks"),
    "no step": (with_meta(without("step")), "its step None is not a training step"),
    "step a string": (with_meta(lambda m: {**m, "step": "10"}), "its step '10' is not a training step"),
    "no label": (with_meta(task_without("label")), "tasks[0]: its label None is not a task label"),
    "no figures": (with_meta(task_without("figures")), "task 'piqa': `figures`: expected a list"),
    "task a string": (with_meta(lambda m: {**m, "tasks": ["piqa"]}), "tasks[0]: expected a mapping"),
    "version 0": (with_meta(lambda m: {**m, "version": 0}), "format version 0 is none this format has"),
    "version true": (with_meta(lambda m: {**m, "version": True}), "format version True is none"),
    "version 2.0": (with_meta(lambda m: {**m, "version": 2.0}), "format version 2.0 is none"),
    "doubled labels": (with_meta(doubled_label), "task labels held twice: ['piqa']"),
    "binary not a subset": (
        with_meta(lambda m: {**m, "tasks": [{**m["tasks"][0], "binary": ["nosuch"]}]}),
        "`binary`: expected a list of its figures",
    ),
    "an array missing": (with_arrays(drop("t0.acc")), "member 't0.acc' is missing"),
    "doc ids missing": (with_arrays(drop("t0.doc_id")), "member 't0.doc_id' is missing"),
    "a 2-D array": (
        with_arrays(put("t0.ce_gold", np.zeros((30, 2)))),
        "member 't0.ce_gold': expected 30 numbers (one per document), found shape (30, 2) of float64",
    ),
    "a short array": (
        with_arrays(put("t0.acc", np.zeros(29, dtype=np.uint8))),
        "member 't0.acc': expected 30 numbers (one per document), found shape (29,) of uint8",
    ),
    "2-D doc ids": (with_arrays(put("t0.doc_id", np.zeros((30, 1), np.int64))), "expected a 1-D array"),
    "float doc ids": (with_arrays(put("t0.doc_id", np.arange(30.0))), "expected a 1-D array of document ids"),
    "string figure": (with_arrays(put("t0.ce_gold", np.array(["x"] * 30))), "expected 30 numbers"),
    "a 0/1 figure holding 7.5": (
        with_arrays(put("t0.acc", np.r_[np.zeros(29), 7.5])),
        "figure 'acc' is a 0/1 figure but holds 7.5 (document 29",
    ),
    "a pickled member": (
        with_arrays(put("t0.ce_gold", np.array([{"x": 1}] * 30, dtype=object))),
        "member 't0.ce_gold': holds Python objects (object); this format holds numbers and strings only",
    ),
    "a header claiming 8 GB": (
        lying_header,
        "member 't0.ce_gold': its header says shape (1000000000,) of float64 (8000000000 bytes) but the "
        "archive holds 240 bytes",
    ),
    "doubled document ids": (
        with_arrays(put("t0.doc_id", np.r_[np.arange(29), 5].astype(np.int64))),
        "document id 5 is held more than once",
    ),
}
