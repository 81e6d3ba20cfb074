"""An OLMo-core Transformer's output head scoring a batch's targets inside the forward, a chunk of positions at a
time, so that no [B, K, V] logits exist: with packed rows a batch reads many positions per row, and their
logits, made at once by `logits_to_keep`, were the largest tensor of an evaluation.

`scoring_head(model, inputs, workspace)`: while it is open, the model's `LMHead` (`olmo_core.nn.lm_head`,
final norm then `w_out`) takes the last hidden states [B, T, X], normalises the positions read (rows_U,
cols_U) and scores every target through `projected_head.token_logprobs` (a float32 `w_out` writes each chunk's
logits into the workspace), inside the head's own `__call__`, where FSDP2 has its parameters gathered. The
forward returns an empty tensor; the scores are `scored.targets`. Its `forward` is an instance-level override
(`attention_route.overridden_forwards`), removed on exit. Under OLMo-core's tensor parallelism the head takes the hidden
states sharded on the positions and its `w_out` is column-wise parallel (its weight's rows, the vocabulary,
split over the TP ranks): the normalised states are gathered (every rank then holds [B, T, X]) and each rank
projects the positions read onto its rows of the vocabulary, scored slice by slice (`vocab_sharded.ShardedHead`),
where OLMo-core's own head would gather every rank's [B, K, V/TP] logits to shard them on the positions. A
head whose rows are split over data-parallel ranks (the watcher's FSDP layout, `layout`), each forwarding its
own batch, scores every rank's targets alike and keeps its own (`vocab_sharded.exchanged_logprobs`):
`peers_share_batch` says which. A head of another class (`NormalizedLMHead`, ...) is not scored here
(`scores_in_head`): its adapter keeps logits of the positions read.
Legend: B rows, T time, X hidden width, U positions read, V vocabulary, N targets.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from inloop_eval.engine.adapter import ForwardInputs, HeadWorkspace
from inloop_eval.engine.attention_route import overridden_forwards, own_class
from inloop_eval.engine.outputs.pipeline_stage import ScoredTargets
from inloop_eval.engine.outputs.projected_head import token_logprobs
from inloop_eval.engine.outputs.vocab_sharded import exchanged_logprobs, sharded_head
from inloop_eval.errors import ModelOutputError


def scores_in_head(model: nn.Module) -> bool:
    """Whether `model`'s output head is OLMo-core's plain `LMHead`, which `scoring_head` scores in."""
    from olmo_core.nn.lm_head import LMHead

    head = getattr(model, "lm_head", None)
    return head is not None and own_class(head) is LMHead


@dataclass
class HeadScores:
    """What the head scored in the forward (None until it ran)."""

    targets: ScoredTargets | None = None

    def result(self) -> ScoredTargets:
        if self.targets is None:
            raise ModelOutputError("OLMo-core model: its forward never called its output head (lm_head)")
        return self.targets


@contextmanager
def scoring_head(
    model: nn.Module, inputs: ForwardInputs, workspace: HeadWorkspace, *, peers_share_batch: bool
) -> Iterator[HeadScores]:
    """During the body, a forward of `model` on `inputs.input_ids_BT` scores `inputs`' targets in its head
    (see the module docstring). peers_share_batch: whether the ranks a split head's rows are split over
    forward the same batch (tensor parallel), or each its own (data parallel)."""
    head = model.lm_head
    scored = HeadScores()

    def forward(x_BTX: Tensor, labels: Any = None, **_: Any) -> Tensor:
        if labels is not None:
            raise ModelOutputError("OLMo-core model: the evaluation's forward passed labels to the output head")
        features_UX = _normalised_features(head, x_BTX, inputs)
        split = sharded_head(head.w_out)
        if split is None:
            logp_N, greedy_N = token_logprobs(
                features_UX, head.w_out, inputs.target_N, inputs.min_vocab, inputs.position_N, workspace,
                inputs.host_targets,
            )  # fmt: skip
        elif peers_share_batch:
            logp_N, greedy_N = split.target_logprobs(
                features_UX, inputs.target_N, inputs.min_vocab, inputs.position_N, workspace, inputs.host_targets
            )
        else:
            logp_N, greedy_N = exchanged_logprobs(
                split, features_UX, inputs.target_N, inputs.min_vocab, inputs.position_N, workspace
            )
        scored.targets = ScoredTargets(logp_N, greedy_N, int(head.w_out.weight.shape[0]))
        return x_BTX.new_empty(0)

    with overridden_forwards(model, {head: forward}):
        yield scored


def _normalised_features(head: nn.Module, x_BTX: Tensor, inputs: ForwardInputs) -> Tensor:
    """The head's normalised input at the positions read [U, X]: of hidden states sharded on the positions
    (a DTensor, under tensor parallelism) normalised where they are, then gathered whole."""
    if isinstance(x_BTX, DTensor):
        h_BTX = head.norm(x_BTX) if head.norm is not None else x_BTX
        return h_BTX.full_tensor()[inputs.rows_U, inputs.cols_U]
    features_UX = x_BTX[inputs.rows_U, inputs.cols_U]
    return head.norm(features_UX) if head.norm is not None else features_UX
