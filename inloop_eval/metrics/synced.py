"""The thin shell under every metric: named states that a rank adds to and that `compute` syncs over the
data-parallel group, by sum or by concatenation.

What every rank promises: it calls `compute` on the same metrics in the same order, so that all ranks make
the same collectives (one all-reduce per sum state; two all-gathers per concatenated state, the lengths and
then the values). A rank that saw no data keeps its zeros or its empty lists. `compute` works on the synced
states and then puts the rank's own states back, so a metric can keep accumulating after it.

It does what torchmetrics' `Metric` did for us (named states, `process_group=`, `sync_on_compute=`, `reset`,
`to`), without importing torchmetrics, whose package import pulls in transformers, scipy and matplotlib.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup


class SyncedMetric:
    """Named states (`add_sum_state`, `add_cat_state`) kept on `device` and synced in `compute`.

    A subclass adds its states in `__init__`, adds to them in `update`, and reads them (already synced, a
    concatenated state as one tensor) in `_compute`.
    """

    def __init__(self, *, process_group: ProcessGroup | None = None, sync_on_compute: bool = True) -> None:
        self.process_group = process_group
        self.sync_on_compute = sync_on_compute
        self.device = torch.device("cpu")
        self._sum_defaults: dict[str, Tensor] = {}
        self._cat_dtypes: dict[str, torch.dtype] = {}

    def add_sum_state(self, name: str, default: Tensor) -> None:
        """A tensor state that ranks sync by adding (`default` is its value after `reset`)."""
        self._sum_defaults[name] = default.detach().clone()
        setattr(self, name, default.detach().clone().to(self.device))

    def add_cat_state(self, name: str, dtype: torch.dtype) -> None:
        """A list of 1-D `dtype` tensors that ranks sync by concatenation, in rank order."""
        self._cat_dtypes[name] = dtype
        setattr(self, name, [])

    def to(self, device: torch.device | str) -> SyncedMetric:
        """Move every state to `device` (where `update` puts what it adds); returns the metric."""
        self.device = torch.device(device)
        for name in self._sum_defaults:
            setattr(self, name, getattr(self, name).to(self.device))
        for name in self._cat_dtypes:
            setattr(self, name, [value.to(self.device) for value in getattr(self, name)])
        return self

    def reset(self) -> None:
        """Every state back to its default (zeros, empty lists)."""
        for name, default in self._sum_defaults.items():
            setattr(self, name, default.clone().to(self.device))
        for name in self._cat_dtypes:
            setattr(self, name, [])

    def compute(self) -> Any:
        """`_compute` over the states of every rank of the group (of this rank alone when not syncing)."""
        local = {name: getattr(self, name) for name in [*self._sum_defaults, *self._cat_dtypes]}
        synced = self._synced_states() if self._syncing() else self._local_states()
        try:
            for name, value in synced.items():
                setattr(self, name, value)
            return self._compute()
        finally:
            for name, value in local.items():
                setattr(self, name, value)

    def _compute(self) -> Any:
        """The metric's figures from its synced states (a concatenated state as one tensor)."""
        raise NotImplementedError

    def _syncing(self) -> bool:
        return (
            self.sync_on_compute
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size(self.process_group) > 1
        )

    def _local_cat(self, name: str) -> Tensor:
        parts = getattr(self, name)
        if not parts:
            return torch.zeros(0, dtype=self._cat_dtypes[name], device=self.device)
        return torch.cat([part.reshape(-1).to(self._cat_dtypes[name]) for part in parts])

    def _local_states(self) -> dict[str, Tensor]:
        return {name: self._local_cat(name) for name in self._cat_dtypes}

    def _synced_states(self) -> dict[str, Tensor]:
        out = {}
        for name in self._sum_defaults:
            total = getattr(self, name).clone()
            dist.all_reduce(total, group=self.process_group)
            out[name] = total
        for name in self._cat_dtypes:
            out[name] = all_gather_cat(self._local_cat(name), self.process_group)
        return out


def all_gather_cat(local_N: Tensor, group: ProcessGroup | None) -> Tensor:
    """Every rank's 1-D tensor (lengths may differ) concatenated in rank order, on every rank."""
    world_size = dist.get_world_size(group)
    length = torch.tensor([local_N.numel()], dtype=torch.long, device=local_N.device)
    lengths = [torch.zeros_like(length) for _ in range(world_size)]
    dist.all_gather(lengths, length, group=group)
    longest = max(int(n) for n in lengths)
    padded = torch.zeros(longest, dtype=local_N.dtype, device=local_N.device)
    padded[: local_N.numel()] = local_N
    parts = [torch.zeros_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[: int(n)] for part, n in zip(parts, lengths, strict=True)])
