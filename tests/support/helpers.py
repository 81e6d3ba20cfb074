"""Test helpers shared by several test modules."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """Import `scripts/<name>.py` once (scripts are not a package; registered in sys.modules so that its
    dataclasses resolve their module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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
