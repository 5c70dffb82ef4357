"""Streaming count of distinct keys per field (a small numba open-addressing hash map).

Memory is proportional to the number of distinct keys, not to the number of rows. 0 marks an
empty slot of the map, so key 0 (a missing value of key scheme 2, ``features.py``) is counted
beside it.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ..splitmix import GOLDEN_GAMMA, mix64

_MAX_LOAD = 0.6
_NO_AMOUNTS = np.empty(0, dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _insert(table_keys, table_counts, shift, keys, amounts, start, max_fill, fill, zeros):
    """Count ``keys[i]`` ``amounts[i]`` times (once each when ``amounts`` is empty) from ``start``;
    returns where it stopped (the map full) and the new fill."""
    mask = table_keys.shape[0] - 1
    weighted = amounts.shape[0] > 0
    for i in range(start, keys.shape[0]):
        key = keys[i]
        amount = amounts[i] if weighted else 1
        if key == 0:  # the empty-slot marker: counted apart
            zeros[0] += amount
            continue
        slot = np.int64((np.uint64(key) * GOLDEN_GAMMA) >> np.uint64(shift))
        while table_keys[slot] != 0 and table_keys[slot] != key:
            slot = (slot + 1) & mask
        if table_keys[slot] == 0:
            if fill >= max_fill:
                return i, fill
            table_keys[slot] = key
            fill += 1
        table_counts[slot] += amount
    return keys.shape[0], fill


@numba.njit(cache=True, nogil=True)
def _rehash(old_keys, old_counts, new_keys, new_counts, shift):
    mask = new_keys.shape[0] - 1
    for i in range(old_keys.shape[0]):
        key = old_keys[i]
        if key != 0:
            slot = np.int64((np.uint64(key) * GOLDEN_GAMMA) >> np.uint64(shift))
            while new_keys[slot] != 0:
                slot = (slot + 1) & mask
            new_keys[slot] = key
            new_counts[slot] = old_counts[i]


@numba.njit(cache=True, nogil=True)
def _top_counts(table_keys, table_counts, extra, k):
    """The ``k`` largest counts of the filled slots and ``extra`` (key 0's count, 0 if none), 0
    where there are fewer: one pass keeping the ``k`` largest seen, not a partition of a copy of
    every count."""
    top = np.zeros(k, dtype=np.int64)  # the k largest counts so far (0: none yet)
    low = 0  # where the smallest of them is
    for i in range(table_keys.shape[0] + 1):
        count = extra if i == table_keys.shape[0] else (table_counts[i] if table_keys[i] != 0 else 0)
        if count > top[low]:
            top[low] = count
            for j in range(k):
                if top[j] < top[low]:
                    low = j
    return top


@numba.njit(cache=True, nogil=True)
def _by_range(keys, counts, parts):
    """``keys`` and ``counts`` in the order of their keys' ranges (:func:`by_range`) and where each
    range starts: a counting sort, two passes."""
    n = keys.shape[0]
    part = np.empty(n, dtype=np.int64)
    starts = np.zeros(parts + 1, dtype=np.int64)
    for i in range(n):
        mixed = mix64(np.uint64(keys[i])) >> np.uint64(32)
        part[i] = np.int64((mixed * np.uint64(parts)) >> np.uint64(32))
        starts[part[i] + 1] += 1
    for r in range(parts):
        starts[r + 1] += starts[r]
    at = starts[:-1].copy()
    out_keys, out_counts = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for i in range(n):
        out_keys[at[part[i]]], out_counts[at[part[i]]] = keys[i], counts[i]
        at[part[i]] += 1
    return out_keys, out_counts, starts


def by_range(keys: np.ndarray, counts: np.ndarray, parts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """A counter's :meth:`KeyCounter.entries` cut into ``parts`` ranges of keys: a key's range is
    the top bits of its SplitMix64 mix scaled to ``parts``, a function of the key alone (every
    counter cuts its keys alike; ranges of about equal size whatever the keys). Not the counter's
    own slot hash: a range's keys would then all fall into one ``parts``-th of the slots of the
    counter they are merged into."""
    keys, counts, starts = _by_range(np.ascontiguousarray(keys, dtype=np.int64),
                                     np.ascontiguousarray(counts, dtype=np.int64), int(parts))
    return [(keys[a:b], counts[a:b]) for a, b in zip(starts[:-1], starts[1:])]


def top_share_of(tops: list[np.ndarray], total: int, k: int = 10) -> float:
    """:meth:`KeyCounter.top_share` of the union of counters of disjoint keys, from each one's
    :meth:`KeyCounter.top_counts` (the ``k`` largest of the union are among them) and their total."""
    if total == 0 or k < 1:
        return 0.0
    counts = np.sort(np.concatenate([np.asarray(top, dtype=np.int64) for top in tops]))
    return float(counts[-k:].sum()) / float(total)


class KeyCounter:
    """Counts occurrences of int64 keys; grows as needed."""

    def __init__(self, initial_bits: int = 10) -> None:
        self._bits = int(initial_bits)
        self._keys = np.zeros(1 << initial_bits, dtype=np.int64)
        self._counts = np.zeros(1 << initial_bits, dtype=np.int64)
        self._fill = 0
        self._zeros = np.zeros(1, dtype=np.int64)  # occurrences of key 0
        self.total = 0

    @classmethod
    def sized_for(cls, keys: int) -> "KeyCounter":
        """A counter with room for ``keys`` distinct keys from the start. Merging other counters'
        :meth:`entries` wants it: they come in the order of their slots, i.e. of this counter's
        hash, and the first of them would all fall into the first slots of a small table (120k
        keys: 0.7 s grown from the default, 3 ms sized)."""
        return cls(max(10, int(np.ceil(np.log2(max(keys, 1) / _MAX_LOAD)))))

    def add(self, keys: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Count every key of ``keys`` (int64 array), ``counts[i]`` times each when given (another
        counter's :meth:`entries`: the counts of rows counted apart, merged)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        amounts = _NO_AMOUNTS if counts is None else np.ascontiguousarray(counts, dtype=np.int64)
        start = 0
        while True:
            max_fill = int(_MAX_LOAD * (1 << self._bits))
            start, self._fill = _insert(self._keys, self._counts, 64 - self._bits, keys, amounts, start, max_fill,
                                        self._fill, self._zeros)
            if start == keys.shape[0]:
                break
            self._grow()
        self.total += keys.shape[0] if counts is None else int(amounts.sum())

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct keys and how often each was counted (key 0 last, when counted)."""
        filled = self._keys != 0
        keys, counts = self._keys[filled], self._counts[filled]
        if self._zeros[0]:
            keys, counts = np.append(keys, np.int64(0)), np.append(counts, self._zeros[0])
        return keys, counts

    def _grow(self) -> None:
        self._bits += 1
        new_keys = np.zeros(1 << self._bits, dtype=np.int64)
        new_counts = np.zeros(1 << self._bits, dtype=np.int64)
        _rehash(self._keys, self._counts, new_keys, new_counts, 64 - self._bits)
        self._keys, self._counts = new_keys, new_counts

    @property
    def distinct(self) -> int:
        """Number of distinct keys seen."""
        return self._fill + int(self._zeros[0] > 0)

    def top_counts(self, k: int = 10) -> np.ndarray:
        """The ``k`` largest counts (0 where fewer keys were counted)."""
        return _top_counts(self._keys, self._counts, self._zeros[0], int(k))

    def top_share(self, k: int = 10) -> float:
        """Fraction of all occurrences taken by the ``k`` most frequent keys (0.0 if none)."""
        return top_share_of([self.top_counts(k)] if k >= 1 else [], self.total, k)


#: rows of a split read at a time by :func:`admitted_keys`
_COUNT_ROWS = 1 << 20


def admitted_keys(store: Any, min_count: int, split: str = "train") -> list[int]:
    """Per field of ``store``, its distinct keys that occur at least ``min_count`` times in the rows
    of ``split``: the keys a first pass over that split admits (``--min-count``), which the tables'
    rows are sized from (``des.options.TableOptions.admitted``). One pass over the split's ids,
    ``_COUNT_ROWS`` rows at a time, a field at a time (memory: one field's distinct keys)."""
    rows = store.split_rows(split)
    out = []
    for field in range(store.num_fields):
        counter = KeyCounter()
        for lo in range(0, rows.shape[0], _COUNT_ROWS):
            counter.add(store.gather(field, rows[lo:lo + _COUNT_ROWS]).keys)
        out.append(int(np.count_nonzero(counter.entries()[1] >= min_count)))
    return out
