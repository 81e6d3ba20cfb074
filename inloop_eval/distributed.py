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
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, overload

import torch
import torch.distributed as dist

from inloop_eval.errors import InLoopEvalError

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class TaskFailedOnAnotherRank(InLoopEvalError):
    """Another rank's evaluation of this task raised; this rank stopped at the same point."""


def world() -> tuple[int, int]:
    """(world size, rank); (1, 0) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


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


def all_reduce_sum(value: int) -> int:
    """`value` summed over ranks (every rank calls this)."""
    if world()[0] == 1:
        return int(value)
    t = torch.tensor([value], dtype=torch.int64, device=_device())
    dist.all_reduce(t)
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
