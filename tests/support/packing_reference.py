"""What the packing tests compare against, independent of the planner: each task's requests, and one plain
forward per request over its own row (context + continuation[:-1]) with a float64 log-softmax over the whole
vocabulary."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inloop_eval.requests.table import PairSet, build_requests
from inloop_eval.tasks import get_task, load_docs

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
