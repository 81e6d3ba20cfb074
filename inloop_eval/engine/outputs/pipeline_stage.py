"""Scores made on a pipeline's last stage: that stage alone holds logits, scores the targets there and
broadcasts a status, the log-probabilities and the greedy flags over the pipeline group (2N + 1 floats per
batch), so every stage returns the same scores, or raises the same error (engine/adapters/pipeline.py runs the
schedule).
Legend: N targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from inloop_eval.engine.adapter import ForwardInputs, HeadWorkspace
from inloop_eval.errors import ModelOutputError


@dataclass
class ScoredTargets:
    """log p(target) [N] and greedy flags [N] already computed (on the last stage) and shared with this rank;
    width: the vocabulary they were scored over."""

    logp_N: Tensor
    greedy_N: Tensor
    width: int

    def target_logprobs(self, inputs: ForwardInputs, workspace: HeadWorkspace) -> tuple[Tensor, Tensor]:
        return self.logp_N, self.greedy_N


def share_from_last_stage(
    scores_2N: Tensor, failure: str, group: ProcessGroup | None, last_rank: int
) -> tuple[Tensor, Tensor]:
    """Broadcast the last stage's status and scores (`scores_2N`: [1 + 2N], status 1.0 when scored) to the
    pipeline group; every rank raises the last stage's failure (`failure`, known on that rank)."""
    dist.broadcast(scores_2N, group=group, group_src=last_rank)
    if scores_2N[0] != 1.0:
        message = [failure]
        dist.broadcast_object_list(message, group=group, group_src=last_rank)
        raise ModelOutputError(message[0])
    n = (scores_2N.shape[0] - 1) // 2
    return scores_2N[1 : 1 + n], scores_2N[1 + n :] == 1.0
