"""The batch record handed to training: labels, row indices and every requested field's ids in ONE
keyed-jagged form (:class:`KeyedIds`, TorchRec's ``KeyedJaggedTensor``), the form the store emits
and the tables, the exchange and the step consume; a field's ids alone are a :class:`FieldBatch`
view of it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class FieldBatch:
    """The ids of one field for the rows of a batch, in CSR form.

    Row ``r`` has the keys ``keys[offsets[r]:offsets[r + 1]]`` (exactly one for a one-hot field).
    """

    offsets: np.ndarray  # int64 [B+1], CSR row pointers into keys
    keys: np.ndarray  # int64 [nnz]
    weights: np.ndarray | None  # float32 [nnz] feature values, None means all 1.0

    @property
    def num_rows(self) -> int:
        """Number of rows (B)."""
        return self.offsets.shape[0] - 1

    def take(self, lo: int, hi: int) -> FieldBatch:
        """Rows ``lo:hi`` with the row pointers re-based to start at 0."""
        offsets = self.offsets[lo : hi + 1]
        start, stop = int(offsets[0]), int(offsets[-1])
        weights = None if self.weights is None else self.weights[start:stop]
        return FieldBatch(offsets - start, self.keys[start:stop], weights)


# per (fields, rows): key_offsets and the [F, B + 1] offsets of one-hot fields, built once (nothing
# writes them; they stay writeable so that the table kernels see one array type)
_ONE_HOT_LAYOUTS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _one_hot_layout(fields: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    layout = _ONE_HOT_LAYOUTS.get((fields, rows))
    if layout is None:
        if len(_ONE_HOT_LAYOUTS) >= 16:  # a few batch sizes per process (train, evaluation, last batches)
            _ONE_HOT_LAYOUTS.clear()
        layout = _ONE_HOT_LAYOUTS[(fields, rows)] = (np.arange(fields + 1, dtype=np.int64) * rows,
                                                     np.tile(np.arange(rows + 1, dtype=np.int64), (fields, 1)))
    return layout


class KeyedIds:
    """Several fields' ids for the same rows, keyed-jagged: ``keys`` holds every field's ids, field
    after field (field ``fields[j]``'s are ``keys[key_offsets[j]:key_offsets[j + 1]]``), each field
    with its CSR row pointers ``offsets[j]`` (``[F, B + 1]``, into its own ids) and, where
    ``weighted[j]``, its ids' ``weights`` (float32, aligned with ``keys``; empty when no field is
    weighted). ``one_hot``: every field has one unweighted id a row (``keys`` may then be the
    ``[F, B]`` block the store read, as it is).

    Indexed by field number, it gives that field's :class:`FieldBatch` (a view; ``items()``, ``values()``, ``in``,
    ``len`` and iteration over the field numbers as a dict's), so code that wants one field reads
    ``ids[f]``; the tables take the arrays as they are (``des.hashtable``'s
    ``ShardTables.touch``): a batch is never re-packed between the store and the lookup."""

    def __init__(self, fields: Sequence[int], keys: np.ndarray, key_offsets: np.ndarray, offsets: np.ndarray,
                 weights: np.ndarray, weighted: np.ndarray, one_hot: bool = False) -> None:
        self.fields = tuple(int(f) for f in fields)
        self.keys, self.key_offsets, self.offsets = keys, key_offsets, offsets
        self.weights, self.weighted, self.one_hot = weights, weighted, bool(one_hot)
        self._position = {f: j for j, f in enumerate(self.fields)}

    # ---------------------------------------------------------------- made from
    @classmethod
    def of(cls, fields: Sequence[int], ids: Sequence[Any]) -> KeyedIds:
        """Per-field CSR ids (objects with ``offsets``, ``keys``, ``weights``: a FieldBatch)
        concatenated; keys must be integers (uint64 ids are reinterpreted as int64)."""
        fields = list(fields)
        if len(fields) != len(ids):
            raise ValueError(f"{len(ids)} fields of ids for {len(fields)} field numbers")
        rows = {int(f.offsets.shape[0]) for f in ids}
        if len(rows) > 1:
            raise ValueError(f"fields disagree on the batch size: offsets of lengths {sorted(rows)}")
        sizes = [int(f.keys.shape[0]) for f in ids]
        key_offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(sizes, out=key_offsets[1:])
        keys = np.concatenate([_int64_keys(f.keys) for f in ids]) if ids else np.zeros(0, np.int64)
        offsets = (np.stack([np.asarray(f.offsets, dtype=np.int64) for f in ids]) if ids
                   else np.zeros((0, (rows.pop() if rows else 1)), np.int64))
        weighted = np.array([f.weights is not None for f in ids], dtype=np.bool_)
        weights = np.ones(keys.shape[0] if weighted.any() else 0, dtype=np.float32)  # read only where weighted
        for j, f in enumerate(ids):
            if f.weights is not None:
                weights[key_offsets[j]:key_offsets[j + 1]] = f.weights
        return cls(fields, keys, key_offsets, offsets, weights, weighted)

    @classmethod
    def of_block(cls, fields: Sequence[int], block: np.ndarray) -> KeyedIds:
        """One-hot unweighted fields read as the rows of one ``[F, B]`` int64 block: its memory
        is the keys (no copy), the offsets are shared per batch size."""
        block = np.ascontiguousarray(block, dtype=np.int64)
        key_offsets, offsets = _one_hot_layout(block.shape[0], block.shape[1])
        return cls(fields, block.reshape(-1), key_offsets, offsets, np.ones(0, np.float32),
                   np.zeros(block.shape[0], np.bool_), one_hot=True)

    @classmethod
    def empty(cls, rows: int) -> KeyedIds:
        """No field, ``rows`` rows."""
        return cls([], np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros((0, rows + 1), np.int64),
                   np.ones(0, np.float32), np.zeros(0, np.bool_))

    # ---------------------------------------------------------------- the Mapping
    def __getitem__(self, field: int) -> FieldBatch:
        j = self._position[int(field)]
        a, b = int(self.key_offsets[j]), int(self.key_offsets[j + 1])
        offsets = self.offsets[j].view()
        offsets.flags.writeable = False  # one-hot fields share their offsets with every batch of that size
        return FieldBatch(offsets, self.keys[a:b], self.weights[a:b] if self.weighted[j] else None)

    def __iter__(self) -> Iterator[int]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __contains__(self, field: object) -> bool:
        return field in self._position

    def items(self) -> Iterator[tuple[int, FieldBatch]]:
        """``(field, its ids)`` in order."""
        return ((f, self[f]) for f in self.fields)

    def values(self) -> Iterator[FieldBatch]:
        """Every field's ids, in order."""
        return (self[f] for f in self.fields)

    @property
    def num_rows(self) -> int:
        """Rows (B)."""
        return int(self.offsets.shape[1] - 1)

    # ---------------------------------------------------------------- parts of it
    def select(self, fields: Sequence[int]) -> KeyedIds:
        """The ids of ``fields``, in that order: views where they are a run of this batch's fields
        in order (the common case: a rank reads exactly the fields it holds), else gathered."""
        fields = [int(f) for f in fields]
        if fields == list(self.fields):
            return self
        positions = [self._position[f] for f in fields]
        if positions and positions == list(range(positions[0], positions[0] + len(positions))):
            j0, j1 = positions[0], positions[-1] + 1
            a, b = int(self.key_offsets[j0]), int(self.key_offsets[j1])
            return KeyedIds(fields, self.keys[a:b], self.key_offsets[j0:j1 + 1] - a, self.offsets[j0:j1],
                            self.weights[a:b] if self.weighted[j0:j1].any() else self.weights[:0],
                            self.weighted[j0:j1], self.one_hot)
        if self.one_hot:
            block = self.keys.reshape(len(self.fields), self.num_rows)
            return KeyedIds.of_block(fields, block[positions])
        if not fields:
            return KeyedIds.empty(self.num_rows)
        return KeyedIds.of(fields, [self[f] for f in fields])

    def take(self, lo: int, hi: int) -> KeyedIds:
        """Rows ``lo:hi`` of every field (a copy of their ids; the row pointers re-based)."""
        if not self.fields:
            return KeyedIds.empty(hi - lo)
        if self.one_hot:
            return KeyedIds.of_block(self.fields, self.keys.reshape(len(self.fields), self.num_rows)[:, lo:hi])
        return KeyedIds.of(self.fields, [self[f].take(lo, hi) for f in self.fields])


