"""Checks of an output head and an input embedding split by rows (the vocabulary) over data-parallel ranks
that each forward their own batch (the watcher's `--fsdp` layout of an OLMo-core model), run by the launcher:

    python tests/support/workers/vocabulary_rows_checks.py --data-root DIR --out DIR --checks head,embedding

Every rank builds the same seeded weights (a vocabulary of 37 rows, which torch.chunk splits unevenly), keeps
its rows as a DTensor over a one-dimensional mesh, and scores or embeds inputs of its own (rank 1 none at all
in `head_with_an_empty_rank`); it writes what it computed and the reference from the whole weight (float64
log-softmax; a plain lookup) to `<out>/rank<r>.json`. tests/integrations/test_olmo_core_vocabulary_rows.py
compares them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from inloop_eval.engine.adapter import HeadWorkspace
from inloop_eval.engine.outputs.vocab_sharded import exchanged_logprobs, sharded_head
from inloop_eval.integrations.olmo_core.layout import VocabRowsEmbedding
from workers.launch import checks_main

VOCAB, WIDTH = 37, 8


def split_rows(whole_VX: torch.Tensor, mesh: Any) -> torch.nn.Parameter:
    """This rank's rows of `whole_VX` (torch.chunk's split) as a DTensor parameter over `mesh`."""
    local = torch.chunk(whole_VX, mesh.size())[mesh.get_local_rank()].clone()
    split = DTensor.from_local(local, mesh, (Shard(0),), run_check=False, shape=whole_VX.shape, stride=whole_VX.stride())
    return torch.nn.Parameter(split, requires_grad=False)


def head_scores(positions: int, targets: int) -> dict[str, Any]:
    """This rank's features [positions, X] and targets scored on the split head, and the reference."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    weight_VX = torch.randn(VOCAB, WIDTH, generator=torch.Generator().manual_seed(0))
    linear = torch.nn.Linear(WIDTH, VOCAB, bias=False)
    linear.weight = split_rows(weight_VX, mesh)
    head = sharded_head(linear)
    assert head is not None
    mine = torch.Generator().manual_seed(1 + dist.get_rank())
    features_UX = torch.randn(positions, WIDTH, generator=mine)
    position_N = torch.randint(0, max(positions, 1), (targets,), generator=mine)
    target_N = torch.randint(0, VOCAB, (targets,), generator=mine)
    logp_N, greedy_N = exchanged_logprobs(head, features_UX, target_N, VOCAB, position_N, HeadWorkspace())
    logits_NV = (features_UX.double() @ weight_VX.double().t())[position_N]
    reference_N = torch.log_softmax(logits_NV, dim=-1).gather(1, target_N[:, None])[:, 0]
    return {
        "logp": logp_N.tolist(),
        "greedy": greedy_N.tolist(),
        "reference_logp": reference_N.tolist(),
        "reference_greedy": (logits_NV.argmax(-1) == target_N).tolist(),
    }


def head(_: Any) -> dict[str, Any]:
    return head_scores(positions=3 + 2 * dist.get_rank(), targets=4 + 3 * dist.get_rank())


def head_with_an_empty_rank(_: Any) -> dict[str, Any]:
    return head_scores(positions=0, targets=0) if dist.get_rank() == 1 else head_scores(positions=5, targets=6)


def embedding(_: Any) -> dict[str, Any]:
    """Token ids of this rank's own shape embedded by the split embedding, and by the whole weight."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    weight_VX = torch.randn(VOCAB, WIDTH, generator=torch.Generator().manual_seed(0))
    rows = VocabRowsEmbedding(VOCAB, WIDTH)
    rows.weight = split_rows(weight_VX, mesh)
    ids_BT = torch.randint(0, VOCAB, (2 + dist.get_rank(), 5), generator=torch.Generator().manual_seed(7 + dist.get_rank()))
    return {"embedded": rows(ids_BT).tolist(), "reference": torch.nn.functional.embedding(ids_BT, weight_VX).tolist()}


CHECKS = {"head": head, "head_with_an_empty_rank": head_with_an_empty_rank, "embedding": embedding}

if __name__ == "__main__":
    checks_main(CHECKS, lambda data_root: Path(data_root))
