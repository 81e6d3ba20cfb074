"""Full logits at the positions read: the output of any model that returns logits [B, T, V] (or an object
with `.logits`).
Legend: U positions read, V vocabulary, N targets.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from inloop_eval.engine.adapter import ForwardInputs, HeadWorkspace
from inloop_eval.engine.logprobs import check_vocab, chunked_logprobs, on_host, plain_logprobs


@dataclass
class FullLogits:
    """logits_UV: the logits of the distinct positions read, every token id of the vocabulary on this rank."""

    logits_UV: Tensor

    @property
    def width(self) -> int:
        return int(self.logits_UV.shape[-1])

    def target_logprobs(self, inputs: ForwardInputs, workspace: HeadWorkspace) -> tuple[Tensor, Tensor]:
        host = on_host(inputs.position_N, inputs.target_N, inputs.host_targets)
        check_vocab(self.width, host.max_target, inputs.min_vocab)

        def score(start: int, stop: int, local_M: Tensor, target_M: Tensor) -> tuple[Tensor, Tensor]:
            # A float32 chunk is a view of the model's tensor: not ours to overwrite.
            logits_CV = self.logits_UV[start:stop].float()
            return plain_logprobs(logits_CV, local_M, target_M, in_place=False)

        n_positions = self.logits_UV.shape[0]
        return chunked_logprobs(n_positions, self.width, inputs.position_N, inputs.target_N, host, score)
