"""The attention route of Megatron-core `GPTModel`s (`ROUTE`, applied to one chunk for one micro-batch): the
chunk's `RotaryEmbedding` returns each token's own position's frequencies [T, R, 1, D] from Megatron's table (its
own gives positions 0..T-1), every local `DotProductAttention` attends through `Routing.attend` at Megatron's
scale; under TP over this rank's heads, under SP after the QKV projection gathered the sequence, under PP for
each stage's chunks. Refused (`packing_refusal(chunks)`, a `ModuleList` of them or one): positions other than
learned absolute, none or the plain unfused RoPE, multi-latent attention, another attention or core attention
(Transformer Engine's needs CUDA: never run here), a sliding window, a softmax offset. Verified:
tests/integrations/test_megatron.py, the conformance suite. Legend: R rows, T width, H/G query/key-value heads,
D head width, N positions of a RoPE table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.attention import Attention, SelfAttention
from megatron.core.transformer.dot_product_attention import DotProductAttention
from torch import Tensor, nn

from inloop_eval.engine.attention_route import AttentionRoute, Override, Routing, first_refusal, unverified

log = logging.getLogger(__name__)


def packing_refusal(chunks: nn.Module) -> str | None:
    """Why the chunks cannot be routed, or None: every stage decides alike, from the configuration and spec."""
    gpts = list(chunks) if isinstance(chunks, nn.ModuleList) else [chunks]
    config, positions = gpts[0].config, gpts[0].position_embedding_type
    rope = positions == "rope"
    refusals = (
        (positions not in ("learned_absolute", "none", "rope"),
         f"its position embedding {positions!r} (only learned absolute, none and RoPE are)"),
        (config.multi_latent_attention, "its multi-latent attention rotates queries and keys in its own modules"),
        (rope and (config.apply_rope_fusion or config.fused_single_qkv_rope),
         "its fused RoPE kernel (apply_rope_fusion / fused_single_qkv_rope)"),
        *((rope and type(e) is not RotaryEmbedding, f"its rotary embedding {type(e).__name__} at 'rotary_pos_emb'")
          for e in (getattr(g, "rotary_pos_emb", None) for g in gpts)),
    )  # fmt: skip
    found = next((why for refused, why in refusals if refused), None)
    found = found or next((r for r in (first_refusal(g, _attention_refusal) for g in gpts) if r), None)
    return None if found is None else f"{found}, not verified"


def _attention_refusal(attention: Any, name: str) -> str | None:
    """What the attention at `name` in its chunk has that was not verified, with its path, or None."""
    if not isinstance(attention, Attention):
        return None
    core, path = attention.core_attention, f"{name}.core_attention"
    softmax_type = getattr(core.config, "softmax_type", None)
    refusals = (
        (type(attention) is not SelfAttention, f"its attention {type(attention).__name__} at {name!r}"),
        (type(core) is not DotProductAttention, f"its core attention {type(core).__name__} at {path!r}"),
        (getattr(getattr(core, "scale_mask_softmax", None), "window_size", None) is not None,
         f"its sliding-window core attention at {path!r}"),
        (getattr(core, "softmax_offset", None) is not None,
         f"its softmax offset (softmax_type {softmax_type!r}) at {path!r}"),
    )  # fmt: skip
    return next((why for refused, why in refusals if refused), None)


def _sites(gpt: nn.Module) -> Iterator[tuple[nn.Module, Override]]:
    """The chunk's RoPE (with RoPE positions) and every core attention."""
    if gpt.position_embedding_type == "rope":
        yield gpt.rotary_pos_emb, _rope_at
    yield from ((m.core_attention, _attend) for m in gpt.modules() if isinstance(m, Attention))


def _rope_at(rope: RotaryEmbedding, routing: Routing, max_seq_len: int, offset: int = 0, packed_seq: bool = False,
             cp_group: Any = None) -> Tensor:  # fmt: skip
    """`RotaryEmbedding.forward` for a micro-batch: each token's position's frequencies [T, R, 1, D], read
    from Megatron's table ([N, 1, 1, D], each position's row the same numbers whatever N)."""
    position_ids_RT = routing.position_ids_BT
    if max_seq_len != position_ids_RT.shape[1] or offset or packed_seq:
        asked = f"{max_seq_len} positions from {offset} (packed_seq={packed_seq})"
        raise unverified("Megatron", f"RoPE asked for {asked} for a width of {position_ids_RT.shape[1]}")
    emb_N11D = rope.get_emb(int(position_ids_RT.max()) + 1)
    return emb_N11D[:, 0, 0][position_ids_RT.t()][:, :, None]


def _attend(core: DotProductAttention, routing: Routing, query: Tensor, key: Tensor, value: Tensor,
            attention_mask: Tensor | None, attn_mask_type: Any = None, attention_bias: Tensor | None = None,
            packed_seq_params: Any = None) -> Tensor:  # fmt: skip
    """`DotProductAttention.forward` as `Routing.attend` at Megatron's softmax scale: queries [T, R, H, D], keys
    and values [T, R, G, D] in, the context [T, R, H * D] out."""
    if attention_bias is not None or packed_seq_params is not None:
        raise unverified("Megatron", "core attention called with an attention bias or packed sequences")
    T, R = query.shape[:2]
    q_RHTD, k_RGTD, v_RGTD = (x.permute(1, 2, 0, 3) for x in (query, key, value))
    scale = core.softmax_scale * (core.scale_mask_softmax.scale or 1.0)
    return routing.attend(core, q_RHTD, k_RGTD, v_RGTD, scale=scale).permute(2, 0, 1, 3).reshape(T, R, -1)


ROUTE = AttentionRoute("Megatron", log, packing_refusal, _sites)
