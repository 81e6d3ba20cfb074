"""The C allocator of a watcher's process: the memory of freed tensors handed back to the system.

glibc's malloc serves an allocation below its mmap threshold from its heaps and raises that threshold (up to
32 MiB) each time a larger mapped block is freed, so after a few frees most of a model's tensors and an
evaluation's buffers come from heaps, whose freed pages stay resident and whose holes the next sizes do not
fit. A watcher loads, evaluates and drops model after model, and its FSDP ranks gather and free parameters at
every forward: `map_large_blocks` pins the threshold (each block of `MAP_THRESHOLD` bytes or more mapped,
unmapped when freed) and `trim` returns what the heaps hold free once a model is dropped. Where the C library
is not glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

MAP_THRESHOLD = 1 << 20  # bytes: a block of a tensor's size is mapped; small objects stay on the heaps
M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def map_large_blocks(threshold: int = MAP_THRESHOLD) -> bool:
    """Every allocation of `threshold` bytes or more mapped on its own from now on; whether it took effect."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, threshold))


def trim() -> None:
    """The free memory of the heaps handed back to the system."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
