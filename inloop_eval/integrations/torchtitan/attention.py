"""Packed rows for torchtitan decoders: a context forwarded once for all its continuations, and shots kept.

A torchtitan 0.3 decoder's attention (`GQAttention`) projects queries, keys and values, rotates queries and
keys with its RoPE module (a cache of every position, read at the `positions` the model is given, 0..T-1
without), and hands them to its core attention module (`inner_attention`: `ScaledDotProductAttention`,
causal; `FlexAttention` under a block mask of the same rows). `packed_attention(model, mask, kept)` makes
one forward of a packed batch take the engine's mask: while it is open, every RoPE module rotates at
`mask.position_ids_BT` (torchtitan's own cache and rotation, read at each token's position: the path its
training takes with packed documents) and every core attention module is `tree_attention.tree_attention`
under `mask`, instead of its kernel. Projections, QK norms, feed-forward and the output head run as in any
forward, through `__call__`, so FSDP2's hooks run. Both are instance-level `forward` overrides, removed on
exit whether the body returns or raises (a parallelized module's own instance `forward`, torchtitan's
redistribution wrapper, is put back); modules compiled with `Module.compile` (torchtitan's per-block
`apply_compile`) run uncompiled meanwhile, so no compiled graph traces an override and training never
recompiles. Parameters, buffers, hooks and classes are never touched.

Under tensor parallelism the heads are sharded: queries, keys and values reach the core attention as
DTensors sharded on the heads (or as this rank's heads, plain) and the mask is per position, so each rank
attends over its own heads under the same mask and hands its output back in the placements its queries
came in. Under sequence parallelism the attention's input is gathered before the projections, so the core
attention sees whole rows.

A kept prefix (`adapter.SharedPrefix`): `keeping_prefix(model, mask, kept, length)` is open while the
prefix's one causal row is forwarded (through `tree_attention` too, under a causal `mask`), and each core
attention records its first `length` keys and values (after RoPE, this rank's heads, [1, G, S, D]) in
`kept`; `packed_attention(model, mask, kept)` then attends, for each row of a later batch, to those before
the batch's own (the mask's S = prefix length).

`packing_refusal(model)` names what a model has that this was not verified for (None: it packs). Verified
(tests/integrations/test_torchtitan_packing.py; tensor parallelism in tests/integrations/test_torchtitan.py):
a `Llama3Model` or `Qwen3Model` of dense blocks whose attention modules are all `GQAttention` with
`ComplexRoPE` (llama3) or `CosSinRoPE` (qwen3) and `ScaledDotProductAttention` or `FlexAttention` as core
attention, its parameters split over no model-parallel mesh dimension but "tp". Refused: mixture of
experts, `VarlenAttention` (its CUDA-only kernel computes in bfloat16, and no GPU was at hand to verify the
numbers it gives), any other model, block, attention, RoPE or core attention class (multi-head latent
attention, sinks, sliding windows, linear attention). Context and pipeline parallelism are refused by the
validator before any of this.

Legend: B rows, T time, S a kept prefix's length, K keys (S + T), H query heads, G key/value heads, D head
width.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torchtitan.models.common.attention import (
    BaseAttention,
    FlexAttention,
    GQAttention,
    ScaledDotProductAttention,
)
from torchtitan.models.common.decoder import TransformerBlock
from torchtitan.models.common.rope import ComplexRoPE, CosSinRoPE
from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock
from torchtitan.models.qwen3.model import Qwen3Model, Qwen3TransformerBlock

from inloop_eval.distributed import model_parallel_dims
from inloop_eval.engine.forward_overrides import overridden_forwards, own_class
from inloop_eval.engine.tree_attention import TreeMask, tree_attention

log = logging.getLogger(__name__)

VERIFIED_MODELS = (Llama3Model, Qwen3Model)
VERIFIED_BLOCKS = (Llama3TransformerBlock, Qwen3TransformerBlock)
VERIFIED_CORES = (ScaledDotProductAttention, FlexAttention)
VERIFIED_ROPES = (ComplexRoPE, CosSinRoPE)
# The model-parallel mesh dimension whose split (heads, and the sequence around attention) packing keeps.
TENSOR_PARALLEL_DIM = "tp"

# Models whose refusal was logged already: one line per model, not one per evaluation.
_REPORTED: weakref.WeakSet[nn.Module] = weakref.WeakSet()

# What `keeping_prefix` records of a prefix: each core attention's keys and values [1, G, S, D].
KeptKeysValues = dict[nn.Module, tuple[Tensor, Tensor]]


def packing_refusal(model: nn.Module) -> str | None:
    """Why `model` (a torchtitan decoder) cannot be fed packed rows, or None when it can."""
    if own_class(model) not in VERIFIED_MODELS:
        return f"model type {own_class(model).__name__} (only Llama3Model and Qwen3Model are verified)"
    for mesh, dim in model_parallel_dims(model):
        name = (mesh.mesh_dim_names or ("unnamed",) * mesh.ndim)[dim]
        if name != TENSOR_PARALLEL_DIM:
            return f"its parameters are split over the model-parallel mesh dimension {name!r}"
    for name, module in model.named_modules():
        cls = own_class(module)
        if isinstance(module, TransformerBlock):
            if cls not in VERIFIED_BLOCKS:
                return f"block type {cls.__name__} at {name!r}"
            if getattr(module, "moe_enabled", False):
                return f"mixture of experts at {name!r}"
        if isinstance(module, BaseAttention):
            refusal = _attention_refusal(module)
            if refusal is not None:
                return f"{refusal} at {name!r}"
    return None


def _attention_refusal(attention: nn.Module) -> str | None:
    if own_class(attention) is not GQAttention:
        return f"attention type {own_class(attention).__name__}"
    core = own_class(attention.inner_attention)
    if core not in VERIFIED_CORES:
        return f"core attention {core.__name__}"
    if own_class(attention.rope) not in VERIFIED_ROPES:
        return f"RoPE type {own_class(attention.rope).__name__}"
    return None


def packs(model: nn.Module) -> bool:
    """Whether `model` takes packed rows; when it does not, one log line per model says why and that its
    requests go one per row."""
    refusal = packing_refusal(model)
    if refusal is not None and model not in _REPORTED:
        _REPORTED.add(model)
        log.info(
            "torchtitan model %s: scoring one request per row, no shared contexts: %s",
            type(model).__name__,
            refusal,
        )
    return refusal is None


@contextmanager
def packed_attention(model: nn.Module, mask: TreeMask, kept: KeptKeysValues | None = None) -> Iterator[None]:
    """During the body, every attention of `model` rotates at `mask.position_ids_BT` and attends under
    `mask` (`tree_attention`), after the keys and values of `kept` (what `keeping_prefix` recorded of a
    prefix of `mask.prefix_length` tokens) where given; on exit the model is exactly as it was."""
    with overridden_forwards(model, _routes(model, mask, kept, None, 0)):
        yield


@contextmanager
def keeping_prefix(model: nn.Module, mask: TreeMask, kept: KeptKeysValues, length: int) -> Iterator[None]:
    """During the body (a forward of one causal row under `mask`, a prefix and any padding after it), every
    attention of `model` attends under `mask` and records its first `length` keys and values into `kept`; on
    exit the model is exactly as it was."""
    with overridden_forwards(model, _routes(model, mask, None, kept, length)):
        yield


def _routes(
    model: nn.Module, mask: TreeMask, read: KeptKeysValues | None, write: KeptKeysValues | None, length: int
) -> dict[nn.Module, Callable[..., Any]]:
    """The overrides of one forward: each RoPE at the mask's positions, each core attention under it."""
    overrides: dict[nn.Module, Callable[..., Any]] = {}
    for module in model.modules():
        if isinstance(module, GQAttention):
            rope, core = module.rope, module.inner_attention
            overrides[rope] = _rope_at(rope, mask.position_ids_BT)
            prefix = None if read is None else read[core]
            overrides[core] = _tree_core(core, mask, prefix, write, length)
    return overrides


