"""Reading a torch.distributed.checkpoint (DCP) folder so that each rank reads only the bytes of the tensor
slices its parallel layout holds, and counting what it read.

DCP's own `FileSystemReader` reads every stored chunk a rank needs any part of whole (`torch.load` of the
chunk, then a slice of it): a rank of a 2-way FSDP watcher loading a checkpoint saved by one process reads
every byte of it, and holds each whole tensor for a moment. `ShardReader` reads a chunk saved by
`torch.save` (DCP's default format, and OLMo-core's writer's) in place: it finds the chunk's data record in
the `torch.save` archive (its directory) and reads only the bytes of the slice the rank holds, straight into
the rank's tensor (a slice cut in the first dimension is one read; one
cut in dimension k, one read per index of the dimensions before k). Any other item (bytes,
a chunk with transforms such as compression, another serialization) is read as DCP reads it, and counted whole.

Files are read with `os.pread`, never mapped: a writer that rewrites a shard in place (DCP's writer opening it
"wb", `cp` over it) truncates it, and a mapped page past the new end kills the reading process with SIGBUS.
A read is an `OSError` naming the file instead: one that ends early (truncated while read), one that is
empty. The memory cost is the slice read (or the chunk read whole, as DCP's reader holds it), never the file.

What it promises: the same tensors as DCP's reader (the same `ReadItem`s, each copied into the tensor the
planner resolves); `reads` lists what this rank read, one `ShardRead` per item.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

ZIP_LOCAL_HEADER = b"PK\x03\x04"
ZIP_LOCAL_HEADER_SIZE = 30


@dataclass(frozen=True)
class ShardRead:
    """One item a rank read: the tensor (`fqn`), the stored chunk it came from (`chunk`, that chunk's offsets
    in the tensor), the region of the tensor read (`offsets`, `lengths`, in the tensor's coordinates) and
    the bytes of it read (`nbytes`; a whole chunk or bytes item read as DCP reads it counts whole)."""

    fqn: str
    chunk: tuple[int, ...]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    nbytes: int
    in_place: bool


class ShardReader(FileSystemReader):
    """DCP's `FileSystemReader` reading only the slices a rank holds (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(str(path))
        self.reads: list[ShardRead] = []
        self.metadata: Metadata | None = None

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self.metadata = metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for relative_path, items in per_file.items():
            with ShardFile(Path(self.path) / relative_path) as shard:
                for item in items:
                    if item.type == LoadItemType.BYTE_IO or not self.read_in_place(item, planner, shard):
                        self.read_whole(item, planner, shard)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def read_in_place(self, item: ReadItem, planner: LoadPlanner, shard: ShardFile) -> bool:
        """Read only the slice `item` asks for out of its chunk's data record, straight into the tensor the
        planner resolves; False (nothing read) when the chunk is not a plain `torch.save` of a contiguous
        little-endian tensor of the metadata's shape."""
        info = self.storage_data[item.storage_index]
        if getattr(info, "transform_descriptors", None):
            return False
        shape = self.chunk_shape(item)
        target = planner.resolve_tensor(item).detach()
        dtype = self.stored_dtype(item) or target.dtype
        start = data_record_start(shard, info.offset, info.length, shape.numel() * dtype.itemsize)
        if start is None:
            return False
        lengths = tuple(int(n) for n in item.lengths)
        if tuple(target.size()) != lengths:
            raise AssertionError(f"{item.storage_index}: slice {lengths} != target {tuple(target.size())}")
        direct = target.dtype == dtype and target.is_contiguous() and target.device.type == "cpu"
        buffer = target if direct else torch.empty(lengths, dtype=dtype)
        into = memoryview(buffer.reshape(-1).view(torch.uint8).numpy())
        offsets = tuple(int(o) for o in item.storage_offsets)
        for stored_at, position, size in slice_runs(tuple(shape), offsets, lengths, dtype.itemsize):
            shard.read_into(start + stored_at, into[position : position + size])
        if not direct:
            target.copy_(buffer)
        planner.commit_tensor(item, target)
        self.record(item, buffer.numel() * dtype.itemsize, in_place=True)
        return True

    def read_whole(self, item: ReadItem, planner: LoadPlanner, shard: ShardFile) -> None:
        """As DCP's `FileSystemReader` reads an item: the whole stored chunk (or bytes), then its slice."""
        info = self.storage_data[item.storage_index]
        data = io.BytesIO(shard.read(info.offset, info.length))
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, data)
        else:
            tensor = torch.load(data, map_location="cpu", weights_only=True)
            for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
                tensor = tensor.narrow(dim, offset, length)
            target = planner.resolve_tensor(item).detach()
            target.copy_(tensor)
            planner.commit_tensor(item, target)
        self.record(item, info.length, in_place=False)

    def whole_bytes(self) -> int:
        """The bytes of every tensor this rank read any part of, whole: what one process would read."""
        total = 0
        for fqn in {r.fqn for r in self.reads}:
            entry = self.metadata.state_dict_metadata.get(fqn) if self.metadata else None
            if isinstance(entry, TensorStorageMetadata):
                total += entry.size.numel() * entry.properties.dtype.itemsize
        return total

    def chunk_shape(self, item: ReadItem) -> torch.Size:
        entry = self.tensor_entry(item)
        offsets = torch.Size(item.storage_index.offset or ())
        for chunk in entry.chunks if entry is not None else ():
            if chunk.offsets == offsets:
                return chunk.sizes
        raise AssertionError(f"{item.storage_index}: no stored chunk at offsets {tuple(offsets)}")

    def stored_dtype(self, item: ReadItem) -> torch.dtype | None:
        entry = self.tensor_entry(item)
        return entry.properties.dtype if entry is not None else None

    def tensor_entry(self, item: ReadItem) -> TensorStorageMetadata | None:
        entry = self.metadata.state_dict_metadata.get(item.storage_index.fqn) if self.metadata else None
        return entry if isinstance(entry, TensorStorageMetadata) else None

    def record(self, item: ReadItem, nbytes: int, *, in_place: bool) -> None:
        chunk = tuple(item.storage_index.offset or ())
        offsets = tuple(c + o for c, o in zip(chunk, item.storage_offsets, strict=False)) or tuple(
            item.storage_offsets
        )
        self.reads.append(
            ShardRead(
                fqn=item.storage_index.fqn,
                chunk=chunk,
                offsets=offsets,
                lengths=tuple(item.lengths),
                nbytes=int(nbytes),
                in_place=in_place,
            )
        )


