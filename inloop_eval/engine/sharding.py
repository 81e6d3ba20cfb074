"""How work is shared out over the data-parallel ranks: documents of a task as dataset items, shared by a
DistributedSampler; perplexity sequences dealt out longest first (`deal_longest_first`).

An item is one document: the rows of its requests in the task's RequestTable. Sharding by document
keeps a document's choices together on one rank; the sampler pads the last round by repeating documents,
and the metric counts each (doc_id, cont_id) once. Which documents are evaluated (all, or a leading subset
sized by `subset_num_batches`) is decided from the table alone, so it is the same at every world size.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset, DistributedSampler

from inloop_eval.engine.batching import row_lengths
from inloop_eval.errors import ConfigError, RequestError
from inloop_eval.requests.table import RequestTable


class ICLMultiChoiceTaskDataset(Dataset):
    """Item i: (doc_id, request rows [k] of that document) for the i-th document of the table.

    n_docs: keep only the table's first `n_docs` documents (a subset, see `subset_size`); None keeps all.
    `n_left_out` counts the documents of the table that the subset leaves out.
    """

    def __init__(self, table: RequestTable, n_docs: int | None = None) -> None:
        self.table = table
        doc_id_R = table.doc_id
        starts = np.flatnonzero(np.diff(doc_id_R, prepend=-1) != 0)  # document ids are >= 0
        if len(doc_id_R) and len(np.unique(doc_id_R)) != len(starts):
            raise RequestError(
                f"task {table.task!r}: the request rows of a document must be contiguous in the table; "
                f"found {len(starts)} runs of rows for {len(np.unique(doc_id_R))} documents"
            )
        n_all = len(starts)
        if n_docs is not None and not 0 <= n_docs <= n_all:
            raise ConfigError(f"task {table.task!r}: a subset of {n_docs} documents out of {n_all}")
        kept = n_all if n_docs is None else n_docs
        self.doc_ids = doc_id_R[starts[:kept]]
        self._bounds = np.append(starts, len(doc_id_R))[: kept + 1]
        self.n_left_out = n_all - kept

    def __len__(self) -> int:
        return len(self.doc_ids)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray]:
        return int(self.doc_ids[i]), np.arange(self._bounds[i], self._bounds[i + 1])

    @property
    def n_rows(self) -> int:
        """Request rows of the kept documents (they are the table's first rows)."""
        return int(self._bounds[-1]) if len(self._bounds) else 0

    def uncond_ids(self) -> np.ndarray:
        """The unconditional requests the kept documents need, ascending."""
        ids = self.table.uncond_id[: self.n_rows]
        return np.unique(ids[ids >= 0])


def subset_size(table: RequestTable, num_batches: int, batch_tokens: int) -> int:
    """How many leading documents `num_batches` batches of `batch_tokens` tokens hold: whole documents, in
    table order, while the sum of their requests' row lengths (context + continuation[:-1], unpacked) stays
    within `num_batches * batch_tokens`; at least one document when the table has any.

    The count depends on the table and the budget only, never on the world size or on how batches are
    planned, so every world size evaluates the same documents.
    """
    if num_batches < 1 or batch_tokens < 1:
        raise ConfigError(
            f"task {table.task!r}: subset_num_batches and batch_tokens must be >= 1, "
            f"found {num_batches} and {batch_tokens}"
        )
    if len(table) == 0:
        return 0
    cost_R = row_lengths(table.pairs, np.arange(len(table)))
    starts = np.flatnonzero(np.diff(table.doc_id, prepend=-1) != 0)
    cumulative_D = np.cumsum(np.add.reduceat(cost_R, starts))
    return max(1, int(np.searchsorted(cumulative_D, num_batches * batch_tokens, side="right")))


def shard_documents(dataset: ICLMultiChoiceTaskDataset, world_size: int, rank: int) -> list[int]:
    """This rank's dataset indices, in order (DistributedSampler without shuffling, padding included)."""
    if world_size == 1:
        return list(range(len(dataset)))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False, drop_last=False)
    return list(sampler)


def rank_rows(dataset: ICLMultiChoiceTaskDataset, indices: list[int]) -> np.ndarray:
    """Request rows of the given documents, concatenated."""
    if not indices:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([dataset[i][1] for i in indices])


def deal_longest_first(length_G: np.ndarray, world_size: int, rank: int) -> np.ndarray:
    """This rank's items (perplexity sequences) of lengths `length_G`: all of them sorted by length (longest
    first, stable), dealt out to the ranks in turn: each item to exactly one rank, none repeated, similar
    lengths on every rank."""
    return np.argsort(-np.asarray(length_G), kind="stable")[rank::world_size]
