"""The few collectives the evaluator makes; every rank calls each of them, in the same order.

Failure agreement. A task's evaluation passes through fixed *points* in the same order on every rank:
after preparing the requests, after planning the forward passes, between consecutive forward passes,
after scoring (before the metric sync) and after computing the metric. Each point is one all-reduce (MAX)
of `[value, failure flag]`. A rank whose own evaluation raises joins the next point it has not passed with
the flag set, and joins nothing more for that task; every rank that meets the flag at that point raises
`TaskFailedOnAnotherRank`. So all ranks leave the task at the same point, report the same failure, and
make the same collectives for the next task. The cost is one all-reduce of two integers per point, i.e.
per forward pass (a host sync, as reading each batch's scores already is).

What this guarantees, for a failure on some ranks only:
- anything raised while loading, tokenizing, reading the request cache or planning (data errors, a bad
  token id): agreed before any forward pass, whatever the model;
- anything raised between two forward passes, outside the model (scoring a batch, a progress callback):
  agreed at the next point; the other ranks have made exactly the forward calls the failing rank made, so
  a sharded model's own collectives stay matched;
- an exception raised inside the model's forward on one rank: agreed at the next point when the forward
  makes no collectives (a replicated model). When it does (FSDP, tensor parallelism), the other ranks are
  blocked inside a collective of that forward that the failing rank will never reach; no in-process
  protocol can release them, and only the process group's timeout (`init_process_group(timeout=...)`,
  NCCL's watchdog) ends the job.

Failures per item. Where one item of an evaluator may fail while the others go on (a perplexity domain
whose file is missing on one node), `agree_failures` all-reduces one failure flag per item, in an order
every rank shares, so that every rank drops the same items before planning any work. A rank that raised for
an item still joins that all-reduce; with `strict`, every rank then raises and `TaskAgreement.failure_agreed`
keeps `report_failure` from joining a point the others will not reach.

Agreed settings. Before anything else, every rank's evaluator settings (`agree_settings`: the config's every
setting that changes what is scored, and the data-parallel group each rank was given) are gathered world-wide
once per evaluation and compared; any difference, or a group that is not a consistent partition of the
world, is a ConfigError on every rank naming the setting and the ranks, so that no rank goes on into
collectives its peers will never make. Each task's tokenized requests are compared too, by fingerprint, at
its first agreement points (`TaskAgreement.agree_same`).

Data parallelism. Documents are shared out, and metrics reduced, over the *data-parallel group* of the
evaluation, which is the world unless `InLoopEvaluator.run` was given one; it is passed down in the open
(`engine.evaluation.EvalContext.dp_group`), never read from a global. The ranks of one model-parallel group (tensor, context, pipeline parallel peers) share
a data-parallel rank, so they are handed the same documents, plan the same batches and make the same forward
calls, as their model's collectives require. Failure agreement, the request cache and the forward-call
count stay world-wide: a failure on any rank stops every rank, and every rank of the world makes as many
forward calls as the busiest (dummy batches pad the others), so no model-parallel group is left waiting.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, overload

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from inloop_eval.errors import ConfigError, InLoopEvalError

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class TaskFailedOnAnotherRank(InLoopEvalError):
    """Another rank's evaluation of this task raised; this rank stopped at the same point."""


