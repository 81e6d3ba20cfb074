"""Leaving training as it was (docs/design.md, invariant 4): after an evaluation every module's mode, every
parameter's `requires_grad` and `.grad`, the RNG streams and the autocast settings are as before.

Evaluation runs under `torch.no_grad()`, not `torch.inference_mode()`: tensors a model creates lazily during
eval and keeps (FSDP2's unsharded parameter buffers, rotary-embedding caches) would otherwise be inference
tensors, and the next training step fails on them ("Inplace update to inference tensor outside
InferenceMode"). Parameters are never written by the evaluator; the tests check them bit for bit.

One model cannot be evaluated under `no_grad` before it has trained: torch's DDP (`replicate`, OLMo-core's
`DataParallelType.ddp`) over tensor-parallel DTensor parameters swaps each parameter for a DTensor built from it
on its first forward, for good; built under `no_grad` that DTensor is detached and the model never learns
again (its next training step fails: the loss has no gradient). `check_no_grad_forward` refuses it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from inloop_eval.engine.adapter import refuse_model

_AUTOCAST_DEVICES = ("cpu", "cuda")


@dataclass
class _RNGStates:
    python: Any
    numpy: Any
    torch: torch.Tensor
    cuda: list[torch.Tensor] | None

    @classmethod
    def capture(cls) -> _RNGStates:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)

    def restore(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


@dataclass
class _AutocastState:
    enabled: dict[str, bool]
    dtype: dict[str, torch.dtype]
    cache_enabled: bool

    @classmethod
    def capture(cls) -> _AutocastState:
        return cls(
            {d: torch.is_autocast_enabled(d) for d in _AUTOCAST_DEVICES},
            {d: torch.get_autocast_dtype(d) for d in _AUTOCAST_DEVICES},
            torch.is_autocast_cache_enabled(),
        )

    def restore(self) -> None:
        for d in _AUTOCAST_DEVICES:
            torch.set_autocast_enabled(d, self.enabled[d])
            torch.set_autocast_dtype(d, self.dtype[d])
        torch.set_autocast_cache_enabled(self.cache_enabled)


def check_no_grad_forward(model: Any) -> None:
    """Refused (`refuse_model`) when a forward under `no_grad` would detach `model`'s parameters for good:
    torch's DDP (`replicate`) over tensor-parallel DTensor parameters that no training forward has swapped
    yet."""
    hooks = model._forward_pre_hooks.values() if isinstance(model, nn.Module) else ()
    if not any(getattr(h, "__name__", "") == "_reconstruct_dtensor" for h in hooks):
        return
    if any(isinstance(p, DTensor) or hasattr(p, "_st_info") for p in model.parameters()):
        refuse_model(
            "a model wrapped by torch's DDP (replicate) over tensor-parallel "
            "DTensor parameters",
            "it has not run a training forward yet, and its first forward under torch.no_grad would replace "
            "its parameters by detached copies, so training would stop learning",
            "evaluate after the first training step (eval_on_startup=False), or shard the data parallel "
            "dimension with FSDP (DataParallelType.fsdp) under tensor parallelism",
        )


@contextmanager
def training_untouched(model: Any) -> Iterator[None]:
    """Run the body in eval mode under `torch.no_grad()`, then restore every module's `training` flag,
    every parameter's `requires_grad` and `.grad` (the same tensor objects), the Python, NumPy, torch and
    CUDA RNG states, and the autocast settings, whether the body returns or raises. A model that a
    `no_grad` forward would change for good is refused first (`check_no_grad_forward`)."""
    check_no_grad_forward(model)
    modules = list(model.modules()) if isinstance(model, nn.Module) else []
    params = list(model.parameters()) if isinstance(model, nn.Module) else []
    modes = [m.training for m in modules]
    requires_grad = [p.requires_grad for p in params]
    grads = [p.grad for p in params]
    rng = _RNGStates.capture()
    autocast = _AutocastState.capture()
    try:
        if isinstance(model, nn.Module):
            model.eval()
        with torch.no_grad():
            yield
    finally:
        for module, mode in zip(modules, modes, strict=True):
            module.training = mode
        for p, flag, grad in zip(params, requires_grad, grads, strict=True):
            if p.requires_grad != flag:
                p.requires_grad_(flag)
            if p.grad is not grad:
                p.grad = grad
        rng.restore()
        autocast.restore()
