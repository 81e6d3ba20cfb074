"""Packed rows for Megatron-core `GPTModel`s: RoPE at each token's position and the core attention through the
engine's `tree_attention`, for the forward of one micro-batch of one model chunk.

Megatron's `GPTModel` rotates queries and keys by column (`RotaryEmbedding.forward(max_seq_len)` returns the
frequencies of positions 0..T-1, [T, 1, 1, D], broadcast over the rows), and its local `DotProductAttention`
applies the mask it is given (or its own causal one). `routed_attention(gpt, position_ids_RT, tree, kept)`
makes one forward take a packed micro-batch: while it is open, the chunk's `RotaryEmbedding` returns the
frequencies of each token's own position, [T, R, 1, D] (sequence first, as Megatron's activations are;
`apply_rotary_pos_emb` broadcasts them over the heads as it did over rows), and every `DotProductAttention`
of the chunk attends through `tree_attention` under `tree` (the micro-batch's `TreeMask`, dense or block)
instead of its own softmax. Everything else (the projections, QK norms, output gates, the MLPs, the output
layer) runs as in any forward. Under tensor parallelism each rank's core attention holds its own heads and
the mask is per position, the same on every rank; under sequence parallelism the QKV projection has gathered
the whole sequence before the core attention, and RoPE is asked for the whole sequence's frequencies (T, not
T / TP); under pipeline parallelism each stage's chunks are routed for the micro-batches they run. The two
overrides are instance-level `forward`s of the `RotaryEmbedding` and `DotProductAttention` modules, removed on
exit whether the body returns or raises: the schedule's training forwards never see them. Parameters,
buffers, hooks and classes are never touched.

A kept prefix (`engine.adapter.SharedPrefix`): `keeping_prefix(gpt, length, kept)` is open while the
micro-batch holding the prefix's one causal row (row 0) is forwarded as plain rows are, and every core
attention records its keys and values (after RoPE, before GQA's repetition) of the row's first `length`
positions in `kept` ([S, 1, G, D]). `routed_attention(..., kept)` then attends, for each row of a later
batch, to those keys and values before the row's own (the `TreeMask` has `prefix_length` S, K = S + T).

`packing_refusal(gpts)` names what a model has that this was not verified for ('' when it packs). Verified
(tests/integrations/test_megatron.py): `GPTModel` chunks with learned absolute positions, none, or Megatron's
plain `RotaryEmbedding` (unfused), whose attentions are `SelfAttention` with Megatron's local
`DotProductAttention`, grouped-query or not, with tied or separate output weights, without a sliding window
or a softmax offset.

Legend: R rows of a micro-batch, T width, S a kept prefix's length, K keys (S + T), H this rank's query heads,
G its key/value heads, D head width, N positions of a RoPE table.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.attention import Attention, SelfAttention
from megatron.core.transformer.dot_product_attention import DotProductAttention
from torch import Tensor, nn

from inloop_eval.engine.forward_overrides import overridden_forwards
from inloop_eval.engine.tree_attention import TreeMask, tree_attention

log = logging.getLogger(__name__)

# What a kept prefix leaves: each core attention's keys and values [S, 1, G, D], after RoPE.
KeptKeysValues = dict[nn.Module, tuple[Tensor, Tensor]]
# Models whose refusal was logged already: one line per model, not one per adapter.
_REPORTED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def packing_refusal(gpts: Sequence[Any]) -> str:
    """'' when the chunks (`GPTModel`s, one per virtual stage) take packed rows through `routed_attention`,
    else what was not verified, with its module path. Every stage decides alike: the conditions are the
    model's configuration and layer spec, the same in every chunk."""
    config = gpts[0].config
    positions = gpts[0].position_embedding_type
    if positions not in ("learned_absolute", "none", "rope"):
        return f"its position embedding {positions!r} (learned absolute positions and RoPE are verified)"
    if config.multi_latent_attention:
        return "its multi-latent attention rotates queries and keys in its own modules, not verified"
    if positions == "rope" and (config.apply_rope_fusion or config.fused_single_qkv_rope):
        return "its fused RoPE kernel (apply_rope_fusion / fused_single_qkv_rope), not verified"
    for gpt in gpts:
        rope = getattr(gpt, "rotary_pos_emb", None)
        if positions == "rope" and type(rope) is not RotaryEmbedding:
            return f"its rotary embedding {type(rope).__name__} at 'rotary_pos_emb', not verified"
        for name, module in gpt.named_modules():
            if isinstance(module, Attention):
                refusal = _attention_refusal(module, name)
                if refusal:
                    return refusal
    return ""


