"""The attention route of OLMo-core Transformers (`ROUTE`) on every backend, for a model that takes neither a
mask nor position ids: each `Attention`'s RoPE rotates queries and keys at the routing's positions (OLMo-core's
tables and precision), its backend's call (q, k, v [B, T, H, D] in, out: every backend's contract) attends
through `Routing.attend` with the backend's scale and window, no kernel of its own run; under Ulysses context
parallelism exchanged as OLMo-core's backends exchange them. Refused (`packing_refusal`): any model but a
`Transformer` of VERIFIED_BLOCKS, another mixer, backend or RoPE, sinks, scalable softmax, attention dropout
(applied in eval mode too), a KV cache, model-parallel parameters (tensor and Ulysses context parallelism only
under `SPLIT_SEQUENCE_ROUTE`). Verified: tests/integrations/test_olmo_core_packing.py, the conformance suite.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from olmo_core.distributed.parallel import context_parallel as cp
from olmo_core.nn.attention import Attention
from olmo_core.nn.attention import backend as backends
from olmo_core.nn.attention.base import SequenceMixer
from olmo_core.nn.attention.ring import UlyssesLoadBalancer
from olmo_core.nn.rope import RotaryEmbedding
from olmo_core.nn.transformer import block
from olmo_core.nn.transformer.model import Transformer
from torch import Tensor, nn

from inloop_eval.engine.attention_route import (
    AttentionRoute,
    Override,
    Routing,
    first_refusal,
    own_class,
    split_dimensions,
    unverified,
)

log = logging.getLogger(__name__)

VERIFIED_BLOCKS = (block.TransformerBlock, block.ReorderedNormTransformerBlock,
                   block.PeriNormTransformerBlock)  # fmt: skip
# Backends called as `backend((q, k, v))`, [B, T, H, D] each, without document lengths, KV cache or sinks.
VERIFIED_BACKENDS = (backends.TorchAttentionBackend, backends.FlashAttention2Backend, backends.FlashAttention3Backend,
                     backends.FlashAttention4Backend, backends.TEAttentionBackend)  # fmt: skip


def packing_refusal(model: nn.Module, split_sequence: bool = False) -> str | None:
    """Why `model` cannot be routed, or None; with `split_sequence`, under tensor or Ulysses parallelism."""
    if own_class(model) is not Transformer:
        return f"model type {own_class(model).__name__} (only Transformer is verified)"
    refusal_at = partial(_module_refusal, split_sequence=split_sequence)
    return _parallelism_refusal(model, split_sequence) or first_refusal(model, refusal_at)


def _module_refusal(module: nn.Module, name: str, split_sequence: bool) -> str | None:
    """What the module at `name` is or has that was not verified, with its path, or None."""
    cls = own_class(module)
    if isinstance(module, block.TransformerBlockBase) and cls not in VERIFIED_BLOCKS:
        return f"block type {cls.__name__} at {name!r}"
    if isinstance(module, SequenceMixer) and cls is not Attention:
        return f"sequence mixer {cls.__name__} at {name!r}"
    why = _attention_refusal(module, split_sequence) if isinstance(module, Attention) else None
    return None if why is None else f"{why} at {name!r}"


def _parallelism_refusal(model: Any, split_sequence: bool) -> str | None:
    """Why the way `model` is split over ranks keeps it from packing, or None."""
    tp, balancer = bool(getattr(model, "tp_enabled", False)), getattr(model, "_cp_load_balancer", None)
    allowed = set(model._tp_mesh.mesh_dim_names or ()) if split_sequence and tp else set()
    split = [name for name in split_dimensions(model) if name not in allowed]
    if split:
        return f"its parameters are split over the model-parallel mesh dimension(s) {split}"
    sequence_split = split_sequence and (balancer is None or isinstance(balancer, UlyssesLoadBalancer))
    if model.pp_enabled or ((tp or balancer is not None) and not sequence_split):
        return "tensor, pipeline or context parallelism is applied"
    return None


def _attention_refusal(attention: Any, split_sequence: bool) -> str | None:
    """What `attention` has that was not verified, or None."""
    backend = attention.backend
    cls, ulysses = own_class(backend), split_sequence and getattr(backend, "uly", None) is not None
    refusals = (
        (cls not in VERIFIED_BACKENDS, f"attention backend {cls.__module__}.{cls.__name__} (not verified)"),
        (attention.rope is not None and own_class(attention.rope) is not RotaryEmbedding,
         f"RoPE type {own_class(attention.rope).__name__}"),
        (attention.sinks is not None, "attention sinks"),
        (attention.scalable_softmax, "scalable softmax"),
        (backend.dropout_p > 0, f"attention dropout {backend.dropout_p} (applied in eval mode too)"),
        (attention.kv_cache_manager is not None, "a KV cache"),
        (backend.cp_enabled and not ulysses, "context parallelism"),
    )  # fmt: skip
    return next((why for refused, why in refusals if refused), None)


def _sites(model: nn.Module) -> Iterator[tuple[nn.Module, Override]]:
    """Each `Attention`'s RoPE (where it has one) and backend, with its Ulysses group (None: none)."""
    for module in model.modules():
        if isinstance(module, Attention):
            ulysses = module.backend.cp_pg if module.backend.cp_enabled else None
            if module.rope is not None:
                yield module.rope, partial(_rope_at, ulysses=ulysses)
            yield module.backend, partial(_attend, ulysses=ulysses)


