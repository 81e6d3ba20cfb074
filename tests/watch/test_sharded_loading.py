"""The watcher's layout options and its shard reader, in one process: the checks of `--tp`/`--fsdp`, what a
format that is not loaded sharded says, `ShardReader` reading what DCP's reader reads (tensors of each dtype
in place, other items whole), and naming a shard that is empty or shorter than its metadata says. Sharded
loads themselves run in 2-rank process groups: tests/watch/test_watch_olmo_core.py and
tests/watch/test_watch_torchtitan.py."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from inloop_eval.checkpoints.formats import Checkpoint
from inloop_eval.checkpoints.layout import ParallelLayout, layout_for
from inloop_eval.checkpoints.shard_reads import ShardReader, slice_runs
from inloop_eval.errors import ConfigError
from inloop_eval.watch import WatchConfig
from inloop_eval.watch.loading import load_model


def test_a_tensor_parallel_degree_below_one_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="tp must be >= 1.*found 0"):
        WatchConfig(checkpoint_dir=str(tmp_path), run_dir=str(tmp_path / "run"), tp=0)


def test_a_layout_the_world_cannot_take_is_refused_at_the_start():
    with pytest.raises(ConfigError, match="--tp 2 needs a world size that is a multiple of it, found 1"):
        layout_for(2, False, torch.device("cpu"))
    with pytest.raises(ConfigError, match="--fsdp shards the model over the processes of torchrun, found 1"):
        layout_for(1, True, torch.device("cpu"))
    assert not layout_for(1, False, torch.device("cpu")).sharded


def test_a_hugging_face_checkpoint_under_tensor_parallelism_is_refused_with_the_remedy(tmp_path):
    checkpoint = Checkpoint(step=1, path=tmp_path / "checkpoint-1", format="hf")
    with pytest.raises(ConfigError, match="--tp does not load sharded.*run the watcher with --fsdp or without"):
        load_model(checkpoint, torch.device("cpu"), layout=ParallelLayout(tp=2))


def test_the_shard_reader_reads_what_dcps_reader_reads(tmp_path):
    saved = {
        "w": torch.randn(6, 4),
        "half": torch.randn(5, 3).to(torch.bfloat16),
        "ids": torch.arange(10),
        "step": 7,
    }
    with warnings.catch_warnings():  # no process group: DCP says it saves and loads in one process
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(saved, checkpoint_id=str(tmp_path))
        loaded = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in saved.items()}
        reader = ShardReader(tmp_path)
        dcp.load(loaded, storage_reader=reader)
    for key in ("w", "half", "ids"):
        assert torch.equal(loaded[key], saved[key]), key
    assert loaded["step"] == 7
    by_name = {r.fqn: r for r in reader.reads}
    assert all(by_name[k].in_place for k in ("w", "half", "ids")) and not by_name["step"].in_place
    assert by_name["half"].nbytes == 5 * 3 * 2 and by_name["w"].lengths == (6, 4)
    assert reader.whole_bytes() == 6 * 4 * 4 + 5 * 3 * 2 + 10 * 8


@pytest.mark.parametrize("size", [0, 100], ids=["empty", "truncated"])
def test_a_shard_empty_or_shorter_than_its_metadata_is_an_error_naming_it(tmp_path, size):
    """Read by `os.pread` (never mapped, which a truncation turns into SIGBUS): an OSError naming the file,
    which the watcher records failed, to be tried again once the file changes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": torch.randn(64, 64)}, checkpoint_id=str(tmp_path))
        (shard,) = tmp_path.glob("*.distcp")
        with shard.open("r+b") as f:
            f.truncate(size)
        says = "is empty" if size == 0 else "short of the"
        with pytest.raises(CheckpointException, match=f"{shard}.*{says}"):
            dcp.load({"w": torch.zeros(64, 64)}, storage_reader=ShardReader(tmp_path))


@pytest.mark.parametrize(
    ("shape", "offsets", "lengths"),
    [
        ((6, 4), (3, 0), (3, 4)),  # FSDP's dim-0 shard: one run
        ((6, 4), (0, 2), (6, 2)),  # a row-wise TP shard: one run per row
        ((4, 3, 5), (1, 0, 1), (2, 3, 3)),
        ((4, 3, 5), (2, 1, 0), (1, 2, 5)),
        ((7,), (2,), (4,)),
        ((), (), ()),
        ((3, 4), (1, 0), (0, 4)),
    ],
)
def test_the_runs_of_a_slice_are_its_bytes_in_order(shape, offsets, lengths):
    """The byte runs `ShardReader` reads of a stored chunk are the slice's bytes, in the slice's order."""
    whole = torch.arange(math.prod(shape), dtype=torch.int16).reshape(shape)
    data = whole.numpy().tobytes()
    runs = list(slice_runs(shape, offsets, lengths, 2))
    read = b"".join(data[at : at + size] for at, _, size in runs)
    box = whole[tuple(slice(o, o + n) for o, n in zip(offsets, lengths, strict=True))]
    assert read == box.contiguous().numpy().tobytes()
    assert [position for _, position, _ in runs] == list(itertools.accumulate([0] + [s for *_, s in runs]))[:-1]
