"""The adapter of Hugging Face causal LMs (`AutoModelForCausalLM`): hidden states and head where its logits are
exactly the head's, packed rows and kept prefixes (its cache) for the verified model types, whose every
forward runs the engine's attention (`attention.routed_attention`) whatever implementation they train with.
Legend: B batch, T time, U positions read, S kept prefix, H heads, Dh head width.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, ModelAdapter, ModelOutputs
from inloop_eval.engine.outputs.full_logits import FullLogits
from inloop_eval.engine.outputs.projected_head import Head, ProjectedHead
from inloop_eval.integrations.hf.attention import TREE_KEYWORD, routed_attention

# Hugging Face model types whose logits are exactly lm_head(final hidden state): no soft-capping or
# scaling after the projection, so projecting only the selected positions gives the same numbers.
_HF_PLAIN_HEAD_TYPES = frozenset(
    {"llama", "gpt_neox", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "olmo3", "gpt2", "phi3", "gemma"}
)
# Types whose logits are `cap * tanh(lm_head(h) / cap)` with cap = `config.final_logit_softcapping` (or
# plain when it is unset): the same ops, in the same dtype, on the selected positions only.
_HF_SOFTCAP_HEAD_TYPES = frozenset({"gemma2", "gemma3_text"})

# Hugging Face model types checked (tests/engine/test_scoring_paths.py, tests/integrations/test_hf_packing.py,
# transformers 5.24) to take position ids and, with their attention routed through the engine's
# (`attention.routed_attention`), give for each packed continuation the numbers of its own unshared row;
# those with a sliding window (mistral; qwen2/3 with `use_sliding_window`, on the layers `layer_types` names
# sliding) pass it to each attention call, which applies it on positions (`attention.engine_window`).
HF_PACKING_TYPES = frozenset(
    {"llama", "gpt_neox", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "gpt2", "phi3", "gemma"}
)
# Packing types checked (same tests) to keep a prefix's keys and values from a forward with `use_cache=True`
# and give, for each row read after it through a fresh cache of them (its attention seeing K = S + T keys),
# the numbers of its own unshared row.
HF_PREFIX_REUSE_TYPES = HF_PACKING_TYPES


def build_adapter(model: Any, max_length: int | None) -> ModelAdapter:
    """The adapter of a Hugging Face causal LM (its context length is its config's; `max_length` is checked
    against it by the caller)."""
    return HFCausalLMAdapter(model)


class HFCausalLMAdapter(ModelAdapter):
    """A Hugging Face causal LM (`AutoModelForCausalLM`). A kept prefix is forwarded with `use_cache=True` into
    a cache of full layers (`full_cache`) and its layers' keys and values kept; each batch after it reads them
    through a fresh one (`prefix_cache`)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        config = model.config
        self.max_length = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        model_type = getattr(config, "model_type", "")
        cap = getattr(config, "final_logit_softcapping", None)
        self.softcap: float | None = cap if model_type in _HF_SOFTCAP_HEAD_TYPES else None
        self.plain_head = (
            model_type in _HF_PLAIN_HEAD_TYPES and not cap
        ) or model_type in _HF_SOFTCAP_HEAD_TYPES
        self.packing = hf_supports_packing(config)
        self.prefix_reuse = self.packing and hf_keeps_prefixes(model)
        self.vocab_size = model.get_input_embeddings().num_embeddings

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(packing=self.packing, prefix_reuse=self.prefix_reuse)

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        """One forward of the batch; for a model that packs, every forward (packed or not) attends through
        the engine's attention under the batch's tree mask (plain causal rows: a causal one)."""
        kwargs: dict[str, Any] = {"use_cache": inputs.keeps_prefix}
        if self.packing:
            kwargs[TREE_KEYWORD] = inputs.tree_or_causal()
        if inputs.position_ids_BT is not None:
            kwargs["position_ids"] = inputs.position_ids_BT
        if inputs.keeps_prefix:
            kwargs["cache"] = full_cache()
        elif inputs.prefix is not None:
            kwargs["cache"] = prefix_cache(inputs.prefix.states, len(inputs.input_ids_BT))
        if inputs.keeps_prefix and not self.plain_head:
            kwargs["logits_to_keep"] = 1  # a kept prefix has no targets: its logits are never read
        model = self.model.base_model if self.plain_head else self.model
        if self.packing:
            with routed_attention(self.model):
                out = model(input_ids=inputs.input_ids_BT, **kwargs)
        else:
            out = model(input_ids=inputs.input_ids_BT, **kwargs)
        if inputs.keeps_prefix and inputs.prefix is not None:
            inputs.prefix.states = [(layer.keys, layer.values) for layer in out.cache.layers]
        rows_U, cols_U = inputs.rows_U, inputs.cols_U
        if self.plain_head:
            head = self.model.get_output_embeddings()
            if self.softcap:
                head = SoftCappedHead(head, self.softcap)
            return ProjectedHead(out.last_hidden_state[rows_U, cols_U], head)
        return FullLogits(out.logits[rows_U, cols_U])


class SoftCappedHead:
    """`cap * tanh(head(x) / cap)`, in the order and dtype Gemma 2 and 3 apply it to their logits."""

    def __init__(self, head: Head, cap: float) -> None:
        self.head = head
        self.cap = cap

    def __call__(self, x: Tensor) -> Tensor:
        return torch.tanh(self.head(x) / self.cap) * self.cap


def hf_supports_packing(config: Any) -> bool:
    """Whether a Hugging Face model of this config may be fed packed rows: a verified model type, with or
    without a sliding window. Its attention implementation does not matter: sdpa, eager, flash_attention_2/3,
    flex_attention, a hub kernel or one unknown here, each is replaced by the engine's attention for the
    length of an evaluation's forward (`attention.routed_attention`)."""
    return getattr(config, "model_type", "") in HF_PACKING_TYPES


def hf_keeps_prefixes(model: Any) -> bool:
    """Whether a Hugging Face model that packs may keep a prefix's keys and values for the batches after it
    (`prefix_cache`): a verified model type, whose forward takes the `cache` of the transformers version
    checked (`cache.layers`, each with `keys` and `values`)."""
    return (
        getattr(model.config, "model_type", "") in HF_PREFIX_REUSE_TYPES
        and "cache" in inspect.signature(model.forward).parameters
    )


def full_cache() -> DynamicCache:
    """An empty `DynamicCache` whose layers, made as the model reaches them, all keep every key and value:
    one built from a config with a sliding window would keep only a sliding layer's last `sliding_window - 1`,
    while the engine's attention reads the whole kept prefix (keys 0..S-1) and applies the window itself."""
    return DynamicCache()


def prefix_cache(kept: list[tuple[Tensor, Tensor]], rows: int) -> DynamicCache:
    """A fresh `full_cache` holding a kept prefix's keys and values (each layer's [1, H, S, Dh]) expanded
    over `rows` rows. A new one per batch: the model appends the batch's own keys and values to it."""
    cache = full_cache()
    for keys, values in kept:
        layer = DynamicLayer()
        # Set, not `update`d: update concatenates onto an empty tensor, a copy of the prefix per row.
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1)
        cache.layers.append(layer)
    return cache
