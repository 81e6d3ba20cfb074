"""Test helpers shared by several test modules."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.requests.table import PairSet

REPO = Path(__file__).resolve().parents[2]
# Figures that count documents: equal exactly across layouts and world sizes.
# Figures compared exactly between layouts and world sizes: accuracies, counts, failures.
EXACT = ("/acc", "/acc_norm", "/acc_bytes", "/acc_per_token", "/acc_pmi", "/n_docs", "/n_skipped_docs", "/failed")


def assert_same_metrics(found: dict[str, float], expected: dict[str, float], where: str, rel: float) -> None:
    """Accuracies and counts exactly; every other figure within `rel`."""
    assert sorted(found) == sorted(expected), where
    for key, value in expected.items():
        if key.endswith(EXACT):
            assert found[key] == value, f"{where}: {key} {found[key]} != {value}"
        else:
            assert math.isclose(found[key], value, rel_tol=rel, abs_tol=rel), f"{where}: {key}"


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_draws() -> tuple[float, float, torch.Tensor]:
    """One number from each global generator: equal after equal seeding only if nothing drew in between."""
    return random.random(), np.random.rand(), torch.rand(1)


def tiny_neox(*, layers: int = 2, max_positions: int = 512, seed: int = 0) -> Any:
    """A random GPT-NeoX-shaped Hugging Face causal LM (hidden 32, 2 heads) over the NeoX vocabulary."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPTNeoXConfig(
        vocab_size=50304,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
    )
    return transformers.GPTNeoXForCausalLM(config)


def run_benchmark(name: str, *args: str, output: Path, timeout: int = 900) -> tuple[dict, str]:
    """`python -m benchmarks.<name> <args> --output <output>` run from the repository root, as a user runs
    it: the JSON report it wrote and what it printed. A failing run fails with its output shown."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *args, "--output", str(output)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(output.read_text()), proc.stdout


def small_evaluator(data_root: Path, tokenizer: Any, tasks: tuple[str, ...] = ("piqa",)) -> InLoopEvaluator:
    """The evaluator of the trainer-hook tests: the first 4 documents of each task, every 2 steps."""
    entries = [{"task": t, "limit": 4, "batch_tokens": 1024} for t in tasks]
    return InLoopEvaluator(EvaluatorConfig(evaluators=entries, eval_interval=2, data_root=str(data_root)), tokenizer=tokenizer)


def two_documents() -> PairSet:
    """Document A: context [11 12 13], continuations [21 22], [31 32 33], [41]; document B: context
    [51 52], continuations [61 62 63], [71 72]."""
    return PairSet(
        ctx_tokens=np.array([11, 12, 13, 51, 52]),
        ctx_offsets=np.array([0, 3, 5]),
        ctx_id=np.array([0, 0, 0, 1, 1]),
        ctx_start=np.zeros(5, dtype=np.int64),
        ctx_end=np.array([3, 3, 3, 2, 2]),
        cont_tokens=np.array([21, 22, 31, 32, 33, 41, 61, 62, 63, 71, 72]),
        cont_offsets=np.array([0, 2, 5, 6, 9, 11]),
    )