def _int64_keys(keys: np.ndarray) -> np.ndarray:
    a = np.asarray(keys)
    if a.dtype == np.uint64:
        return a.view(np.int64)  # the bits: uint64 ids are valid keys too
    if a.dtype.kind not in "iu" and a.size:
        raise TypeError(f"keys must be an integer array, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


@dataclass
class Batch:
    """A batch of rows: labels, the rows' indices in the store, and the requested fields' ids
    (:class:`KeyedIds`; a ``{field: FieldBatch}`` dict given here is packed into one)."""

    epoch: int
    index: int  # batch number within the epoch
    rows: np.ndarray  # int64 [B] row indices in the store
    labels: np.ndarray  # float32 [B]
    fields: KeyedIds  # only the requested fields
    global_size: int = -1  # rows of the whole global batch this is a part of (-1: this batch)
    #: the dense (numeric) features ``[B, D]`` float32 of the rows, None when the data has none
    dense: np.ndarray | None = None
    #: more fields of one run of the rows (the reader's ``block``): their ids, and the run ``(lo, hi)``
    block: KeyedIds | None = None
    block_rows: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.global_size < 0:
            self.global_size = self.rows.shape[0]
        if not isinstance(self.fields, KeyedIds):
            given = dict(self.fields)
            self.fields = KeyedIds.of(list(given), list(given.values())) if given else KeyedIds.empty(self.size)

    @property
    def size(self) -> int:
        """Number of rows in the batch (B)."""
        return self.rows.shape[0]

    def ids_of_rows(self, fields: Sequence[int], lo: int, hi: int) -> KeyedIds:
        """The ids of ``fields`` for rows ``lo:hi``: from :attr:`block` where it holds them, else
        from :attr:`fields`."""
        if self.block is not None and self.block_rows == (lo, hi) and set(fields) <= set(self.block.fields):
            return self.block.select(fields)
        return self.fields.take(lo, hi).select(fields)

    def take(self, lo: int, hi: int) -> Batch:
        """The rows ``lo:hi`` of this batch (re-based CSR), e.g. one rank's part of a global batch."""
        if not 0 <= lo <= hi <= self.size:
            raise ValueError(f"take({lo}, {hi}) out of range for a batch of {self.size} rows")
        dense = None if self.dense is None else self.dense[lo:hi]
        return Batch(self.epoch, self.index, self.rows[lo:hi], self.labels[lo:hi], self.fields.take(lo, hi),
                     self.global_size, dense)
