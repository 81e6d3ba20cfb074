"""Documents as dataset items, shared across ranks by a DistributedSampler.

An item is one document: the rows of its requests in the task's RequestTable. Sharding by document
keeps a document's choices together on one rank; the sampler pads the last round by repeating documents,
and the metric counts each (doc_id, cont_id) once.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset, DistributedSampler

from inloop_eval.requests import RequestTable


class ICLMultiChoiceTaskDataset(Dataset):
    """Item i: (doc_id, request rows [k] of that document) for the i-th document of the table."""

    def __init__(self, table: RequestTable) -> None:
        self.table = table
        doc_ids, first = np.unique(table.doc_id, return_index=True)
        order = np.argsort(first, kind="stable")  # documents in table order
        self.doc_ids = doc_ids[order]
        starts = np.sort(first)
        self._bounds = np.append(starts, len(table.doc_id))
        if not np.all(np.diff(table.doc_id[starts]) != 0) and len(starts) > 1:
            raise ValueError("RequestTable rows of a document must be contiguous")

    def __len__(self) -> int:
        return len(self.doc_ids)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray]:
        return int(self.doc_ids[i]), np.arange(self._bounds[i], self._bounds[i + 1])


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
