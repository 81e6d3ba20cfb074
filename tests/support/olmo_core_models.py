"""Tiny seeded OLMo-core Transformers for the packing tests and the conformance suite: the verified shapes on the
torch backend (`olmo_core_model`), OLMo 3 on flash-attention 2 as its users build it, built on this CPU machine
(`olmo3_flash_model`, `flash_on_cpu`), and its twin on the torch backend (`torch_backend_twin`)."""

from __future__ import annotations

import copy

import torch
from flash_on_cpu import flash_build
from olmo_core.nn.attention import GateConfig, SlidingWindowAttentionConfig
from olmo_core.nn.attention.backend import TorchAttentionBackend
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from packing_reference import MAX_LENGTH

VOCAB = 50304


def olmo_core_model(shape: str, dropout: float | None = None, **overrides) -> torch.nn.Module:
    """A tiny seeded OLMo-core Transformer (d_model 32, 2 layers) of one of the verified shapes:
    `olmo2` (reordered norms, QK norm, 4 query heads on 2 key/value heads), `llama` (pre-norm, multi-head),
    `olmo3_window` (peri-norm, head-wise QK norm, one key/value head, a head-wise gate, and a sliding window
    of 3 tokens on the first layer, which every context here is longer than); `dropout` on each block's
    outputs where given (training only)."""
    common = dict(d_model=32, vocab_size=VOCAB, n_layers=2, hidden_size_multiple_of=16)
    if shape == "olmo2":
        kwargs = dict(n_heads=4, n_kv_heads=2, block_name=TransformerBlockType.reordered_norm, qk_norm=True)
    elif shape == "llama":
        kwargs = dict(n_heads=2)
    elif shape == "olmo3_window":
        window = SlidingWindowAttentionConfig(
            pattern=[3, -1],
            force_full_attention_on_first_layer=False,
            force_full_attention_on_last_layer=False,
        )
        kwargs = dict(
            n_heads=4,
            n_kv_heads=1,
            block_name=TransformerBlockType.peri_norm,
            qk_norm=True,
            use_head_qk_norm=True,
            gate=GateConfig(),
            sliding_window=window,
        )
    else:
        raise ValueError(shape)
    config = TransformerConfig.llama_like(**common, **{**kwargs, **overrides})
    config.block.dropout = dropout
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(
        max_seq_len=MAX_LENGTH, device=torch.device("cpu")
    )  # RoPE tables warmed, as in training
    return model.eval()


def olmo3_flash_model(window: int = 16, dropout: float | None = None) -> torch.nn.Module:
    """OLMo-core's OLMo 3 config as its users build it (`TransformerConfig.olmo3_1M`: flash-attention 2, its
    default backend, a sliding window on three layers of four), here with a `window`-token window that
    every context here is longer than, and `dropout` on each block's outputs where given; built on this CPU
    machine (`flash_on_cpu`)."""
    sliding = SlidingWindowAttentionConfig(
        pattern=[window, window, window, -1],
        force_full_attention_on_first_layer=False,
        force_full_attention_on_last_layer=True,
    )
    config = TransformerConfig.olmo3_1M(vocab_size=VOCAB, sliding_window=sliding)
    config.block.dropout = dropout
    with flash_build():
        torch.manual_seed(0)
        model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=MAX_LENGTH, device=torch.device("cpu"))
    backends_found = {type(block.attention.backend).__name__ for block in model.blocks.values()}
    assert backends_found == {"FlashAttention2Backend"}, backends_found
    return model.eval()


def torch_backend_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights and windows on OLMo-core's torch backend: what flash-attention computes, on CPU."""
    twin = copy.deepcopy(model)
    for block in twin.blocks.values():
        flash = block.attention.backend
        block.attention.backend = TorchAttentionBackend(
            head_dim=flash.head_dim, n_heads=flash.n_heads, n_kv_heads=flash.n_kv_heads,
            scale=flash.scale, window_size=flash.window_size,
        )  # fmt: skip
    return twin