def _rope_at(rope: Any, routing: Routing, q: Tensor, k: Tensor, head_first: bool = True, start_pos: Any = None,
             pos_sin: Any = None, pos_cos: Any = None, freqs_cis: Any = None, cu_doc_lens: Any = None, *,
             ulysses: Any = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`RotaryEmbedding.forward` at the routing's positions (under Ulysses its chunk's, not its buffers)."""
    buffers = () if ulysses is not None else (pos_sin, pos_cos, freqs_cis)
    if head_first or any(x is not None for x in (start_pos, *buffers, cu_doc_lens)):
        raise unverified("OLMo-core", "RoPE: head-first inputs, a start, buffers or documents")
    position_ids_BT = routing.position_ids_BT
    if ulysses is not None:  # chunk r of CP, contiguous, as `UlyssesLoadBalancer` cuts the inputs
        chunk, rank = position_ids_BT.shape[1] // dist.get_world_size(ulysses), dist.get_rank(ulysses)
        position_ids_BT = position_ids_BT[:, rank * chunk : (rank + 1) * chunk]
    q_, k_ = (q.float(), k.float()) if rope.full_precision else (q, k)
    with torch.autocast(q.device.type, enabled=False):
        sin_TD, cos_TD = rope._get_rotary_embedding(routing.rope_positions, q_.device)
        sin_BT1D = sin_TD.type_as(q_)[position_ids_BT][:, :, None]
        cos_BT1D = cos_TD.type_as(q_)[position_ids_BT][:, :, None]
        q_ = rope._apply_rotary_pos_emb(sin_BT1D, cos_BT1D, q_)
        k_ = rope._apply_rotary_pos_emb(sin_BT1D, cos_BT1D, k_)
    return q_.type_as(q), k_.type_as(k)


def _attend(
    backend: Any, routing: Routing, qkv: Any, *args: Any, ulysses: Any = None, **kwargs: Any
) -> Tensor:
    """A backend's `forward` as `Routing.attend`; under Ulysses exchanged as its own backend exchanges."""
    if not isinstance(qkv, tuple) or any(x is not None for x in (*args, *kwargs.values())):
        raise unverified("OLMo-core", "attention: packed QKV, document lengths, a KV cache or sinks")
    q_BTHD, k_BTGD, v_BTGD = qkv
    if ulysses is not None:
        q_BTHD = cp.all_to_all_single_cp2hp(q_BTHD, ulysses)
        k_BTGD, v_BTGD = cp.all_to_all_cp2hp([k_BTGD, v_BTGD], ulysses)
    q, k, v = q_BTHD.transpose(1, 2), k_BTGD.transpose(1, 2), v_BTGD.transpose(1, 2)
    window = tuple(backend.window_size)
    att_BTHD = routing.attend(backend, q, k, v, scale=backend.scale, window=window).transpose(1, 2)
    if ulysses is not None:
        att_BTHD = cp.all_to_all_single_hp2cp(att_BTHD, ulysses)
    return att_BTHD.contiguous()


ROUTE = AttentionRoute("OLMo-core model", log, packing_refusal, _sites)
# Under tensor or Ulysses context parallelism: every rank's attention sees every position, its own heads.
SPLIT_SEQUENCE_ROUTE = dataclasses.replace(ROUTE, refusal=partial(packing_refusal, split_sequence=True))
