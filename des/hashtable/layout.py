"""What a table's parts share: its keys (the reserved ones and their checks), its sizing bounds, a
row's value blocks (:class:`BlockSpec`) and its arrays as kernels see them (:class:`TableArrays`).

The storage (``table.py``) and what acts on it, optimizer application (``updates.py``), eviction
(``eviction.py``) and persistence (``persistence.py``), all import these from here, never from
one another, so that each stays a module of its own (``docs/design.md``, section 4).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Sequence

import numpy as np

from . import _index as K
from .init import Initializer
from .optimizers import FTRL, SGD, AdaGrad, Adam, Optimizer, RowwiseAdaGrad, RowwiseAdam, optimizer_from_dict

EMPTY_KEY: int = int(K.EMPTY)
SHARED_KEY: int = EMPTY_KEY + 1  # unadmitted="shared": the field's out-of-vocabulary row
INDEX_GROWTH = 1.5
ROW_GROWTH = 1.15
MIN_CAPACITY = 16
MAX_LOAD = 0.7  # the index's default load bound (keys per slot) before it grows
INITIAL_ROWS_MAX = 1 << 16
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
MAX_CAPACITY = 2**32  # fastrange uses 32 hash bits


@dataclass(frozen=True)
class BlockSpec:
    """One value block of a table row: ``dim`` columns trained by ``optimizer``."""

    name: str
    dim: int
    optimizer: Optimizer
    init: Initializer

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"block name must be a non-empty string, got {self.name!r}")
        if isinstance(self.dim, bool) or int(self.dim) != self.dim or self.dim < 1:
            raise ValueError(f"block {self.name!r}: dim must be an integer >= 1, got {self.dim!r}")
        object.__setattr__(self, "dim", int(self.dim))
        if not isinstance(self.optimizer, (SGD, AdaGrad, Adam, FTRL, RowwiseAdaGrad, RowwiseAdam)):
            raise TypeError(f"block {self.name!r}: optimizer must be SGD, AdaGrad, Adam, FTRL, RowwiseAdaGrad or "
                            "RowwiseAdam")
        if not isinstance(self.init, Initializer):
            raise TypeError(f"block {self.name!r}: init must be an Initializer")

    @property
    def slot_widths(self) -> tuple[int, ...]:
        """Columns of each slot: ``dim``, or 1 for a row-wise slot."""
        return self.optimizer.slot_widths(self.dim)

    @property
    def computed(self) -> bool:
        """Whether a row holds only the optimizer's slots, its values computed from them when read
        (FTRL on a zeros-initialized block: ``optimizers.FTRL.computes_values``)."""
        return self.optimizer.computes_values(self.init.kind == "zeros")

    @property
    def value_columns(self) -> int:
        """Columns of stored values in a row: ``dim``, or 0 where they are :attr:`computed`."""
        return 0 if self.computed else self.dim

    @property
    def width(self) -> int:
        """Columns of the co-located row: the stored values then each slot."""
        return self.value_columns + sum(self.slot_widths)

    def value_args(self, dtype: Any) -> np.ndarray:
        """What a reader of a row needs to compute its values (``bfloat16.read_value``), in the
        table's ``dtype``: empty where they are stored."""
        return self.optimizer.value_args(np.dtype(dtype)) if self.computed else np.zeros(0, np.dtype(dtype))

    def with_computed(self, computed: bool) -> "BlockSpec":
        """This block with its values computed from the slots (``computed``, where its optimizer
        and initializer allow) or stored: the same training, another row layout."""
        return replace(self, optimizer=self.optimizer.stored_values(not computed))

    def slot_column_values(self) -> np.ndarray:
        """A new row's slot columns (float64 ``[width - dim]``): each slot's initial value over its width."""
        return np.repeat(np.array(self.optimizer.slot_initial_values(), dtype=np.float64),
                         np.array(self.slot_widths, dtype=np.int64))

    def columns(self, data: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The stored values ``[rows, value_columns]`` and each slot (``[rows, width]``) of this
        block's co-located array ``data`` (views): the one place that knows a row holds its values
        (none where :attr:`computed`) then each slot."""
        start, slots = self.value_columns, []
        for width in self.slot_widths:
            slots.append(data[:, start:start + width])
            start += width
        return data[:, :self.value_columns], tuple(slots)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "optimizer": self.optimizer.to_dict(),
                "init": self.init.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BlockSpec":
        """A table file's block (:meth:`to_dict`; an earlier version's too: ``optimizer_from_dict``'s ``saved``)."""
        return cls(name=d["name"], dim=int(d["dim"]), optimizer=optimizer_from_dict(d["optimizer"], saved=True),
                   init=Initializer.from_dict(d["init"]))


class TableArrays(NamedTuple):
    """A table's arrays as kernels read and write them, each at least as long as the row capacity
    (address space may be reserved beyond it); replaced when :attr:`EmbeddingTable.version` changes."""

    index: np.ndarray  # int32 [capacity, 3]: the index's slots (key low, key high, row + 1)
    keys: np.ndarray  # int64 [rows]: each row's key
    meta: np.ndarray  # int32 [rows, 2]: each row's (count, last_seen)
    blocks: tuple[np.ndarray, ...]  # per block, [rows, dim * (1 + slots)]: values, then the optimizer's slots
    steps: tuple[np.ndarray, ...]  # per block, int32 [rows]: Adam's per-row step count (empty: none)


def check_rate(blocks: Sequence[BlockSpec], lr_scale: float) -> None:
    """A ValueError where a rate factor other than 1 (a schedule's) would update a block whose
    values are computed when read: their formula takes the rate, so a row's weights would change
    with the rate of the step that reads them (``ftrl:store_w=1`` stores them, as a schedule needs)."""
    if lr_scale != 1.0:
        for b in blocks:
            if b.computed:
                raise ValueError(f"block {b.name!r}: FTRL computing its weights from z and n needs a constant rate, "
                                 f"got a factor {lr_scale} (a schedule: use ftrl:store_w=1)")


def as_keys(keys: np.ndarray) -> np.ndarray:
    """Keys as a C-contiguous int64 array (uint64 ids reinterpreted; any other dtype refused)."""
    a = np.asarray(keys)
    if a.dtype == np.uint64:
        a = a.view(np.int64)  # reinterpret the bits: uint64 ids are valid keys too
    elif a.dtype.kind not in "iu" and a.size:
        raise TypeError(f"keys must be an integer array, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


def check_step(step: int) -> int:
    """``step`` as an int that fits the int32 ``last_seen`` column."""
    step = int(step)
    if not _INT32_MIN <= step <= _INT32_MAX:
        raise ValueError(f"step {step} does not fit the int32 last_seen column")
    return step


def sentinel_error(keys: np.ndarray) -> ValueError:
    """The error for keys holding the reserved sentinel ``EMPTY_KEY`` (names its first position)."""
    i = int(np.flatnonzero(np.asarray(keys) == K.EMPTY)[0])
    return ValueError(f"key at position {i} is the reserved sentinel {EMPTY_KEY} (int64 min)")