def world() -> tuple[int, int]:
    """(world size, rank); (1, 0) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


# Mesh dimension names that are data parallel (torchtitan's and OLMo-core's); any other dimension of more
# than one rank ("tp", "cp", "pp", "ep", torchtitan's "dp_shard_cp") splits the model or the sequence.
# torchtitan's DTensor backend ("partial_dtensor") shards parameters over "fsdp", which folds dp_shard and
# cp: data parallel without context parallelism, which its validator (integrations/torchtitan/) refuses.
DATA_PARALLEL_DIMS = ("dp", "dp_replicate", "dp_shard", "fsdp")

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


def agreed_data_parallel(dp: ProcessGroup | DeviceMesh | None, settings: dict[str, Any]) -> ProcessGroup | None:
    """The data-parallel process group of `dp` (`resolve_data_parallel`), once every rank agrees on it and on
    `settings` (`agree_settings`); a `dp` this rank cannot read is refused on every rank."""
    try:
        group, problem = resolve_data_parallel(dp), ""
    except ConfigError as exc:
        group, problem = None, str(exc)
    agree_settings(settings, group, problem)
    return group


def agree_settings(settings: dict[str, Any], group: ProcessGroup | None, problem: str = "") -> None:
    """ConfigError on every rank unless every rank of the world passed the same `settings` (a flat mapping
    of setting name -> JSON-able value) and a data-parallel `group` (None: the world) that is one block of a
    partition of the world: this rank in it, every member naming the same members. `problem`: this rank's own
    reason to refuse (a group it could not read), raised on every rank. One `all_gather_object`."""
    world_size, rank = world()
    if world_size == 1:
        if problem:
            raise ConfigError(problem)
        return
    if group is None or group == dist.group.WORLD:
        members, name = list(range(world_size)), "the world"
    else:  # ranks passing different groups of the same members would make collectives no peer joins
        members, name = sorted(dist.get_process_group_ranks(group)), f"group {group.group_name}"
    mine = {"settings": {k: json.dumps(v, sort_keys=True, default=str) for k, v in settings.items()},
            "members": members, "group": name, "problem": problem}  # fmt: skip
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, mine)
    problems = [f"rank {r}: {e['problem']}" for r, e in enumerate(every) if e["problem"]]
    if problems:
        raise ConfigError("evaluator: " + "; ".join(problems))
    differing = []
    for name in sorted({n for e in every for n in e["settings"]}):
        values = [e["settings"].get(name, "(unset)") for e in every]
        if len(set(values)) > 1:
            shown = ", ".join(f"rank {r} {v}" for r, v in enumerate(values))
            differing.append(f"{name}: {shown}")
    if differing:
        raise ConfigError(
            "evaluator: the ranks were given different settings, so they would score different requests and "
            f"their collectives would not match: {'; '.join(differing[:8])}; build the evaluator from the "
            "same config on every rank"
        )
    def agrees(r: int, e: dict[str, Any]) -> bool:
        same = [(every[m]["members"], every[m]["group"]) == (e["members"], e["group"]) for m in e["members"]]
        return r in e["members"] and all(same)

    split = [r for r, e in enumerate(every) if not agrees(r, e)]
    if split:
        shown = ", ".join(f"rank {r} {every[r]['group']} of ranks {every[r]['members']}" for r in split)
        raise ConfigError(
            "evaluator: the data-parallel groups the ranks were given do not agree (each rank's group must "
            f"hold it, and its members must name the same group): {shown}; pass dp_group= alike on every "
            "rank (the same kind of group, or None everywhere)"
        )


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
        spread = torch.tensor([dp_rank, -dp_rank], dtype=torch.int64, device=_device())
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


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_from_env() -> torch.device:
    """Join the process group `torchrun` describes (RANK, WORLD_SIZE), if any and not joined yet: nccl on
    the GPU of LOCAL_RANK where CUDA is available, else gloo. Returns this process's device."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group("nccl")
        else:
            dist.init_process_group("gloo")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def usable_device(name: str, flag: str) -> torch.device:
    """The device `name` names, checked present before anything is placed on it, so that a device this
    machine lacks (`cuda` on a CPU-only torch, `cuda:7` on a one-GPU machine) is one error naming `flag`
    rather than a traceback at the first forward. ConfigError naming the flag, what was found, why, and the
    devices this machine has."""
    reason = _device_absence(name)
    if reason is not None:
        raise ConfigError(
            f"{flag} {name!r} is not a device this machine has ({reason}); expected one of: "
            f"{', '.join(present_devices())}"
        )
    return torch.device(name)


def _device_absence(name: str) -> str | None:
    """Why this process cannot use the device `name` (None: it can)."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        return f"not a torch device: {str(exc).strip().splitlines()[0]}"
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu, ...
    if device.type != "cpu" and callable(getattr(backend, "is_available", None)):
        if not backend.is_available():
            built = ""
            if device.type == "cuda":
                built = f", built with CUDA {torch.version.cuda}" if torch.version.cuda else ", a CPU-only build"
            return f"this torch ({torch.__version__}{built}) sees no {device.type} device"
        count = backend.device_count() if callable(getattr(backend, "device_count", None)) else None
        if device.index is not None and count is not None and device.index >= count:
            return f"this machine has {count} {device.type} device(s), 0 to {count - 1}"
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def present_devices() -> list[str]:
    """The devices this process can use: cpu, then each GPU (`cuda`, `cuda:0`, ...) or `mps` when present."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def all_reduce_sum(value: int, group: ProcessGroup | None = None) -> int:
    """`value` summed over the ranks of `group` (None: the world; every rank of it calls this)."""
    if data_parallel_in(group)[0] == 1:
        return int(value)
    t = torch.tensor([value], dtype=torch.int64, device=_device())
    dist.all_reduce(t, group=group)
    return int(t.item())


