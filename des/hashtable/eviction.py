"""A table's eviction: which rows go (by age, then the least recently seen over a budget) and the
log of the keys evicted since an incremental checkpoint's base, and the replay of a checkpoint's
evictions (:func:`delete`) (``docs/design.md``, section 4).

The choice rests on the table's rows alone (``last_seen``, then the key), never on insertion order
or placement, so N ranks evict as 1; the removal itself (backward shift in the index, the last rows
moved into the holes) is the storage's (:meth:`EmbeddingTable.remove_rows`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _index as K
from .layout import as_keys, sentinel_error


class Eviction:
    """The eviction of one table, passed in at each call; this object keeps only the log of
    evicted keys (so that it and the table hold no reference to each other)."""

    def __init__(self) -> None:
        self._evicted_keys: list[np.ndarray] | None = None  # kept while tracked (track_evictions)

    def evict(self, table: Any, ttl: int | None, step: int, max_rows: int = 0) -> int:
        """Remove every key with ``step - last_seen > ttl`` (``ttl`` None: none by age), then, while
        more than ``max_rows`` > 0 rows remain, the least recently seen: the smallest ``last_seen``
        first, of equal ones the smaller key (as int64), so the rows kept depend on the table's rows alone.
        Returns how many were removed (added to ``table.evicted_count``). The shared row
        (``unadmitted="shared"``) is the field's, not an id's: never removed (it counts toward
        ``max_rows``, which must then be at least 1).

        The index deletes by backward shift (no tombstones); the last rows move into the holes, so
        rows stay dense and earlier ``lookup`` results become stale. Oversized storage shrinks.
        """
        if not table.counters:  # nothing to evict by: nothing asked, or an error
            if ttl is None and max_rows <= 0:
                return 0
            raise ValueError(f"table of field {table.field} has no last-seen steps to evict by (made without counters)")
        n = len(table)
        if n == 0:
            return 0
        arrays = table.arrays
        last = arrays.meta[:n, K.LAST]
        dead = np.zeros(n, dtype=np.bool_) if ttl is None else np.int64(step) - last > int(ttl)
        kept = table.shared_row(None)
        if kept >= 0:
            dead[kept] = False
        over = n - int(np.count_nonzero(dead)) - int(max_rows)
        if max_rows > 0 and over > 0:
            dead[_least_recent(arrays, dead, kept, over)] = True
        if self._evicted_keys is not None:
            self._evicted_keys.append(arrays.keys[:n][dead])
        n_dead = table.remove_rows(dead)
        table.evicted_count += n_dead
        return n_dead

    def track_evictions(self) -> np.ndarray | None:
        """The keys :meth:`evict` removed since the previous call (None at the first: not tracked
        until then); from this call on, evicted keys are kept until the next (an incremental
        checkpoint records them, so that loading it deletes them)."""
        taken = self._evicted_keys
        self._evicted_keys = []
        return None if taken is None else (np.concatenate(taken) if taken else np.zeros(0, np.int64))


def delete(table: Any, keys: np.ndarray) -> int:
    """Remove these keys' rows from ``table`` (keys it lacks are ignored), as :meth:`Eviction.evict`
    removes rows but without counting them as evicted (replaying a checkpoint's evictions).
    Returns how many."""
    keys = as_keys(keys).reshape(-1)
    n = len(table)
    if n == 0 or keys.shape[0] == 0:
        return 0
    rows = np.empty(keys.shape[0], dtype=np.int64)
    if K.lookup_only(table.arrays.index, table.arrays.keys, keys, rows) >= 0:
        raise sentinel_error(keys)
    dead = np.zeros(n, dtype=np.bool_)
    dead[rows[rows >= 0]] = True
    return table.remove_rows(dead) if dead.any() else 0


def _least_recent(arrays: Any, dead: np.ndarray, kept: int, count: int) -> np.ndarray:
    """The ``count`` live rows (not ``dead``, not row ``kept``) seen least recently, of equal
    ``last_seen`` the smaller keys: the count-th smallest ``last_seen`` by selection, then only the
    rows at it by key (linear time, where sorting every row by both would not be)."""
    rows = np.flatnonzero(~dead)
    if kept >= 0:
        rows = rows[rows != kept]
    last = arrays.meta[rows, K.LAST]
    cut = np.partition(last, count - 1)[count - 1]
    older, tied = rows[last < cut], rows[last == cut]
    need = count - older.shape[0]
    if need < tied.shape[0]:  # keys are distinct: the `need` smallest are one set
        tied = tied[np.argpartition(arrays.keys[tied], need - 1)[:need]]
    return np.concatenate([older, tied])
