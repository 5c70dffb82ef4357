"""Options of the engine that entry points build before TensorFlow is loaded."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LearningRates:
    """Multipliers of the optimizers' rates for the next step (``des.schedules``): the runner sets
    them from the global step before every step; the components pass them to the kernels."""

    sparse: float = 1.0
    dense: float = 1.0


@dataclass(frozen=True)
class Optimizers:
    """Which optimizer updates what: one per embedding block (sparse, per row) and one for all
    dense parameters (the field slices of substituted layers and the top network); ``rates`` is
    the current schedule factor of each group (shared by every table and dense state of a rank)."""

    sparse: Mapping[str, Any]
    dense: Any
    rates: LearningRates = field(default_factory=LearningRates)


#: index slots a table starts with when neither ``--table-capacity`` nor the data sizes it
DEFAULT_CAPACITY = 1 << 14


@dataclass(frozen=True)
class TableOptions:
    """How a rank's tables start: ``capacity`` index slots each, or, with ``capacity`` 0, sized
    from the data (:meth:`initial_size`: ``distinct`` holds each field's distinct keys, by field,
    and ``admitted``, where given, how many of them the training split admits: counted at least
    ``min_count`` times in it)."""

    capacity: int = DEFAULT_CAPACITY
    min_count: int = 1
    unadmitted: str = "init"
    distinct: tuple[int, ...] = ()
    table_dtype: str | None = None  # how rows are stored (``EmbeddingTable``'s ``table_dtype``; None: the dtype)
    #: (field, owner) pairs: the field uses the owner's table (``des/strategies/table_groups.py``)
    shared: tuple[tuple[int, int], ...] = ()
    #: rows keep an admission count and a last-seen step (``EmbeddingTable``'s ``counters``)
    counters: bool = True
    #: per field, the keys the training split counts at least ``min_count`` times (empty: unknown)
    admitted: tuple[int, ...] = ()

    def shared_map(self) -> dict[int, int]:
        """Field -> the field whose table it uses, of the fields that share one."""
        return {int(f): int(o) for f, o in self.shared}

    def initial_size(self, field: int, parts: int = 1) -> tuple[int, int | None]:
        """``(index slots, rows)`` field ``field``'s table starts with (rows None: the table's
        default for its index). Sized from the data, the table holds the field's distinct keys
        (and a shared row) without growing, its index at the load a growth leaves it at
        (``INDEX_GROWTH / max_load`` slots a key): a first epoch then inserts its keys without
        rehashing the index and moving the rows a dozen times (each growth a slow step of page
        faults). The memory is what the grown table takes. With admission counts known
        (``admitted``, ``min_count`` > 1), rows only for the keys the training split admits, and
        the index for every key at its load bound (``1 / max_load`` slots a key): a key that is
        not admitted is pending, its slot its whole cost, so the slots are sized as tightly as
        the growth rule allows. ``parts``: the field is split by key into that many shares, this
        table holds one. A table shared by other fields also holds theirs."""
        from des.hashtable.table import INDEX_GROWTH, MAX_CAPACITY, MAX_LOAD, MIN_CAPACITY

        if self.capacity or field >= len(self.distinct):
            return self.capacity or DEFAULT_CAPACITY, None
        keys = self._held(self.distinct, field, parts)
        pending = self.min_count > 1 and field < len(self.admitted)
        slots_per_key = 1 / MAX_LOAD if pending else INDEX_GROWTH / MAX_LOAD
        rows = self._held(self.admitted, field, parts) if pending else keys
        # beyond the index's limit (2^32 slots, ~2 billion keys at this load) the table grows into it
        return max(MIN_CAPACITY, min(MAX_CAPACITY, math.ceil(keys * slots_per_key) + 1)), rows

    def rows_held(self, field: int, parts: int = 1) -> int:
        """The rows field ``field``'s table (one of ``parts`` shares) holds once the training
        split is in it: its admitted keys where known (``min_count`` > 1), else every key."""
        counts = self.admitted if self.min_count > 1 and field < len(self.admitted) else self.distinct
        return self._held(counts, field, parts)

    def _held(self, counts: tuple[int, ...], field: int, parts: int) -> int:
        """Of ``counts`` (by field), the keys of field ``field``'s table (one of ``parts`` shares),
        with the fields that share it, and a shared row."""
        held = int(counts[field]) + sum(int(counts[f]) for f, o in self.shared if o == field)
        return -(-held // max(int(parts), 1)) + 1
