"""The rows of a split that `datasets.Dataset.save_to_disk` wrote, read with pyarrow alone.

Evaluation reads a task's rows one by one as plain dicts. Importing `datasets` for that (with pandas, fsspec
and their kin) costs about 60 MiB resident and most of a second in every process that evaluates, each rank
of a sharded sidecar included; pyarrow alone costs about 28 MiB. A saved split is `state.json` (its Arrow
stream files, in order, and its output format), `dataset_info.json` (its features) and those files.

`read_saved_split` gives rows equal to `datasets.load_from_disk(folder)[i]` when the split is plain:
- no indices mapping and no output format set (`save_to_disk` writes neither: it flattens them);
- only features whose stored Arrow values are what `datasets` returns for them (`PLAIN_FEATURES`, and dicts
  and lists of them); `Image`, `Audio` and other decoded features are not;
- its Arrow columns are exactly the features' columns.
For any other split it returns None, and the caller loads it through `datasets`
(`inloop_eval.data.root.split_rows`).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import pyarrow

STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
# Features stored as the Python values `datasets` returns for them (its Python format decodes none of them).
PLAIN_FEATURES = frozenset({"Value", "ClassLabel", "Sequence", "List", "LargeList"})


class SplitRows(Sequence[dict[str, Any]]):
    """A saved split's rows as dicts, converted from its memory-mapped Arrow table one row at a time."""

    def __init__(self, table: pyarrow.Table) -> None:
        self._table = table

    def __len__(self) -> int:
        return self._table.num_rows

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n, i = len(self), operator.index(index)  # NumPy integers index too, as they do a `datasets.Dataset`
        i = i + n if i < 0 else i
        if not 0 <= i < n:
            raise IndexError(f"row {index} of a split of {n} rows")
        return self._table.slice(i, 1).to_pylist()[0]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self._table.to_batches():
            yield from batch.to_pylist()


def read_saved_split(folder: Path) -> SplitRows | None:
    """The rows of the split saved in `folder`, or None when it is not plain (see the module docstring).

    Raises what json and pyarrow raise for a damaged file (the caller names the split and its files)."""
    state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    features = json.loads((folder / INFO_FILE).read_text(encoding="utf-8")).get("features")
    if (
        state.get("_indices_data_files")
        or state.get("_format_type") is not None
        or state.get("_format_columns") is not None
        or not isinstance(features, dict)
        or not all(is_plain(f) for f in features.values())
    ):
        return None
    names = [str(entry["filename"]) for entry in state["_data_files"]]
    if not names or any(Path(name).name != name for name in names):
        return None
    import pyarrow as pa  # deferred: only the evaluation reads task rows
    import pyarrow.ipc  # noqa: F401  # `pa.ipc` is a submodule pyarrow does not import itself

    tables = [pa.ipc.open_stream(pa.memory_map(str(folder / name))).read_all() for name in names]
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    if table.column_names != list(features):
        return None
    return SplitRows(table)


def is_plain(feature: Any) -> bool:
    """Whether a feature (as `dataset_info.json` writes it) is stored as the values `datasets` returns."""
    if isinstance(feature, list):  # `[feature]`: a list of that feature
        return all(is_plain(f) for f in feature)
    if not isinstance(feature, dict):
        return False
    kind = feature.get("_type")
    if kind is None:  # a dict of features
        return all(is_plain(f) for f in feature.values())
    if kind not in PLAIN_FEATURES:
        return False
    inner = feature.get("feature")
    return inner is None or is_plain(inner)