def slice_runs(
    shape: tuple[int, ...], offsets: tuple[int, ...], lengths: tuple[int, ...], itemsize: int
) -> Iterator[tuple[int, int, int]]:
    """The contiguous byte runs of the box (`offsets`, `lengths`) of a row-major tensor of `shape`: (bytes
    from the tensor's start, bytes from the box's start, bytes), in the box's order. A box covering every
    dimension after the first is one run; one cut in dimension k is one run per index of the dimensions
    before k."""
    if not shape:
        yield 0, 0, itemsize
        return
    if 0 in lengths:
        return
    cut = len(shape) - 1
    while cut > 0 and offsets[cut] == 0 and lengths[cut] == shape[cut]:
        cut -= 1
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    run = lengths[cut] * strides[cut] * itemsize
    position = 0
    for index in itertools.product(*(range(offsets[d], offsets[d] + lengths[d]) for d in range(cut))):
        element = sum(i * strides[d] for d, i in enumerate(index)) + offsets[cut] * strides[cut]
        yield element * itemsize, position, run
        position += run


class ShardFile:
    """One shard file open for `os.pread`s (never mapped: see the module docstring). OSError naming the file
    for an empty one, and for a read past its end (a file truncated while read)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        if os.fstat(self.fd).st_size == 0:
            os.close(self.fd)
            raise OSError(f"{path} is empty (0 bytes): a shard not yet written, or being written again")

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def read(self, at: int, size: int) -> bytes:
        """The `size` bytes from `at`."""
        out = bytearray(size)
        self.read_into(at, memoryview(out))
        return bytes(out)

    def read_into(self, at: int, into: memoryview) -> None:
        """Fill `into` with the bytes from `at`."""
        done = 0
        while done < len(into):
            got = os.preadv(self.fd, [into[done:]], at + done)
            if not got:
                size = os.fstat(self.fd).st_size
                raise OSError(
                    f"{self.path} ends at {size} bytes, short of the {at + len(into)} its metadata says: "
                    "truncated (rewritten) while read?"
                )
            done += got


def data_record_start(shard: ShardFile, offset: int, length: int, nbytes: int) -> int | None:
    """The file offset of the one tensor storage record of the `torch.save` archive stored at
    [offset, offset + length), when it holds `nbytes` bytes stored uncompressed in little-endian order;
    None otherwise (another format, a view's larger storage, a big-endian save)."""
    window = io.BytesIO(shard.read(offset, length)) if length <= (1 << 16) else None
    try:
        archive = zipfile.ZipFile(window or _Window(shard, offset, length))
    except zipfile.BadZipFile:
        return None
    with archive:
        names = archive.namelist()
        records = [n for n in names if n.rsplit("/", 2)[-2:-1] == ["data"]]
        order = [n for n in names if n.endswith("/byteorder")]
        if len(records) != 1 or (order and archive.read(order[0]) != b"little"):
            return None
        record = archive.getinfo(records[0])
        if record.compress_type != zipfile.ZIP_STORED or record.file_size != nbytes:
            return None
        header = offset + record.header_offset
        if shard.read(header, 4) != ZIP_LOCAL_HEADER:
            return None
        name_length, extra_length = struct.unpack("<HH", shard.read(header + 26, 4))
        return header + ZIP_LOCAL_HEADER_SIZE + name_length + extra_length


class _Window(io.RawIOBase):
    """A read-only, seekable view of [offset, offset + length) of a shard, for `zipfile`, which reads only the
    archive's directory through it."""

    def __init__(self, shard: ShardFile, offset: int, length: int) -> None:
        self.shard, self.offset, self.length, self.position = shard, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, min(self.length, base + position))
        return self.position

    def readinto(self, buffer: Any) -> int:
        size = min(len(buffer), self.length - self.position)
        self.shard.read_into(self.offset + self.position, memoryview(buffer)[:size])
        self.position += size
        return size


def load_shards(model: nn.Module, folder: Path, under: str | None = None) -> ShardReader:
    """Read the DCP checkpoint in `folder` into `model`'s own state dict (its local shards as DTensors in a
    parallel layout) through a `ShardReader`, which it returns with what was read. under: the key the
    checkpoint nests the model's entries under, beside others (an optimizer's); None: at the top."""
    weights = model.state_dict()
    state = {under: weights} if under else weights
    reader = ShardReader(folder)
    dcp.load(state, storage_reader=reader)
    model.load_state_dict(weights)
    return reader
