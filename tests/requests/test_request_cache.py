"""The on-disk request cache: exact round trip, keys that change with everything a table depends on,
damaged files rebuilt rather than trusted, atomic writes, and an evaluator that reads instead of tokenizing.
(Concurrent writers and readers in real processes: tests/test_distributed.py.)"""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import numpy as np
import pytest
import torch

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.requests.cache import (
    FORMAT_VERSION,
    RequestCacheError,
    cache_dir,
    cache_path,
    file_label,
    load_table,
    save_table,
)
from inloop_eval.requests.table import PairSet, build_requests
from inloop_eval.tasks import get_task, load_docs


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("INLOOP_EVAL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def copa(data_root, neox_tokenizer):
    task = get_task("copa")
    docs = load_docs(task, str(data_root), limit=10)
    return task, docs, build_requests(task, docs, neox_tokenizer, 512, with_uncond=True)


def assert_tables_equal(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, PairSet):
            for g in dataclasses.fields(x):
                np.testing.assert_array_equal(getattr(x, g.name), getattr(y, g.name), err_msg=g.name)
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert x == y, f.name


def test_round_trip_is_exact(copa, tmp_path):
    _, _, table = copa
    path = tmp_path / "t.npz"
    save_table(table, path)
    assert_tables_equal(load_table(path), table)
    assert load_table(tmp_path / "missing.npz") is None
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]  # no temporary file left


def test_strings_survive_any_unicode(copa, tmp_path):
    _, _, table = copa
    odd = dataclasses.replace(
        table,
        context_text=["", "é ü 中文 🙂", *table.context_text[2:]],
        continuation_text=table.continuation_text,
    )
    save_table(odd, tmp_path / "u.npz")
    assert load_table(tmp_path / "u.npz").context_text == odd.context_text


def test_key_changes_with_everything_the_table_depends_on(copa, neox_tokenizer):
    task, docs, _ = copa
    kw = {"max_length": 512, "limit": 10, "with_uncond": True}
    base = cache_path(task, docs, neox_tokenizer, **kw)
    assert base is not None and base.parent == cache_dir() and base.name.startswith("copa-")
    assert cache_path(task, docs, neox_tokenizer, **kw) == base
    others = [
        cache_path(task, docs, neox_tokenizer, **{**kw, "max_length": 256}),
        cache_path(task, docs, neox_tokenizer, **{**kw, "limit": None}),
        cache_path(task, docs, neox_tokenizer, **{**kw, "with_uncond": False}),
        cache_path(task, docs[:-1], neox_tokenizer, **kw),
        cache_path(
            task, [dataclasses.replace(docs[0], gold=(1 - docs[0].gold[0],)), *docs[1:]], neox_tokenizer, **kw
        ),
    ]
    other_tokenizer = type(neox_tokenizer)(
        neox_tokenizer.backend, bos_token_id=None, eos_token_id=0, fingerprint="another", name=""
    )
    others.append(cache_path(task, docs, other_tokenizer, **kw))
    assert len({base, *others}) == len(others) + 1


def test_tokenizer_without_fingerprint_is_not_cached(copa):
    task, docs, _ = copa

    class Plain:
        def encode(self, text: str) -> list[int]:
            return [1]

    assert cache_path(task, docs, Plain(), max_length=512, limit=None, with_uncond=False) is None


def test_damaged_or_foreign_files_raise(copa, tmp_path):
    _, _, table = copa
    path = tmp_path / "t.npz"
    save_table(table, path)
    path.write_bytes(path.read_bytes()[:200])  # truncated
    with pytest.raises(
        RequestCacheError, match=r"t\.npz: unreadable .* not used: the evaluator tokenizes the task again"
    ):
        load_table(path)
    save_table(table, path)
    path.rename(tmp_path / "other.npz")  # a file under another key
    with pytest.raises(RequestCacheError, match=f"expected format {FORMAT_VERSION} and key 'another'"):
        load_table((tmp_path / "other.npz").rename(tmp_path / "another.npz"))
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(RequestCacheError, match="not a request table"):
        load_table(tmp_path / "plain.npz")


