"""Packed rows for OLMo-core Transformers: a context forwarded once for all its continuations.

An OLMo-core `Transformer` takes neither an attention mask nor position ids (its forward accepts unknown
keywords and ignores them). `packed_attention(model, mask, positions)` makes one forward take them: while it
is open, the RoPE of every `Attention` module rotates queries and keys at `position_ids_BT` instead of
0..T-1, and its torch SDPA backend attends under `attention_mask_B1TT` (True = may attend; a sliding window
is applied on positions, as an unshared row would see it) instead of the causal mask. Everything else
(projections, QK norms, gates, feed-forward, the output head) runs as in any forward, through `__call__`, so
FSDP2's hooks run. The two are instance-level `forward` overrides of the RoPE and backend submodules, removed
on exit whether the body returns or raises; modules compiled with `Module.compile` (OLMo-core's per-block
`apply_compile`) run uncompiled meanwhile, so no compiled graph traces an override and training never
recompiles. Parameters, buffers, hooks and classes are never touched.

A kept prefix (`adapter.SharedPrefix`): `keeping_prefix(model, kept)` is open while the prefix's one causal
row [1, S] is forwarded as any row is, and each torch backend records its keys and values (after RoPE,
before GQA's head repetition) in `kept`. `packed_attention(model, mask, positions, kept)` then attends, for
each row of a later batch, to those keys and values before the batch's own, under a mask [B, 1, T, S + T];
its sliding windows are applied on key positions 0..S-1 followed by the batch's position ids. Both are
instance-level overrides like the above, removed the same way, compiled modules running uncompiled.

`packing_refusal(model)` names what a model has that this was not verified for (None: it packs). Verified
(tests/engine/test_olmo_core_packing.py): a plain `Transformer` of the blocks in VERIFIED_BLOCKS whose
sequence mixers are all plain `Attention` on the torch backend (GQA, QK norms, head-wise QK norms, sliding
windows), with default RoPE or none; no attention sinks, scalable softmax, attention dropout (OLMo-core's
torch backend applies it in eval mode too) or KV cache; parameters split over no model-parallel mesh
dimension (tensor, context or pipeline parallelism). The flash-attention and Transformer Engine backends are
refused: their kernels take no arbitrary mask, and no GPU was at hand to verify routing them through SDPA.

Legend: B rows, T time, S a kept prefix's length, K keys (S + T), H query heads, G key/value heads, D head
width.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inloop_eval.distributed import model_parallel_dims

log = logging.getLogger(__name__)

# Block classes of olmo_core.nn.transformer.block whose only mixing along the sequence is their attention.
VERIFIED_BLOCKS = frozenset({"TransformerBlock", "ReorderedNormTransformerBlock", "PeriNormTransformerBlock"})

# Models whose refusal was logged already: one line per model, not one per evaluation.
_REPORTED: weakref.WeakSet[nn.Module] = weakref.WeakSet()

_MISSING = object()

# What `keeping_prefix` records of a prefix: each attention backend's keys and values [1, S, G, D].
KeptKeysValues = dict[nn.Module, tuple[Tensor, Tensor]]
# Instance-level `forward` overrides: id(module) -> (module, its forward meanwhile).
Overrides = dict[int, tuple[nn.Module, Callable[..., Any]]]


def own_class(module: nn.Module) -> type:
    """The module's class under the wrapper classes torch swaps in (FSDP2's `FSDP<name>`, `replicate`'s):
    the first class of its MRO defined outside torch."""
    return next(c for c in type(module).__mro__ if not c.__module__.startswith("torch."))


def packing_refusal(model: nn.Module) -> str | None:
    """Why `model` (an OLMo-core Transformer) cannot be fed packed rows, or None when it can."""
    from olmo_core.nn.attention import Attention
    from olmo_core.nn.attention.backend import TorchAttentionBackend
    from olmo_core.nn.attention.base import SequenceMixer
    from olmo_core.nn.rope import RotaryEmbedding
    from olmo_core.nn.transformer.block import TransformerBlockBase
    from olmo_core.nn.transformer.model import Transformer

    if own_class(model) is not Transformer:
        return f"model type {own_class(model).__name__} (only Transformer is verified)"
    dims = model_parallel_dims(model)
    if dims:
        names = sorted({(mesh.mesh_dim_names or ("unnamed",) * mesh.ndim)[dim] for mesh, dim in dims})
        return f"its parameters are split over the model-parallel mesh dimension(s) {names}"
    if model.tp_enabled or model.pp_enabled or getattr(model, "_cp_load_balancer", None) is not None:
        return "tensor, pipeline or context parallelism is applied"
    for name, module in model.named_modules():
        cls = own_class(module)
        if isinstance(module, TransformerBlockBase) and cls.__name__ not in VERIFIED_BLOCKS:
            return f"block type {cls.__name__} at {name!r}"
        if isinstance(module, SequenceMixer):
            if cls is not Attention:
                return f"sequence mixer {cls.__name__} at {name!r}"
            refusal = _attention_refusal(module, TorchAttentionBackend, RotaryEmbedding)
            if refusal is not None:
                return f"{refusal} at {name!r}"
    return None


def _attention_refusal(attention: Any, torch_backend: type, default_rope: type) -> str | None:
    backend = attention.backend
    if own_class(backend) is not torch_backend:
        return f"attention backend {own_class(backend).__name__} (takes no attention mask)"
    if attention.rope is not None and own_class(attention.rope) is not default_rope:
        return f"RoPE type {own_class(attention.rope).__name__}"
    if attention.sinks is not None:
        return "attention sinks"
    if attention.scalable_softmax:
        return "scalable softmax"
    if backend.dropout_p > 0:
        return f"attention dropout {backend.dropout_p} (applied in eval mode too)"
    if attention.kv_cache_manager is not None:
        return "a KV cache"
    if backend.cp_enabled:
        return "context parallelism"
    return None


def packs(model: nn.Module) -> bool:
    """Whether `model` takes packed rows; when it does not, one log line per model says why and that its
    requests go one per row."""
    refusal = packing_refusal(model)
    if refusal is not None and model not in _REPORTED:
        _REPORTED.add(model)
        log.info(
            "OLMo-core model %s: scoring one request per row, no shared contexts: %s",
            type(model).__name__,
            refusal,
        )
    return refusal is None


@contextmanager
def packed_attention(
    model: nn.Module,
    attention_mask_B1TK: Tensor,
    position_ids_BT: Tensor,
    kept: KeptKeysValues | None = None,
    max_positions: int | None = None,
) -> Iterator[None]:
    """During the body, every `Attention` of `model` attends under `attention_mask_B1TK` with RoPE at
    `position_ids_BT`; on exit the model is exactly as it was (see the module docstring). With `kept` (what
    `keeping_prefix` recorded of a prefix of S tokens), K = S + T and each attention attends to the
    prefix's keys and values before the rows' own; without, K = T. `max_positions` bounds the RoPE table
    asked for (no position reaches it: the model's context length), so that OLMo-core never caches a table
    longer than its own forwards would."""
    from olmo_core.nn.attention import Attention

    T = position_ids_BT.shape[1]
    S = attention_mask_B1TK.shape[-1] - T
    overrides: Overrides = {}
    windowed: dict[tuple[int, int], Tensor] = {}
    for module in model.modules():
        if isinstance(module, Attention):
            backend = module.backend
            if module.rope is not None:
                n_positions = S + T if max_positions is None else min(S + T, max_positions)
                overrides[id(module.rope)] = (module.rope, _rope_at(module.rope, position_ids_BT, n_positions))
            window = tuple(backend.window_size)
            if window not in windowed:
                windowed[window] = _within_window(attention_mask_B1TK, position_ids_BT, window)
            prefix = None if kept is None else kept[backend]
            overrides[id(backend)] = (backend, _sdpa_under(backend, windowed[window], prefix))
    with _overridden(model, overrides):
        yield


@contextmanager
def keeping_prefix(model: nn.Module, kept: KeptKeysValues) -> Iterator[None]:
    """During the body (a forward of one causal row, a prefix), every `Attention` backend of `model` runs
    as it is and records its keys and values into `kept`; on exit the model is exactly as it was."""
    from olmo_core.nn.attention import Attention

    backends = {id(m.backend): m.backend for m in model.modules() if isinstance(m, Attention)}
    with _overridden(model, {i: (b, _recording(b, kept)) for i, b in backends.items()}):
        yield


@contextmanager
def _overridden(model: nn.Module, overrides: Overrides) -> Iterator[None]:
    """During the body, each module's `forward` is its override and compiled modules run uncompiled; on
    exit every instance attribute is as it was, whether the body returns or raises."""
    compiled = [m for m in model.modules() if m._compiled_call_impl is not None]
    saved_forward = [(m, m.__dict__.get("forward", _MISSING)) for m, _ in overrides.values()]
    saved_compiled = [(m, m._compiled_call_impl) for m in compiled]
    try:
        for module, forward in overrides.values():
            module.forward = forward
        for module in compiled:
            module._compiled_call_impl = None
        yield
    finally:
        for module, impl in saved_compiled:
            module._compiled_call_impl = impl
        for module, forward in saved_forward:
            if forward is _MISSING:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = forward


def _within_window(mask_B1TK: Tensor, position_ids_BT: Tensor, window: tuple[int, int]) -> Tensor:
    """The mask narrowed to a sliding window (keys at most `window[0]` positions back), as OLMo-core's
    torch backend narrows an unshared row's causal mask; the mask as is without a window. The keys are a
    kept prefix's (positions 0..S-1, S = K - T) followed by the rows' own."""
    if window == (-1, -1):
        return mask_B1TK
    B, T = position_ids_BT.shape
    S = mask_B1TK.shape[-1] - T
    prefix_BS = torch.arange(S, device=position_ids_BT.device).expand(B, S)
    key_positions_BK = torch.cat([prefix_BS, position_ids_BT], dim=1)
    back_BTK = position_ids_BT[:, :, None] - key_positions_BK[:, None, :]
    return mask_B1TK & (back_BTK <= window[0])[:, None]


def _rope_at(rope: Any, position_ids_BT: Tensor, n_positions: int) -> Callable[..., tuple[Tensor, Tensor]]:
    """`RotaryEmbedding.forward` for queries and keys [B, T, H, D] at `position_ids_BT` (all below
    `n_positions`): the same tables, precision and rotation as OLMo-core's, read at each token's position
    rather than its column."""

    def rotate(
        q: Tensor,
        k: Tensor,
        head_first: bool = True,
        start_pos: int | None = None,
        pos_sin: Tensor | None = None,
        pos_cos: Tensor | None = None,
        freqs_cis: Tensor | None = None,
        cu_doc_lens: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        if head_first or any(x is not None for x in (start_pos, pos_sin, pos_cos, freqs_cis, cu_doc_lens)):
            raise RuntimeError(
                "packed OLMo-core forward: RoPE was called with head-first inputs, a start position, given "
                "buffers or document lengths, none of which the packed rows were verified with"
            )
        q_, k_ = (q.float(), k.float()) if rope.full_precision else (q, k)
        with torch.autocast(q.device.type, enabled=False):
            sin_TD, cos_TD = rope._get_rotary_embedding(n_positions, q_.device)
            sin_BT1D = sin_TD.type_as(q_)[position_ids_BT][:, :, None]
            cos_BT1D = cos_TD.type_as(q_)[position_ids_BT][:, :, None]
            q_ = rope._apply_rotary_pos_emb(sin_BT1D, cos_BT1D, q_)
            k_ = rope._apply_rotary_pos_emb(sin_BT1D, cos_BT1D, k_)
        return q_.type_as(q), k_.type_as(k)

    return rotate


def _sdpa_under(
    backend: Any, mask_B1TK: Tensor, prefix: tuple[Tensor, Tensor] | None
) -> Callable[..., Tensor]:
    """`TorchAttentionBackend.forward` attending under `mask_B1TK` instead of the causal mask, to the keys
    and values of `prefix` ([1, S, G, D], K = S + T) before the rows' own where one is kept: keys and values
    repeated for GQA and heads moved before time, as OLMo-core's backend does."""

    def attend(qkv: Any, *args: Any, **kwargs: Any) -> Tensor:
        if not isinstance(qkv, tuple) or any(x is not None for x in (*args, *kwargs.values())):
            raise RuntimeError(
                "packed OLMo-core forward: attention was called with packed QKV, document lengths, a KV "
                "cache or attention sinks, none of which the packed rows were verified with"
            )
        q_BTHD, k_BTHD, v_BTHD = qkv
        if prefix is not None:
            B = q_BTHD.shape[0]
            k_BTHD = torch.cat([prefix[0].expand(B, -1, -1, -1), k_BTHD], dim=1)
            v_BTHD = torch.cat([prefix[1].expand(B, -1, -1, -1), v_BTHD], dim=1)
        n_rep = q_BTHD.shape[2] // k_BTHD.shape[2]
        k_BTHD, v_BTHD = _repeat_heads(k_BTHD, n_rep), _repeat_heads(v_BTHD, n_rep)
        q, k, v = q_BTHD.transpose(1, 2), k_BTHD.transpose(1, 2), v_BTHD.transpose(1, 2)
        att_BHTD = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_B1TK, scale=backend.scale)
        return att_BHTD.transpose(1, 2).contiguous()

    return attend


def _recording(backend: nn.Module, kept: KeptKeysValues) -> Callable[..., Tensor]:
    """`backend`'s own forward, its keys and values [1, S, G, D] (after RoPE, before GQA's repetition)
    recorded in `kept` under `backend`."""

    def attend(qkv: Any, *args: Any, **kwargs: Any) -> Tensor:
        out = type(backend).forward(backend, qkv, *args, **kwargs)
        kept[backend] = (qkv[1], qkv[2])
        return out

    return attend


def _repeat_heads(x_BTGD: Tensor, n_rep: int) -> Tensor:
    """Each of G key or value heads repeated `n_rep` times in place ([B, T, G * n_rep, D]), as OLMo-core's
    torch backend repeats them for grouped-query attention."""
    if n_rep == 1:
        return x_BTGD
    B, T, G, D = x_BTGD.shape
    return x_BTGD[:, :, :, None].expand(B, T, G, n_rep, D).reshape(B, T, G * n_rep, D)
