"""An OLMo-core `Transformer` built in a parallel layout for loading sharded weights (the watcher's `--tp`,
`--fsdp`): built on the meta device, split by OLMo-core's own `apply_tp` over the mesh's `tp` dimension and
sharded by its `apply_fsdp` over `dp`, as its train module does, then materialised: each rank allocates only
its share of the weights before any is read."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed import ProcessGroup

from inloop_eval.checkpoints.layout import ParallelLayout


def build_in_layout(
    config: Any, layout: ParallelLayout, device: torch.device
) -> tuple[nn.Module, nn.Module, ProcessGroup | None]:
    """The model of OLMo-core `TransformerConfig` `config`, tensor parallel over the layout mesh's `tp` ranks
    when `layout.tp` > 1, FSDP2 over its `dp` ranks with `layout.fsdp`, its local shards allocated on `device`
    (their values not yet the checkpoint's); (the model, what the evaluator scores: the model itself, the
    data-parallel group the documents are sharded over)."""
    mesh = layout.mesh()
    model = config.build(init_device="meta")
    if layout.tp > 1:
        model.apply_tp(mesh["tp"])
    if layout.fsdp:
        model.apply_fsdp(dp_mesh=mesh["dp"])
        # OLMo-core keeps its output head (and FSDP2 the root) gathered after the forward, for training's
        # backward; an evaluation has none, and a whole head kept from one batch to the next sits beside the
        # next batch's gathered embeddings: every module resharded, each rank holds its share between forwards.
        model.set_reshard_after_forward(True)
    # The local shards allocated, uninitialised: every parameter is then read from the checkpoint (DCP refuses
    # a key it lacks), and OLMo-core keeps no buffers (its RoPE tables are computed on first use). Not
    # `init_weights`: its random init of the sharded parameters holds whole tensors for a while (twice the
    # one-process watcher's peak of a load, measured by an earlier benchmarks/watch_memory.py of loading alone).
    model.to_empty(device=device)
    return model, model, layout.dp_group()
