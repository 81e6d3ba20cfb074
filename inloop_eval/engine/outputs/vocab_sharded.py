"""Logits sharded over the vocabulary (a tensor-parallel output head): target log-probabilities without
gathering the vocabulary.

A head parallelised torchtitan's way (`ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)`)
returns a DTensor whose ranks each hold a contiguous slice of the vocabulary (torch.chunk's split). The
log-softmax then needs only per-position figures from every slice: the max (all-reduce MAX), the sum of
exponentials below it (SUM), the target's logit from the slice that owns it (SUM of zeros elsewhere), and for
the greedy flag the lowest index reaching the max (MIN). Every rank of the tensor-parallel group scores the
same positions and makes the same four all-reduces per chunk; nothing wider than [C, V/TP] is allocated.
`logits_outputs` and `selected_logits` read the layout off the tensor itself (a DTensor's placements): full
logits for a plain or replicated tensor, `VocabSharded` for one sharded on the vocabulary. `ShardedHead`
is the head itself split so (a linear head whose weight is a DTensor sharded on its rows, `sharded_head`):
every rank of its group projects the same features a chunk at a time onto its rows and scores them alike,
so not even [U, V/TP] logits exist. Its ranks may also hold different features (a head whose rows are split
over data-parallel ranks, each with its own documents): `exchanged_logprobs` gathers every rank's features
and targets, scores them all on every rank, and keeps this rank's.
Legend: B rows, T time, U positions read, C positions of one chunk, L this rank's slice of the vocabulary,
M targets of the chunk, V vocabulary, X hidden width, N targets, A and G every rank's positions and targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from inloop_eval.distributed import gather_rows
from inloop_eval.engine.adapter import ForwardInputs, HeadWorkspace
from inloop_eval.engine.logprobs import HostTargets, check_vocab, chunked_logprobs, on_host
from inloop_eval.engine.outputs.full_logits import FullLogits
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
    if logits_CV.dim() != 2:
        _refuse_placements(logits_CV.device_mesh, logits_CV.placements)
    sliced = _vocab_slice(logits_CV.device_mesh, logits_CV.placements, int(logits_CV.shape[-1]), (1, -1))
    local_CL = logits_CV.to_local().float()
    return local_CL if sliced is None else VocabShard(local_CL, *sliced)


def _vocab_slice(
    mesh: DeviceMesh, placements: tuple[Placement, ...], vocab: int, vocab_dims: tuple[int, ...]
) -> tuple[int, ProcessGroup] | None:
    """(first token id of this rank's slice, the group holding the others) of logits sharded on the
    vocabulary (tensor dimension `vocab_dims`) over one mesh dimension, the others replicated; None when no
    mesh dimension shards them; ModelOutputError for any other layout."""
    sharding = [d for d, p in enumerate(placements) if isinstance(p, Shard) and p.dim in vocab_dims]
    others = [p for d, p in enumerate(placements) if d not in sharding and not isinstance(p, Replicate)]
    if others or len(sharding) > 1:
        _refuse_placements(mesh, placements)
    if not sharding:
        return None
    dim = sharding[0]
    start = min(mesh.get_local_rank(dim) * -(-vocab // mesh.size(dim)), vocab)  # torch.chunk's split
    return start, mesh.get_group(dim)


def _refuse_placements(mesh: DeviceMesh, placements: tuple[Placement, ...]) -> NoReturn:
    raise ModelOutputError(
        f"model output: logits as a DTensor with placements {tuple(placements)} on mesh "
        f"{mesh.mesh_dim_names or tuple(mesh.shape)}; expected them sharded on the vocabulary "
        "(Shard(-1)) over one mesh dimension and replicated over the others"
    )


def sharded_logprobs(
    shard: VocabShard, local_M: Tensor, target_M: Tensor, *, in_place: bool = False
) -> tuple[Tensor, Tensor]:
    """log p(target) [M] and whether the target is the argmax [M] (ties to the lowest id, as argmax),
    for targets predicted by the chunk's positions `local_M`, over the whole vocabulary.
    in_place: the logits are the caller's scratch: their exponentials are taken where they are (after every
    other read of them), not in a copy of [C, L]."""
    logits_CL, group = shard.logits_CL, shard.group
    width = logits_CL.shape[1]
    max_C = logits_CL.amax(dim=-1)
    dist.all_reduce(max_C, op=dist.ReduceOp.MAX, group=group)
    shift_C = torch.where(torch.isfinite(max_C), max_C, torch.zeros_like(max_C))  # as torch.logsumexp does
    owned_M = (target_M >= shard.start) & (target_M < shard.start + width)
    slot_M = (target_M - shard.start).clamp(0, max(width - 1, 0))
    picked_M = logits_CL[local_M, slot_M] if width else torch.zeros_like(target_M, dtype=torch.float32)
    first_C = _first_argmax(logits_CL, max_C, shard.start)
    shifted_CL = logits_CL.sub_(shift_C[:, None]) if in_place else logits_CL - shift_C[:, None]
    sumexp_C = shifted_CL.exp_().sum(dim=-1)
    dist.all_reduce(sumexp_C, group=group)
    logit_M = torch.where(owned_M, picked_M, torch.zeros_like(picked_M))
    dist.all_reduce(logit_M, group=group)
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


@dataclass
class VocabSharded:
    """This rank's slice [U, L] of the logits of the positions read, over token ids `start`..`start + L - 1` of
    `vocab`, the other slices on the other ranks of `group` (which score the same positions together)."""

    local_UL: Tensor
    start: int
    vocab: int
    group: ProcessGroup

    @property
    def width(self) -> int:
        return self.vocab

    def target_logprobs(self, inputs: ForwardInputs, workspace: HeadWorkspace) -> tuple[Tensor, Tensor]:
        host = on_host(inputs.position_N, inputs.target_N, inputs.host_targets)
        check_vocab(self.vocab, host.max_target, inputs.min_vocab)

        def score(start: int, stop: int, local_M: Tensor, target_M: Tensor) -> tuple[Tensor, Tensor]:
            shard = VocabShard(self.local_UL[start:stop].float(), self.start, self.group)
            return sharded_logprobs(shard, local_M, target_M)

        n_positions = self.local_UL.shape[0]
        return chunked_logprobs(n_positions, self.vocab, inputs.position_N, inputs.target_N, host, score)


@dataclass
class ShardedHead:
    """A linear head split on the vocabulary: this rank's rows `weight_LX` (and `bias_L`) project onto token ids
    `start`..`start + L - 1` of `vocab`, the other rows on the other ranks of `group`."""

    weight_LX: Tensor
    bias_L: Tensor | None
    start: int
    vocab: int
    group: ProcessGroup

    def target_logprobs(
        self,
        features_UX: Tensor,
        target_N: Tensor,
        min_vocab: int,
        position_N: Tensor,
        workspace: HeadWorkspace,
        host: HostTargets | None = None,
    ) -> tuple[Tensor, Tensor]:
        """log p(target) [N] and the greedy flags [N] of targets predicted by the features [U, X], the same
        on every rank of the group (each rank passes the same features and targets: the collectives of
        `sharded_logprobs`, one round per chunk of positions)."""
        host = on_host(position_N, target_N, host)
        check_vocab(self.vocab, host.max_target, min_vocab)
        width = int(self.weight_LX.shape[0])

        def score(start: int, stop: int, local_M: Tensor, target_M: Tensor) -> tuple[Tensor, Tensor]:
            out_CL = workspace.get(stop - start, width, features_UX.device)
            x_CX = features_UX[start:stop].to(self.weight_LX.dtype)
            if self.bias_L is None:
                torch.mm(x_CX, self.weight_LX.t(), out=out_CL)
            else:
                torch.addmm(self.bias_L, x_CX, self.weight_LX.t(), out=out_CL)
            return sharded_logprobs(VocabShard(out_CL, self.start, self.group), local_M, target_M, in_place=True)

        return chunked_logprobs(features_UX.shape[0], self.vocab, position_N, target_N, host, score)


def exchanged_logprobs(
    head: ShardedHead,
    features_UX: Tensor,
    target_N: Tensor,
    min_vocab: int,
    position_N: Tensor,
    workspace: HeadWorkspace,
) -> tuple[Tensor, Tensor]:
    """`head.target_logprobs` when each rank of `head.group` has features and targets of its own (the head's
    rows split over data-parallel ranks): every rank's gathered (features, then (position, target) pairs with
    the positions moved past the earlier ranks' features), all scored by every rank alike, this rank's kept.
    Each rank makes the same collectives whatever it holds (none at all: a rank's dummy batch)."""
    features_AX, first_u = gather_rows(features_UX, head.group)
    pairs_N2 = torch.stack([position_N.long() + first_u, target_N.long()], dim=1)
    pairs_G2, first_n = gather_rows(pairs_N2, head.group)
    logp_G, greedy_G = head.target_logprobs(features_AX, pairs_G2[:, 1], min_vocab, pairs_G2[:, 0], workspace)
    mine = slice(first_n, first_n + target_N.shape[0])
    return logp_G[mine], greedy_G[mine]


def sharded_head(linear: nn.Linear) -> ShardedHead | None:
    """The head `linear` as this rank's rows of the vocabulary, when its weight is a float32 DTensor sharded on
    its rows (the vocabulary) over one mesh dimension and replicated over the others (a column-wise
    tensor-parallel head); None for a plain or replicated weight. ModelOutputError for any other layout."""
    weight = linear.weight
    if not isinstance(weight, DTensor) or weight.dtype != torch.float32:
        return None
    vocab = int(weight.shape[0])
    sliced = _vocab_slice(weight.device_mesh, weight.placements, vocab, (0, -2))
    if sliced is None:
        return None
    bias = linear.bias
    bias_L = bias.to_local() if isinstance(bias, DTensor) else None
    if bias is not None and (bias_L is None or bias_L.shape[0] != weight.to_local().shape[0]):
        _refuse_placements(weight.device_mesh, getattr(bias, "placements", ()))
    return ShardedHead(weight.to_local(), bias_L, sliced[0], vocab, sliced[1])


def logits_outputs(logits_UV: Tensor) -> FullLogits | VocabSharded:
    """Logits [U, V] of the positions read, in the layout their tensor has: `VocabSharded` for a DTensor
    sharded on the vocabulary, else `FullLogits` (a replicated DTensor's local copy)."""
    if not isinstance(logits_UV, DTensor):
        return FullLogits(logits_UV)
    if logits_UV.dim() != 2:
        _refuse_placements(logits_UV.device_mesh, logits_UV.placements)
    vocab = int(logits_UV.shape[-1])
    sliced = _vocab_slice(logits_UV.device_mesh, logits_UV.placements, vocab, (1, -1))
    if sliced is None:
        return FullLogits(logits_UV.to_local())
    return VocabSharded(logits_UV.to_local(), sliced[0], vocab, sliced[1])


def selected_logits(logits_BTV: Tensor, rows_U: Tensor, cols_U: Tensor) -> FullLogits | VocabSharded:
    """The logits at (rows_U, cols_U) of logits [B, T, V]: of a DTensor sharded on the vocabulary, this
    rank's slice indexed locally (nothing gathered)."""
    if not isinstance(logits_BTV, DTensor):
        return FullLogits(logits_BTV[rows_U, cols_U])
    placements = logits_BTV.placements
    if any(isinstance(p, Shard) and p.dim in (0, 1, -3, -2) for p in placements):
        raise ModelOutputError(
            f"model output: logits as a DTensor with placements {tuple(placements)}: sharded on the batch or "
            "the sequence, which only an adapter that gathers the sequence reads; shard them on "
            "the vocabulary (Shard(-1)) or return full logits"
        )
    local_UL = logits_BTV.to_local()[rows_U, cols_U]
    vocab = int(logits_BTV.shape[-1])
    sliced = _vocab_slice(logits_BTV.device_mesh, placements, vocab, (2, -1))
    if sliced is None:
        return FullLogits(local_UL)
    return VocabSharded(local_UL, sliced[0], vocab, sliced[1])
