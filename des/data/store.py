"""The column store: the fields' keys, labels, a split array and a manifest, memory-mappable.

Layout of a store directory (all arrays are raw little-endian binaries; their dtype and shape are
recorded in ``manifest.json`` and they are opened with ``np.memmap``)::

    manifest.json                 format version, schema, counts, split, sources, key scheme
    labels.bin                    uint8 [N]      0/1 click labels
    split.bin                     uint8 [N]      0 train, 1 validation, 2 test
    one_hot.keys.bin              int64 [N, F1]  the keys of every one-hot field, row after row
                                                 (column j: the j-th one-hot field in field order)
    NN_<field>.keys.bin           int64 [nnz]    a multi-hot field's keys
    NN_<field>.offsets.bin        int64 [N+1]    CSR row pointers (multi-hot fields only)
    NN_<field>.weights.bin        float32 [nnz]  feature values (weighted fields only)
    dense.bin                     float32 [N, D] the dense (numeric) features of every row, row
                                                 after row (only when the schema declares some)
    <extra>.bin                   e.g. probabilities (float32 [N], synthetic data only)

One-hot fields carry no offsets (45M rows x 39 fields of offsets would be 14 GB); row ``r`` of
such a field is ``one_hot_keys[r, j]``. They are stored row-major because training reads random
rows: a batch's row of Criteo's 39 keys is 312 contiguous bytes (5-6 cache lines), where
field-major columns cost a cache and TLB miss per key (docs/benchmarks.md, "The column store's
layout", has the measurement).

Version 1 stores (one ``NN_<field>.keys.bin`` of int64 [N] per one-hot field, no
``one_hot.keys.bin``) are still read; their :attr:`ColumnStore.fingerprint` is the same as the
version 2 store prepared from the same input, so a run resumes on either. ``StoreWriter`` appends
chunk by chunk, so no input has to fit in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numba
import numpy as np

from .._views import view1
from .batch import FieldBatch, KeyedIds
from .counting import KeyCounter
from .errors import DataError
from .keys import KEY_SCHEME
from .parallel import Background, each
from .split import SPLIT_NAMES, assign_splits, check_fractions, split_code

FORMAT_NAME = "des-column-store"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # what ColumnStore.open reads (module docstring)
MANIFEST_NAME = "manifest.json"
ONE_HOT = "one-hot"
MULTI_HOT = "multi-hot"
ONE_HOT_KEYS_FILE = "one_hot.keys.bin"
DENSE_FILE = "dense.bin"
SPLIT_METHOD = "splitmix64: x = (stream(seed)[row] >> 11) / 2^53; train if x < f0, validation if x < f0+f1, else test"
SPLIT_BY_INPUT = "by input: every row of an input in the split of its role (split.inputs: [role, source])"

_KEY_DTYPE = np.dtype("<i8")
_WEIGHT_DTYPE = np.dtype("<f4")
_DENSE_DTYPE = np.dtype("<f4")
_BYTE_DTYPE = np.dtype("u1")
_ROWS_PER_TASK = 1 << 15


@numba.njit(cache=True, nogil=True)
def _interleave(columns, rows, start, stop):
    """``rows[i, j] = column j [i]`` for ``start <= i < stop``, ``columns[j]`` the address of
    column ``j``'s int64 keys (:mod:`des._views`: one compiled kernel for any number of
    fields), in tiles of 64 rows (each field's values read in order, every row's cache lines written
    while they are in cache). Read where the fields left their keys: no copy of them in between."""
    for first in range(start, stop, 64):
        last = min(first + 64, stop)
        for j in range(columns.shape[0]):
            column = view1(columns[j], stop, rows)
            for i in range(first, last):
                rows[i, j] = column[i]


@dataclass(frozen=True)
class FieldSpec:
    """What a store holds for one field."""

    name: str
    kind: str  # "integer" or "categorical"
    hotness: str = ONE_HOT  # or MULTI_HOT
    weighted: bool = False


def _array_entry(file_name: str, dtype: np.dtype, shape: Sequence[int]) -> dict[str, Any]:
    return {"file": file_name, "dtype": np.dtype(dtype).str, "shape": [int(n) for n in shape]}


class _AppendFile:
    """A raw binary array written by appending chunks (of rows of ``width`` values when given)."""

    def __init__(self, directory: Path, file_name: str, dtype: np.dtype, width: int | None = None) -> None:
        self.file_name = file_name
        self.dtype = np.dtype(dtype)
        self.width = width
        self.length = 0
        self._handle: IO[bytes] | None = open(directory / file_name, "wb")

    def append(self, values: np.ndarray) -> None:
        chunk = np.ascontiguousarray(values, dtype=self.dtype)
        assert self._handle is not None and chunk.shape[1:] == (() if self.width is None else (self.width,))
        self._handle.write(memoryview(chunk).cast("B"))
        self.length += chunk.shape[0]

    def close(self) -> dict[str, Any]:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        return _array_entry(self.file_name, self.dtype, [self.length] + ([] if self.width is None else [self.width]))


class _PlacedFile:
    """As :class:`_AppendFile`, the rows written from row ``first`` of an existing file (a joined
    store's, made long enough: ``des/data/ranks.py``), through shared mappings, so the ranks
    placing their rows into one file at once do not wait for each other (see :func:`place_part`)."""

    def __init__(self, path: Path, dtype: np.dtype, width: int, first: int, limit: int) -> None:
        self.file_name = path.name
        self.dtype = np.dtype(dtype)
        self.width = width
        self.length = 0
        self._path, self._first, self._limit = path, int(first), int(limit)

    def append(self, values: np.ndarray) -> None:
        chunk = np.ascontiguousarray(values, dtype=self.dtype)
        assert chunk.shape[1:] == (self.width,)
        if self.length + chunk.shape[0] > self._limit:  # the next writer's rows: never overwritten
            raise RuntimeError(f"{self._path}: more than the {self._limit} rows placed from row {self._first}")
        if chunk.size:
            into = _file_range(self._path, self.dtype, (self._first + self.length) * self.width, chunk.size)
            into[:] = chunk.reshape(-1)
            del into
        self.length += chunk.shape[0]

    def close(self) -> dict[str, Any]:
        return _array_entry(self.file_name, self.dtype, [self.length, self.width])


def one_hot_width(fields: Sequence[FieldSpec]) -> int:
    """Columns of a store's ``one_hot.keys.bin``: its one-hot fields."""
    return sum(spec.hotness != MULTI_HOT for spec in fields)


def counted(counter: KeyCounter) -> dict[str, Any]:
    """A field's manifest figures of its keys' counter."""
    return key_figures(counter.distinct, counter.total, counter.top_share(10))


def key_figures(distinct: int, occurrences: int, top10_share: float) -> dict[str, Any]:
    """A field's manifest figures: its distinct keys, their occurrences, the 10 most frequent
    keys' share of them."""
    return {"distinct": distinct, "nnz": occurrences, "top10_share": round(top10_share, 6)}


class _FieldWriter:
    """Appends one field's keys (and offsets / weights) and counts its distinct keys. A one-hot
    field's keys go to the store's row-major ``one_hot.keys.bin`` (``one_hot``: its column there)."""

    def __init__(self, directory: Path, index: int, spec: FieldSpec, one_hot: tuple[_AppendFile, int] | None) -> None:
        self.spec = spec
        stem = f"{index:02d}_{spec.name}"
        self.one_hot = one_hot
        self.keys = None if one_hot else _AppendFile(directory, f"{stem}.keys.bin", _KEY_DTYPE)
        self.offsets = _AppendFile(directory, f"{stem}.offsets.bin", _KEY_DTYPE) if spec.hotness == MULTI_HOT else None
        self.weights = _AppendFile(directory, f"{stem}.weights.bin", _WEIGHT_DTYPE) if spec.weighted else None
        if self.offsets is not None:
            self.offsets.append(np.zeros(1, dtype=np.int64))
        self.counter = KeyCounter()

    def append(self, column: np.ndarray | FieldBatch, num_rows: int) -> np.ndarray | None:
        """Append the field's rows and count their keys; a one-hot field's keys are returned
        (contiguous int64), for the caller to interleave into ``one_hot.keys.bin``."""
        if self.offsets is None:
            keys = column.keys if isinstance(column, FieldBatch) else column
            weights = column.weights if isinstance(column, FieldBatch) else None
            if keys.shape[0] != num_rows:
                raise ValueError(f"field {self.spec.name}: {keys.shape[0]} keys for {num_rows} rows")
        else:
            if not isinstance(column, FieldBatch) or column.num_rows != num_rows:
                raise ValueError(f"field {self.spec.name}: multi-hot fields need a FieldBatch of {num_rows} rows")
            keys, weights = column.keys, column.weights
            self.offsets.append(column.offsets[1:] - column.offsets[0] + self.keys.length)
        if (weights is None) == self.spec.weighted:
            raise ValueError(f"field {self.spec.name}: weights {'missing' if self.spec.weighted else 'unexpected'}")
        if self.weights is not None:
            self.weights.append(weights)
        keys = np.ascontiguousarray(keys, dtype=_KEY_DTYPE)
        self.counter.add(keys)
        if self.keys is None:
            return keys
        self.keys.append(keys)
        return None

    def close(self, field_number: int) -> dict[str, Any]:
        if self.one_hot is None:
            assert self.keys is not None
            keys = self.keys.close()
        else:
            matrix, column = self.one_hot
            keys = {**matrix.close(), "column": column}
        return {
            "index": field_number,
            "name": self.spec.name,
            "kind": self.spec.kind,
            "hotness": self.spec.hotness,
            **counted(self.counter),
            "keys": keys,
            "offsets": None if self.offsets is None else self.offsets.close(),
            "weights": None if self.weights is None else self.weights.close(),
        }


class StoreWriter:
    """Writes a column store chunk by chunk into an (empty, existing) directory.

    Use as a context manager; ``finish`` closes the arrays and writes ``manifest.json``.
    """

    def __init__(
        self,
        directory: str | Path,
        fields: Sequence[FieldSpec],
        split: Sequence[float],
        seed: int,
        extra_arrays: Mapping[str, np.dtype] | None = None,
        dense_names: Sequence[str] = (),
        one_hot_into: tuple[Path, int, int] | None = None,
    ) -> None:
        """``one_hot_into``: ``(file, first row, most rows)``, the one-hot keys written into rows
        ``first`` on of that existing file (a joined store's) instead of a file of this store."""
        self.directory = Path(directory)
        self.dense_names = tuple(str(name) for name in dense_names)
        self._dense = (_AppendFile(self.directory, DENSE_FILE, _DENSE_DTYPE, len(self.dense_names))
                       if self.dense_names else None)
        self.split_fractions = check_fractions(split)
        self.split_seed = int(seed)
        #: the split of each input's rows when the rows of separate inputs are given their split
        #: (``append(split_code=...)``): ``[[role, source name], ...]``, recorded in the manifest
        self.split_by_input: list[list[str]] | None = None
        self.num_rows = 0
        self.num_positives = 0
        self.split_counts = np.zeros(len(SPLIT_NAMES), dtype=np.int64)
        one_hot = [i for i, spec in enumerate(fields) if spec.hotness != MULTI_HOT]
        self._one_hot: _AppendFile | _PlacedFile | None = None
        if one_hot:
            self._one_hot = (_AppendFile(self.directory, ONE_HOT_KEYS_FILE, _KEY_DTYPE, len(one_hot))
                             if one_hot_into is None else _PlacedFile(one_hot_into[0], _KEY_DTYPE, len(one_hot),
                                                                      *one_hot_into[1:]))
        self._fields = [_FieldWriter(self.directory, i, spec,
                                     (self._one_hot, one_hot.index(i)) if self._one_hot and i in one_hot else None)
                        for i, spec in enumerate(fields)]
        self._background = Background()  # writes one_hot.keys.bin's blocks in order, beside the next chunk's work
        self._block: np.ndarray | None = None  # the rows' one-hot keys, written while the next rows are keyed
        self._block_write: Any = None
        self._labels = _AppendFile(self.directory, "labels.bin", _BYTE_DTYPE)
        self._split = _AppendFile(self.directory, "split.bin", _BYTE_DTYPE)
        self._extras = {
            name: _AppendFile(self.directory, f"{name}.bin", dtype) for name, dtype in (extra_arrays or {}).items()
        }

    @property
    def counters(self) -> list[KeyCounter]:
        """Each field's counter of its keys so far."""
        return [writer.counter for writer in self._fields]

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close_files()

    def append(
        self,
        labels: np.ndarray,
        columns: Sequence[np.ndarray | FieldBatch],
        extras: Mapping[str, np.ndarray] | None = None,
        dense: np.ndarray | None = None,
        split_code: int | None = None,
    ) -> np.ndarray:
        """Append rows: labels (0/1), one column per field (keys array or FieldBatch), extras, and
        the dense features ``[rows, D]`` (float32) when the store has some; ``split_code``: the
        split of every one of these rows (rows of a separate input), else the seeded split's.

        Returns the split codes (0 train, 1 validation, 2 test) given to these rows.
        """
        count = labels.shape[0]
        if len(columns) != len(self._fields):
            raise ValueError(f"{len(columns)} columns for {len(self._fields)} fields")
        codes = (assign_splits(self.split_seed, self.split_fractions, self.num_rows, count) if split_code is None
                 else np.full(count, split_code, dtype=np.uint8))
        keys = each(lambda field: field[0].append(field[1], count), zip(self._fields, columns))
        if self._one_hot is not None:
            addresses = np.zeros(self._one_hot.width, dtype=np.int64)  # column j's keys at addresses[j]
            for writer, field_keys in zip(self._fields, keys):
                if writer.one_hot is not None:
                    addresses[writer.one_hot[1]] = field_keys.ctypes.data
            block = self._one_hot_block(count)
            rows = [(start, min(start + _ROWS_PER_TASK, count)) for start in range(0, count, _ROWS_PER_TASK)]
            each(lambda bounds: _interleave(addresses, block, *bounds), rows)  # ``keys`` keeps them alive
            self._block_write = self._background.submit(self._one_hot.append, block)
        if (dense is None) != (self._dense is None):
            raise ValueError(f"dense features {'missing' if dense is None else 'unexpected'}")
        if self._dense is not None:
            assert dense is not None
            if dense.shape != (count, len(self.dense_names)):
                raise ValueError(f"dense features of shape {dense.shape} for {count} rows x {len(self.dense_names)}")
            self._dense.append(dense)
        for name, values in (extras or {}).items():
            if values.shape[0] != count:
                raise ValueError(f"extra array {name}: {values.shape[0]} values for {count} rows")
            self._extras[name].append(values)
        self._labels.append(labels)
        self._split.append(codes)
        self.num_rows += count
        self.num_positives += int(np.count_nonzero(labels))
        self.split_counts += np.bincount(codes, minlength=len(SPLIT_NAMES))
        return codes

    def _one_hot_block(self, count: int) -> np.ndarray:
        """The ``[count, one-hot fields]`` block of the rows' keys in the store's order, once the
        previous rows' block is written (reused: no chunk faults in memory of its own)."""
        assert self._one_hot is not None
        if self._block_write is not None:
            self._block_write.result()
        if self._block is None or self._block.shape[0] < count:
            self._block = np.empty((count, self._one_hot.width), dtype=_KEY_DTYPE)
        return self._block[:count]

    def _close_files(self) -> None:
        self._background.close()
        for file in [self._labels, self._split, *self._extras.values(), *([self._one_hot] if self._one_hot else []),
                     *([self._dense] if self._dense else [])]:
            file.close()
        for writer in self._fields:
            for file in (writer.keys, writer.offsets, writer.weights):
                if file is not None:
                    file.close()

    def finish(self, **sections: Any) -> dict[str, Any]:
        """Close all arrays and write ``manifest.json``; ``sections`` are added to the manifest."""
        self._background.wait()
        fields = [writer.close(i) for i, writer in enumerate(self._fields)]
        manifest: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "key_scheme": KEY_SCHEME,
            "num_rows": self.num_rows,
            "num_positives": self.num_positives,
            "positive_rate": positive_rate(self.num_positives, self.num_rows),
            "num_fields": len(fields),
            "field_names": [field["name"] for field in fields],
            "hotness": [field["hotness"] for field in fields],
            "fields": fields,
            "labels": self._labels.close(),
            "split": {
                "array": self._split.close(),
                "names": list(SPLIT_NAMES),
                "fractions": list(self.split_fractions),
                "seed": self.split_seed,
                "method": SPLIT_METHOD,
                "rows": {name: int(n) for name, n in zip(SPLIT_NAMES, self.split_counts)},
            },
            "arrays": {name: file.close() for name, file in self._extras.items()},
        }
        if self.split_by_input is not None:
            _by_input(manifest["split"], self.split_by_input)
        if self._dense is not None:  # absent otherwise: a store without dense features is as before
            manifest["dense"] = {"names": list(self.dense_names), "array": self._dense.close()}
        manifest.update(sections)
        write_manifest(self.directory, manifest)
        return manifest


