"""Deterministic batches over a split of a column store (or of several read as one,
:class:`des.data.inputs.ConcatStore`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .batch import Batch
from .errors import DataError
from .store import ColumnStore, resolve_fields
from ..row_blocks import row_bounds


class BatchReader:
    """Batches of ``batch_size`` rows of one split, reading only the requested fields.

    The row order of an epoch is ``rows[np.random.default_rng([seed, epoch]).permutation(n)]``
    (``rows`` = the split's rows in store order): a pure function of (store, split, seed, epoch),
    identical in every process whatever fields it reads. With ``shuffle=False`` rows come in store
    order. ``drop_last`` drops a final partial batch; ``start_batch`` starts at that batch (resume).
    ``shard=(r, n)`` yields only part ``r`` of ``n`` of every batch (rows ``r·b//n`` to
    ``(r+1)·b//n``), for strategies where each rank takes a slice of the global batch.
    ``block=(fields, r, n)`` reads ``fields`` too, for part ``r`` of ``n`` of the rows only
    (:attr:`Batch.block`): a rank that needs its own fields of every row and every field of its
    rows (des's exchange per distinct id) reads those, not every field of every row.
    """

    def __init__(
        self,
        store: ColumnStore,
        split: str = "train",
        fields: Sequence[int | str] | None = None,
        batch_size: int = 4096,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        start_batch: int = 0,
        shard: tuple[int, int] = (0, 1),
        block: tuple[Sequence[int | str], int, int] | None = None,
    ) -> None:
        if batch_size < 1:
            raise DataError(f"batch_size must be positive, not {batch_size}")
        if start_batch < 0:
            raise DataError(f"start_batch must be >= 0, not {start_batch}")
        self.store = store
        self.split = split
        self.fields = resolve_fields(store, fields)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.start_batch = int(start_batch)
        part, parts = int(shard[0]), int(shard[1])
        if not 0 <= part < parts:
            raise DataError(f"shard {part} of {parts} does not exist")
        self.shard = (part, parts)
        self.block = None
        if block is not None:
            names, part, parts = block
            if not 0 <= int(part) < int(parts):
                raise DataError(f"row block {part} of {parts} does not exist")
            if self.shard != (0, 1):
                raise DataError("a reader of a row block reads whole batches (shard (0, 1))")
            self.block = (resolve_fields(store, names), int(part), int(parts))
        self._split_rows = store.split_rows(split)
        self._order: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        """Rows in the split (including any dropped last partial batch)."""
        return self._split_rows.shape[0]

    def __len__(self) -> int:
        """Number of batches in the epoch (counting from batch 0, not from ``start_batch``)."""
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def row_order(self) -> np.ndarray:
        """All rows of the split in this epoch's order."""
        if self._order is None:
            if self.shuffle:
                permutation = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_rows)
                self._order = self._split_rows[permutation]
            else:
                self._order = self._split_rows
        return self._order

    def batch(self, index: int) -> Batch:
        """Batch number ``index`` of the epoch."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} out of range 0..{len(self) - 1}")
        rows = self.row_order[index * self.batch_size : (index + 1) * self.batch_size]
        global_size = rows.shape[0]
        part, parts = self.shard
        lo, hi = row_bounds(global_size, parts)[part : part + 2]
        rows = rows[lo:hi]
        labels = self.store.take_labels(rows).astype(np.float32)
        fields = self.store.gather_fields(self.fields, rows)
        block, block_rows = None, None
        if self.block is not None:
            names, part, parts = self.block
            block_rows = tuple(row_bounds(global_size, parts)[part : part + 2])
            block = self.store.gather_fields(names, rows[block_rows[0] : block_rows[1]])
        return Batch(self.epoch, index, rows, labels, fields, global_size, dense=self.store.take_dense(rows),
                     block=block, block_rows=block_rows)

    def __iter__(self) -> Iterator[Batch]:
        for index in range(self.start_batch, len(self)):
            yield self.batch(index)
