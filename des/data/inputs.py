"""Separate training, validation and test inputs: ``--train-data``, ``--validation-data``, ``--test-data``.

Each is one or more raw Criteo TSV/.gz files, directories prepared with ``python -m des.data
prepare``, or globs (a glob's matches in natural order: ``day_2`` before ``day_10``), read in the
given order as one stream of rows.

Every raw file is prepared on its own, whole, into the cache by :func:`open_dataset` (the entry is
named after the file's sha256, so a changed file is prepared again and an unchanged one never; it
is the entry ``des.evaluate`` uses for the same file), and a prepared directory contributes all its
rows (its own split is not used). Raw files of a schema other than Criteo's are read with it; its
training statistics (quantile boundaries, standardize mean and std) come from all rows of the
training files and apply to the validation and test files too. :class:`ConcatStore` reads these
stores side by side as one: row ``i`` of part ``p`` is row ``starts[p] + i``, and every row of a
part belongs to the split of its flag. It answers what the runner and :class:`BatchReader` ask of
a :class:`ColumnStore`, so the batch order (a function of the seed and the epoch, not of the number
of ranks), the row shards and checkpoint positions work as with ``--data``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .batch import FieldBatch, KeyedIds
from .build import SchemaLike, open_dataset
from .errors import DataError
from .schema import Schema, describe_schema, load_schema
from .split import SPLIT_NAMES
from .store import ONE_HOT, ColumnStore

FLAGS: dict[str, str] = {"train": "--train-data", "validation": "--validation-data", "test": "--test-data"}
WHOLE_FILE: tuple[float, float, float] = (0.0, 0.0, 1.0)  # a raw file prepared whole (as des.evaluate does)
_GLOB_CHARACTERS = re.compile(r"[*?\[]")


def natural_key(path: str) -> list[Any]:
    """Sort key that compares runs of digits as numbers: ``day_2`` < ``day_10``."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", path))]


def split_inputs(spec: str) -> list[str]:
    """``"a.gz,b/*.gz"`` -> ``["a.gz", "b/*.gz"]`` (the flags take several values, joined by commas)."""
    return [item.strip() for item in spec.split(",") if item.strip()]


def expand_inputs(spec: str, flag: str) -> list[str]:
    """The files and directories of one flag, in order: each glob replaced by its matches (natural
    order); a DataError naming the flag if a glob matches nothing."""
    paths: list[str] = []
    for item in split_inputs(spec):
        item = os.path.expanduser(item)
        if _GLOB_CHARACTERS.search(item) and not os.path.exists(item):
            matches = sorted(glob.glob(item), key=natural_key)
            if not matches:
                raise DataError(f"{flag}: {item}: no file matches")
            paths.extend(matches)
        else:
            paths.append(item)
    if not paths:
        raise DataError(f"{flag}: no input given")
    return paths


@dataclass(frozen=True)
class Part:
    """One input: its split (``train``, ``validation``, ``test``), the path as given, its store."""

    role: str
    input: str
    store: ColumnStore


def open_inputs(specs: Mapping[str, str], cache_dir: str | os.PathLike | None = None,
                bad_rows: str = "fail", schema: SchemaLike = None, comm: Any = None) -> "ConcatStore":
    """Expand, validate and prepare (once, into the cache) the inputs of each split; ``specs`` maps
    ``train`` / ``validation`` / ``test`` to a flag's value; raw files are read with ``schema``
    (default ``criteo``). Every error is one line naming the flag and the file (a glob matching
    nothing, a missing, malformed or empty file, a file of another column layout than the training
    data). ``comm``: every rank of it calls this and prepares its share of each file (``ranks.py``)."""
    schema = load_schema(schema)
    planned = [(role, path) for role in FLAGS if specs.get(role) for path in expand_inputs(specs[role], FLAGS[role])]
    # First what costs nothing (every file there and not empty, every layout the same), then the
    # preparations (which read and validate every row).
    check_layouts([(role, path, _checked_layout(path, FLAGS[role], schema)) for role, path in planned])
    schema = _training_statistics(schema, planned, bad_rows, comm)
    parts = []
    for role, path in planned:
        try:
            store = open_dataset(path, cache_dir=cache_dir, split=WHOLE_FILE, seed=0, bad_rows=bad_rows,
                                 schema=schema, comm=comm)
        except DataError as error:
            raise DataError(f"{FLAGS[role]}: {error}") from None
        if store.num_rows == 0:
            raise DataError(f"{FLAGS[role]}: {path}: no rows")
        parts.append(Part(role, path, store))
    check_same_statistics(parts)
    _warn_about_shared_files(parts)
    return ConcatStore(parts)


