"""What the packing tests compare against, independent of the planner: each task's requests, and one plain
forward per request over its own row (context + continuation[:-1]) with a float64 log-softmax over the whole
vocabulary; and what they share: the plans they score through (`packed_plan`, `unpacked_plan`, `score`), a
packed batch a model that does not pack must refuse, and the state a routed forward must leave as it was."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inloop_eval.engine.adapter import AdapterNeeds, TokenCount
from inloop_eval.engine.batching import Batch, BatchShape, plan_batches
from inloop_eval.engine.scoring import PairScores, run_batches
from inloop_eval.requests.table import PairSet, build_requests
from inloop_eval.tasks import get_task, load_docs

# The context length of the tiny models the packing tests build.
MAX_LENGTH = 512
# The logits [n, V] at the last n positions of one row [1, T].
LastLogits = Callable[[torch.Tensor, int], torch.Tensor]


def task_pairs(
    names: Iterable[str], data_root: Path, tokenizer: Any, n_docs: int, max_length: int
) -> dict[str, tuple[PairSet, np.ndarray]]:
    """Each task's first `n_docs` documents: their pairs, and the ids of the main then unconditional pairs."""
    out = {}
    for name in names:
        task = get_task(name)
        table = build_requests(
            task, load_docs(task, data_root, limit=n_docs), tokenizer, max_length, with_uncond=True
        )
        uncond = np.unique(table.uncond_id)
        out[name] = (
            table.pairs.concat(table.uncond),
            np.concatenate([np.arange(len(table)), len(table) + uncond[uncond >= 0]]),
        )
    return out


def reference_scores(
    last_logits: LastLogits, pairs: PairSet, pair_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Loglikelihood and greedy flag of each request, from one forward of its own row (`last_logits`)."""
    ll, greedy = [], []
    with torch.no_grad():
        for p in pair_ids:
            ctx, cont = pairs.context(int(p)), pairs.continuation(int(p))
            ids = torch.from_numpy(np.concatenate([ctx, cont[:-1]]))[None]
            logp = torch.log_softmax(last_logits(ids, len(cont)).double(), dim=-1)
            target = torch.from_numpy(cont)
            ll.append(float(logp[torch.arange(len(cont)), target].sum()))
            greedy.append(bool((logp.argmax(-1) == target).all()))
    return np.array(ll), np.array(greedy)


def plain_reference(model: Any, pairs: PairSet, pair_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`reference_scores` of a model called on token ids alone, returning logits [1, T, V]."""
    return reference_scores(lambda ids, n: model(ids)[0, -n:], pairs, pair_ids)


def packed_plan(
    keep_prefixes: bool = False,
    batch_tokens: int = 4096,
    width_multiple: int = 1,
    by_cost: bool = False,
    max_length: int = MAX_LENGTH,
) -> dict[str, Any]:
    """`plan_batches` arguments of packed rows; with `keep_prefixes` the plan below kept prefixes (whatever the
    cost model would take, unless `by_cost`); every width, a kept prefix's row included, a multiple of
    `width_multiple`, the adapter's own (as `BatchShape.of` makes it)."""
    needs = AdapterNeeds(width_multiple=width_multiple, packing=True, prefix_reuse=True)
    shape = BatchShape.of(needs, keep_prefixes=keep_prefixes)
    return {"batch_tokens": batch_tokens, "shape": shape, "max_length": max_length, "by_cost": by_cost}


def unpacked_plan(max_length: int = MAX_LENGTH) -> dict[str, Any]:
    """`plan_batches` arguments of one request per row."""
    return {"batch_tokens": 4096, "shape": BatchShape(packing=False), "max_length": max_length}


def score(
    adapter: Any, pairs: PairSet, pair_ids: np.ndarray, rendering: str = "dense", **plan: Any
) -> PairScores:
    """Every request of `pair_ids` scored through `adapter` as `plan` plans them, masks rendered `rendering`."""
    with torch.no_grad():
        batches = plan_batches(pairs, pair_ids, **plan)
        return run_batches(adapter, batches, len(pair_ids), TokenCount(), mask_rendering=rendering)


def one_packed_batch() -> Batch:
    """A packed batch of one context and two continuations: what an adapter that does not pack must refuse."""
    pairs = PairSet(
        ctx_tokens=np.array([11, 12, 13]), ctx_offsets=np.array([0, 3]), ctx_id=np.zeros(2, dtype=np.int64),
        ctx_start=np.zeros(2, dtype=np.int64), ctx_end=np.array([3, 3]),
        cont_tokens=np.array([21, 22, 31, 32]), cont_offsets=np.array([0, 2, 4]),
    )  # fmt: skip
    (batch,) = plan_batches(pairs, np.arange(2), 4096, BatchShape(packing=True), max_length=64)
    return batch


def model_state(model: torch.nn.Module, schedule_attributes: Collection[str] = ()) -> tuple:
    """What a routed forward must leave as it was: every module's class and instance attributes (a `forward`,
    a compiled call, anything added but the `schedule_attributes` the framework's own schedule sets in every
    run, training's too), parameters and buffers (values, objects), and its hooks."""
    return (
        [
            (
                type(m),
                sorted(set(m.__dict__) - set(schedule_attributes)),
                m.__dict__.get("forward"),
                m._compiled_call_impl,
            )
            for m in model.modules()
        ],
        [(name, t, t.clone()) for name, t in [*model.named_parameters(), *model.named_buffers()]],
        [(dict(m._forward_hooks), dict(m._forward_pre_hooks)) for m in model.modules()],
    )


def assert_same_state(before: tuple, after: tuple) -> None:
    assert before[0] == after[0] and before[2] == after[2]
    for (name, t0, v0), (_, t1, v1) in zip(before[1], after[1], strict=True):
        assert t0 is t1 and torch.equal(v0, v1), name
