"""Which adapter scores a model: the registered layouts, tried in order, the first whose `matches` accepts the
model builds its adapter (`make_adapter`).

Built in, in the order tried: OLMo-core Transformers, Hugging Face causal LMs, models that show their hidden
states (the reference GPT), and any callable returning logits. `register_layout` puts a layout of the
caller's own ahead of them (one registration per layout; docs/design.md, "Adding a model layout"). An
adapter passed to the evaluator is used as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule

from inloop_eval.engine.adapters import (
    HFCausalLMAdapter,
    HiddenStatesAdapter,
    LogitsAdapter,
    check_max_length,
)
from inloop_eval.engine.layout import ModelAdapter
from inloop_eval.engine.olmo_core_adapter import OLMoCoreAdapter
from inloop_eval.errors import ConfigError


@dataclass(frozen=True)
class LayoutEntry:
    """One registered layout.

    name: how messages name it.
    matches: whether a model (unwrapped from DDP and torch.compile) is of this layout.
    build: its adapter, given the model and the configured `max_length` (None: the model's own).
    through_call: the adapter calls the model through `__call__`; False for adapters that reach past it
        (hidden states and a head), which an FSDP2 module is then called through `LogitsAdapter` instead.
    """

    name: str
    matches: Callable[[Any], bool]
    build: Callable[[Any, int | None], ModelAdapter]
    through_call: bool = True


def _olmo_core(model: Any, max_length: int | None) -> ModelAdapter:
    if max_length is None:
        raise ConfigError(
            f"evaluator: the OLMo-core model {type(model).__name__} does not record the context length "
            "it was trained at; set `max_length:` in the evaluator config to the train module's "
            "max_sequence_length (the OLMo-core callback, inloop_eval.integrations.olmo_core, reads it)"
        )
    return OLMoCoreAdapter(model, max_length)


def _is_olmo_core_transformer(model: Any) -> bool:
    # Looked up, not imported: a model can be an OLMo-core Transformer only if olmo_core is loaded, and
    # importing it (seconds) for every other model would be waste.
    module = sys.modules.get("olmo_core.nn.transformer.model")
    return module is not None and isinstance(model, module.Transformer)


def _is_hf_causal_lm(model: Any) -> bool:
    module = sys.modules.get("transformers")  # looked up, not imported, for the same reason
    return (
        module is not None
        and isinstance(model, module.PreTrainedModel)
        and hasattr(model, "get_output_embeddings")
    )


def _shows_hidden_states(model: Any) -> bool:
    config = getattr(model, "config", None)
    return (
        callable(getattr(model, "hidden_states", None))
        and isinstance(getattr(model, "lm_head", None), nn.Module)
        and isinstance(getattr(config, "max_seq_len", None), int)
        and isinstance(getattr(config, "vocab_size", None), int)
    )


_BUILT_IN = (
    LayoutEntry("OLMo-core Transformer", _is_olmo_core_transformer, _olmo_core),
    LayoutEntry("Hugging Face causal LM", _is_hf_causal_lm, lambda m, _: HFCausalLMAdapter(m), through_call=False),
    LayoutEntry("hidden states and head", _shows_hidden_states, lambda m, _: HiddenStatesAdapter(m), through_call=False),
    LayoutEntry("logits", callable, LogitsAdapter),
)
_registered: list[LayoutEntry] = []


def register_layout(entry: LayoutEntry) -> None:
    """Try `entry` before every built-in layout and every layout registered before it; an entry of the same
    name is replaced."""
    _registered[:] = [e for e in _registered if e.name != entry.name]
    _registered.insert(0, entry)


def unregister_layout(name: str) -> None:
    """Remove the registered layout `name` (a no-op when there is none)."""
    _registered[:] = [e for e in _registered if e.name != name]


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
    of the first layout matching the model. An FSDP2
    module of a layout that reaches past `__call__` is called through it (`LogitsAdapter`), keeping what the
    layout's adapter knows (context length, vocabulary): FSDP2's hooks unshard the parameters and lazily
    initialise the root, which reaching past `forward` would skip."""
    if isinstance(model, ModelAdapter):
        if max_length is not None:  # an adapter knows its model's context; a longer one is refused
            check_max_length(max_length, model.max_length, type(model).__name__)
        return model
    model = unwrap(model)
    entry = next((e for e in (*_registered, *_BUILT_IN) if e.matches(model)), None)
    if entry is None:
        raise TypeError(
            f"make_adapter: expected a module or callable returning logits, found {type(model).__name__}"
        )
    adapter = entry.build(model, max_length)
    if max_length is not None:
        check_max_length(max_length, adapter.max_length, type(model).__name__)
        adapter.max_length = max_length
    if not entry.through_call and isinstance(model, FSDPModule):
        through_hooks = LogitsAdapter(model, adapter.max_length)
        through_hooks.vocab_size = adapter.vocab_size
        return through_hooks
    return adapter
