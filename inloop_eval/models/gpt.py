"""A small GPT for the demo and the tests: causal, pre-norm, learned positions.

It accepts a boolean attention mask [B, 1, T, T] (True = may attend) and position ids [B, T], so the
evaluator can pack several continuations after one shared context, and keeps and reads the keys and values
of a prefix (`kv_out`, `kv_prefix`), so that a prefix many rows begin with is forwarded once.
Legend: B batch, T time, D model width, V vocabulary, H heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(kw_only=True)
class GPTConfig:
    """Shape of the reference model."""

    vocab_size: int = 50304
    """Rows of the embedding and the output head (>= the tokenizer's vocabulary)."""
    d_model: int = 64
    """Width of the residual stream."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    max_seq_len: int = 512
    """Longest sequence (learned position embeddings)."""
    dropout: float = 0.0
    """Dropout on attention and MLP outputs during training."""

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"GPTConfig: n_heads={self.n_heads} must divide d_model={self.d_model}")


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.ln1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x_BTD: Tensor,
        mask_B1TT: Tensor | None,
        kv_prefix: tuple[Tensor, Tensor] | None = None,
        kv_out: list[tuple[Tensor, Tensor]] | None = None,
    ) -> Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(self.ln1(x_BTD)).view(B, T, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D/H]
        if kv_out is not None:
            kv_out.append((k, v))
        if kv_prefix is not None:  # keys and values of a prefix [1, H, S, D/H] every row begins with
            k_prefix, v_prefix = kv_prefix
            k = torch.cat([k_prefix.expand(B, -1, -1, -1), k], dim=2)
            v = torch.cat([v_prefix.expand(B, -1, -1, -1), v], dim=2)
        if mask_B1TT is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_B1TT)
        x_BTD = x_BTD + self.dropout(self.proj(attn.transpose(1, 2).reshape(B, T, D)))
        return x_BTD + self.dropout(self.mlp(self.ln2(x_BTD)))


class GPT(nn.Module):
    """Reference causal language model; `forward` returns logits [B, T, V]."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def hidden_states(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        *,
        kv_prefix: list[tuple[Tensor, Tensor]] | None = None,
        kv_out: list[tuple[Tensor, Tensor]] | None = None,
    ) -> Tensor:
        """Final-norm hidden states [B, T, D].

        attention_mask: optional bool [B, 1, T, S + T], True where a query may attend a key (causal if None);
            its first S columns are the keys of `kv_prefix` (S = 0 without one).
        position_ids: optional [B, T]; defaults to 0..T-1.
        kv_prefix: each block's keys and values [1, H, S, D/H] of a prefix every row begins with (what
            `kv_out` kept of it), attended to before the rows' own.
        kv_out: a list each block appends its keys and values [B, H, T, D/H] to.
        """
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        x_BTD = self.tok_emb(input_ids) + self.pos_emb(position_ids)
        for i, block in enumerate(self.blocks):
            x_BTD = block(x_BTD, attention_mask, kv_prefix[i] if kv_prefix is not None else None, kv_out)
        return self.ln_f(x_BTD)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        return self.lm_head(self.hidden_states(input_ids, attention_mask, position_ids))
