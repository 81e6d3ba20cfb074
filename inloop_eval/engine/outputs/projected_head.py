"""Hidden states and the output head: the head projects only the positions read, a chunk at a time, so no
[B, T, V] logits exist (the reference GPT, Hugging Face models whose logits are exactly the head of the last
hidden state, torchtitan models with their head skipped). A head whose output is a DTensor sharded on the
vocabulary (a tensor-parallel head) is scored slice by slice (`vocab_sharded`): the tensor says so.
Legend: U positions read, X feature width (hidden size, or V for logits), V vocabulary, C positions of one
chunk, M targets of a chunk, N targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from inloop_eval.engine.adapter import ForwardInputs, HeadWorkspace
from inloop_eval.engine.logprobs import HostTargets, check_vocab, chunked_logprobs, on_host, plain_logprobs
from inloop_eval.engine.outputs.vocab_sharded import VocabShard, sharded_logprobs, vocab_shard

Head = Callable[[Tensor], Tensor]


@dataclass
class ProjectedHead:
    """features_UX: the hidden states of the distinct positions read; head: maps [C, X] to logits [C, V]."""

    features_UX: Tensor
    head: Head

    @property
    def width(self) -> int:
        return head_width(self.features_UX, self.head)

    def target_logprobs(self, inputs: ForwardInputs, workspace: HeadWorkspace) -> tuple[Tensor, Tensor]:
        return token_logprobs(
            self.features_UX,
            self.head,
            inputs.target_N,
            inputs.min_vocab,
            inputs.position_N,
            workspace,
            inputs.host_targets,
        )


def token_logprobs(
    features_UX: Tensor,
    head: Head,
    target_N: Tensor,
    min_vocab: int = 0,
    position_N: Tensor | None = None,
    workspace: HeadWorkspace | None = None,
    host: HostTargets | None = None,
) -> tuple[Tensor, Tensor]:
    """log p(target) in float32 and whether the target is the argmax, projecting in chunks.

    features_UX: features of U positions; target n is predicted by position `position_N[n]` (default: n).
    min_vocab: the tokenizer's vocabulary size; narrower logits mean the model does not match it.
    workspace: a logits buffer to reuse across calls (a float32 nn.Linear head writes into it).
    host: the same targets and positions on the host (`HostTargets`); without them they are read from the
        device once.
    """
    if position_N is None:
        position_N = torch.arange(target_N.shape[0], device=target_N.device)
    workspace = workspace or HeadWorkspace()
    linear = _float32_linear(head, features_UX)
    vocab = head_width(features_UX, head)
    host = on_host(position_N, target_N, host)
    check_vocab(vocab, host.max_target, min_vocab)

    def score(start: int, stop: int, local_M: Tensor, target_M: Tensor) -> tuple[Tensor, Tensor]:
        logits_CV, owned = _project(head, linear, features_UX[start:stop], workspace)
        if isinstance(logits_CV, DTensor):  # a tensor-parallel head: this rank's slice of the vocabulary
            logits_CV = vocab_shard(logits_CV)
            if isinstance(logits_CV, VocabShard):
                return sharded_logprobs(logits_CV, local_M, target_M)
        return plain_logprobs(logits_CV, local_M, target_M, in_place=owned)

    return chunked_logprobs(features_UX.shape[0], vocab, position_N, target_N, host, score)


def head_width(features_NX: Tensor, head: Head) -> int:
    """The width of the head's logits: an nn.Linear's `out_features`, else measured on one position."""
    if isinstance(head, nn.Linear):
        return int(head.out_features)
    if features_NX.shape[0] == 0:
        return int(features_NX.shape[-1])
    return int(head(features_NX[:1]).shape[-1])


def _float32_linear(head: Head, features_UX: Tensor) -> nn.Linear | None:
    """The head, when calling it is exactly a float32 matrix product: a plain nn.Linear (no subclass, no
    hooks, no sharded or quantised weight) fed float32 features. Then it can write into a workspace."""
    if (
        type(head) is nn.Linear
        and not (head._forward_hooks or head._forward_pre_hooks)
        and type(head.weight.data) is Tensor
        and head.weight.dtype == features_UX.dtype == torch.float32
    ):
        return head
    return None


def _project(head: Head, linear: nn.Linear | None, x_CX: Tensor, workspace: HeadWorkspace) -> tuple[Tensor, bool]:
    """Float32 logits [C, V] of a chunk, and whether they live in the workspace (may be overwritten)."""
    if linear is None:
        return head(x_CX).float(), False
    out = workspace.get(x_CX.shape[0], linear.out_features, x_CX.device)
    if linear.bias is None:
        return torch.mm(x_CX, linear.weight.t(), out=out), True
    return torch.addmm(linear.bias, x_CX, linear.weight.t(), out=out), True
