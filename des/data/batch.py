"""The batch records handed to training: one CSR block per field plus labels and row indices."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class FieldBatch:
    """The ids of one field for the rows of a batch, in CSR form.

    Row ``r`` has the keys ``keys[offsets[r]:offsets[r + 1]]`` (exactly one for a one-hot field).
    """

    offsets: np.ndarray  # int64 [B+1], CSR row pointers into keys
    keys: np.ndarray  # int64 [nnz]
    weights: np.ndarray | None  # float32 [nnz] feature values, None means all 1.0
    #: ``(block, i)`` when ``keys`` is row ``i`` of ``block``, a C-contiguous [fields, B] array of
    #: several one-hot fields read at once (``ColumnStore.gather_fields``): the table lookup then
    #: takes the block's memory as it is instead of concatenating the fields' keys; else None
    block: tuple[np.ndarray, int] | None = None

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


@dataclass
class Batch:
    """A batch of rows: labels, the rows' indices in the store, and the requested fields."""

    epoch: int
    index: int  # batch number within the epoch
    rows: np.ndarray  # int64 [B] row indices in the store
    labels: np.ndarray  # float32 [B]
    fields: dict[int, FieldBatch]  # only the requested fields
    global_size: int = -1  # rows of the whole global batch this is a part of (-1: this batch)
    #: the dense (numeric) features ``[B, D]`` float32 of the rows, None when the data has none
    dense: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.global_size < 0:
            self.global_size = self.rows.shape[0]

    @property
    def size(self) -> int:
        """Number of rows in the batch (B)."""
        return self.rows.shape[0]

    def take(self, lo: int, hi: int) -> Batch:
        """The rows ``lo:hi`` of this batch (re-based CSR), e.g. one rank's part of a global batch."""
        if not 0 <= lo <= hi <= self.size:
            raise ValueError(f"take({lo}, {hi}) out of range for a batch of {self.size} rows")
        fields = {field: block.take(lo, hi) for field, block in self.fields.items()}
        dense = None if self.dense is None else self.dense[lo:hi]
        return Batch(self.epoch, self.index, self.rows[lo:hi], self.labels[lo:hi], fields, self.global_size, dense)
