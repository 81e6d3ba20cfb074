"""The checksummed cache scheme shared by the request cache and the text-token cache: entries read back
exactly, and any entry that is not what was written (another key or format, a file cut short or
overwritten, no record) is refused with a reason, never read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inloop_eval.data.cache import (
    RECORD_FILE,
    CacheMismatch,
    discard,
    read_archive,
    read_folder,
    write_archive,
    write_folder,
)

FILES = ("a.bin", "b.npy")


def write_sample_folder(target: Path) -> None:
    def build(out: Path) -> None:
        (out / "a.bin").write_bytes(bytes(range(100)))
        np.save(out / "b.npy", np.arange(7))

    write_folder(target, build, version=1, key="k", files=FILES, info={"dtype": "uint8"})


def test_folder_round_trip_and_absent_entry(tmp_path):
    target = tmp_path / "entry"
    assert read_folder(target, version=1, key="k", files=FILES) is None
    write_sample_folder(target)
    assert read_folder(target, version=1, key="k", files=FILES) == {"dtype": "uint8"}
    assert sorted(p.name for p in target.iterdir()) == sorted([*FILES, RECORD_FILE])
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]  # no staging folder left


@pytest.mark.parametrize(
    ("damage", "damaged", "reason"),
    [
        (lambda d: (d / "a.bin").write_bytes(bytes(50)), True, "a.bin holds 50 bytes, the record says 100"),
        (lambda d: (d / "a.bin").write_bytes(bytes(100)), True, "a.bin is not what was written"),
        (lambda d: (d / RECORD_FILE).write_text("{"), True, f"{RECORD_FILE} unreadable"),
        (lambda d: (d / "b.npy").unlink(), True, "b.npy unreadable"),
    ],
)
def test_folder_that_differs_from_its_record_is_refused(tmp_path, damage, damaged, reason):
    target = tmp_path / "entry"
    write_sample_folder(target)
    damage(target)
    with pytest.raises(CacheMismatch, match=reason) as info:
        read_folder(target, version=1, key="k", files=FILES)
    assert info.value.damaged is damaged


def test_entry_of_another_key_or_format_is_refused_but_not_damaged(tmp_path):
    target = tmp_path / "entry"
    write_sample_folder(target)
    with pytest.raises(CacheMismatch, match="expected format 2 and key 'k', found format 1") as info:
        read_folder(target, version=2, key="k", files=FILES)
    assert not info.value.damaged
    write_archive(tmp_path / "t.npz", {"x": np.arange(3)}, version=1, key="t", info={})
    with pytest.raises(CacheMismatch, match="expected format 1 and key 'u'") as info:
        read_archive(tmp_path / "t.npz", version=1, key="u")
    assert not info.value.damaged


def test_archive_round_trip_is_exact(tmp_path):
    arrays = {"ids": np.arange(10, dtype=np.uint16), "scores": np.ones((2, 3), np.float32)}
    path = tmp_path / "t.npz"
    assert read_archive(path, version=1, key="t") is None
    write_archive(path, arrays, version=1, key="t", info={"layout": ["ids", "scores"]})
    read, info = read_archive(path, version=1, key="t")
    assert info == {"layout": ["ids", "scores"]}
    for name, array in arrays.items():
        assert read[name].dtype == array.dtype
        np.testing.assert_array_equal(read[name], array)


def test_archive_without_record_or_cut_short_is_refused(tmp_path):
    np.savez(tmp_path / "plain.npz", x=np.arange(3))
    with pytest.raises(CacheMismatch, match="no __record__ member") as info:
        read_archive(tmp_path / "plain.npz", version=1, key="plain")
    assert not info.value.damaged
    path = tmp_path / "t.npz"
    write_archive(path, {"x": np.arange(1000)}, version=1, key="t", info={})
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CacheMismatch) as info:
        read_archive(path, version=1, key="t")
    assert info.value.damaged


def test_discard_removes_the_entry_whole(tmp_path):
    target = tmp_path / "entry"
    write_sample_folder(target)
    discard(target)
    discard(target)  # already gone (another process discarded it first): not an error
    assert list(tmp_path.iterdir()) == []
