"""Tiny seeded Hugging Face causal LMs for the packing tests and the conformance suite."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from packing_reference import MAX_LENGTH


def tiny_hf_model(model_type: str, vocab_size: int = 50304, **overrides: Any) -> Any:
    """A seeded causal LM of `model_type` (hidden size 32, two layers, 4 query heads on 2 key/value heads but
    for gpt_neox), run with sdpa, in eval mode; `overrides` go to its config."""
    torch.manual_seed(0)
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_LENGTH,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,  # attention sharp enough that a wrong mask or key moves the numbers
    )
    if model_type != "gpt_neox":
        kwargs.update(num_key_value_heads=2, head_dim=8)
    kwargs.update(overrides)
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
