"""The parallel layout the watcher builds each checkpoint's model in under torchrun (`--tp N`, `--fsdp`), and
its device mesh.

Without either option every rank holds the whole model and the documents are sharded over the world (the
watcher as it always was). With them the world is a [dp, tp] mesh, tp innermost: the model is split over the
`tp` ranks of each row by its framework's tensor parallelism, and with `--fsdp` sharded over the `dp` ranks
by FSDP2 (else replicated over them); the documents are sharded over `dp`. Each rank then holds and reads
only its share of the weights (`shard_reads`), and the checkpoint's own training layout does not matter:
torch.distributed.checkpoint reshards between it and the watcher's.

What every rank promises: the same layout options and the same checkpoints in the same order (rank 0
decides, `loop`), so the collectives that build the mesh and load the weights match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from inloop_eval.distributed import world
from inloop_eval.errors import ConfigError


@dataclass
class ParallelLayout:
    """The watcher's parallel layout: `tp` ranks split each model (tensor parallel), `fsdp` shards it over
    the data-parallel ranks. `mesh` is built at the first sharded load, on every rank."""

    tp: int = 1
    fsdp: bool = False
    device_type: str = "cpu"
    built: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def sharded(self) -> bool:
        return self.tp > 1 or self.fsdp

    def check(self) -> None:
        """ConfigError for a layout this world cannot take: fewer ranks than `tp`, or not a multiple of it."""
        size = world()[0]
        if not self.sharded:
            return
        if size % self.tp:
            raise ConfigError(
                f"watch: --tp {self.tp} needs a world size that is a multiple of it, found {size} processes; "
                f"launch with torchrun --nproc_per_node {self.tp} (or a multiple)"
            )
        if size == 1:
            raise ConfigError(
                "watch: --fsdp shards the model over the processes of torchrun, found 1; launch with "
                "torchrun --nproc_per_node 2 (or more), or drop --fsdp"
            )

    def mesh(self) -> DeviceMesh:
        """The [dp, tp] device mesh over the world (built once, by every rank)."""
        if "mesh" not in self.built:
            size = world()[0]
            self.built["mesh"] = init_device_mesh(
                self.device_type, (size // self.tp, self.tp), mesh_dim_names=("dp", "tp")
            )
        return self.built["mesh"]

    def dp_group(self) -> ProcessGroup | None:
        """The data-parallel group the documents are sharded over; None (the world) when not sharded."""
        return self.mesh()["dp"].get_group() if self.sharded else None

    def describe(self) -> str:
        if not self.sharded:
            return "every rank the whole model"
        dp = world()[0] // self.tp
        shards = f"FSDP over {dp}" if self.fsdp else f"replicated over {dp}"
        return f"tensor parallel {self.tp} x {shards}"


def layout_for(tp: int, fsdp: bool, device: torch.device) -> ParallelLayout:
    """The checked layout of the options `tp` and `fsdp` on `device`'s kind."""
    layout = ParallelLayout(tp=tp, fsdp=fsdp, device_type=device.type)
    layout.check()
    return layout
