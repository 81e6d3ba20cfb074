"""Instance-level `forward` overrides for the length of one forward: how each framework's attention and RoPE
modules are routed through the engine's attention during an evaluation, and only then.

`overridden_forwards(model, overrides)`: during the body each module's `forward` is its override (an instance
attribute, so `__call__` and every hook, FSDP2's included, still run), and the modules of `model` compiled
with `Module.compile` run uncompiled (no compiled graph traces an override, and training never recompiles);
on exit every instance attribute is as it was, whether the body returns, raises or is interrupted.
Parameters, buffers, hooks and classes are never touched. `own_class(module)`: the class a module was
written as, under the wrapper classes torch swaps in, for the routing modules' checks of what they verified.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch import nn

_MISSING = object()


def own_class(module: nn.Module) -> type:
    """The module's class under the wrapper classes torch swaps in (FSDP2's `FSDP<name>`, `replicate`'s): the
    first class of its MRO defined outside torch."""
    return next(c for c in type(module).__mro__ if not c.__module__.startswith("torch."))


@contextmanager
def overridden_forwards(
    model: nn.Module, overrides: Mapping[nn.Module, Callable[..., Any]]
) -> Iterator[None]:
    """During the body, each module of `overrides` forwards through its override and the compiled modules of
    `model` run uncompiled; on exit all is as it was (see the module docstring)."""
    compiled = [m for m in model.modules() if m._compiled_call_impl is not None]
    saved_forward = [(m, m.__dict__.get("forward", _MISSING)) for m in overrides]
    saved_compiled = [(m, m._compiled_call_impl) for m in compiled]
    try:
        for module, forward in overrides.items():
            module.forward = forward
        for module in compiled:
            module._compiled_call_impl = None
        yield
    finally:
        for module, impl in saved_compiled:
            module._compiled_call_impl = impl
        for module, forward in saved_forward:
            if forward is _MISSING:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = forward
