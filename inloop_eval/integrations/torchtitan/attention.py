"""The attention route of torchtitan decoders (`ROUTE`): each `GQAttention`'s RoPE module rotates at the
routing's positions through its own forward (torchtitan's cache and rotation, the path its training takes with
packed documents), its core attention (`inner_attention`: causal SDPA or `FlexAttention`) attends through
`Routing.attend`; under tensor parallelism over this rank's heads, the output handed back in the queries'
placements (sequence parallelism gathers before). Refused (`packing_refusal`): any model, block, attention, core
attention (`VarlenAttention`: CUDA-only, never verified here) or RoPE not in VERIFIED_*, mixture of experts, a
split over a mesh dimension but "tp". Verified: tests/integrations/test_torchtitan_packing.py, test_torchtitan.py
(TP), the conformance suite. Legend: B rows, T time, H query heads, G key/value heads, D head width.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torchtitan.models.common import attention as tt
from torchtitan.models.common.decoder import TransformerBlock
from torchtitan.models.common.rope import ComplexRoPE, CosSinRoPE
from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock
from torchtitan.models.qwen3.model import Qwen3Model, Qwen3TransformerBlock

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

VERIFIED_MODELS = (Llama3Model, Qwen3Model)
VERIFIED_BLOCKS = (Llama3TransformerBlock, Qwen3TransformerBlock)
VERIFIED_CORES = (tt.ScaledDotProductAttention, tt.FlexAttention)
VERIFIED_ROPES = (ComplexRoPE, CosSinRoPE)
# The model-parallel mesh dimension whose split (heads, and the sequence around attention) packing keeps.
TENSOR_PARALLEL_DIM = "tp"


def packing_refusal(model: nn.Module) -> str | None:
    """Why `model` (a torchtitan decoder) cannot be routed, or None."""
    if own_class(model) not in VERIFIED_MODELS:
        return f"model type {own_class(model).__name__} (only Llama3Model and Qwen3Model are verified)"
    split = [name for name in split_dimensions(model) if name != TENSOR_PARALLEL_DIM]
    if split:
        return f"its parameters are split over the model-parallel mesh dimension {split[0]!r}"
    return first_refusal(model, _module_refusal)


def _module_refusal(module: nn.Module, name: str) -> str | None:
    """What the module at `name` is or has that was not verified, with its path, or None."""
    cls, block = own_class(module), isinstance(module, TransformerBlock)
    core, rope = (own_class(getattr(module, a, module)) for a in ("inner_attention", "rope"))
    attention = isinstance(module, tt.BaseAttention)
    refusals = (
        (block and cls not in VERIFIED_BLOCKS, f"block type {cls.__name__}"),
        (block and getattr(module, "moe_enabled", False), "mixture of experts"),
        (attention and cls is not tt.GQAttention, f"attention type {cls.__name__}"),
        (attention and core not in VERIFIED_CORES, f"core attention {core.__name__}"),
        (attention and rope not in VERIFIED_ROPES, f"RoPE type {rope.__name__}"),
    )
    return next((f"{why} at {name!r}" for refused, why in refusals if refused), None)


def _sites(model: nn.Module) -> Iterator[tuple[nn.Module, Override]]:
    """Each `GQAttention`'s RoPE and core attention."""
    for module in model.modules():
        if isinstance(module, tt.GQAttention):
            yield from ((module.rope, _rope_at), (module.inner_attention, _attend))


def _rope_at(rope: nn.Module, routing: Routing, query: Tensor, key: Tensor, positions: Any = None) -> Any:
    """The RoPE module's own forward (a parallelized module's instance `forward`, else its class's) at the
    routing's positions, whatever it is called with."""
    return routing.originals[rope](query, key, routing.position_ids_BT)


def _attend(core: nn.Module, routing: Routing, q_BTHD: Tensor, k_BTGD: Tensor, v_BTGD: Tensor, *,
            attention_masks: Any = None, scale: float | None = None, enable_gqa: bool = False,
            is_causal: bool = True, **unverified_kwargs: Any) -> Tensor:  # fmt: skip
    """The core attention's forward as `Routing.attend`: [B, T, *, D] in (DTensors sharded on the heads, or this
    rank's heads), the output [B, T, H, D] back in the queries' placements."""
    given = sorted(name for name, value in unverified_kwargs.items() if value is not None)
    if not is_causal or given:
        raise unverified("torchtitan", f"the core attention called with {given or 'is_causal=False'}")
    q_BHTD, k_BGTD, v_BGTD = (_heads_local(x).transpose(1, 2) for x in (q_BTHD, k_BTGD, v_BTGD))
    out_BTHD = routing.attend(core, q_BHTD, k_BGTD, v_BGTD, scale=scale).transpose(1, 2)
    if isinstance(q_BTHD, DTensor):
        return DTensor.from_local(out_BTHD, q_BTHD.device_mesh, q_BTHD.placements, run_check=False)
    return out_BTHD


def _heads_local(x_BTHD: Tensor) -> Tensor:
    """This rank's heads: a DTensor's local tensor when sharded on the heads or replicated, a plain tensor as it
    is (RuntimeError for a split of the rows or the positions)."""
    if not isinstance(x_BTHD, DTensor):
        return x_BTHD
    if not all(isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim == 2) for p in x_BTHD.placements):
        raise unverified(
            "torchtitan", f"core attention inputs placed {tuple(x_BTHD.placements)}, not Shard(2)"
        )
    return x_BTHD.to_local()


ROUTE = AttentionRoute("torchtitan model", log, packing_refusal, _sites)