def _by_input(split: dict[str, Any], inputs: list[list[str]]) -> None:
    """A manifest's split section of a store whose inputs' rows are each in the split of its role
    (no fractions, no seed)."""
    split.update(fractions=None, seed=None, method=SPLIT_BY_INPUT, inputs=inputs)


def positive_rate(positives: int, rows: int) -> float:
    return positives / rows if rows else 0.0


def part_arrays(manifest: Mapping[str, Any]) -> list[tuple[dict[str, Any], str, int | None]]:
    """The arrays of a store as ``(entry, what, field)``: ``what`` is ``"rows"`` for an array of
    a value (or a row of values) per row, ``"offsets"`` for a multi-hot field's row pointers and
    ``"values"`` for its keys and weights (``field``: its number)."""
    arrays = [(manifest["labels"], "rows", None), (manifest["split"]["array"], "rows", None)]
    arrays += [(entry, "rows", None) for entry in manifest.get("arrays", {}).values()]
    if manifest.get("dense"):
        arrays.append((manifest["dense"]["array"], "rows", None))
    one_hot = False
    for number, field in enumerate(manifest["fields"]):
        if field["offsets"] is None:
            if "column" not in field["keys"]:
                arrays.append((field["keys"], "rows", None))  # version 1: a file per field
            elif not one_hot:
                one_hot = True
                arrays.append(({k: v for k, v in field["keys"].items() if k != "column"}, "rows", None))
            continue
        arrays += [(field["offsets"], "offsets", number), (field["keys"], "values", number)]
        if field.get("weights") is not None:
            arrays.append((field["weights"], "values", number))
    return arrays


