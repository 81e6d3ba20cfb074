"""Building the model a checkpoint's weights are loaded into from `model_builder`, `module:function`: a callable
taking no argument that returns the `nn.Module` itself or a config with `build()`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from inloop_eval.errors import ConfigError
from inloop_eval.frameworks import resolve


def resolve_builder(spec: str) -> Any:
    """The callable `module:function` names; ConfigError when it cannot be imported."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"watch: model_builder {spec!r} is not `module:function`, e.g. my_models:build_model")
    try:
        target = resolve(spec)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"watch: model_builder {spec!r} cannot be imported ({exc}); check the name") from exc
    if not callable(target):
        raise ConfigError(f"watch: model_builder {spec!r} is {type(target).__name__}, not a callable")
    return target


def build_model(made: Any, spec: str) -> nn.Module:
    """The module a `model_builder` result stands for (the module itself, or a config's `build()`), its buffers
    initialised on the CPU (`init_weights`, where the model keeps buffers no checkpoint holds)."""
    if not isinstance(made, nn.Module) and callable(getattr(made, "build", None)):
        made = made.build()
    if not isinstance(made, nn.Module):
        raise ConfigError(
            f"watch: model_builder {spec!r} returned {type(made).__name__}; expected an nn.Module or a config "
            "with build()"
        )
    init = getattr(made, "init_weights", None)
    if callable(init):
        with torch.no_grad():
            try:
                init(buffer_device=None)
            except TypeError:
                init()
    return made
