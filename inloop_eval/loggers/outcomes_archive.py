"""An outcomes file's `.npz` archive read member by member: only the members the reader names, each one's
`.npy` header checked against the archive's record of its size before any of its data is read, never a
pickle.

`np.load` would do less checking and more work: it opens any file it is given (a named pipe blocks it
forever), and a caller walking `NpzFile.files` reads every member, however large (a 3 MB file can hold a
3 GiB member of zeros). Here a file must be a regular file, a member's header must be one of the `.npy`
versions NumPy writes and hold no Python objects, and its shape and dtype must account for exactly the
bytes the archive says the member holds; what is read is then that many bytes, their CRC checked by
`zipfile`. Every problem is an `ArchiveError` saying what is wrong in one line, without the file's name
(the caller adds it).
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from inloop_eval.errors import InLoopEvalError

# What `zipfile` and the `.npy` parser raise on a damaged archive: cut (EOFError, BadZipFile), flipped bytes
# (zlib.error, a CRC BadZipFile), an unknown compression (NotImplementedError), an encrypted member
# (RuntimeError), a garbled header (ValueError), a failing disk (OSError).
DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError, RuntimeError)
NPY_HEADERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}


class ArchiveError(InLoopEvalError):
    """An archive, or one of its members, that is not what the reader asked for."""


@dataclass(frozen=True)
class Member:
    """One member's header: `name` (without `.npy`), its `shape` and `dtype`, where its data starts
    (`offset`) and how many bytes it holds (`nbytes`)."""

    name: str
    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def describe(self) -> str:
        """`shape (3,) of int64`, for messages."""
        return f"shape {self.shape} of {self.dtype}"


def one_line(text: object) -> str:
    """`text` with its whitespace runs (newlines included) made single spaces: a message stays one line."""
    return " ".join(str(text).split())


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


@contextmanager
def open_archive(path: Path) -> Iterator[zipfile.ZipFile]:
    """`path` opened as a zip archive, when it is a regular file that is one; ArchiveError otherwise.

    Opened without blocking and checked on the open descriptor, so that a named pipe (or a file swapped
    for one after a check) is refused at once instead of waiting for a writer that never comes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ArchiveError(f"cannot be opened ({exc.strerror or exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ArchiveError(f"is {file_kind(mode)}, not a file")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        try:
            archive = zipfile.ZipFile(handle)
        except DAMAGE as exc:
            raise ArchiveError(f"not a readable .npz archive ({type(exc).__name__}: {one_line(exc)})") from exc
        with archive:
            yield archive


def member_header(archive: zipfile.ZipFile, name: str) -> Member:
    """The header of member `name` (`<name>.npy`), checked: an `.npy` version NumPy writes, no Python
    objects, and a shape and dtype that fill exactly the bytes the archive records for it."""
    try:
        info = archive.getinfo(f"{name}.npy")
    except KeyError:
        raise ArchiveError(f"member {name!r} is missing") from None
    try:
        with archive.open(info) as stream:
            version = npy.read_magic(stream)
            if version not in NPY_HEADERS:
                raise ArchiveError(f"member {name!r}: .npy format version {version}, expected 1.0 or 2.0")
            shape, fortran_order, dtype = NPY_HEADERS[version](stream)
            offset = stream.tell()
    except ArchiveError:
        raise
    except DAMAGE as exc:
        raise ArchiveError(f"member {name!r}: header not readable ({type(exc).__name__}: {one_line(exc)})") from exc
    if dtype.hasobject:
        raise ArchiveError(
            f"member {name!r}: holds Python objects ({dtype}); this format holds numbers and strings only "
            "and is never unpickled"
        )
    member = Member(name, info, tuple(int(s) for s in shape), bool(fortran_order), dtype, offset)
    if info.file_size != offset + member.nbytes:
        raise ArchiveError(
            f"member {name!r}: its header says {member.describe()} ({member.nbytes} bytes) but the archive "
            f"holds {info.file_size - offset} bytes of data for it"
        )
    return member


def read_member(archive: zipfile.ZipFile, member: Member) -> np.ndarray:
    """The array of a checked member (`member_header`): exactly its bytes, read and CRC-checked."""
    try:
        with archive.open(member.info) as stream:
            stream.read(member.offset)
            data = stream.read(member.nbytes)
    except DAMAGE as exc:
        raise ArchiveError(f"member {member.name!r}: not readable ({type(exc).__name__}: {one_line(exc)})") from exc
    if len(data) != member.nbytes:
        raise ArchiveError(f"member {member.name!r}: {len(data)} of its {member.nbytes} bytes could be read")
    array = np.frombuffer(data, dtype=member.dtype)
    return array.reshape(member.shape, order="F" if member.fortran_order else "C")


def has_member(archive: zipfile.ZipFile, name: str) -> bool:
    """Whether the archive holds member `name`."""
    try:
        archive.getinfo(f"{name}.npy")
    except KeyError:
        return False
    return True