def _attention_refusal(attention: Any, name: str) -> str:
    """'' when `attention` (at `name` in its chunk) is one `routed_attention` was verified for."""
    if type(attention) is not SelfAttention:
        return f"its attention {type(attention).__name__} at {name!r}, not verified"
    core, path = attention.core_attention, f"{name}.core_attention"
    if type(core) is not DotProductAttention:
        # Transformer Engine's attention needs CUDA: routing it was never run here.
        return f"its core attention {type(core).__name__} at {path!r}, not verified"
    if core.scale_mask_softmax.window_size is not None:
        return f"its sliding-window core attention at {path!r}, not verified"
    if core.softmax_offset is not None:
        return f"its softmax offset (softmax_type {core.config.softmax_type!r}) at {path!r}, not verified"
    return ""


def report_unpacked(gpt: nn.Module, refusal: str) -> None:
    """Log, once per model (`gpt`: its first chunk), that its requests go one per row and why."""
    if gpt not in _REPORTED:
        _REPORTED.add(gpt)
        log.info("Megatron GPTModel: scoring one request per row, no shared contexts: %s", refusal)


def core_attentions(gpt: nn.Module) -> list[DotProductAttention]:
    """The chunk's core attentions, in layer order."""
    return [m.core_attention for m in gpt.modules() if isinstance(m, Attention)]


@contextmanager
def routed_attention(
    gpt: nn.Module, position_ids_RT: Tensor, tree: TreeMask, kept: KeptKeysValues | None = None
) -> Iterator[None]:
    """During the body (the forward of one micro-batch [R, T] by chunk `gpt`), RoPE rotates each token at
    `position_ids_RT` and every core attention attends through `tree_attention` under `tree` (after the kept
    prefix's keys and values where `kept` is given); on exit the chunk is exactly as it was."""
    overrides: dict[nn.Module, Callable[..., Any]] = {}
    if gpt.position_embedding_type == "rope":
        overrides[gpt.rotary_pos_emb] = _rope_at(gpt.rotary_pos_emb, position_ids_RT)
    for core in core_attentions(gpt):
        overrides[core] = _attend_under(core, tree, None if kept is None else kept[core])
    with overridden_forwards(gpt, overrides):
        yield


@contextmanager
def keeping_prefix(gpt: nn.Module, length: int, kept: KeptKeysValues) -> Iterator[None]:
    """During the body (the forward of the micro-batch whose row 0 is a prefix of `length` tokens), every
    core attention of `gpt` runs as it is and records the prefix's keys and values into `kept`; on exit the
    chunk is exactly as it was."""
    with overridden_forwards(gpt, {core: _recording(core, length, kept) for core in core_attentions(gpt)}):
        yield


def _rope_at(rope: RotaryEmbedding, position_ids_RT: Tensor) -> Callable[..., Tensor]:
    """`RotaryEmbedding.forward` for a micro-batch: the frequencies [T, R, 1, D] of each token's position,
    read from the table Megatron computes ([N, 1, 1, D], each position's row the same numbers whatever N)."""

    def freqs(max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group: Any = None) -> Tensor:
        if max_seq_len != position_ids_RT.shape[1] or offset or packed_seq:
            raise RuntimeError(
                f"packed Megatron forward: RoPE was asked for {max_seq_len} positions from {offset} "
                f"(packed_seq={packed_seq}) for a micro-batch of width {position_ids_RT.shape[1]}; only the "
                "whole width from 0, unpacked, was verified"
            )
        emb_N11D = rope.get_emb(int(position_ids_RT.max()) + 1)
        return emb_N11D[:, 0, 0][position_ids_RT.t()][:, :, None]

    return freqs


def _attend_under(
    core: DotProductAttention, tree: TreeMask, prefix: tuple[Tensor, Tensor] | None
) -> Callable[..., Tensor]:
    """`DotProductAttention.forward` through `tree_attention`: queries [T, R, H, D], keys and values
    [T, R, G, D] in, the context [T, R, H * D] out, at Megatron's softmax scale; the kept prefix's keys and
    values ([S, 1, G, D]) before the rows' own where one is kept."""
    scale = core.softmax_scale * (core.scale_mask_softmax.scale or 1.0)

    def attend(
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise RuntimeError(
                "packed Megatron forward: core attention was called with an attention bias or packed "
                "sequence parameters, neither of which the packed rows were verified with"
            )
        T, R = query.shape[:2]
        if prefix is not None:
            key = torch.cat([prefix[0].expand(-1, R, -1, -1), key])
            value = torch.cat([prefix[1].expand(-1, R, -1, -1), value])
        q_RHTD, k_RGKD, v_RGKD = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        out_RHTD = tree_attention(q_RHTD, k_RGKD, v_RGKD, tree, scale=scale)
        return out_RHTD.permute(2, 0, 1, 3).reshape(T, R, -1)

    return attend


def _recording(core: DotProductAttention, length: int, kept: KeptKeysValues) -> Callable[..., Tensor]:
    """`core`'s own forward, the keys and values of row 0's first `length` positions ([S, 1, G, D], after
    RoPE, before GQA's repetition) recorded in `kept` under `core`."""

    def attend(query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        kept[core] = (key[:length, :1], value[:length, :1])
        return type(core).forward(core, query, key, value, *args, **kwargs)

    return attend
