"""The world and its groups: this rank's place in the world and in a data-parallel group, the few integer
collectives every other module builds on (and `gather_rows`: every rank's rows, of any number), and which
process group documents are sharded over.

Data parallelism. Documents are shared out, and metrics reduced, over the *data-parallel group* of the
evaluation, which is the world unless `InLoopEvaluator.run` was given one; it is passed down in the open
(`engine.evaluation.EvalContext.dp_group`), never read from a global. The ranks of one model-parallel group (tensor, context, pipeline parallel peers) share
a data-parallel rank, so they are handed the same documents, plan the same batches and make the same forward
calls, as their model's collectives require. Failure agreement, the request cache and the forward-call
count stay world-wide: a failure on any rank stops every rank, and every rank of the world makes as many
forward calls as the busiest (dummy batches pad the others), so no model-parallel group is left waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from inloop_eval.errors import ConfigError


def world() -> tuple[int, int]:
    """(world size, rank); (1, 0) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def collective_device() -> torch.device:
    """Where the tensors of this process group's collectives live: the current GPU under nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(value: int, group: ProcessGroup | None = None) -> int:
    """`value` summed over the ranks of `group` (None: the world; every rank of it calls this)."""
    if data_parallel_in(group)[0] == 1:
        return int(value)
    t = torch.tensor([value], dtype=torch.int64, device=collective_device())
    dist.all_reduce(t, group=group)
    return int(t.item())


def all_reduce_max_many(values: Sequence[int]) -> list[int]:
    """The element-wise largest of `values` over ranks (one collective; every rank passes as many)."""
    if world()[0] == 1:
        return [int(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.int64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def all_reduce_max(value: int) -> int:
    """The largest `value` over ranks."""
    return all_reduce_max_many([value])[0]


# Mesh dimension names that are data parallel (torchtitan's and OLMo-core's); any other dimension of more
# than one rank ("tp", "cp", "pp", "ep", torchtitan's "dp_shard_cp") splits the model or the sequence.
# torchtitan's DTensor backend ("partial_dtensor") shards parameters over "fsdp", which folds dp_shard and
# cp: data parallel without context parallelism, which its validator (integrations/torchtitan/) refuses.
DATA_PARALLEL_DIMS = ("dp", "dp_replicate", "dp_shard", "fsdp")

def gather_rows(rows_NX: torch.Tensor, group: ProcessGroup) -> tuple[torch.Tensor, int]:
    """Every rank's `rows_NX` (any number of rows, the same trailing shape and dtype) concatenated in rank order,
    the same on every rank of `group`, and the index of this rank's first row in it. Two all-gathers on every
    rank: the counts, then the rows padded to the most (none when no rank has a row)."""
    count = torch.tensor([rows_NX.shape[0]], dtype=torch.int64, device=rows_NX.device)
    counts = [torch.empty_like(count) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, count, group=group)
    n = [int(c) for c in counts]
    first = sum(n[: dist.get_rank(group)])
    if max(n) == 0:
        return rows_NX, first
    padded = rows_NX.new_zeros((max(n), *rows_NX.shape[1:]))
    padded[: rows_NX.shape[0]] = rows_NX
    parts = [torch.empty_like(padded) for _ in n]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:k] for part, k in zip(parts, n, strict=True)]), first


def resolve_data_parallel(dp: ProcessGroup | DeviceMesh | None) -> ProcessGroup | None:
    """The process group of `dp`: a group as is; a one-dimensional mesh's group; the data-parallel dimensions
    of a larger mesh (named as in DATA_PARALLEL_DIMS: "dp", or "dp_replicate" and "dp_shard", flattened into
    one group). None stays None (the world). Every rank calls it (flattening a mesh creates a group)."""
    if dp is None or isinstance(dp, ProcessGroup):
        return dp
    if not isinstance(dp, DeviceMesh):
        raise ConfigError(
            f"dp_group: expected a torch.distributed ProcessGroup or DeviceMesh, found {type(dp).__name__}"
        )
    if dp.ndim == 1:
        return dp.get_group()
    names = tuple(n for n in (dp.mesh_dim_names or ()) if n in DATA_PARALLEL_DIMS)
    if "dp" in names:
        names = ("dp",)
    if not names:
        raise ConfigError(
            f"dp_group: the device mesh {dp.mesh_dim_names} has no data-parallel dimension (named one of "
            f"{DATA_PARALLEL_DIMS}); pass the data-parallel submesh (e.g. mesh['dp']) or its process group"
        )
    if len(names) == 1:
        return dp[names[0]].get_group()
    return dp[names]._flatten("_".join(names) + "_eval").get_group()


def model_parallel_dims(module: Any) -> list[tuple[DeviceMesh, int]]:
    """The (mesh, dimension) pairs, of more than one rank, that split `module`'s DTensor parameters by model
    rather than by data: every named dimension outside DATA_PARALLEL_DIMS, and every dimension of an unnamed
    mesh of more than one dimension (a one-dimensional unnamed mesh is FSDP's default, data parallel)."""
    found: dict[tuple[int, int], tuple[DeviceMesh, int]] = {}
    for param in module.parameters() if isinstance(module, torch.nn.Module) else ():
        mesh = getattr(param, "device_mesh", None)
        if not isinstance(mesh, DeviceMesh):
            continue
        names = mesh.mesh_dim_names
        for dim in range(mesh.ndim):
            named_model = names is not None and names[dim] not in DATA_PARALLEL_DIMS
            if mesh.size(dim) > 1 and (named_model or (names is None and mesh.ndim > 1)):
                found.setdefault((id(mesh), dim), (mesh, dim))
    return list(found.values())


def _is_data_and_model(name: str) -> bool:
    """A flattened mesh dimension spanning data-parallel ranks and their context-parallel peers (OLMo-core's
    `dp_cp`, FSDP over both): it needs a data-parallel group given, but spans several data-parallel ranks by
    design, so its peers are not compared (its context-parallel group is, when the adapter names it)."""
    return any(name.startswith(dp + "_") for dp in DATA_PARALLEL_DIMS)


def check_data_parallel(
    module: Any, group: ProcessGroup | None, model_groups: Sequence[tuple[str, ProcessGroup | None]] = ()
) -> None:
    """ConfigError on every rank unless documents can be sharded over `group` (None: the world) for the model
    `module`: when it is split over model-parallel ranks (its DTensor parameters on a mesh with a
    model-parallel dimension, or `model_groups`: other groups splitting it, by name, such as a pipeline's
    stages or OLMo-core's context-parallel ranks), a group must be given, and the ranks of each
    model-parallel group must share their rank in it (so they are handed the same documents). A flattened
    data-and-context dimension (`dp_cp`) is not compared (`_is_data_and_model`). One all-reduce per distinct
    group, and one world-wide, on every rank (each holds the same model structure)."""
    splits = [(_dim_name(m, d), m.size(d), m.get_group(d)) for m, d in model_parallel_dims(module)]
    # A group of None is the world (a pipeline over torch's default group).
    splits += [(name, dist.get_world_size(g), g) for name, g in model_groups if dist.get_world_size(g) > 1]
    if not splits:
        return
    if group is None:
        name, size, _ = splits[0]
        raise ConfigError(
            f"evaluator: the model is split over the model-parallel dimension {name!r} of {size} ranks (its "
            "DTensor parameters' mesh, its pipeline stages, or its sequence), and no data-parallel group was "
            "given: sharding documents over the whole world would hand its peers different documents. Pass "
            "dp_group= to InLoopEvaluator.run (the data-parallel ProcessGroup, or the DeviceMesh with "
            "dimensions named 'dp' or 'dp_replicate'/'dp_shard')"
        )
    _, dp_rank = data_parallel_in(group)
    # Each group once (many parameters share a mesh dimension), in the same order on every rank.
    compared = {g: name for name, _, g in splits if not _is_data_and_model(name)}
    split: list[str] = []
    for model_group, name in compared.items():
        spread = torch.tensor([dp_rank, -dp_rank], dtype=torch.int64, device=collective_device())
        dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=model_group)
        if int(spread[0]) != -int(spread[1]) and name not in split:
            split.append(name)
    if all_reduce_max(int(bool(split))):
        named = split or sorted(set(compared.values()))  # split on another rank only
        raise ConfigError(
            f"evaluator: dp_group splits the peers of the model-parallel dimension {named} across "
            "data-parallel ranks (they would score different documents and their model's collectives "
            "would not match); pass the data-parallel group, which holds one rank of each model-parallel "
            "group"
        )


def _dim_name(mesh: DeviceMesh, dim: int) -> str:
    names = mesh.mesh_dim_names
    return names[dim] if names else f"dim {dim}"


def data_parallel_in(group: ProcessGroup | None) -> tuple[int, int]:
    """(size, rank) of this rank in `group` (None: the world)."""
    if group is None:
        return world()
    return dist.get_world_size(group), dist.get_rank(group)