def all_reduce_max_many(values: Sequence[int]) -> list[int]:
    """The element-wise largest of `values` over ranks (one collective; every rank passes as many)."""
    if world()[0] == 1:
        return [int(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.int64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def all_reduce_max(value: int) -> int:
    """The largest `value` over ranks."""
    return all_reduce_max_many([value])[0]


class TaskAgreement:
    """The failure-agreement points of one task's evaluation on this rank (see the module docstring).

    Every rank must create one per task and call `agree` the same number of times; a rank whose own code
    raised calls `report_failure` once instead of its remaining `agree` calls.
    """

    def __init__(self, title: str) -> None:
        self.title = title  # the evaluation as messages name it, e.g. `task 'piqa'`
        self.points_passed = 0
        self.closed = False

    def agree(self, value: int = 0, *, last: bool = False) -> int:
        """Join the next point; returns the largest `value` over ranks.

        last: this is the task's final point (after it, a local failure is no longer reported).
        Raises TaskFailedOnAnotherRank when another rank reported a failure at this point.
        """
        if self.closed:
            raise RuntimeError(f"{self.title}: agreement point after the last one")
        value_max, failed = all_reduce_max_many([value, 0])
        self.points_passed += 1
        self.closed = last or bool(failed)
        if failed:
            raise TaskFailedOnAnotherRank(
                f"{self.title}: evaluation failed on rank {failed - 1} (its log has the reason); "
                f"this rank stopped at agreement point {self.points_passed} with it"
            )
        return value_max

    def agree_same(self, value: int, what: str) -> None:
        """Join the next two points with `value` (a fingerprint, at most 62 bits) and its negation; raise
        `ConfigError` on every rank when the ranks' values differ (`what` names what they fingerprint)."""
        highest = self.agree(value)
        lowest = -self.agree(-value)
        if highest != lowest:
            raise ConfigError(
                f"{self.title}: {what} differ across ranks (fingerprints {lowest:x} to {highest:x}); every rank "
                "must be given the same task data and tokenizer"
            )

    def failure_agreed(self) -> None:
        """Record that every rank already knows of this task's failure, from a collective of the caller's own
        (`agree_failures`), so that `report_failure` joins nothing more on any rank."""
        self.closed = True

    def report_failure(self) -> None:
        """On a rank whose own evaluation raised: join the next point with the failure flag, so that the
        other ranks stop there too. A no-op after the last point or when a failure was already agreed."""
        if self.closed:
            return
        self.closed = True
        _, rank = world()
        all_reduce_max_many([0, rank + 1])


def agree_failures(failed: Sequence[bool]) -> list[int | None]:
    """For each item (the same items in the same order on every rank: an evaluator's domain labels), the
    lowest rank on which it failed, or None where it failed on none. One all-reduce; every rank calls it."""
    world_size, rank = world()
    top = all_reduce_max_many([world_size - rank if f else 0 for f in failed])
    return [world_size - t if t else None for t in top]


def run_agreed(name: str, body: Callable[[TaskAgreement], _T], *, strict: bool) -> _T | None:
    """Run one evaluator's work under failure agreement: `body(agreement)` joins the agreement's points and
    returns its result; its final point follows. On a failure on any rank every rank logs it and returns
    None (or, with `strict`, raises: the rank that failed its own exception, the others
    TaskFailedOnAnotherRank)."""
    agreement = TaskAgreement(name)
    try:
        result = body(agreement)
        agreement.agree(last=True)
    except Exception as exc:
        if not isinstance(exc, TaskFailedOnAnotherRank):
            agreement.report_failure()
        if strict:
            raise
        log.error("in-loop eval of %s failed: %s: %s", name, type(exc).__name__, exc)
        return None
    return result


class AgreedSequence(Sequence[_T]):
    """`items` (a plan of forward passes), where iterating joins `agreement`'s next point before every item
    but the first. A rank that fails while handling one item (scoring a batch) thus stops the other ranks
    before their next forward pass rather than leaving them inside that forward's collectives.
    `len` and indexing join nothing; every rank must iterate the same number of times."""

    def __init__(self, items: Sequence[_T], agreement: TaskAgreement) -> None:
        self._items = list(items)
        self.agreement = agreement

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> _T: ...
    @overload
    def __getitem__(self, i: slice) -> list[_T]: ...
    def __getitem__(self, i: int | slice) -> _T | list[_T]:
        return self._items[i]

    def __iter__(self) -> Iterator[_T]:
        for i, item in enumerate(self._items):
            if i:
                self.agreement.agree()
            yield item