def joined_manifest(parts: Sequence[Mapping[str, Any]], counts: Sequence[Mapping[str, Any]], split_rows: Sequence[int],
                    split_inputs: list[list[str]] | None = None, **sections: Any) -> dict[str, Any]:
    """The manifest of the store whose rows are the rows of the stores of ``parts`` (manifests, in
    order, written by :class:`StoreWriter` s of the same fields), their keys counted by
    ``counts`` (each field's :func:`counted` figures of every part's keys) and ``split_rows`` rows in each split
    (``split_inputs``: each input's split, when given by input); ``sections`` replace the parts'
    (sources, bad rows)."""
    manifest = json.loads(json.dumps(parts[0]))
    rows = sum(int(part["num_rows"]) for part in parts)
    positives = sum(int(part["num_positives"]) for part in parts)
    manifest.update(num_rows=rows, num_positives=positives, positive_rate=positive_rate(positives, rows))
    manifest["split"]["rows"] = {name: int(n) for name, n in zip(SPLIT_NAMES, split_rows)}
    for field, figures in zip(manifest["fields"], counts):
        field.update(figures)
    lengths: dict[tuple[str, int | None], int] = {}
    for part in parts:
        for entry, what, _ in part_arrays(part):
            lengths[entry["file"], what] = lengths.get((entry["file"], what), 0) + int(entry["shape"][0]) - (
                what == "offsets")
    for entry, what, _ in part_arrays(manifest):
        entry["shape"][0] = lengths[entry["file"], what] + (what == "offsets")
    for field in manifest["fields"]:  # the one-hot keys' entry is each one-hot field's, with its column
        if field["offsets"] is None and "column" in field["keys"]:
            field["keys"]["shape"][0] = rows
    if split_inputs is not None:
        _by_input(manifest["split"], split_inputs)
    manifest.update(sections)
    return manifest


