"""Agreement between ranks: every rank calls each of these, in the same order.

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
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, overload

import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from inloop_eval.distributed.world import all_reduce_max_many, resolve_data_parallel, world
from inloop_eval.errors import ConfigError, InLoopEvalError

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class TaskFailedOnAnotherRank(InLoopEvalError):
    """Another rank's evaluation of this task raised; this rank stopped at the same point."""


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