def _training_statistics(schema: Schema, planned: Sequence[tuple[str, str]], bad_rows: str, comm: Any = None
                         ) -> Schema:
    """The schema resolved with the statistics of every row of the raw training files (or, when
    the training inputs are prepared directories, the schema recorded in the first one; with a
    ``comm`` of several ranks, rank 0's)."""
    if schema.resolved:
        return schema
    from .tabular import resolve_statistics

    if comm is not None and comm.Get_size() > 1:
        from .ranks import resolved_on_ranks

        return resolved_on_ranks(comm, schema, lambda: _training_statistics(schema, planned, bad_rows).statistics())

    raw = [path for role, path in planned if role == "train" and not os.path.isdir(path)]
    if not raw:
        first = next(path for role, path in planned if role == "train")
        return Schema.from_dict(ColumnStore.open(first).schema or {}, source=first)
    try:
        return resolve_statistics(schema, raw, (1.0, 0.0, 0.0), 0, bad_rows)
    except DataError as error:
        raise DataError(f"{FLAGS['train']}: {error}") from None


def _checked_layout(path: str, flag: str, schema: Schema) -> list[tuple[str, str, str, bool]]:
    """The column layout of an input that exists and is not empty: a prepared directory's own, a
    raw file's is the schema's (each row is checked when the file is prepared)."""
    if os.path.isdir(path):
        try:
            return ColumnStore.open(path).layout()
        except DataError as error:
            raise DataError(f"{flag}: {error}") from None
    if not os.path.exists(path):
        raise DataError(f"{flag}: {path}: no such file or dataset directory")
    if os.path.getsize(path) == 0:
        raise DataError(f"{flag}: {path}: file is empty (no rows)")
    return schema.layout()


def check_layouts(inputs: Sequence[tuple[str, str, list[tuple[str, str, str, bool]]]]) -> None:
    """``(split, input, layout)`` of every input: each layout must be the first training input's."""
    first = next((item for item in inputs if item[0] == "train"), None)
    if first is None:
        raise DataError("--train-data: no training input given")
    for role, given, layout in inputs:
        difference = layout_difference(layout, first[2])
        if difference:
            raise DataError(f"{FLAGS[role]}: {given}: another column layout than the training data {first[1]}: "
                            f"{difference}")


def check_same_statistics(parts: Sequence[Part]) -> None:
    """Every input must have been prepared with the first training input's resolved schema: the
    validation and test rows transformed with the training data's statistics (quantiles, means and
    standard deviations), never their own (as ``des.evaluate`` refuses data of other statistics)."""
    first = next(part for part in parts if part.role == "train")
    wanted = describe_schema(first.store.schema)
    for part in parts:
        have = describe_schema(part.store.schema)
        if have != wanted:
            raise DataError(f"{FLAGS[part.role]}: {part.input} was prepared with schema {have}, {FLAGS['train']} "
                            f"{first.input} with {wanted}: every split must be transformed with the training "
                            "data's statistics (prepare them as one store: des.data prepare --train FILES "
                            "--validation FILES --test FILES, and train on it with --data)")


def _warn_about_shared_files(parts: Sequence[Part]) -> None:
    """A file in two splits (a glob of training days that also matches the test day, say) is
    allowed but rarely meant: one warning line each."""
    seen: dict[str, str] = {}
    for part in parts:
        first = seen.setdefault(os.path.realpath(part.input), part.role)
        if first != part.role:
            print(f"warning: {part.input} is in {FLAGS[first]} and in {FLAGS[part.role]}: its rows are in both "
                  "splits", file=sys.stderr, flush=True)


