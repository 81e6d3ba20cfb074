"""Leaving training as it was: modes, gradients and random number streams are restored after eval."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn


@contextmanager
def training_untouched(model: Any) -> Iterator[None]:
    """Run the body in eval mode under `torch.inference_mode()`, then restore every module's `training`
    flag and the Python, NumPy, torch (and CUDA) RNG states."""
    modules = list(model.modules()) if isinstance(model, nn.Module) else []
    modes = [m.training for m in modules]
    py_state = random.getstate()
    np_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        if isinstance(model, nn.Module):
            model.eval()
        with torch.inference_mode():
            yield
    finally:
        for module, mode in zip(modules, modes, strict=True):
            module.training = mode
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
