"""Checks for tests/test_distributed.py: ranks handed different settings (task lists, limits, task order and
count, data-parallel groups, task data, pipeline step shapes), each refused on every rank before any forward;
per check, what each rank raised (or its figures) and how long the check took. They run in the 2-rank launch
of tests/support/workers/world_checks.py, as `agreement_<check>`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import inloop_eval.evaluators.downstream as downstream_module
from inloop_eval.engine.adapters.pipeline import PipelineAdapter
from inloop_eval.errors import InLoopEvalError
from workers.dist_checks import Context, patched, tiny_gpt
from workers.pipeline_checks import BATCH_ROWS, SEQ_LEN, pipeline

COPA = {"task": "copa", "limit": 9, "batch_tokens": 96}
ARC = {"task": "arc_easy", "limit": 7, "batch_tokens": 160}


def outcome(run: Callable[[], Any]) -> dict[str, Any]:
    """What `run` did on this rank: the error it raised (type, message) or its figures, and its seconds."""
    start = time.perf_counter()
    try:
        result: dict[str, Any] = {"metrics": run()}
    except InLoopEvalError as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = time.perf_counter() - start
    return result


def mine(ctx: Context, per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return per_rank[ctx.rank % len(per_rank)]


def check_limits(ctx: Context) -> dict[str, Any]:
    limits = [[COPA], [{**COPA, "limit": 13}]]
    return outcome(lambda: ctx.evaluator(mine(ctx, limits)).run(tiny_gpt()))


def check_task_lists(ctx: Context) -> dict[str, Any]:
    lists = [[COPA], [ARC]]
    return outcome(lambda: ctx.evaluator(mine(ctx, lists)).run(tiny_gpt()))


def check_task_count(ctx: Context) -> dict[str, Any]:
    counts = [[COPA], [COPA, ARC]]
    return outcome(lambda: ctx.evaluator(mine(ctx, counts)).run(tiny_gpt()))


def check_task_order(ctx: Context) -> dict[str, Any]:
    orders = [[COPA, ARC], [ARC, COPA]]
    return outcome(lambda: ctx.evaluator(mine(ctx, orders)).run(tiny_gpt()))


def check_dp_groups(ctx: Context) -> dict[str, Any]:
    """None on rank 0, the world's own group on rank 1; then a group holding rank 0 only, passed by both."""
    world_group = dist.new_group(list(range(ctx.world_size)))
    only_first = dist.new_group([0])
    out = {
        "none_and_group": outcome(
            lambda: ctx.evaluator([COPA]).run(tiny_gpt(), dp_group=None if ctx.rank == 0 else world_group)
        ),
        "not_a_member": outcome(lambda: ctx.evaluator([COPA]).run(tiny_gpt(), dp_group=only_first)),
    }
    return out


def check_task_data(ctx: Context) -> dict[str, Any]:
    """The last rank reads one document fewer (its data differs): the task fails on every rank, or raises on
    every rank with `strict`; the next task gives its figures."""
    load_docs = downstream_module.load_docs

    def short_on_last(task: Any, data_root: Any, limit: int | None = None, spread: bool = False) -> Any:
        docs = load_docs(task, data_root, limit=limit, spread=spread)
        return docs[:-1] if ctx.rank == ctx.world_size - 1 else docs

    with patched(downstream_module, "load_docs", short_on_last):
        lenient = outcome(lambda: ctx.evaluator([ARC]).run(tiny_gpt()))
        strict = outcome(lambda: ctx.evaluator([ARC], strict=True).run(tiny_gpt()))
    after = outcome(lambda: ctx.evaluator([COPA]).run(tiny_gpt()))
    return {"lenient": lenient, "strict": strict, "after": after}


def check_pipeline_arguments(ctx: Context) -> dict[str, Any]:
    """PipelineAdapter arguments wrong on one rank only: no stages, then another step shape."""
    mesh = init_device_mesh("cpu", (1, ctx.world_size), mesh_dim_names=("dp", "pp"))
    schedule, stages = pipeline(tiny_gpt(), mesh)
    last = ctx.world_size - 1
    return {
        "no_stages": outcome(
            lambda: PipelineAdapter(
                schedule, stages if ctx.rank != last else [], batch_rows=BATCH_ROWS, seq_len=SEQ_LEN
            )
        ),
        "step_shape": outcome(
            lambda: PipelineAdapter(
                schedule, stages, batch_rows=BATCH_ROWS, seq_len=SEQ_LEN if ctx.rank != last else SEQ_LEN // 2
            )
        ),
    }


CHECKS: dict[str, Callable[[Context], Any]] = {
    "limits": check_limits,
    "task_lists": check_task_lists,
    "task_count": check_task_count,
    "task_order": check_task_order,
    "dp_groups": check_dp_groups,
    "task_data": check_task_data,
    "pipeline_arguments": check_pipeline_arguments,
}