class ConcatStore:
    """Several column stores of one layout read as one; each part's rows are one split's."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts = list(parts)
        for part in self.parts:
            if part.role not in FLAGS:
                raise DataError(f"{part.input}: unknown split {part.role!r}")
        check_layouts([(part.role, part.input, part.store.layout()) for part in self.parts])
        first = next(part for part in self.parts if part.role == "train")
        self.field_names: tuple[str, ...] = first.store.field_names
        self.num_fields: int = first.store.num_fields
        self.dense_names: tuple[str, ...] = first.store.dense_names
        self.num_dense: int = first.store.num_dense
        sizes = [part.store.num_rows for part in self.parts]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.num_rows: int = int(self.starts[-1])
        self._split_rows: dict[str, np.ndarray] = {}
        self._layout = first.store.layout()
        self._last_rows: Any = None
        self._last_groups: list[tuple[int, np.ndarray, np.ndarray]] = []

    # ------------------------------------------------------------------ across processes
    def to_json(self) -> list[list[str]]:
        """What another process needs to open the same stores (after rank 0 prepared them)."""
        return [[p.role, p.input, str(p.store.path)] for p in self.parts]

    @classmethod
    def from_json(cls, parts: list[list[str]]) -> "ConcatStore":
        return cls([Part(role, given, ColumnStore.open(path)) for role, given, path in parts])

    # ------------------------------------------------------------------ identity and reports
    @property
    def fingerprint(self) -> str:
        """The training and validation parts, in order, by content: a checkpoint's batch order and
        its early-stopping history belong to them. Test inputs may change between runs."""
        kept = [[p.role, p.store.fingerprint] for p in self.parts if p.role != "test"]
        return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16]

    def input_names(self, roles: Sequence[str] = ("train", "validation")) -> dict[str, list[str]]:
        """The file names of each split's inputs (for a resume refused because they changed)."""
        return {role: [Path(p.input).name for p in self.parts if p.role == role] for role in roles
                if any(p.role == role for p in self.parts)}

    @property
    def display_name(self) -> str:
        def names(role: str) -> str:
            given = [Path(p.input).name for p in self.parts if p.role == role]
            return given[0] if len(given) == 1 else f"{given[0]} .. {given[-1]} ({len(given)} files)"

        return "; ".join(f"{role} {names(role)}" for role in FLAGS if any(p.role == role for p in self.parts))

    @property
    def source(self) -> dict[str, list[dict[str, Any]]]:
        """Each split's inputs (as given) and their prepared stores, for ``config.json``."""
        return {role: [{"input": os.path.abspath(p.input), "store": str(p.store.path), "rows": p.store.num_rows}
                       for p in self.parts if p.role == role] for role in FLAGS}

    def __repr__(self) -> str:
        return f"ConcatStore({self.display_name!r}, rows={self.num_rows}, fields={self.num_fields})"

    # ------------------------------------------------------------------ what the batch reader asks
    def field_index(self, field: int | str) -> int:
        return self.parts[0].store.field_index(field)

    def distinct_count(self, field: int | str) -> int:
        """Distinct ids of the field over the training inputs, counted per input and summed (an id
        in several inputs counts once for each): a bound of the rows training inserts."""
        f = self.field_index(field)
        return sum(p.store.distinct_count(f) for p in self.parts if p.role == "train")

    def split_rows(self, name: str) -> np.ndarray:
        """Row indices (int64, ascending) of ``'train'``, ``'validation'``, ``'test'`` or ``'all'``."""
        if name not in self._split_rows:
            if name != "all" and name not in SPLIT_NAMES:
                raise DataError(f"unknown split {name!r} (expected one of {', '.join(SPLIT_NAMES)} or 'all')")
            ranges = [np.arange(self.starts[i], self.starts[i + 1], dtype=np.int64)
                      for i, p in enumerate(self.parts) if name in ("all", p.role)]
            rows = np.concatenate(ranges) if ranges else np.zeros(0, dtype=np.int64)
            rows.flags.writeable = False
            self._split_rows[name] = rows
        return self._split_rows[name]

    def _by_part(self, rows: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``(part, positions in rows, the part's own row numbers)`` for every part ``rows`` touch.
        The batch reader asks for the labels and every field of the same ``rows`` array: the last
        answer is kept for it."""
        if rows is self._last_rows:
            return self._last_groups
        indices = np.asarray(rows, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_rows):
            raise DataError(f"{self!r}: row {indices.min() if indices.min() < 0 else indices.max()} out of range")
        part = np.searchsorted(self.starts, indices, side="right") - 1
        order = np.argsort(part, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=len(self.parts)))])
        groups = []
        for p in np.flatnonzero(np.diff(bounds)):
            positions = order[bounds[p]:bounds[p + 1]]
            groups.append((int(p), positions, indices[positions] - self.starts[p]))
        self._last_rows, self._last_groups = rows, groups
        return groups

    def take_labels(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty(len(rows), dtype=np.uint8)
        for p, positions, local in self._by_part(rows):
            out[positions] = self.parts[p].store.take_labels(local)
        return out

    def take_dense(self, rows: np.ndarray) -> np.ndarray | None:
        if not self.num_dense:
            return None
        out = np.empty((len(rows), self.num_dense), dtype=np.float32)
        for p, positions, local in self._by_part(rows):
            out[positions] = self.parts[p].store.take_dense(local)
        return out

    @property
    def schema(self) -> dict[str, Any] | None:
        return self.parts[0].store.schema

    def gather_fields(self, fields: Sequence[int], rows: np.ndarray) -> KeyedIds:
        """The ids of ``fields`` for ``rows``, keyed-jagged, each part's fields read together
        (``ColumnStore.gather_fields``)."""
        fields = [self.field_index(f) for f in fields]
        groups = self._by_part(rows)
        if len(groups) == 1:  # every row from one part: its positions are 0..n-1 in order
            return self.parts[groups[0][0]].store.gather_fields(fields, groups[0][2])
        parts = [(positions, self.parts[p].store.gather_fields(fields, local)) for p, positions, local in groups]
        return KeyedIds.of(fields, [self._merge(f, len(rows), [(positions, got[f]) for positions, got in parts])
                                    for f in fields])

    def gather(self, field: int | str, rows: np.ndarray) -> FieldBatch:
        """The field's ids for ``rows`` (in that order) as a CSR block."""
        f = self.field_index(field)
        return self.gather_fields([f], rows)[f]

    def _merge(self, f: int, size: int, pieces: list[tuple[np.ndarray, FieldBatch]]) -> FieldBatch:
        """Field ``f``'s batch of ``size`` rows from the parts' ``(positions, their rows' batch)``."""
        weighted = self._layout[f][3]
        if self._layout[f][2] == ONE_HOT:  # one key per row: put each part's keys at its rows' positions
            keys = np.empty(size, dtype=np.int64)
            weights = np.empty(size, dtype=np.float32) if weighted else None
            for positions, block in pieces:
                keys[positions] = block.keys
                if weights is not None:
                    weights[positions] = block.weights
            return FieldBatch(np.arange(size + 1, dtype=np.int64), keys, weights)
        lengths = np.zeros(size, dtype=np.int64)
        for positions, block in pieces:
            lengths[positions] = np.diff(block.offsets)
        offsets = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        keys = np.empty(int(offsets[-1]), dtype=np.int64)
        weights = np.empty(keys.shape[0], dtype=np.float32) if weighted else None
        for positions, block in pieces:
            counts = np.diff(block.offsets)
            target = np.repeat(offsets[positions] - block.offsets[:-1], counts) + np.arange(block.keys.shape[0])
            keys[target] = block.keys
            if weights is not None:
                weights[target] = block.weights
        return FieldBatch(offsets, keys, weights)


def layout_difference(layout: list[tuple[str, str, str, bool]], expected: list[tuple[str, str, str, bool]]) -> str:
    """How a column layout differs from the expected one ("" if it does not)."""
    if len(layout) != len(expected):
        return f"{len(layout)} fields, the training data has {len(expected)}"
    for (name, kind, hotness, weighted), (e_name, e_kind, e_hotness, e_weighted) in zip(layout, expected):
        if name != e_name:
            return f"field {name} where the training data has {e_name}"
        if (kind, hotness, weighted) != (e_kind, e_hotness, e_weighted):
            def what(k: str, h: str, w: bool) -> str:
                return f"{k} {h}{' weighted' if w else ''}"
            return (f"field {name} is {what(kind, hotness, weighted)}, in the training data "
                    f"{what(e_kind, e_hotness, e_weighted)}")
    return ""
