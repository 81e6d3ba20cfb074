"""Target log-probabilities from logits sharded over the vocabulary (a tensor-parallel output head), without
gathering the vocabulary.

A head parallelised torchtitan's way (`ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)`)
returns a DTensor whose ranks each hold a contiguous slice of the vocabulary (torch.chunk's split). The
log-softmax then needs only per-position figures from every slice: the max (all-reduce MAX), the sum of
exponentials below it (SUM), the target's logit from the slice that owns it (SUM of zeros elsewhere), and for
the greedy flag the lowest index reaching the max (MIN). Every rank of the tensor-parallel group scores the
same positions and makes the same four all-reduces per chunk; nothing wider than [C, V/TP] is allocated.
Legend: C positions of one chunk, L this rank's slice of the vocabulary, M targets of the chunk, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from inloop_eval.errors import ModelOutputError


@dataclass
class VocabShard:
    """This rank's slice of a chunk's logits: `logits_CL` (float32) over token ids `start`..`start + L - 1`,
    the other slices on the other ranks of `group`."""

    logits_CL: Tensor
    start: int
    group: ProcessGroup


def vocab_shard(logits_CV: DTensor) -> VocabShard | Tensor:
    """This rank's slice of DTensor logits [C, V] sharded on the vocabulary over one mesh dimension (the
    others replicated); the full local tensor when no dimension shards them. Any other layout (sharded on
    positions, partial sums) is a ModelOutputError: scoring it would need a gather this module avoids."""
    mesh, placements = logits_CV.device_mesh, logits_CV.placements
    vocab_dims = [d for d, p in enumerate(placements) if isinstance(p, Shard) and p.dim in (1, -1)]
    others = [p for d, p in enumerate(placements) if d not in vocab_dims and not isinstance(p, Replicate)]
    if others or len(vocab_dims) > 1 or logits_CV.dim() != 2:
        raise ModelOutputError(
            f"model output: logits as a DTensor with placements {tuple(placements)} on mesh "
            f"{mesh.mesh_dim_names or tuple(mesh.shape)}; expected them sharded on the vocabulary "
            "(Shard(-1)) over one mesh dimension and replicated over the others"
        )
    local_CL = logits_CV.to_local().float()
    if not vocab_dims:
        return local_CL
    dim = vocab_dims[0]
    vocab, n_slices = int(logits_CV.shape[-1]), mesh.size(dim)
    start = min(mesh.get_local_rank(dim) * -(-vocab // n_slices), vocab)  # torch.chunk's split
    return VocabShard(local_CL, start, mesh.get_group(dim))


def sharded_logprobs(shard: VocabShard, local_M: Tensor, target_M: Tensor) -> tuple[Tensor, Tensor]:
    """log p(target) [M] and whether the target is the argmax [M] (ties to the lowest id, as argmax),
    for targets predicted by the chunk's positions `local_M`, over the whole vocabulary."""
    logits_CL, group = shard.logits_CL, shard.group
    width = logits_CL.shape[1]
    max_C = logits_CL.amax(dim=-1)
    dist.all_reduce(max_C, op=dist.ReduceOp.MAX, group=group)
    shift_C = torch.where(torch.isfinite(max_C), max_C, torch.zeros_like(max_C))  # as torch.logsumexp does
    sumexp_C = (logits_CL - shift_C[:, None]).exp_().sum(dim=-1)
    dist.all_reduce(sumexp_C, group=group)
    owned_M = (target_M >= shard.start) & (target_M < shard.start + width)
    slot_M = (target_M - shard.start).clamp(0, max(width - 1, 0))
    picked_M = logits_CL[local_M, slot_M] if width else torch.zeros_like(target_M, dtype=torch.float32)
    logit_M = torch.where(owned_M, picked_M, torch.zeros_like(picked_M))
    dist.all_reduce(logit_M, group=group)
    first_C = _first_argmax(logits_CL, max_C, shard.start)
    dist.all_reduce(first_C, op=dist.ReduceOp.MIN, group=group)
    logp_M = logit_M - (sumexp_C.log() + shift_C)[local_M]
    return logp_M, first_C[local_M] == target_M


def _first_argmax(logits_CL: Tensor, max_C: Tensor, start: int) -> Tensor:
    """Per position, the lowest token id of this slice that reaches the global max; int64 max elsewhere."""
    none = torch.iinfo(torch.int64).max
    if logits_CL.shape[1] == 0:
        return torch.full_like(max_C, none, dtype=torch.int64)
    local_max_C, local_arg_C = logits_CL.max(dim=-1)  # the first maximal index, as argmax
    return torch.where(local_max_C >= max_C, local_arg_C + start, torch.full_like(local_arg_C, none))


class VocabShardedLogits:
    """The head of selected rows of vocabulary-sharded logits: wraps this rank's slice [N, L] back into the
    DTensor [N, V] it is part of, so that scoring takes it like a parallel head's output."""

    def __init__(self, mesh: DeviceMesh, placements: tuple[Placement, ...], vocab: int) -> None:
        self.mesh = mesh
        self.placements = placements
        self.vocab = vocab

    def __call__(self, local_NL: Tensor) -> DTensor:
        shape = torch.Size([local_NL.shape[0], self.vocab])
        return DTensor.from_local(
            local_NL, self.mesh, self.placements, run_check=False, shape=shape, stride=(self.vocab, 1)
        )


def select_rows(logits_BTV: DTensor, rows_N: Tensor, cols_N: Tensor) -> tuple[Tensor, VocabShardedLogits]:
    """The logits at (rows_N, cols_N) of DTensor logits [B, T, V] sharded on the vocabulary: this rank's
    slice [N, L] (indexed locally, nothing gathered) and the head that rewraps it."""
    placements = logits_BTV.placements
    if any(isinstance(p, Shard) and p.dim in (0, 1, -3, -2) for p in placements):
        raise ModelOutputError(
            f"model output: logits as a DTensor with placements {tuple(placements)}: sharded on the batch or "
            "the sequence, which is read only from OLMo-core Transformers (OLMoCoreAdapter); shard them on "
            "the vocabulary (Shard(-1)) or return full logits"
        )
    rows = tuple(Shard(1) if isinstance(p, Shard) else p for p in placements)
    local_NL = logits_BTV.to_local()[rows_N, cols_N]
    return local_NL, VocabShardedLogits(logits_BTV.device_mesh, rows, int(logits_BTV.shape[-1]))