def test_a_failed_write_leaves_nothing_behind(copa, tmp_path, monkeypatch):
    _, _, table = copa

    def failing_savez(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(OSError, match="disk full"):
        save_table(table, tmp_path / "sub" / "t.npz")
    assert list((tmp_path / "sub").iterdir()) == []


def make_evaluator(data_root, tokenizer, **task) -> InLoopEvaluator:
    config = EvaluatorConfig(
        evaluators=[{"task": "copa", "limit": 10, **task}], data_root=str(data_root), strict=True
    )
    return InLoopEvaluator(config, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(d_model=16, n_layers=1, n_heads=2))


def test_a_restarted_evaluator_reads_the_cache_instead_of_tokenizing(
    data_root, neox_tokenizer, model, monkeypatch
):
    first = make_evaluator(data_root, neox_tokenizer).run(model)
    assert len(list(cache_dir().glob("copa-*.npz"))) == 1

    def no_encoding(text: str) -> list[int]:
        raise AssertionError("tokenized although the request cache holds the table")

    monkeypatch.setattr(neox_tokenizer, "encode", no_encoding)
    assert make_evaluator(data_root, neox_tokenizer).run(model) == first


def test_a_damaged_cache_file_is_rebuilt(data_root, neox_tokenizer, model, caplog):
    first = make_evaluator(data_root, neox_tokenizer).run(model)
    (path,) = cache_dir().glob("copa-*.npz")
    path.write_bytes(b"not a zip file")
    with caplog.at_level(logging.WARNING):
        again = make_evaluator(data_root, neox_tokenizer).run(model)
    assert again == first
    assert "unreadable" in caplog.text and "tokenizes the task again" in caplog.text
    # the rebuild is automatic: the warning must not ask for a deletion
    assert "rewrites the file, nothing to do" in caplog.text and "delete" not in caplog.text
    assert load_table(path) is not None  # rewritten whole


def test_an_unwritable_cache_is_not_fatal(data_root, neox_tokenizer, model, cache_home, caplog):
    cache_home.mkdir(parents=True)
    (cache_home / "requests").write_text("a file where the cache directory should be")
    with caplog.at_level(logging.WARNING):
        out = make_evaluator(data_root, neox_tokenizer).run(model)
    assert out["eval/downstream/copa/n_docs"] == 10
    assert "not written" in caplog.text


# --- file names derived from the task id, always inside the cache ---------------------------------------

GOOD_YAML = """\
task: good
dataset_path: json
dataset_kwargs: {data_files: {test: good.jsonl}}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: answer
"""


@pytest.fixture
def escaping_task_id(tmp_path, monkeypatch) -> str:
    """`harness:../../../../x/good.yaml` from a working directory four levels under tmp_path: a real task
    whose id, taken as a path below `<tmp_path>/home/requests/` (where `harness:..` is one folder), lands
    beside the YAML in tmp_path/x."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "good.yaml").write_text(GOOD_YAML)
    rows = [
        {"question": f"Which is a metal ({i})?", "choices": ["iron", "wood"], "answer": 0} for i in range(4)
    ]
    (tmp_path / "x" / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    workdir = tmp_path / "a" / "b" / "c" / "d"
    workdir.mkdir(parents=True)
    monkeypatch.chdir(workdir)
    return "harness:../../../../x/good.yaml"


def test_cache_file_names_stay_in_the_cache_whatever_the_task_id(escaping_task_id, data_root, neox_tokenizer):
    task = get_task(escaping_task_id)
    docs = load_docs(task, str(data_root))
    path = cache_path(task, docs, neox_tokenizer, max_length=512, limit=None, with_uncond=False)
    assert path.parent == cache_dir()
    assert re.fullmatch(r"harness_x_good_yaml-[0-9a-f]{32}\.npz", path.name), path.name
    assert file_label("oe_eval:arc_easy:rc_5shot") == "oe_eval_arc_easy_rc_5shot"
    assert file_label("../..") == "task" and file_label("a/" * 40).count("/") == 0


def test_an_evaluation_writes_no_file_outside_the_cache(
    escaping_task_id, data_root, neox_tokenizer, model, tmp_path
):
    config = EvaluatorConfig(
        evaluators=[{"task": escaping_task_id, "label": "good"}], data_root=str(data_root)
    )
    out = InLoopEvaluator(config, tokenizer=neox_tokenizer).run(model)
    assert out["eval/downstream/good/n_docs"] == 4
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.npz"))
    assert len(written) == 1 and written[0].parent == cache_dir().relative_to(tmp_path), written
