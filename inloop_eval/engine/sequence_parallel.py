"""How an OLMo-core model splits the sequence over ranks, and the logits each rank holds for some positions
only (scored by `layouts/sequence_sharded.py`): OLMo-core's tensor
parallelism (logits a DTensor sharded on the positions, `Shard(1)`: each rank the whole vocabulary for 1/TP of
them) and its Ulysses context parallelism (every rank passes the same full inputs, the model cuts them into
contiguous chunks and returns each rank its chunk's logits as a plain tensor), or both.

What every rank of the model-parallel groups promises: the same input ids [B, T] (the data-parallel group hands
them the same documents; T padded to a multiple of `SequenceLayout.multiple`, so the model pads nothing), the
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

import torch
from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from inloop_eval.engine.layout import refuse_layout
from inloop_eval.engine.layouts.sequence_sharded import SequenceShard
from inloop_eval.errors import ModelOutputError


@dataclass
class SequenceLayout:
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

    def features(self, model: nn.Module, input_ids_BT: Tensor, rows_U: Tensor, cols_U: Tensor) -> SequenceShard:
        """Run `model` on the full inputs, projecting only the positions (rows_U, cols_U) in this rank's
        chunk (`logits_to_keep` in the chunk's coordinates; under tensor parallelism a replicated DTensor, the
        logits coming back sharded over the kept slots), and keep the logits of those this rank holds."""
        start, width = self.held(input_ids_BT.shape[1])
        chunk_C = torch.nonzero((cols_U >= start) & (cols_U < start + width))[:, 0]
        rows_C = rows_U[chunk_C]
        keep_BK, slot_C = positions_to_keep(rows_C, cols_U[chunk_C] - start, input_ids_BT.shape[0])
        if self.tp_mesh is None:
            logits_BKV = model(input_ids_BT, logits_to_keep=keep_BK)
            _check_local(logits_BKV, keep_BK.shape, "with logits_to_keep")
            logits_LV, held_L = logits_BKV[rows_C, slot_C], chunk_C
        else:
            keep = DTensor.from_local(keep_BK, self.tp_mesh, (Replicate(),), run_check=False)
            local_BWV = _sequence_local(model(input_ids_BT, logits_to_keep=keep))
            first = self.tp_rank * -(-keep_BK.shape[1] // self.tp_size)  # torch.chunk's split of the slots
            _check_local(local_BWV, (keep_BK.shape[0], local_BWV.shape[1]), "sharded on the kept positions")
            mine_C = (slot_C >= first) & (slot_C < first + local_BWV.shape[1])
            logits_LV, held_L = local_BWV[rows_C[mine_C], slot_C[mine_C] - first], chunk_C[mine_C]
        groups = [g for _, g in self.groups()]
        return SequenceShard(logits_LV, held_L, int(rows_U.shape[0]), groups)


def olmo_core_layout(model: nn.Module) -> SequenceLayout | None:
    """The sequence layout of an OLMo-core `Transformer` with tensor or context parallelism applied (read from
    what `apply_tp` / `apply_cp` record on it), None without either. Ring context parallelism (zig-zag or
    Llama 3 load balancing, which interleave chunks) is refused: only Ulysses' contiguous chunks are read."""
    layout = SequenceLayout()
    if getattr(model, "tp_enabled", False):
        mesh = model._tp_mesh
        layout.tp_size, layout.tp_rank, layout.tp_mesh = mesh.size(), mesh.get_local_rank(), mesh
    balancer = getattr(model, "_cp_load_balancer", None)
    if balancer is not None:
        if type(balancer).__name__ != "UlyssesLoadBalancer":
            refuse_layout(
                f"an OLMo-core model under ring context parallelism ({type(balancer).__name__})",
                "its interleaved chunks are not read yet",
                "evaluate with Ulysses context parallelism (TransformerContextParallelConfig.ulysses) or "
                "without context parallelism",
            )
        mesh = model.lm_head._cp_mesh
        layout.cp_size, layout.cp_rank, layout.cp_group = balancer.cp_world_size, balancer.cp_rank, mesh.get_group()
    return layout if layout.multiple > 1 else None


def positions_to_keep(rows_N: Tensor, cols_N: Tensor, n_rows: int) -> tuple[Tensor, Tensor]:
    """The positions of each row to project, as OLMo-core's `logits_to_keep` takes them: keep [B, K] (K the
    most positions any row needs; a row needing fewer repeats position 0), and the slot of each selected
    position within its row's K [N]."""
    order_N = torch.argsort(rows_N, stable=True)
    rows_sorted_N = rows_N[order_N]
    count_B = torch.bincount(rows_N, minlength=n_rows)
    start_B = torch.cumsum(count_B, 0) - count_B
    slot_sorted_N = torch.arange(rows_N.shape[0], device=rows_N.device) - start_B[rows_sorted_N]
    slot_N = torch.empty_like(slot_sorted_N)
    slot_N[order_N] = slot_sorted_N
    width = max(int(count_B.max()) if n_rows else 0, 1)
    keep_BK = torch.zeros(n_rows, width, dtype=torch.long, device=rows_N.device)
    keep_BK[rows_N, slot_N] = cols_N.long()
    return keep_BK, slot_N


def _sequence_local(logits_BTV: object) -> Tensor:
    """This rank's positions of DTensor logits sharded on the positions (Shard(1)) over one mesh dimension."""
    if not isinstance(logits_BTV, DTensor) or tuple(logits_BTV.placements) != (Shard(1),):
        found = tuple(logits_BTV.placements) if isinstance(logits_BTV, DTensor) else type(logits_BTV).__name__
        raise ModelOutputError(
            f"tensor-parallel OLMo-core model output: expected logits as a DTensor sharded on the positions "
            f"(placements (Shard(dim=1),)), found {found}"
        )
    return logits_BTV.to_local()


def _check_local(logits_BXV: object, shape: tuple[int, ...] | torch.Size, how: str) -> None:
    if not isinstance(logits_BXV, Tensor) or logits_BXV.dim() != 3 or tuple(logits_BXV.shape[:2]) != tuple(shape):
        found = tuple(logits_BXV.shape) if isinstance(logits_BXV, Tensor) else type(logits_BXV).__name__
        raise ModelOutputError(
            f"sequence-parallel OLMo-core model output ({how}): expected this rank's logits of shape "
            f"[{shape[0]}, {shape[1]}, V], found {found}"
        )
