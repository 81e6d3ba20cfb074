"""An OLMo-core `Transformer` built in a parallel layout for loading sharded weights (the watcher's `--tp`,
`--fsdp`): built on the meta device, split by OLMo-core's own `apply_tp` over the mesh's `tp` dimension and
sharded over `dp`, then materialised: each rank allocates only its share of the weights before any is read.

With `--fsdp` alone its blocks are sharded by FSDP2 as OLMo-core's `apply_fsdp` shards them, but its input
embedding and output head, the largest tensors ([V, X] each), are split by rows (the vocabulary) over the
data-parallel ranks and never gathered: FSDP2 would gather each whole at every forward (with its all-gather
buffer, twice its size beside the rank's share). Instead each forward exchanges what the rows are needed for:
the embedding gathers every rank's token ids, looks up those its rows hold and sums the lookups over the
ranks (`VocabRowsEmbedding`: [every rank's tokens, X] floats, exact: each row is one rank's value plus
zeros), and the head scores every rank's targets on each rank's rows of the vocabulary (`head.scoring_head`,
`vocab_sharded.exchanged_logprobs`). Models this does not fit (tied embeddings, a head of another class, an
embedding of another class) are sharded by `apply_fsdp` whole.
Legend: B rows, T time, X hidden width, V vocabulary, L this rank's rows, A every rank's tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from inloop_eval.checkpoints.layout import ParallelLayout
from inloop_eval.distributed import gather_rows
from inloop_eval.integrations.olmo_core.head import scores_in_head


def build_in_layout(
    config: Any, layout: ParallelLayout, device: torch.device
) -> tuple[nn.Module, nn.Module, ProcessGroup | None]:
    """The model of OLMo-core `TransformerConfig` `config`, tensor parallel over the layout mesh's `tp` ranks
    when `layout.tp` > 1, sharded over its `dp` ranks with `layout.fsdp` (see the module docstring), its local
    shards allocated on `device` (their values not yet the checkpoint's); (the model, what the evaluator
    scores: the model itself, the data-parallel group the documents are sharded over)."""
    mesh = layout.mesh()
    model = config.build(init_device="meta")
    if layout.tp > 1:
        model.apply_tp(mesh["tp"])
    if layout.fsdp and layout.tp == 1 and splits_vocabulary_rows(model):
        shard_with_vocabulary_rows(model, mesh["dp"])
    elif layout.fsdp:
        model.apply_fsdp(dp_mesh=mesh["dp"])
        # OLMo-core keeps its output head (and FSDP2 the root) gathered after the forward, for training's
        # backward; an evaluation has none, and a whole head kept from one batch to the next sits beside the
        # next batch's gathered embeddings: every module resharded, each rank holds its share between forwards.
        model.set_reshard_after_forward(True)
    # The local shards allocated, uninitialised: every parameter is then read from the checkpoint (DCP refuses
    # a key it lacks), and OLMo-core keeps no buffers (its RoPE tables are computed on first use). Not
    # `init_weights`: its random init of the sharded parameters holds whole tensors for a while (twice the
    # one-process watcher's peak of a load, measured by an earlier benchmarks/watch_memory.py of loading alone).
    model.to_empty(device=device)
    return model, model, layout.dp_group()


def splits_vocabulary_rows(model: nn.Module) -> bool:
    """Whether `shard_with_vocabulary_rows` takes `model`: an untied plain `nn.Embedding` and OLMo-core's plain
    `LMHead` (which `head.scoring_head` scores in), and no embedding norm."""
    return (
        type(getattr(model, "embeddings", None)) is nn.Embedding
        and not getattr(model, "tie_word_embeddings", False)
        and getattr(model, "embedding_norm", None) is None
        and scores_in_head(model)
    )


def shard_with_vocabulary_rows(model: nn.Module, dp_mesh: DeviceMesh) -> None:
    """Each block and the head's norm sharded by FSDP2 (resharded after its forward), the input embedding and
    the output head's weight (and bias) split by rows over `dp_mesh` (see the module docstring); on the meta
    device."""
    policy = MixedPrecisionPolicy(param_dtype=model.embeddings.weight.dtype, reduce_dtype=torch.float32)
    for block in model.blocks.values():
        block.apply_fsdp(dp_mesh=dp_mesh, reshard_after_forward=True, mp_policy=policy)
    if model.lm_head.norm is not None:  # read by one rank, as every other tensor
        fully_shard(model.lm_head.norm, mesh=dp_mesh, reshard_after_forward=True, mp_policy=policy)
    old = model.embeddings
    embedding = VocabRowsEmbedding(old.num_embeddings, old.embedding_dim, device="meta", dtype=old.weight.dtype)
    embedding.weight = rows_over(old.weight, dp_mesh)
    model.embeddings = embedding
    w_out = model.lm_head.w_out
    w_out.weight = rows_over(w_out.weight, dp_mesh)
    if w_out.bias is not None:
        w_out.bias = rows_over(w_out.bias, dp_mesh)


def rows_over(param: Tensor, mesh: DeviceMesh) -> nn.Parameter:
    """A meta parameter of `param`'s shape as a DTensor split by rows over `mesh` (torch.chunk's split)."""
    rows, size = int(param.shape[0]), mesh.size()
    chunk = -(-rows // size)
    local = max(0, min(chunk, rows - mesh.get_local_rank() * chunk))
    local_LX = torch.empty((local, *param.shape[1:]), dtype=param.dtype, device="meta")
    split = DTensor.from_local(local_LX, mesh, (Shard(0),), run_check=False, shape=param.shape, stride=param.stride())
    return nn.Parameter(split, requires_grad=False)


class VocabRowsEmbedding(nn.Embedding):
    """An input embedding whose rows (its `weight`, a DTensor split by rows over a one-dimensional mesh of
    data-parallel ranks) stay split at every forward: every rank's token ids gathered, each rank looking up
    those its rows hold (zeros for the others), the lookups summed over the ranks (all-reduce of [A, X]), this
    rank's kept. Every rank of the mesh forwards together (the evaluator pads the ranks with fewer batches)."""

    def forward(self, input_ids_BT: Tensor) -> Tensor:
        weight = self.weight
        if not isinstance(weight, DTensor):
            return super().forward(input_ids_BT)
        mesh = weight.device_mesh
        local_LX, group = weight.to_local(), mesh.get_group()
        start = mesh.get_local_rank() * -(-self.num_embeddings // mesh.size())
        ids_A, first = gather_rows(input_ids_BT.reshape(-1), group)
        held_A = ids_A - start
        mine_A = (held_A >= 0) & (held_A < local_LX.shape[0])
        embedded_AX = local_LX.new_zeros((ids_A.shape[0], local_LX.shape[1]))
        embedded_AX[mine_A] = local_LX[held_A[mine_A]]
        dist.all_reduce(embedded_AX, group=group)
        return embedded_AX[first : first + input_ids_BT.numel()].view(*input_ids_BT.shape, -1)