def _own_forward(module: nn.Module) -> Callable[..., Any]:
    """The forward `module` runs today: its instance `forward` (torchtitan's wrapper of a parallelized
    module) where it has one, else its class's."""
    own = module.__dict__.get("forward")
    return own if own is not None else functools.partial(type(module).forward, module)


def _rope_at(rope: nn.Module, position_ids_BT: Tensor) -> Callable[..., tuple[Tensor, Tensor]]:
    """The RoPE module's own forward, given `position_ids_BT` as the positions whatever it is called with."""
    own = _own_forward(rope)

    def rotate(query: Tensor, key: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return own(query, key, position_ids_BT)

    return rotate


def _tree_core(
    core: nn.Module,
    mask: TreeMask,
    prefix: tuple[Tensor, Tensor] | None,
    record: KeptKeysValues | None,
    length: int,
) -> Callable[..., Tensor]:
    """The core attention's forward as `tree_attention` under `mask`: queries, keys and values [B, T, *, D]
    in (DTensors sharded on the heads, or this rank's heads), the output [B, T, H, D] back in the queries'
    placements; the keys and values of `prefix` ([1, G, S, D]) before the rows' own, and the first `length`
    keys and values recorded in `record` under `core`, where given."""

    def attend(
        q_BTHD: Tensor,
        k_BTGD: Tensor,
        v_BTGD: Tensor,
        *,
        attention_masks: Any = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        is_causal: bool = True,
        **unverified: Any,
    ) -> Tensor:
        given = sorted(name for name, value in unverified.items() if value is not None)
        if not is_causal or given:
            raise RuntimeError(
                f"packed torchtitan forward: the core attention was called with {given or 'is_causal=False'}, "
                "which the packed rows were not verified with"
            )
        q_BHTD, k_BGTD, v_BGTD = (_heads_local(x).transpose(1, 2) for x in (q_BTHD, k_BTGD, v_BTGD))
        if record is not None:
            record[core] = (k_BGTD[:, :, :length], v_BGTD[:, :, :length])
        if prefix is not None:
            B = q_BHTD.shape[0]
            k_BGTD = torch.cat([prefix[0].expand(B, -1, -1, -1), k_BGTD], dim=2)
            v_BGTD = torch.cat([prefix[1].expand(B, -1, -1, -1), v_BGTD], dim=2)
        out_BTHD = tree_attention(q_BHTD, k_BGTD, v_BGTD, mask, scale=scale).transpose(1, 2)
        if isinstance(q_BTHD, DTensor):
            return DTensor.from_local(out_BTHD, q_BTHD.device_mesh, q_BTHD.placements, run_check=False)
        return out_BTHD

    return attend


def _heads_local(x_BTHD: Tensor) -> Tensor:
    """This rank's heads of `x_BTHD`: a DTensor's local tensor when it is sharded on the heads or not at all
    (RuntimeError for a split of the rows or the positions), a plain tensor as it is."""
    if not isinstance(x_BTHD, DTensor):
        return x_BTHD
    if not all(isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim == 2) for p in x_BTHD.placements):
        raise RuntimeError(
            f"packed torchtitan forward: the core attention's inputs have placements "
            f"{tuple(x_BTHD.placements)}; the packed rows were verified with heads sharded (Shard(2)) only"
        )
    return x_BTHD.to_local()