def place_part(part: Path, manifest: Mapping[str, Any], target: Path, rows_before: int, values_before: Sequence[int],
               rewrite: Mapping[str, Any] | None = None, block_bytes: int = 1 << 24, placed: Collection[str] = ()
               ) -> None:
    """Write the arrays of the store at ``part`` (``manifest``) into the files of the joined store
    at ``target`` (made at their full sizes), at the place of its rows: after ``rows_before`` rows
    and, for a multi-hot field ``f``, ``values_before[f]`` keys (its row pointers shifted by them;
    the first part writes the leading 0). ``rewrite`` maps a file name to ``f(first row, values)``
    giving the values to write instead (the split codes, a function of the row's number); the files
    named in ``placed`` are in place already (:class:`StoreWriter`'s ``one_hot_into``).

    The ranks of a job place their parts into the same files at once, each through a shared
    mapping of its range, a block at a time (:func:`_file_range`; a rank holds a block): a
    ``write`` or ``copy_file_range`` into a file holds the file's lock for the whole call, so the
    ranks' copies would run one after another (as long as one process copying the whole store,
    however many ranks), where page faults on different pages of one file proceed side by side."""
    for entry, what, field in part_arrays(manifest):
        if entry["file"] in placed:
            continue
        dtype = np.dtype(entry["dtype"])
        shape = [int(n) for n in entry["shape"]]
        count = int(np.prod(shape, dtype=np.int64))
        width = count // shape[0] if shape[0] else 1
        skip, first = 0, rows_before * width
        if what == "values":
            first = values_before[field]
        elif what == "offsets":
            skip, first = (0, 0) if rows_before == 0 else (1, rows_before + 1)
        if count <= skip:  # nothing of its own (a part without rows)
            continue
        step = max(1, block_bytes // dtype.itemsize // width) * width
        for start in range(skip, count, step):
            values = _file_range(part / entry["file"], dtype, start, min(step, count - start), mode="r")
            if what == "offsets":
                values = values + np.int64(values_before[field])
            elif entry["file"] in (rewrite or {}):
                values = rewrite[entry["file"]](rows_before + start // width, values)
            into = _file_range(target / entry["file"], dtype, first + start - skip, values.shape[0])
            into[:] = values
            del into, values


def _file_range(path: Path, dtype: np.dtype, first: int, count: int, mode: str = "r+") -> np.ndarray:
    """Elements ``first .. first + count`` of the array file ``path`` as a shared mapping (``mode``
    ``r+``: writable)."""
    return np.memmap(path, dtype=dtype, mode=mode, offset=first * dtype.itemsize, shape=(count,))


def make_files(target: Path, manifest: Mapping[str, Any], keep: Collection[str] = ()) -> None:
    """Create the array files of ``manifest`` in ``target`` at their sizes (holes, to be written);
    the files named in ``keep`` exist and are only cut (or grown) to their sizes."""
    for entry, _, _ in part_arrays(manifest):
        size = int(np.prod([int(n) for n in entry["shape"]], dtype=np.int64)) * np.dtype(entry["dtype"]).itemsize
        with open(target / entry["file"], "r+b" if entry["file"] in keep else "wb") as handle:
            handle.truncate(size)


def move_rows(path: Path, width: int, moves: Sequence[tuple[int, int, int]], block_rows: int = 1 << 16) -> None:
    """Move rows of ``width`` int64 values within the file ``path``: ``(from, to, rows)`` each, in
    order, every ``to`` at most its ``from`` and past the rows moved before (a joined store's
    one-hot keys placed where they would be had every line been a row: ``des/data/ranks.py``)."""
    for source, dest, rows in moves:
        if source == dest:
            continue
        for start in range(0, rows, block_rows):
            count = min(block_rows, rows - start) * width
            block = np.array(_file_range(path, _KEY_DTYPE, (source + start) * width, count))  # a copy: may overlap
            into = _file_range(path, _KEY_DTYPE, (dest + start) * width, count)
            into[:] = block
            del into


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest.json`` deterministically (sorted keys, no timestamps)."""
    text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n"
    (directory / MANIFEST_NAME).write_text(text, encoding="utf-8")


def _map_array(directory: Path, entry: Mapping[str, Any]) -> np.ndarray:
    """Open one array of the store read-only, checking that its file has the recorded size."""
    path = directory / entry["file"]
    dtype = np.dtype(entry["dtype"])
    shape = tuple(int(n) for n in entry["shape"])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if not path.is_file():
        raise DataError(f"{path}: array file is missing")
    size = path.stat().st_size
    if size != expected:
        raise DataError(f"{path}: {size} bytes, expected {expected} ({dtype.str} x {shape})")
    if expected == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


@dataclass
class _FieldArrays:
    keys: np.memmap  # a one-hot field of a version 2 store: its column of one_hot.keys.bin (strided)
    offsets: np.memmap | None
    weights: np.memmap | None
    column: int | None = None  # that column's number


def _as_version_1(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest a version 1 store of the same data has (one keys file per one-hot field)."""
    old = json.loads(json.dumps(manifest))
    if old.get("format_version") == 1:
        return old
    old["format_version"] = 1
    for entry in old["fields"]:
        keys = entry["keys"]
        if "column" in keys:
            entry["keys"] = _array_entry(f"{int(entry['index']):02d}_{entry['name']}.keys.bin", np.dtype(keys["dtype"]),
                                         keys["shape"][:1])
    return old


class ColumnStore:
    """A prepared dataset opened read-only: memory-mapped labels, split and per-field arrays."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self.num_rows: int = int(manifest["num_rows"])
        self.field_names: tuple[str, ...] = tuple(manifest["field_names"])
        self.num_fields: int = len(self.field_names)
        self.labels: np.ndarray = self._checked(manifest["labels"], "labels", [self.num_rows])
        self.split: np.ndarray = self._checked(manifest["split"]["array"], "split", [self.num_rows])
        self._one_hot_keys: np.ndarray | None = None  # one_hot.keys.bin (version 2)
        self._fields = [self._open_field(entry) for entry in manifest["fields"]]
        columns = sorted(f.column for f in self._fields if f.column is not None)
        if self._one_hot_keys is not None and columns != list(range(self._one_hot_keys.shape[1])):
            raise DataError(f"{path / MANIFEST_NAME}: the one-hot fields' columns {columns} are not each of the "
                            f"{self._one_hot_keys.shape[1]} columns of {ONE_HOT_KEYS_FILE} once")
        self._arrays = {name: _map_array(path, entry) for name, entry in manifest.get("arrays", {}).items()}
        dense = manifest.get("dense") or {}
        #: names of the dense (numeric) features, in the order of the columns of :meth:`take_dense`
        self.dense_names: tuple[str, ...] = tuple(dense.get("names", ()))
        self.num_dense: int = len(self.dense_names)
        self._dense = (self._checked(dense["array"], "dense features", [self.num_rows, self.num_dense])
                       if self.num_dense else None)
        self._split_rows: dict[str, np.ndarray] = {}
        self._one_hot_offsets: np.ndarray | None = None

    @classmethod
    def open(cls, path: str | Path) -> ColumnStore:
        """Open and validate a store directory; raises DataError naming the offending file."""
        directory = Path(path)
        if not directory.exists():
            raise DataError(f"{directory}: no such dataset directory")
        if not directory.is_dir():
            raise DataError(f"{directory}: not a directory")
        manifest_path = directory / MANIFEST_NAME
        if not manifest_path.is_file():
            raise DataError(f"{manifest_path}: missing (not a prepared dataset)")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise DataError(f"{manifest_path}: not valid JSON ({error})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
            raise DataError(f"{manifest_path}: not a {FORMAT_NAME} manifest")
        if manifest.get("format_version") not in READABLE_VERSIONS:
            raise DataError(f"{manifest_path}: format version {manifest.get('format_version')!r}, expected "
                            f"{' or '.join(map(str, READABLE_VERSIONS))}")
        try:
            return cls(directory, manifest)
        except (KeyError, TypeError, ValueError) as error:
            raise DataError(f"{manifest_path}: malformed manifest ({type(error).__name__}: {error})") from None

    def _checked(self, entry: Mapping[str, Any], what: str, shape: list[int]) -> np.ndarray:
        if list(entry["shape"]) != shape:
            raise DataError(f"{self.path / entry['file']}: {what} has shape {entry['shape']}, expected {shape}")
        return _map_array(self.path, entry)

    def _open_field(self, entry: Mapping[str, Any]) -> _FieldArrays:
        column = None
        if entry["hotness"] == ONE_HOT and "column" in entry["keys"]:
            if entry["keys"]["file"] != ONE_HOT_KEYS_FILE:
                raise DataError(f"{self.path / MANIFEST_NAME}: field {entry['name']}'s one-hot keys are in "
                                f"{entry['keys']['file']!r}, not {ONE_HOT_KEYS_FILE!r}")
            if self._one_hot_keys is None:
                self._one_hot_keys = self._checked(entry["keys"], "one-hot keys",
                                                   [self.num_rows, int(entry["keys"]["shape"][1])])
            column = int(entry["keys"]["column"])
            if not 0 <= column < self._one_hot_keys.shape[1]:
                raise DataError(f"{self.path / MANIFEST_NAME}: field {entry['name']} at column {column} of "
                                f"{self._one_hot_keys.shape[1]} one-hot keys")
            keys, offsets = self._one_hot_keys[:, column], None
        elif entry["hotness"] == ONE_HOT:  # version 1: a file of its own
            keys = self._checked(entry["keys"], f"field {entry['name']} keys", [self.num_rows])
            offsets = None
        else:
            offsets = self._checked(entry["offsets"], f"field {entry['name']} offsets", [self.num_rows + 1])
            keys = _map_array(self.path, entry["keys"])
            if int(offsets[-1]) != keys.shape[0] or int(offsets[0]) != 0:
                offsets_path = self.path / entry["offsets"]["file"]
                raise DataError(f"{offsets_path}: row pointers do not match {keys.shape[0]} keys")
        weights = None
        if entry.get("weights") is not None:
            weights = self._checked(entry["weights"], f"field {entry['name']} weights", [keys.shape[0]])
        return _FieldArrays(keys, offsets, weights, column)

    def __repr__(self) -> str:
        return f"ColumnStore({str(self.path)!r}, rows={self.num_rows}, fields={self.num_fields})"

    @property
    def fingerprint(self) -> str:
        """Identifies the prepared data by content: its manifest (sources' sha256, split, counts), in
        its version 1 form (the same data prepared in either layout is the same data)."""
        return hashlib.sha256(json.dumps(_as_version_1(self.manifest), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def display_name(self) -> str:
        """How reports name the data (the store folder's name)."""
        return self.path.name

    @property
    def source(self) -> str:
        """Where the data is, as recorded in a run's ``config.json``."""
        return str(self.path)

    def layout(self) -> list[tuple[str, str, str, bool]]:
        """The column layout: (name, kind, hotness, weighted) of every field, then ``(name, "dense",
        "dense", False)`` of every dense feature. Stores of the same layout can be read side by side
        (:class:`des.data.inputs.ConcatStore`)."""
        return ([(f["name"], f["kind"], f["hotness"], f.get("weights") is not None) for f in self.manifest["fields"]]
                + [(name, "dense", "dense", False) for name in self.dense_names])

    def field_index(self, field: int | str) -> int:
        """The number of a field given by number or name."""
        if isinstance(field, str):
            if field not in self.field_names:
                raise DataError(f"{self.path}: no field named {field!r}")
            return self.field_names.index(field)
        index = int(field)
        if not 0 <= index < self.num_fields:
            raise DataError(f"{self.path}: field number {index} out of range 0..{self.num_fields - 1}")
        return index

    def is_one_hot(self, field: int | str) -> bool:
        """True if every row of the field has exactly one key (no offsets stored)."""
        return self._fields[self.field_index(field)].offsets is None

    def field(self, field: int | str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(offsets, keys, weights_or_None)`` of a whole field (memmaps; offsets made up for one-hot;
        a one-hot field's keys of a version 2 store are a strided column of ``one_hot.keys.bin``)."""
        arrays = self._fields[self.field_index(field)]
        offsets = arrays.offsets
        if offsets is None:
            if self._one_hot_offsets is None:
                self._one_hot_offsets = np.arange(self.num_rows + 1, dtype=np.int64)
            offsets = self._one_hot_offsets
        return offsets, arrays.keys, arrays.weights

    def distinct_count(self, field: int | str) -> int:
        """Number of distinct keys in the field over all rows."""
        return int(self.manifest["fields"][self.field_index(field)]["distinct"])

    def array(self, name: str) -> np.ndarray:
        """An extra per-row array, e.g. ``"probabilities"`` of synthetic data."""
        if name not in self._arrays:
            raise DataError(f"{self.path}: no array named {name!r} (has: {', '.join(self._arrays) or 'none'})")
        return self._arrays[name]

    def split_rows(self, name: str) -> np.ndarray:
        """Row indices (int64, ascending) of split ``'train'``, ``'validation'``, ``'test'`` or ``'all'``."""
        if name not in self._split_rows:
            if name == "all":
                rows = np.arange(self.num_rows, dtype=np.int64)
            else:
                rows = np.flatnonzero(np.asarray(self.split) == split_code(name)).astype(np.int64)
            rows.flags.writeable = False
            self._split_rows[name] = rows
        return self._split_rows[name]

    def take_labels(self, rows: np.ndarray) -> np.ndarray:
        """The 0/1 labels (uint8) of ``rows``, in that order."""
        return np.asarray(self.labels).take(rows)

    def take_dense(self, rows: np.ndarray) -> np.ndarray | None:
        """The dense features ``[len(rows), num_dense]`` (float32) of ``rows``, in that order; None
        when the store has none."""
        if self._dense is None:
            return None
        return np.asarray(self._dense).take(np.asarray(rows, dtype=np.int64), axis=0)

    @property
    def schema(self) -> dict[str, Any] | None:
        """The schema the store was prepared with (``des.data.schema``), None for Criteo's."""
        return self.manifest.get("schema")

    def gather_fields(self, fields: Sequence[int], rows: np.ndarray) -> KeyedIds:
        """The ids of ``fields`` for ``rows`` (in that order), keyed-jagged. The one-hot fields of a
        version 2 store are read together, one row-major read of every row's keys (see the module
        docstring), or, where they are at most a fifth of the one-hot fields, their keys alone;
        when every field asked for is such a field, unweighted, their ``[F, B]`` block is the
        batch's keys as it is."""
        rows = np.asarray(rows, dtype=np.int64)
        fields = [int(f) for f in fields]
        columns = {f: self._fields[f].column for f in fields if self._fields[f].column is not None}
        if not columns:
            return KeyedIds.of(fields, [self.gather(f, rows) for f in fields])
        assert self._one_hot_keys is not None
        every = np.asarray(self._one_hot_keys)
        wanted = list(columns.values())
        if len(wanted) * 5 <= every.shape[1] and every.flags.c_contiguous:
            # a few of many (a rank's own fields): their keys alone, [fields, b] by flat index; whole
            # rows cost 312 B a row on Criteo where 5 fields read 40 (32768 rows: 0.8 against 2.5 ms)
            keys = every.reshape(-1).take(np.asarray(wanted, np.int64)[:, None] + rows[None, :] * every.shape[1])
        else:
            block = every.take(rows, axis=0)  # [b, F1]: each row's keys at once
            # [fields, b], owning its memory
            keys = np.ascontiguousarray(block.T) if wanted == list(range(block.shape[1])) else block.T[wanted]
        if len(columns) == len(fields) and all(self._fields[f].weights is None for f in fields):
            return KeyedIds.of_block(fields, keys)
        offsets = np.arange(rows.shape[0] + 1, dtype=np.int64)
        read = {f: FieldBatch(offsets, keys[i], None if self._fields[f].weights is None
                              else np.asarray(self._fields[f].weights).take(rows)) for i, f in enumerate(columns)}
        return KeyedIds.of(fields, [read[f] if f in read else self.gather(f, rows) for f in fields])

    def gather(self, field: int | str, rows: np.ndarray) -> FieldBatch:
        """The field's ids for ``rows`` (in that order) as a CSR block."""
        arrays = self._fields[self.field_index(field)]
        rows = np.asarray(rows, dtype=np.int64)
        if arrays.offsets is None:
            index = rows
            offsets = np.arange(rows.shape[0] + 1, dtype=np.int64)
        else:
            starts = arrays.offsets[rows]
            lengths = arrays.offsets[rows + 1] - starts
            offsets = np.empty(rows.shape[0] + 1, dtype=np.int64)
            offsets[0] = 0
            np.cumsum(lengths, out=offsets[1:])
            index = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
        keys = np.asarray(arrays.keys).take(index)
        weights = None if arrays.weights is None else np.asarray(arrays.weights).take(index)
        return FieldBatch(offsets, keys, weights)


def resolve_fields(store: ColumnStore, fields: Sequence[int | str] | None) -> list[int]:
    """Field numbers for a selection given by numbers or names (``None`` = all fields)."""
    if fields is None:
        return list(range(store.num_fields))
    return [store.field_index(f) for f in fields]

