"""Packed rows for Hugging Face causal LMs, whatever attention implementation they train with.

Transformers' attention modules look their kernel up at each call, by name (`config._attn_implementation`,
in `AttentionInterface`): sdpa, eager, flash_attention_2/3/4, flex_attention, a kernel from the hub, or one
registered by the user. `routed_attention(model)` makes one forward use the engine's own attention instead:
`tree_attention_forward`, registered once under `ATTENTION_NAME`, is set as the implementation of every
config of the model (its sub-configs and those of its sub-models included) for the body only, and each
config's own implementation is put back on exit, whether the body returns or raises (KeyboardInterrupt
included). Training never sees it; parameters, modules and the registry's other entries are never touched.

During that forward the model is called with `tree_mask=` (`TREE_KEYWORD`) the batch's `TreeMask`, which the
model's keyword arguments carry down to each attention call, and no attention mask: transformers' mask
builders have no entry under `ATTENTION_NAME` and build none (`masking_utils` returns a missing mask as
None for implementations it does not know). Each attention call then attends under the tree mask, rendered
dense on the CPU ([B, 1, T, S + T] boolean, for SDPA) or as a FlexAttention BlockMask on CUDA
(`engine/tree_attention.py`), with the module's `scaling` and, where the call carries transformers'
`sliding_window` (each layer passes its own: None on full-attention layers), the window it means
(`engine_window`). After a kept prefix of S tokens the keys and values come from the cache
(`adapter.prefix_cache`, every key of the prefix, sliding layers included) already concatenated before the
rows' own: K = S + T.

What a call is refused with (it was not verified): dropout (the model in training mode), attention logit
soft-capping, attention sinks, or an attention mask the model built itself. Which model types are routed is
`adapter.HF_PACKING_TYPES`.
Legend: B rows, T time, S a kept prefix's length, K keys (S + T), H query heads, G key/value heads, D head
width.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from inloop_eval.engine.tree_attention import NO_WINDOW, TreeMask, tree_attention

# The name the engine's attention is registered under in transformers' `AttentionInterface`.
ATTENTION_NAME = "inloop_eval_tree"
# The keyword the batch's `TreeMask` is passed to the model with, and reaches each attention call by.
TREE_KEYWORD = "tree_mask"
# Keywords of an attention call that change its numbers in ways not verified here.
_REFUSED_KEYWORDS = ("softcap", "s_aux")


def tree_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Transformers' attention function (`AttentionInterface`) for a packed batch: queries [B, H, T, D] over
    keys and values [B, G, K, D] under the batch's `TreeMask` (keyword `tree_mask`); returns the attention
    [B, T, H, D] and no weights."""
    tree = kwargs.get(TREE_KEYWORD)
    name = type(module).__name__
    if not isinstance(tree, TreeMask):
        raise RuntimeError(
            f"tree attention: {name} was called without the batch's TreeMask (keyword {TREE_KEYWORD!r}); this "
            "attention implementation is set only during an evaluation's forward, which passes it"
        )
    if dropout:
        raise RuntimeError(
            f"tree attention: {name} asks for dropout {dropout}; evaluate the model in eval mode"
        )
    refused = [k for k in _REFUSED_KEYWORDS if kwargs.get(k) is not None]
    if refused or attention_mask is not None:
        what = ", ".join(refused) if refused else "an attention mask of its own"
        raise RuntimeError(
            f"tree attention: {name} was called with {what}, which packed rows were not verified with"
        )
    window = engine_window(kwargs.get("sliding_window"))
    out_BHTD = tree_attention(query, key, value, tree, scale=scaling, window=window)
    return out_BHTD.transpose(1, 2).contiguous(), None


def engine_window(sliding_window: int | None) -> tuple[int, int]:
    """The engine's window (keys at most `left` positions back, `(left, 0)`) of transformers' `sliding_window`
    (None: no window). Transformers' query sees `sliding_window` tokens, itself included: its mask keeps
    `key > query - sliding_window` (`masking_utils.sliding_window_overlay`) and its flash-attn path passes
    `window_size=(sliding_window - 1, ...)`; so `left = sliding_window - 1`."""
    return NO_WINDOW if sliding_window is None else (sliding_window - 1, 0)


def model_configs(model: nn.Module) -> list[Any]:
    """Every config whose attention implementation the modules of `model` read: each Hugging Face
    sub-model's config and, at any depth, their sub-configs; each once."""
    found: dict[int, Any] = {}
    pending = [m.config for m in model.modules() if isinstance(m, PreTrainedModel)]
    while pending:
        config = pending.pop()
        if config is None or id(config) in found:
            continue
        found[id(config)] = config
        pending.extend(getattr(config, key, None) for key in getattr(config, "sub_configs", {}))
    return list(found.values())


@contextmanager
def routed_attention(model: nn.Module) -> Iterator[None]:
    """During the body, every attention module of `model` runs `tree_attention_forward`; on exit each
    config's attention implementation is as it was (see the module docstring)."""
    if ALL_ATTENTION_FUNCTIONS.get(ATTENTION_NAME) is not tree_attention_forward:
        AttentionInterface.register(ATTENTION_NAME, tree_attention_forward)
    configs = model_configs(model)
    saved = [(config, config._attn_implementation_internal) for config in configs]
    try:
        for config in configs:
            # The attribute behind the `_attn_implementation` property: its setter would also walk the
            # sub-configs, which are all in `configs` already.
            config._attn_implementation_internal = ATTENTION_NAME
        yield
    finally:
        for config, implementation in saved:
            config._attn_implementation_internal = implementation
