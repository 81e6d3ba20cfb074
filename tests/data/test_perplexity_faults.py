"""Fault tolerance of perplexity domains: a damaged or unwritable token cache is rebuilt with a warning and
gives the same figures, one bad memmap file fails only its own label (naming label and file), and a label that
failed is tried again at the next evaluation. (A domain that fails on one rank only, agreed by every rank on two
real gloo processes: tests/test_distributed.py, whose 2-rank launch runs it.)"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from lm_helpers import lm_entry, tiny_gpt, write_domains

from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.data.perplexity.domain_set import load_memmap_domain
from inloop_eval.data.perplexity.token_bytes import token_byte_lengths
from inloop_eval.errors import LMDataError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator

LABELS = ("code", "prose", "tiny")
FIGURES = ("ce", "ppl", "bpb")


@pytest.fixture(scope="module")
def model():
    return tiny_gpt()


@pytest.fixture(scope="module")
def domain_files(tmp_path_factory, neox_tokenizer):
    return write_domains(tmp_path_factory.mktemp("lm"), neox_tokenizer)


def run_lm(files, tokenizer, cache_dir, model, *, strict: bool = False, **overrides) -> dict[str, float]:
    """One evaluation by a fresh evaluator (as a new process would make)."""
    config = EvaluatorConfig(evaluators=[lm_entry(files, cache_dir, **overrides)], strict=strict)
    return InLoopEvaluator(config, tokenizer=tokenizer).run(model)


@pytest.fixture(scope="module")
def clean(model, domain_files, neox_tokenizer, tmp_path_factory) -> dict[str, float]:
    """The figures with every file and the token cache intact."""
    out = run_lm(domain_files, neox_tokenizer, tmp_path_factory.mktemp("clean-cache"), model, strict=True)
    assert sorted(out) == sorted(f"eval/lm/{label}/{k}" for label in LABELS for k in FIGURES)
    return out


# --- a damaged token cache is rebuilt, not trusted ----------------------------------------------------


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _in_vocabulary_garbage(path: Path) -> None:
    # Same size and dtype, every id a real token: only a checksum can tell.
    ids = np.fromfile(path, dtype=np.uint16)
    np.random.default_rng(0).integers(2, 50000, len(ids)).astype(np.uint16).tofile(path)


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(1).bytes(path.stat().st_size))


def _empty(folder: Path) -> None:
    for f in folder.iterdir():
        f.unlink()


DAMAGE = {
    "meta_missing": lambda d: (d / "meta.json").unlink(),
    "meta_cut": lambda d: _cut(d / "meta.json"),
    "tokens_cut": lambda d: _cut(d / "tokens.bin"),
    "tokens_in_vocabulary_garbage": lambda d: _in_vocabulary_garbage(d / "tokens.bin"),
    "sequences_garbage": lambda d: _garbage(d / "sequences.npy"),
    "emptied": _empty,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_token_cache_is_rebuilt_with_the_same_figures(
    damage, model, domain_files, neox_tokenizer, clean, tmp_path, caplog
):
    cache = tmp_path / "cache"
    assert run_lm(domain_files, neox_tokenizer, cache, model) == clean
    (folder,) = cache.glob("prose-*")
    DAMAGE[damage](folder)
    with caplog.at_level(logging.WARNING, logger="inloop_eval"):
        assert run_lm(domain_files, neox_tokenizer, cache, model) == clean
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("label 'prose'" in m and str(folder) in m and "rebuil" in m for m in warnings), warnings
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="inloop_eval"):
        assert run_lm(domain_files, neox_tokenizer, cache, model) == clean  # rebuilt on disk: read back
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [p.name for p in cache.iterdir()] == [folder.name]  # nothing left beside it


def test_unwritable_cache_location_works_from_memory(
    model, domain_files, neox_tokenizer, clean, tmp_path, caplog
):
    # A cache location that cannot be created (its parent is a file): as a read-only mount would refuse it.
    (tmp_path / "not-a-folder").write_text("")
    cache = tmp_path / "not-a-folder" / "cache"
    with caplog.at_level(logging.WARNING, logger="inloop_eval"):
        assert run_lm(domain_files, neox_tokenizer, cache, model) == clean
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("label 'prose'" in m and str(cache) in m and "memory" in m for m in warnings), warnings


# --- one bad memmap file fails only its own label ------------------------------------------------------


def corrupt_npy(path: Path) -> Path:
    np.save(path, np.arange(200, dtype=np.uint16))
    path.write_bytes(path.read_bytes()[:40])  # the header cut short
    return path


def test_corrupt_npy_header_names_label_and_file(tmp_path, neox_tokenizer):
    path = corrupt_npy(tmp_path / "bad.npy")
    config = LMDomainConfig(label="web", paths=[str(path)])
    with pytest.raises(LMDataError, match=rf"label 'web' file {path}: not a readable .npy file"):
        load_memmap_domain(config, 20, token_byte_lengths(neox_tokenizer), None)


def test_corrupt_npy_fails_only_its_label(model, domain_files, neox_tokenizer, clean, tmp_path, caplog):
    path = corrupt_npy(tmp_path / "bad.npy")
    entry = lm_entry(domain_files, tmp_path / "cache")
    entry["domains"].append({"label": "bad", "paths": [str(path)]})
    with caplog.at_level(logging.ERROR, logger="inloop_eval"):
        out = InLoopEvaluator(EvaluatorConfig(evaluators=[entry]), tokenizer=neox_tokenizer).run(model)
    assert out == {**clean, "eval/lm/bad/failed": 1.0}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"label 'bad' file {path}" in m for m in errors), errors
    strict = EvaluatorConfig(evaluators=[entry], strict=True)
    with pytest.raises(LMDataError, match=rf"label 'bad' file {path}: not a readable .npy file"):
        InLoopEvaluator(strict, tokenizer=neox_tokenizer).run(model)


@pytest.mark.parametrize("fmt", ["memmap", "jsonl"])
def test_an_io_error_fails_only_its_label(fmt, model, domain_files, neox_tokenizer, clean, tmp_path, caplog):
    # Reading /proc/self/mem from its start is a real EIO: a disk or network file system failing mid-read.
    entry = lm_entry(domain_files, tmp_path / "cache")
    entry["domains"].append({"label": "broken", "paths": ["/proc/self/mem"], "format": fmt})
    with caplog.at_level(logging.ERROR, logger="inloop_eval"):
        out = InLoopEvaluator(EvaluatorConfig(evaluators=[entry]), tokenizer=neox_tokenizer).run(model)
    assert out == {**clean, "eval/lm/broken/failed": 1.0}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    expected = "label 'broken' file /proc/self/mem: cannot be read (OSError: Input/output error)"
    assert any(expected in m for m in errors), errors


# --- a label that failed is tried again at the next evaluation ---------------------------------------


@pytest.mark.parametrize("label", ["tiny", "prose"])
def test_a_failed_label_is_retried_and_each_failure_logged(
    label, model, domain_files, neox_tokenizer, clean, tmp_path, caplog
):
    late = tmp_path / domain_files[label].name  # appears after the first evaluations (an NFS hiccup)
    files = {**domain_files, label: late}
    config = EvaluatorConfig(evaluators=[lm_entry(files, tmp_path / "cache")])
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="inloop_eval"):
            out = evaluator.run(model)
        assert out == {
            **{k: v for k, v in clean.items() if not k.startswith(f"eval/lm/{label}/")},
            f"eval/lm/{label}/failed": 1.0,
        }
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(f"label {label!r}: file {late} does not exist" in m for m in errors), errors
    shutil.copy(domain_files[label], late)
    assert evaluator.run(model) == clean
