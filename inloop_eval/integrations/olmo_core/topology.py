"""How an OLMo-core model splits the sequence over ranks (its parallel topology); the adapter
(`adapter.OLMoCoreSequenceSplitAdapter`) scores the logits each rank holds for some positions only
(`engine/outputs/sequence_sharded.py`): OLMo-core's tensor
parallelism (logits a DTensor sharded on the positions, `Shard(1)`: each rank the whole vocabulary for 1/TP of
them) and its Ulysses context parallelism (every rank passes the same full inputs, the model cuts them into
contiguous chunks and returns each rank its chunk's logits as a plain tensor), or both.

What every rank of the model-parallel groups promises: the same input ids [B, T] (the data-parallel group hands
them the same documents; T padded to a multiple of `SequenceSplit.multiple`, so the model pads nothing), the
same forward call, and then one all-reduce (SUM) of [2, N] per batch over each model-parallel group: each rank
scores the targets its positions predict (a local log-softmax over the full vocabulary) and contributes zeros
for the others, so the sum is every target's score, exactly. The model projects only the positions read
(OLMo-core's `logits_to_keep`: under context parallelism in the chunk's coordinates, under tensor parallelism
a replicated DTensor, the logits then sharded over the kept slots), so neither the forward nor the scoring
holds more than [B, K/TP, V] logits on a rank, K <= T the most positions any row reads.
(OLMo-core's per-token loss, `model_forward(..., labels=, loss_reduction="none")`, is not used: it projects
every position, has one target per position where a letter-key document has K at one, and no greedy flag.)
Legend: B rows, T time, U distinct positions read, C of them in this rank's context-parallel chunk, L of those
this rank holds, K kept per row, V vocabulary, N targets.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from inloop_eval.engine.adapter import refuse_model
from inloop_eval.errors import ModelOutputError


@dataclass
class SequenceSplit:
    """How an OLMo-core model splits the sequence: context-parallel chunks (Ulysses: contiguous, rank r holds
    chunk r of `cp_size`) and, within a chunk, tensor parallelism over `tp_mesh`, whose output head returns
    the kept positions' logits sharded over its ranks (Shard(1), torch.chunk's split). Input widths must
    be a multiple of `multiple` = cp_size x tp_size (the model's blocks split each chunk over TP too)."""

    tp_size: int = 1
    tp_rank: int = 0
    tp_mesh: DeviceMesh | None = None
    cp_size: int = 1
    cp_rank: int = 0
    cp_group: ProcessGroup | None = None

    @property
    def multiple(self) -> int:
        return self.tp_size * self.cp_size

    def groups(self) -> list[tuple[str, ProcessGroup]]:
        """The model-parallel groups, by name (`tp`, `cp`), whose ranks must be fed the same documents."""
        tp_group = self.tp_mesh.get_group() if self.tp_mesh is not None else None
        named = (("tp", tp_group), ("cp", self.cp_group))
        return [(name, group) for name, group in named if group is not None]

    def held(self, width: int) -> tuple[int, int]:
        """(first position, number of positions) of a row of `width` in this rank's context-parallel chunk."""
        if width % self.multiple:
            raise ModelOutputError(
                f"sequence-parallel model: input width {width} is not a multiple of {self.multiple} (context "
                f"parallel {self.cp_size} x tensor parallel {self.tp_size}); the batches must be padded to it"
            )
        chunk = width // self.cp_size
        return self.cp_rank * chunk, chunk


def read_sequence_split(model: nn.Module) -> SequenceSplit | None:
    """The sequence split of an OLMo-core `Transformer` with tensor or context parallelism applied (read from
    what `apply_tp` / `apply_cp` record on it), None without either. Ring context parallelism (zig-zag or
    Llama 3 load balancing, which interleave chunks) is refused: only Ulysses' contiguous chunks are read."""
    split = SequenceSplit()
    if getattr(model, "tp_enabled", False):
        mesh = model._tp_mesh
        split.tp_size, split.tp_rank, split.tp_mesh = mesh.size(), mesh.get_local_rank(), mesh
    balancer = getattr(model, "_cp_load_balancer", None)
    if balancer is not None:
        if type(balancer).__name__ != "UlyssesLoadBalancer":
            refuse_model(
                f"an OLMo-core model under ring context parallelism ({type(balancer).__name__})",
                "its interleaved chunks are not read yet",
                "evaluate with Ulysses context parallelism (TransformerContextParallelConfig.ulysses) or "
                "without context parallelism",
            )
        mesh = model.lm_head._cp_mesh
        split.cp_size, split.cp_rank, split.cp_group = (
            balancer.cp_world_size,
            balancer.cp_rank,
            mesh.get_group(),
        )
    return split if split.multiple > 1 else None
