"""Shared fixtures: the real task data and the real GPT-NeoX tokenizer, fetched once and cached."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# Shared helpers (helpers, reference, workers, ...) live in tests/support, importable by name from every test folder.
sys.path.insert(0, str(Path(__file__).parent / "support"))

from inloop_eval.data.root import default_data_root


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the cores shared out among the workers: torch in each takes its share of threads
    (the processes tests launch take one each already)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


# What a test module that starts processes holds (tests/support/workers/launch.py is the one way to start them).
PROCESS_STARTERS = ("launch", "run_job_in_processes", "subprocess")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that start processes first, each module's tests kept together and in order: they are the
    longest, and under pytest-xdist a long module handed out last leaves the other workers idle at the end."""
    def starts_processes(item: pytest.Item) -> bool:
        module = getattr(item, "module", None)
        return module is not None and any(name in vars(module) for name in PROCESS_STARTERS)

    items.sort(key=lambda item: not starts_processes(item))


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The standard tasks in OLMo's layout: `$INLOOP_EVAL_DATA` if set, else fetched once into the cache."""
    env = os.environ.get("INLOOP_EVAL_DATA")
    if env and Path(env).is_dir():
        return Path(env)
    from inloop_eval.data.fetch import fetch
    from inloop_eval.tasks.splits import standard_splits

    return fetch(default_data_root(), standard_splits())


@pytest.fixture(scope="session")
def neox_tokenizer(data_root: Path):
    """The real GPT-NeoX-20B BPE tokenizer (no BOS; EOS `<|endoftext|>` = 0)."""
    from inloop_eval.data.root import neox_tokenizer_path
    from inloop_eval.data.tokenizer import load_tokenizer

    return load_tokenizer(neox_tokenizer_path(data_root))


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory, data_root: Path) -> Path:
    """A random GPT-NeoX-shaped model saved with its tokenizer, as a user's checkpoint would be."""
    from helpers import tiny_neox

    from inloop_eval.data.root import neox_tokenizer_path

    model = tiny_neox()
    out = tmp_path_factory.mktemp("hf") / "tiny-neox"
    model.save_pretrained(out)
    shutil.copy(neox_tokenizer_path(data_root), out / "tokenizer.json")
    return out
