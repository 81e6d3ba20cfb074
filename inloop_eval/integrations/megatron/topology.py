"""How a Megatron-core `GPTModel` is split over this rank: read once from the model chunks and their process
groups, with the set-ups the evaluator cannot score refused up front (`ConfigError`, the same on every rank:
every rank holds chunks of the same configuration).

Scored: tensor parallelism (the output layer's logits sharded over the vocabulary, `parallel_output=True`, or
gathered), sequence parallelism, pipeline parallelism with or without virtual stages (a list of chunks),
data parallelism over `parallel_state`'s data-parallel group, and their products. Refused: context
parallelism (Megatron's local attention refuses `context_parallel_size > 1`, transformer/dot_product_attention.py;
only Transformer Engine's attention runs it, and that needs CUDA, so it was never run here), expert
parallelism over several ranks (its all-to-all would pair data-parallel ranks' different batches; not run
here), multi-token prediction (its forward needs labels), and any module that is not a `GPTModel`.

Packed rows are taken where the attention route was verified (`attention.packing_refusal`: learned
absolute positions, none or RoPE, and Megatron's local `DotProductAttention`); elsewhere rows are one request
each, for the reason `packing_blocker` names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from megatron.core.models.gpt import GPTModel
from torch import nn
from torch.distributed import ProcessGroup

from inloop_eval.engine.adapter import refuse_model
from inloop_eval.errors import ConfigError
from inloop_eval.integrations.megatron.attention import packing_refusal


@dataclass(frozen=True)
class MegatronTopology:
    """This rank's place in the model: its tensor-parallel group and rank, its pipeline group and rank, the
    virtual stages it holds (its chunks), what the schedule needs to size its micro-batches, and why rows
    cannot be packed ('' when they can)."""

    tp_group: ProcessGroup | None
    tp_size: int
    tp_rank: int
    pp_group: ProcessGroup | None
    pp_size: int
    pp_rank: int
    n_chunks: int
    sequence_parallel: bool
    microbatch_group: int
    vocab_size: int
    max_length: int
    hidden_size: int
    packing_blocker: str

    @property
    def has_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def sequence_multiple(self) -> int:
        """Widths the model requires a multiple of: sequence parallelism cuts every sequence over TP."""
        return self.tp_size if self.sequence_parallel else 1

    def microbatch_multiple(self) -> int:
        """Micro-batches per schedule call must be a multiple of this: the interleaved schedule runs them in
        groups of `microbatch_group_size_per_vp_stage` (at least the pipeline size)."""
        return self.microbatch_group if self.n_chunks > 1 else 1


def unwrap_gpt(chunk: Any) -> Any:
    """The `GPTModel` inside a chunk: Megatron's DDP and Float16Module hold it as `.module`."""
    inner = chunk
    while not isinstance(inner, GPTModel) and isinstance(getattr(inner, "module", None), nn.Module):
        inner = inner.module
    if not isinstance(inner, GPTModel):
        raise ConfigError(
            f"MegatronAdapter: expected a megatron.core GPTModel (or a list of its chunks, wrapped or not by "
            f"Megatron's DistributedDataParallel / Float16Module), found {type(chunk).__name__}"
        )
    return inner


def _size_and_rank(group: ProcessGroup | None) -> tuple[int, int]:
    if group is None:
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def read_topology(chunks: Sequence[Any]) -> MegatronTopology:
    """The topology of this rank's model chunks (one per virtual pipeline stage, in order); ConfigError for a
    topology the evaluator does not score."""
    if not chunks:
        raise ConfigError(
            "MegatronAdapter: no model chunks; pass the model (or list of chunks) Megatron trains"
        )
    gpts = [unwrap_gpt(c) for c in chunks]
    first = gpts[0]
    config = first.config
    groups = first.pg_collection
    cp_size = max(_size_and_rank(getattr(groups, "cp", None))[0], getattr(config, "context_parallel_size", 1))
    if cp_size > 1:
        refuse_model(
            f"a Megatron-core model under context parallelism ({cp_size} ranks)",
            "Megatron-core runs it only in Transformer Engine's attention (its local DotProductAttention "
            "refuses context_parallel_size > 1), which needs CUDA, so it was never run here",
            "evaluate a topology without context parallelism",
        )
    if getattr(config, "expert_model_parallel_size", 1) > 1:
        refuse_model(
            f"a Megatron-core model under expert parallelism over {config.expert_model_parallel_size} ranks",
            "its all-to-all spans data-parallel ranks, which are fed different batches",
            "evaluate with expert_model_parallel_size=1",
        )
    if getattr(config, "mtp_num_layers", None):
        refuse_model(
            "a Megatron-core model with multi-token prediction (mtp_num_layers set)",
            "its forward needs labels",
            "evaluate the model built without MTP layers",
        )
    if any(g.config.sequence_parallel != config.sequence_parallel for g in gpts):
        raise ConfigError(
            "MegatronAdapter: the model chunks disagree on sequence_parallel; pass one model's chunks"
        )
    tp_group = getattr(groups, "tp", None)
    pp_group = getattr(groups, "pp", None)
    tp_size, tp_rank = _size_and_rank(tp_group)
    pp_size, pp_rank = _size_and_rank(pp_group)
    return MegatronTopology(
        tp_group=tp_group if tp_size > 1 else None,
        tp_size=tp_size,
        tp_rank=tp_rank,
        pp_group=pp_group if pp_size > 1 else None,
        pp_size=pp_size,
        pp_rank=pp_rank,
        n_chunks=len(gpts),
        sequence_parallel=bool(config.sequence_parallel and tp_size > 1),
        microbatch_group=int(getattr(config, "microbatch_group_size_per_vp_stage", None) or pp_size),
        vocab_size=int(first.vocab_size),
        max_length=int(first.max_sequence_length),
        hidden_size=int(config.hidden_size),
        packing_blocker=packing_refusal(nn.ModuleList(gpts)) or "",
    )
