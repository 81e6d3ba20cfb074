"""Packed rows for OLMo-core Transformers, on every attention backend: a context forwarded once for all its
continuations, a kept prefix once for all the rows after it.

An OLMo-core `Transformer` takes neither an attention mask nor position ids (its forward accepts unknown
keywords and ignores them), and its attention backends (`torch`, `flash_2`, `flash_3`, `flash_4`, `te`) take
no arbitrary mask. `routed_attention(model, tree, positions)` makes one forward take them: while it is open,
the RoPE of every `Attention` module rotates queries and keys at `position_ids_BT` instead of 0..T-1, and its
backend's call (queries, keys, values [B, T, H, D] in, outputs out: the one contract every backend has) is
the engine's `tree_attention` under the batch's `TreeMask` (dense SDPA on CPU, a FlexAttention block mask on
CUDA), with the backend's scale and sliding window (applied on positions, as an unshared row would see it).
No backend kernel runs meanwhile. Everything else (projections, QK norms, gates, feed-forward, the output
head) runs as in any forward, through `__call__`, so FSDP2's hooks run. The two are instance-level
`forward` overrides of the RoPE and backend submodules, removed on exit whether the body returns or raises;
modules compiled with `Module.compile` (OLMo-core's per-block `apply_compile`) run uncompiled meanwhile, so
no compiled graph traces an override and training never recompiles. Parameters, buffers, hooks and classes
are never touched.

A kept prefix (`adapter.SharedPrefix`) is forwarded as one causal row under `routed_attention(...,
record=kept)`, each backend recording its keys and values (after RoPE, before GQA's head repetition) in
`kept`; `routed_attention(model, tree, positions, kept)` then attends, for each row of a later batch, to
those keys and values before the batch's own (the tree's keys are S + T).

`packing_refusal(model)` names what a model has that this was not verified for (None: it packs). Verified
(tests/engine/test_olmo_core_packing.py): a plain `Transformer` of the blocks in VERIFIED_BLOCKS whose
sequence mixers are all plain `Attention` on a backend of VERIFIED_BACKENDS (GQA, QK norms, head-wise QK
norms, sliding windows), with default RoPE or none; no attention sinks, scalable softmax, attention dropout
(OLMo-core's backends apply it in eval mode too) or KV cache; parameters split over no model-parallel mesh
dimension but OLMo-core's tensor parallelism (under which `OLMoCoreSequenceSplitAdapter` packs rows; context
and pipeline parallelism: one request per row).

Legend: B rows, T time, S a kept prefix's length, H query heads, G key/value heads, D head width.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from inloop_eval.distributed import model_parallel_dims
from inloop_eval.engine.forward_overrides import overridden_forwards, own_class
from inloop_eval.engine.tree_attention import TreeMask, tree_attention

log = logging.getLogger(__name__)

# Block classes of olmo_core.nn.transformer.block whose only mixing along the sequence is their attention.
VERIFIED_BLOCKS = frozenset({"TransformerBlock", "ReorderedNormTransformerBlock", "PeriNormTransformerBlock"})
# Backend classes of olmo_core.nn.attention.backend called as `backend((q, k, v))` with [B, T, H, D] tensors
# and no other argument in a forward without document lengths, KV cache or sinks: what `routed_attention`
# replaces by the engine's attention.
VERIFIED_BACKENDS = frozenset(
    {
        "TorchAttentionBackend",
        "FlashAttention2Backend",
        "FlashAttention3Backend",
        "FlashAttention4Backend",
        "TEAttentionBackend",
    }
)

# Models whose refusal was logged already: one line per model, not one per evaluation.
_REPORTED: weakref.WeakSet[nn.Module] = weakref.WeakSet()

# What a forward with `record` records of a prefix: each attention backend's keys and values [1, S, G, D].
KeptKeysValues = dict[nn.Module, tuple[Tensor, Tensor]]


def packing_refusal(model: nn.Module, split_sequence: bool = False) -> str | None:
    """Why `model` (an OLMo-core Transformer) cannot be fed packed rows, or None when it can. With
    `split_sequence`, OLMo-core's tensor parallelism and Ulysses context parallelism are allowed (attention
    sees every position, its heads sharded: the mask and positions are per position); pipeline parallelism
    never is."""
    from olmo_core.nn.attention import Attention
    from olmo_core.nn.attention.base import SequenceMixer
    from olmo_core.nn.rope import RotaryEmbedding
    from olmo_core.nn.transformer.block import TransformerBlockBase
    from olmo_core.nn.transformer.model import Transformer

    if own_class(model) is not Transformer:
        return f"model type {own_class(model).__name__} (only Transformer is verified)"
    refusal = _parallelism_refusal(model, split_sequence)
    if refusal is not None:
        return refusal
    for name, module in model.named_modules():
        cls = own_class(module)
        if isinstance(module, TransformerBlockBase) and cls.__name__ not in VERIFIED_BLOCKS:
            return f"block type {cls.__name__} at {name!r}"
        if isinstance(module, SequenceMixer):
            if cls is not Attention:
                return f"sequence mixer {cls.__name__} at {name!r}"
            refusal = _attention_refusal(module, RotaryEmbedding, split_sequence)
            if refusal is not None:
                return f"{refusal} at {name!r}"
    return None


def _parallelism_refusal(model: nn.Module, split_sequence: bool) -> str | None:
    """Why the way `model` is split over ranks keeps it from packing (with `split_sequence`, OLMo-core's
    tensor and Ulysses context parallelism do not), or None."""
    tp_enabled = bool(getattr(model, "tp_enabled", False))
    balancer = getattr(model, "_cp_load_balancer", None)
    allowed = set(model._tp_mesh.mesh_dim_names or ()) if split_sequence and tp_enabled else set()
    dims = [
        (mesh, dim)
        for mesh, dim in model_parallel_dims(model)
        if mesh.mesh_dim_names is None or mesh.mesh_dim_names[dim] not in allowed
    ]
    if dims:
        names = sorted({(mesh.mesh_dim_names or ("unnamed",) * mesh.ndim)[dim] for mesh, dim in dims})
        return f"its parameters are split over the model-parallel mesh dimension(s) {names}"
    ulysses = balancer is not None and type(balancer).__name__ == "UlyssesLoadBalancer"
    if (
        model.pp_enabled
        or (not split_sequence and (tp_enabled or balancer is not None))
        or (balancer and not ulysses)
    ):
        return "tensor, pipeline or context parallelism is applied"
    return None


def _attention_refusal(attention: Any, default_rope: type, split_sequence: bool) -> str | None:
    backend = attention.backend
    backend_class = own_class(backend)
    if (
        backend_class.__module__ != "olmo_core.nn.attention.backend"
        or backend_class.__name__ not in VERIFIED_BACKENDS
    ):
        return f"attention backend {backend_class.__module__}.{backend_class.__name__} (not verified)"
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
    if backend.cp_enabled and not (split_sequence and getattr(backend, "uly", None) is not None):
        return "context parallelism"
    return None


def packs(model: nn.Module, split_sequence: bool = False) -> bool:
    """Whether `model` takes packed rows (`packing_refusal`); when it does not, one log line per model says
    why and that its requests go one per row."""
    refusal = packing_refusal(model, split_sequence)
    if refusal is not None and model not in _REPORTED:
        _REPORTED.add(model)
        log.info(
            "OLMo-core model %s: scoring one request per row, no shared contexts: %s",
            type(model).__name__,
            refusal,
        )
    return refusal is None


@contextmanager
def routed_attention(
    model: nn.Module,
    tree: TreeMask,
    position_ids_BT: Tensor,
    kept: KeptKeysValues | None = None,
    record: KeptKeysValues | None = None,
    max_positions: int | None = None,
    record_length: int | None = None,
) -> Iterator[None]:
    """During the body, every `Attention` of `model` rotates queries and keys at `position_ids_BT` and
    attends through the engine's `tree_attention` under `tree`, whatever its backend; on exit the model is
    exactly as it was (see the module docstring). With `kept` (what a forward with `record` recorded of a
    prefix of S tokens), each attention attends to the prefix's keys and values before the rows' own (the
    tree's keys are S + T); with `record`, each backend's keys and values are recorded in it (the first
    `record_length` positions: a prefix's row padded on the right to the width a split sequence needs).
    `max_positions` bounds the RoPE table asked for (no position reaches it: the model's context length),
    so that OLMo-core never caches a table longer than its own forwards would."""
    from olmo_core.nn.attention import Attention

    overrides: dict[nn.Module, Callable[..., Any]] = {}
    for module in model.modules():
        if isinstance(module, Attention):
            backend = module.backend
            ulysses = backend.cp_pg if backend.cp_enabled else None
            if module.rope is not None:
                n_positions = tree.keys if max_positions is None else min(tree.keys, max_positions)
                positions = position_ids_BT if ulysses is None else _held_chunk(position_ids_BT, ulysses)
                overrides[module.rope] = _rope_at(module.rope, positions, n_positions, ulysses is not None)
            prefix = None if kept is None else kept[backend]
            overrides[backend] = _tree_attention_of(backend, tree, prefix, record, record_length, ulysses)
    with overridden_forwards(model, overrides):
        yield


def _held_chunk(position_ids_BT: Tensor, cp_group: Any) -> Tensor:
    """The positions of this rank's chunk under Ulysses context parallelism: chunk r of CP, contiguous, as
    OLMo-core's `UlyssesLoadBalancer` cuts the inputs."""
    size, rank = dist.get_world_size(cp_group), dist.get_rank(cp_group)
    chunk = position_ids_BT.shape[1] // size
    return position_ids_BT[:, rank * chunk : (rank + 1) * chunk]


def _rope_at(
    rope: Any, position_ids_BT: Tensor, n_positions: int, sharded_buffers: bool = False
) -> Callable[..., tuple[Tensor, Tensor]]:
    """`RotaryEmbedding.forward` for queries and keys [B, T, H, D] at `position_ids_BT` (all below
    `n_positions`): the same tables, precision and rotation as OLMo-core's, read at each token's position
    rather than its column. With `sharded_buffers` (context parallelism), the sin and cos buffers OLMo-core
    hands it (its chunk's columns) are passed over: the positions are this rank's chunk's."""

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
        buffers = () if sharded_buffers else (pos_sin, pos_cos, freqs_cis)
        if head_first or any(x is not None for x in (start_pos, *buffers, cu_doc_lens)):
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


def _tree_attention_of(
    backend: Any,
    tree: TreeMask,
    prefix: tuple[Tensor, Tensor] | None,
    record: KeptKeysValues | None,
    record_length: int | None = None,
    ulysses: Any = None,
) -> Callable[..., Tensor]:
    """An attention backend's `forward`, whatever its kernel, as the engine's `tree_attention` under `tree`
    with the backend's scale and sliding window: queries, keys and values [B, T, H or G, D] in, [B, T, H, D]
    out, as every OLMo-core backend takes and gives them. With `prefix` ([1, S, G, D] keys and values),
    they come before the rows' own; with `record`, the rows' keys and values are recorded under `backend`.
    Under Ulysses context parallelism (`ulysses`: its group) each rank holds a chunk of the positions and
    every head: exchanged, as OLMo-core's backends exchange them, for every position and a share of the
    heads before attention, and back after."""
    from olmo_core.distributed.parallel.context_parallel import (
        all_to_all_cp2hp,
        all_to_all_single_cp2hp,
        all_to_all_single_hp2cp,
    )

    def attend(qkv: Any, *args: Any, **kwargs: Any) -> Tensor:
        if not isinstance(qkv, tuple) or any(x is not None for x in (*args, *kwargs.values())):
            raise RuntimeError(
                "packed OLMo-core forward: attention was called with packed QKV, document lengths, a KV "
                "cache or attention sinks, none of which the packed rows were verified with"
            )
        q_BTHD, k_BTGD, v_BTGD = qkv
        if ulysses is not None:
            q_BTHD = all_to_all_single_cp2hp(q_BTHD, ulysses)
            k_BTGD, v_BTGD = all_to_all_cp2hp([k_BTGD, v_BTGD], ulysses)
        if record is not None:
            record[backend] = (k_BTGD[:, :record_length], v_BTGD[:, :record_length])
        if prefix is not None:
            B = q_BTHD.shape[0]
            k_BTGD = torch.cat([prefix[0].expand(B, -1, -1, -1), k_BTGD], dim=1)
            v_BTGD = torch.cat([prefix[1].expand(B, -1, -1, -1), v_BTGD], dim=1)
        q, k, v = q_BTHD.transpose(1, 2), k_BTGD.transpose(1, 2), v_BTGD.transpose(1, 2)
        att_BHTD = tree_attention(q, k, v, tree, scale=backend.scale, window=tuple(backend.window_size))
        att_BTHD = att_BHTD.transpose(1, 2)
        if ulysses is not None:
            att_BTHD = all_to_all_single_hp2cp(att_BTHD, ulysses)
        return att_BTHD.contiguous()

    return attend
