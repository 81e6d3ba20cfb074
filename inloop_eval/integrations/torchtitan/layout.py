"""A torchtitan model built in a parallel layout for loading sharded weights (the watcher's `--tp`, `--fsdp`):
its config updated from the trainer config as torchtitan's trainer does (`update_from_config`: each module's
sharding plan), built on the meta device, parallelised by the model's own `parallelize_fn` (its tensor
parallel plan, FSDP2 over its data-parallel mesh), then materialised: each rank allocates only its share of
the weights before any is read. The trainer config's parallelism degrees are replaced by the layout's; the
rest (mixed precision, SPMD backend, compile) is the config's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torchtitan.distributed import ParallelDims

from inloop_eval.checkpoints.layout import ParallelLayout
from inloop_eval.distributed import world
from inloop_eval.integrations.torchtitan.adapter import TorchTitanAdapter
from inloop_eval.integrations.torchtitan.validator import data_parallel_mesh


@dataclass
class TorchTitanLayout:
    """torchtitan's parallel dims for `tp` x (FSDP or replicate) over `world_size` ranks."""

    dims: ParallelDims

    @classmethod
    def of(cls, trainer_config: Any, *, tp: int, fsdp: bool, world_size: int) -> TorchTitanLayout:
        """The parallel dims of the layout, their mesh built (every rank)."""
        cls.set_degrees(trainer_config, tp=tp, fsdp=fsdp, world_size=world_size)
        dims = ParallelDims.from_config(trainer_config.parallelism, world_size)
        dims.build_mesh()
        return cls(dims=dims)

    @staticmethod
    def set_degrees(trainer_config: Any, *, tp: int, fsdp: bool, world_size: int) -> None:
        """The trainer config's parallelism degrees set to the layout's (its `parallelize_fn` reads them)."""
        parallelism = trainer_config.parallelism
        dp = world_size // tp
        parallelism.tensor_parallel_degree = tp
        parallelism.data_parallel_shard_degree = dp if fsdp else 1
        parallelism.data_parallel_replicate_degree = 1 if fsdp else dp
        parallelism.context_parallel_degree = parallelism.pipeline_parallel_degree = 1
        parallelism.expert_parallel_degree = 1


def build_in_layout(
    trainer_config: Any, layout: ParallelLayout, device: torch.device
) -> tuple[nn.Module, TorchTitanAdapter, Any]:
    """The model of torchtitan trainer config `trainer_config` parallelised in `layout` (torchtitan's parallel
    dims built at the first call, kept in `layout.built`), its local shards allocated on `device` and
    initialised (buffers such as the rotary tables; the weights are then read); (the model, the adapter
    scoring it as the validator does: widths a multiple of the layout's sequence split, the data-parallel
    mesh the documents are sharded over: the validator's "batch" mesh)."""
    if "torchtitan" not in layout.built:
        layout.built["torchtitan"] = TorchTitanLayout.of(
            trainer_config, tp=layout.tp, fsdp=layout.fsdp, world_size=world()[0]
        )
    titan: TorchTitanLayout = layout.built["torchtitan"]
    TorchTitanLayout.set_degrees(trainer_config, tp=layout.tp, fsdp=layout.fsdp, world_size=world()[0])
    model_config = trainer_config.model_spec.model
    # As torchtitan's trainer: the runtime config sets each module's sharding config (its TP plan) first.
    model_config.update_from_config(config=trainer_config)
    with torch.device("meta"):
        model = model_config.build()
    model = trainer_config.model_spec.parallelize_fn(
        model,
        parallel_dims=titan.dims,
        training=trainer_config.training,
        parallelism=trainer_config.parallelism,
        compile_config=trainer_config.compile,
        ac_config=None,  # no backward in an evaluation
        dump_folder=trainer_config.dump_folder,
    )
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    adapter = TorchTitanAdapter(
        model, forward=model, max_length=None, seq_multiple=titan.dims.seq_len_divisor
    )
    return model, adapter, data_parallel_mesh(titan.dims)
