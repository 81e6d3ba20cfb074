"""Which adapter scores a model: the model families, tried in order; the first whose `matches` accepts the model
builds its adapter (`make_adapter`).

Tried in order: the families a user registered (`register_model_family`, the latest first), each registered
framework's (its plugin's model class and adapter builder, `inloop_eval.frameworks`; the adapter lives in
its integration package), models that show their hidden states (the reference GPT), and any callable
returning logits. A framework's model class is looked up in `sys.modules`, never imported, and its adapter
builder imported when it first builds one (for a model of that class, so its framework is loaded already):
the engine imports no framework, and a model of no framework imports nothing of one (docs/design.md,
"Adding a framework"). An adapter passed to the evaluator is used as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule

from inloop_eval.engine.adapter import ModelAdapter, check_max_length
from inloop_eval.engine.adapters.hidden_states import HiddenStatesAdapter
from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.frameworks import Framework, frameworks

Builder = Callable[[Any, "int | None"], ModelAdapter]


@dataclass(frozen=True)
class ModelFamily:
    """One family of models and how to build its adapter.

    name: how messages name it.
    matches: whether a model (unwrapped from DDP and torch.compile) is of this family.
    build: its adapter, given the model and the configured `max_length` (None: the model's own).
    through_call: the adapter calls the model through `__call__`; False for adapters that reach past it
        (hidden states and a head), which an FSDP2 module is then called through `LogitsAdapter` instead.
    """

    name: str
    matches: Callable[[Any], bool]
    build: Builder
    through_call: bool = True


def _shows_hidden_states(model: Any) -> bool:
    config = getattr(model, "config", None)
    return (
        callable(getattr(model, "hidden_states", None))
        and isinstance(getattr(model, "lm_head", None), nn.Module)
        and isinstance(getattr(config, "max_seq_len", None), int)
        and isinstance(getattr(config, "vocab_size", None), int)
    )


# Framework-neutral, tried after every framework's.
NEUTRAL = (
    ModelFamily("hidden states and head", _shows_hidden_states, lambda m, _: HiddenStatesAdapter(m), through_call=False),
    ModelFamily("logits", callable, LogitsAdapter),
)
_registered: list[ModelFamily] = []


def register_model_family(family: ModelFamily) -> None:
    """Try `family` before every built-in family and every family registered before it; a family of the same
    name is replaced."""
    _registered[:] = [f for f in _registered if f.name != family.name]
    _registered.insert(0, family)


def unregister_model_family(name: str) -> None:
    """Remove the registered family `name` (a no-op when there is none)."""
    _registered[:] = [f for f in _registered if f.name != name]


def framework_family(plugin: Framework) -> ModelFamily:
    """The family of a framework's models: its model class and adapter builder."""
    return ModelFamily(plugin.title, plugin.matches, plugin.build_adapter, plugin.through_call)


def families() -> tuple[ModelFamily, ...]:
    """Every family in the order tried (see the module docstring)."""
    plugins = tuple(framework_family(p) for p in frameworks() if p.adapter is not None)
    return (*_registered, *plugins, *NEUTRAL)


def unwrap(model: Any) -> Any:
    """The module to evaluate: DDP's `.module`, torch.compile's original module."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model, nn.Module):
            model = model._orig_mod
        else:
            return model


def make_adapter(model: Any, max_length: int | None = None) -> ModelAdapter:
    """The adapter for `model`: an adapter as is (refused when `max_length` is longer than its own); else that
    of the first family matching the model. An FSDP2 module of a family whose adapter reaches past
    `__call__` is called through it (`LogitsAdapter`), keeping what the family's adapter knows (context length, vocabulary): FSDP2's hooks unshard the parameters and lazily
    initialise the root, which reaching past `forward` would skip."""
    if isinstance(model, ModelAdapter):
        if max_length is not None:  # an adapter knows its model's context; a longer one is refused
            check_max_length(max_length, model.max_length, type(model).__name__)
        return model
    model = unwrap(model)
    family = next((f for f in families() if f.matches(model)), None)
    if family is None:
        raise TypeError(
            f"make_adapter: expected a module or callable returning logits, found {type(model).__name__}"
        )
    adapter = family.build(model, max_length)
    if max_length is not None:
        check_max_length(max_length, adapter.max_length, type(model).__name__)
        adapter.max_length = max_length
    if not family.through_call and isinstance(model, FSDPModule):
        through_hooks = LogitsAdapter(model, adapter.max_length)
        through_hooks.vocab_size = adapter.vocab_size
        return through_hooks
    return adapter
