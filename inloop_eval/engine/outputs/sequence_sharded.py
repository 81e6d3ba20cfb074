"""Logits sharded on the sequence: each rank holds the logits of some of the positions read (OLMo-core's
tensor and Ulysses context parallelism, integrations/olmo_core/adapter.py), scores the targets its positions predict
with a local log-softmax over the full vocabulary, contributes zeros for the others, and one all-reduce (SUM)
of [2, N] per batch over each model-parallel group completes every target's score, exactly.
Legend: U positions read, L of them this rank holds, V vocabulary, N targets, M this rank's targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from inloop_eval.engine.adapter import ForwardInputs, HeadWorkspace
from inloop_eval.engine.logprobs import HostTargets, check_vocab, on_host
from inloop_eval.engine.outputs.projected_head import token_logprobs


@dataclass
class SequenceShard:
    """The logits [L, V] of the selected positions this rank holds, `held_L` their indices among the U
    positions read, and the groups over which the other ranks hold the rest."""

    logits_LV: Tensor
    held_L: Tensor
    n_positions: int
    groups: list[ProcessGroup]

    @property
    def width(self) -> int:
        return int(self.logits_LV.shape[-1])

    def all_reduce(self, scores_XN: Tensor) -> Tensor:
        """`scores_XN` summed over the ranks holding the other positions (in place; returned)."""
        for group in self.groups:
            dist.all_reduce(scores_XN, group=group)
        return scores_XN

    def target_logprobs(self, inputs: ForwardInputs, workspace: HeadWorkspace) -> tuple[Tensor, Tensor]:
        return sequence_shard_logprobs(
            self, inputs.target_N, inputs.min_vocab, inputs.position_N, workspace, inputs.host_targets
        )


def sequence_shard_logprobs(
    shard: SequenceShard,
    target_N: Tensor,
    min_vocab: int,
    position_N: Tensor,
    workspace: HeadWorkspace | None = None,
    host: HostTargets | None = None,
) -> tuple[Tensor, Tensor]:
    """log p(target) [N] and the greedy flag [N] when this rank holds the logits of some positions only:
    its targets scored by `token_logprobs` on its positions, the others zero, then one all-reduce of [2, N]
    over the ranks holding the rest. The vocabulary is checked on every target first, so that every rank
    raises alike or joins the all-reduce. `host`: the same targets on the host (`HostTargets`); which of
    them this rank holds is worked out there, from one copy of `shard.held_L`."""
    host = on_host(position_N, target_N, host)
    check_vocab(shard.width, host.max_target, min_vocab)
    picked_M, mine = held_targets(shard.held_L.cpu().numpy(), shard.n_positions, host)
    scores_2N = torch.zeros(2, target_N.shape[0], dtype=torch.float32, device=target_N.device)
    if picked_M.size:
        picked_dev_M = torch.from_numpy(picked_M).to(target_N.device)
        local_M = torch.from_numpy(mine.position_N).to(target_N.device)
        logp_M, greedy_M = token_logprobs(
            shard.logits_LV, _identity, target_N[picked_dev_M], 0, local_M, workspace, mine
        )
        scores_2N[0, picked_dev_M] = logp_M
        scores_2N[1, picked_dev_M] = greedy_M.float()
    shard.all_reduce(scores_2N)
    return scores_2N[0], scores_2N[1] > 0


def held_targets(held_L: np.ndarray, n_positions: int, host: HostTargets) -> tuple[np.ndarray, HostTargets]:
    """Which of the batch's targets (`host`) the positions `held_L` (indices among the U read) predict: their
    indices [M] among the N, and those targets with their positions among the L held."""
    local_U = np.full(n_positions, -1, dtype=np.int64)
    local_U[held_L] = np.arange(held_L.shape[0])
    local_N = local_U[host.position_N]
    picked_M = np.flatnonzero(local_N >= 0)
    return picked_M, HostTargets(local_N[picked_M], host.target_N[picked_M])


def _identity(x: Tensor) -> Tensor:
    return x
