"""``EmbeddingTable``: one field's dynamic embedding table (key -> row -> value blocks + slots).

The table is the storage: index, rows, blocks, lookup and insertion, gather, growth and the
removal of rows. What acts on that storage is apart, as SOK keeps its optimizers and dump/load
apart from ``DynamicVariable``, each a module taking the table through its public surface
(:attr:`~EmbeddingTable.arrays`, :meth:`~EmbeddingTable.block_index`, and for bulk writes and
removals :meth:`~EmbeddingTable.claim_rows`, :meth:`~EmbeddingTable.reserve_rows` with
:meth:`~EmbeddingTable.adopt_rows`, :meth:`~EmbeddingTable.remove_rows`): optimizer application
(``updates.py``), eviction (``eviction.py``), persistence (dump, load, the merge of a field's parts
and an increment's rows: ``persistence.py``) and the memory figures (``footprint.py``); the table
keeps their methods' names as one-line delegations. What they all share (keys, sizing, :class:`BlockSpec`,
:class:`TableArrays`) is ``layout.py``'s.

Layout (see ``_index.py`` for the kernels):

* index: open addressing with linear probing over 12-byte slots (key, int32 row), load factor
  kept <= ``max_load``; grows by rehash to 1.5x capacity (``INDEX_GROWTH``), so the load stays in
  [max_load / 1.5, max_load].
* rows: densely packed, row ``r`` is the r-th live key. Per row: ``keys`` (int64), ``meta`` =
  (count, last_seen) (int32 pair; none in a table without counters, below), and per block one array ``[rows, dim + slot columns]`` (a slot
  spans ``dim`` columns, a row-wise one 1) holding the values followed by the optimizer slots of
  that row (co-located, so an update touches one or two cache lines), in the dtype or as bfloat16
  bits (``table_dtype``, ``bfloat16.py``), plus an int32 step count for Adam blocks. A block whose
  values are a function of its slots (FTRL's w of z and n on a zeros-initialized block:
  ``BlockSpec.computed``) stores the slots only; every read computes the values
  (``bfloat16.read_value``), bit for bit what the update would have stored. A row is admitted iff
  its count >= ``min_count`` (the count only grows, so no separate flag is needed).
* pending keys (``min_count`` > 1): a key seen fewer than ``min_count`` times has no row, only its
  index slot, whose row field holds its count (``_index.py``); its row is made, count and all,
  when the count reaches ``min_count``. So the rows are the admitted keys' only (a file of an
  earlier version that holds unadmitted keys as rows loads them as pending keys), and a key that is
  never admitted costs 12 bytes / load instead of a whole row: the rows can be sized from the keys
  that will be admitted (``TableOptions.initial_size``) and the index from all keys. A pending key
  gathers as an absent one: its initial value (as its untrained row held it; bfloat16 rows held it
  rounded), zeros or the shared row. It is never evicted (it has no last-seen step; it holds
  no row), and every checkpoint, incremental ones too, saves every pending key with its count.
* growth: the row capacity grows by ``ROW_GROWTH`` = 1.15x, which bounds the row slack to 15%.
  The two slacks can peak together (a freshly grown index at load ``max_load / 1.5`` while the
  rows have just grown), so the worst case is ``1.15 * (payload + 8 B meta) + 12 B * 1.5 /
  max_load`` per row: for the benchmark's FTRL[1] (storing w) + Adam[8] float32 row (payload 120 B: key 8 +
  12 + 96 + Adam step 4) that is (1.15 * 128 + 25.7) / 120 = 1.44x the raw payload at any size
  past the initial allocation (``docs/benchmarks.md`` has the measured figures). Large row arrays
  live in address-space reservations of 8x (``_memory.py``): growing inside a reservation commits
  the new rows in bulk and moves nothing; outgrowing it copies the live rows into a new
  reservation, so a row is copied a fraction of a time on average instead of at every growth
  step. The memory figures count the row
  capacity, never the reserved address space (which holds no memory until used); the next
  growth step's rows are committed in the background ahead of it, so the resident memory may run
  up to one step (15 % of the rows) ahead of the figures.
* without counters (``counters=False``: nothing needs an admission count or a last-seen step, so
  ``min_count <= 1`` and no eviction or incremental checkpoint): no ``meta`` and a compact index
  of 4-byte slots holding only the row (``_index.py``), so key, index and metadata take
  ``8 + 4 / load`` bytes per row (13.7 to 16.6 B at the index's load bounds) instead of
  ``16 + 12 / load`` (33.1 to 41.7 B).
  Every row is admitted; the same rows, values and slots as a table with counters, bit for bit.

The reserved sentinel key is ``EMPTY_KEY = -2**63`` (int64 minimum); every other int64 is a valid
key. Rows handed out by :meth:`EmbeddingTable.lookup` stay valid until the next :meth:`evict`
(eviction compacts rows) or until the table is replaced by :meth:`load`. Not thread-safe; all
kernels release the GIL, so *different* tables may be used from different threads.

Kernels that drive many tables at once (``fused.py``) use the table through a small public
surface: :attr:`EmbeddingTable.arrays` (valid while :attr:`EmbeddingTable.version` is unchanged:
it changes whenever an array is replaced), :attr:`EmbeddingTable.row_capacity`,
:attr:`EmbeddingTable.fill_limit`, :attr:`EmbeddingTable.pending_count`, :meth:`EmbeddingTable.grow`,
:meth:`EmbeddingTable.commit_rows` (rows such a kernel inserted), the
shared row (:meth:`EmbeddingTable.shared_row`, :meth:`EmbeddingTable.map_to_shared`) and
:attr:`EmbeddingTable.stream_bases`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, Sequence

import numpy as np

from . import _index as K
from . import _threads, eviction, footprint, persistence, updates
from ._memory import commit_ahead, grow_in_place, row_array
from .bfloat16 import checked_storage, init_table_rows
from .init import Initializer
from .layout import (EMPTY_KEY, INDEX_GROWTH, INITIAL_ROWS_MAX, MAX_CAPACITY, MAX_LOAD, MIN_CAPACITY,  # noqa: F401
                     ROW_GROWTH, SHARED_KEY, BlockSpec, TableArrays, as_keys, check_step, sentinel_error)
from .persistence import KeyFilter
from .updates import RowUpdates

_MAX_ROWS = 2**31 - 1  # row numbers are int32 in the index
_NO_STEPS = np.zeros(0, dtype=np.int32)  # a block without a step count
_MIN_PARALLEL_KEYS = 1 << 15  # keys below which one thread looks them all up (read-only)


class EmbeddingTable:
    """Dynamic hash table of one field: int64 key -> row of value blocks with optimizer slots.

    ``capacity`` is the initial number of index slots and ``rows`` of rows (default: as many as
    the index holds at its load bound, at most ``INITIAL_ROWS_MAX``; the table grows as needed);
    ``min_count``: a key gets a trained ("admitted") row after ``min_count`` occurrences at
    ``lookup(insert=True)``; ``unadmitted``: what a not-yet-admitted or unknown key contributes in
    :meth:`gather`, its deterministic initial value (``"init"``), zeros (``"zero"``) or the
    field's trained shared row (``"shared"``: :meth:`lookup` maps such keys to it).
    """

    def __init__(self, field: int, blocks: Sequence[BlockSpec], seed: int, dtype: Any = np.float32,
                 capacity: int = 1024, max_load: float = MAX_LOAD, min_count: int = 1,
                 unadmitted: str = "init", rows: int | None = None, table_dtype: str | None = None,
                 counters: bool = True) -> None:
        self.field = int(field)
        self.seed = int(seed)
        self.blocks: tuple[BlockSpec, ...] = tuple(blocks)
        if not self.blocks:
            raise ValueError("a table needs at least one BlockSpec")
        names = [b.name for b in self.blocks]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate block names in {names}")
        self._block_pos = {name: i for i, name in enumerate(names)}
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype}")
        #: how rows are stored: ``dtype``'s name, or ``"bfloat16"`` (float32 only: ``bfloat16.py``)
        self.table_dtype = self.dtype.name if table_dtype is None else str(table_dtype)
        self.stored_dtype = checked_storage(self.table_dtype, self.dtype, self.blocks)
        if not 0.1 <= float(max_load) <= 0.95:
            raise ValueError(f"max_load must be in [0.1, 0.95], got {max_load!r}")
        self.max_load = float(max_load)
        if int(min_count) < 0:
            raise ValueError(f"min_count must be >= 0, got {min_count!r}")
        self.min_count = int(min_count)
        #: whether rows hold an admission count and a last-seen step (``meta``); without, the compact layout
        self.counters = bool(counters)
        if not self.counters and self.min_count > 1:
            raise ValueError(f"min_count {self.min_count} needs counters (a table without counters admits every key)")
        if unadmitted not in ("init", "zero", "shared"):
            raise ValueError(f"unadmitted must be 'init', 'zero' or 'shared', got {unadmitted!r}")
        self.unadmitted = unadmitted
        self._bases = [Initializer.stream_base(self.seed, self.field, b.name) for b in self.blocks]
        self.evicted_count = 0
        self.admitted_total = 0  # admissions ever (a key evicted and admitted again counts twice)
        self.last_update_step: int | None = None
        self._eviction = eviction.Eviction()  # which rows go, and the log of evicted keys (eviction.py)
        self._updates = RowUpdates()  # the optimizer application's scratch buffers (updates.py)
        self._n = 0
        self._pending = 0  # keys held in the index without a row (counted below min_count)
        #: changes whenever an array of :attr:`arrays` is replaced (growth, eviction, loading); read only
        self.version = 0
        self._shared = -1  # row of SHARED_KEY once known (unadmitted="shared"); rows move on evict
        self._slot_init = [b.slot_column_values() for b in self.blocks]
        self._value_args = [b.value_args(self.dtype) for b in self.blocks]  # rows computing their values
        self._committing: Any = None  # a background commit of the next growth step's rows
        self._alloc_index(self._clamp_capacity(capacity))
        # rows for the initial index, but a huge `capacity` does not commit memory up front
        self._alloc_rows(max(MIN_CAPACITY, min(self._max_fill, INITIAL_ROWS_MAX if rows is None else int(rows))))
        #: the index slots and rows allocated at construction (``footprint.estimated_bytes``' floor)
        self.initial_capacity, self.initial_rows = self.capacity, self._row_cap

    # ---------------------------------------------------------------- storage management

    @staticmethod
    def _clamp_capacity(capacity: int) -> int:
        capacity = max(MIN_CAPACITY, int(capacity))
        if capacity > MAX_CAPACITY:
            raise ValueError(f"index capacity {capacity} exceeds {MAX_CAPACITY}")
        return capacity

    def _alloc_index(self, capacity: int) -> None:
        self._idx = K.new_index(capacity, K.WIDE if self.counters else K.COMPACT)
        # keep one slot free at least, so probing always terminates
        self._max_fill = min(capacity - 1, int(capacity * self.max_load))
        self.version += 1

    def _alloc_rows(self, row_cap: int) -> None:
        # row arrays may be longer than the capacity (address space reserved for growth)
        self._keys = row_array(row_cap, (), np.int64, reserve=True)
        self._meta = row_array(row_cap, (2 if self.counters else 0,), np.int32, reserve=True)  # (count, last_seen)
        self._data = [row_array(row_cap, (b.width,), self.stored_dtype, reserve=True) for b in self.blocks]
        self._steps = [row_array(row_cap, (), np.int32, reserve=True) if b.optimizer.needs_step else None
                       for b in self.blocks]
        self._row_cap = row_cap
        self.version += 1

    def _row_arrays(self) -> list[np.ndarray]:
        arrays = [self._keys, self._meta, *self._data]
        return arrays + [s for s in self._steps if s is not None]

    def _resize_rows(self, row_cap: int) -> None:
        """Row capacity ``row_cap`` holding the live rows: in place where an array's reservation
        allows (growing), else a new array and a copy of the live rows. Rows past the live ones
        are uninitialized: every field of a row is written when the row is inserted."""
        self._await_commit()
        n = min(self._n, row_cap)
        moved_any = False

        def resized(a: np.ndarray) -> np.ndarray:
            nonlocal moved_any
            if row_cap >= self._row_cap and grow_in_place(a, self._row_cap, row_cap):
                return a
            b = row_array(row_cap, a.shape[1:], a.dtype, reserve=row_cap >= self._row_cap)
            b[:n] = a[:n]
            moved_any = True
            return b

        self._keys = resized(self._keys)
        self._meta = resized(self._meta)
        self._data = [resized(d) for d in self._data]
        self._steps = [None if s is None else resized(s) for s in self._steps]
        growing = row_cap > self._row_cap
        self._row_cap = row_cap
        self.version += moved_any
        if growing:  # the next growth step's rows, committed while these fill (see _memory.py)
            self._committing = commit_ahead(self._row_arrays(), row_cap, self._next_row_cap())

    def _next_row_cap(self) -> int:
        return min(_MAX_ROWS, max(self._row_cap + 1, math.ceil(self._row_cap * ROW_GROWTH)))

    def _await_commit(self) -> None:
        if self._committing is not None:
            self._committing.result()
            self._committing = None

    def _rehash(self, capacity: int) -> None:
        old = self._idx
        self._alloc_index(self._clamp_capacity(capacity))
        K.rehash(old, self._idx, self._keys)

    def grow(self) -> None:
        """Room for at least one more row and one more key (:attr:`row_capacity` > ``len(self)``,
        :attr:`fill_limit` > ``len(self) + pending_count``): the rows grow by
        ``ROW_GROWTH``, the index by ``INDEX_GROWTH``, as needed; :attr:`version` may change."""
        if self._n >= self._row_cap:
            if self._n >= _MAX_ROWS:
                raise ValueError(f"table of field {self.field} is full ({_MAX_ROWS} rows)")
            self._resize_rows(self._next_row_cap())
        if self._n + self._pending >= self._max_fill:
            self._rehash(math.ceil(self.capacity * INDEX_GROWTH))

    def _init_rows(self, start: int, stop: int) -> None:
        """Values from the initializers and slots from the optimizers for rows [start, stop)."""
        init_table_rows(self.arrays, self.blocks, self._bases, self._slot_init, start, stop)

    def block_index(self, name: str) -> int:
        """Position of block ``name`` in :attr:`blocks` (and in :attr:`arrays`' ``blocks``)."""
        try:
            return self._block_pos[name]
        except KeyError:
            raise KeyError(f"unknown block {name!r}; this table has {list(self._block_pos)}") from None

    # ---------------------------------------------------------------- the engine's interface

    def lookup(self, keys: np.ndarray, *, insert: bool, step: int = 0) -> np.ndarray:
        """int64 rows, one per key (same shape; duplicates map to the same row).

        ``insert=True`` (training): missing keys are inserted (values from the initializer, slots
        from the optimizer), every occurrence increments the key's count, ``last_seen = step``, and a
        key whose count reaches ``min_count`` is admitted (counted in ``admitted_total``).
        ``insert=False`` (evaluation): nothing changes; unknown keys get row -1. Raises ValueError
        if a key is the sentinel ``EMPTY_KEY``. With ``unadmitted="shared"`` unknown and
        not-yet-admitted keys get the field's shared row instead (key ``SHARED_KEY``: a row like
        any other, trained by their gradients, checkpointed and resharded with the field).
        """
        shared = self.shared_row(step if insert else None)
        rows = self._lookup(keys, insert=insert, step=step)
        if self.unadmitted == "shared":
            flat = rows.reshape(-1)
            admitted = np.empty(flat.shape[0], dtype=np.bool_)
            if K.admit_rows(flat, admitted, self._meta, self.min_count, shared):
                self.map_to_shared(flat, admitted)  # evaluation before the shared row exists
        return rows

    def shared_row(self, step: int | None) -> int:
        """Row of the shared out-of-vocabulary key (``unadmitted="shared"``; else -1). A training
        lookup (``step`` given) inserts it on first use and refreshes its ``last_seen`` so that
        eviction keeps it; an evaluation lookup only finds it (-1 while it does not exist)."""
        if self.unadmitted != "shared":
            return -1
        if self._shared < 0:
            row = np.empty(1, dtype=np.int64)
            K.lookup_only(self._idx, self._keys, np.array([SHARED_KEY], dtype=np.int64), row)
            self._shared = int(row[0])
        if step is None:
            return self._shared
        return self._make_shared_row(step)

    def shared_row_made(self) -> int:
        """The shared row (``unadmitted="shared"``), inserted and admitted if missing but not marked
        in use; else -1. A training lookup of many tables marks theirs in use in one kernel call
        (``ShardTables.touch``), as :meth:`shared_row` with a step does for one table."""
        if self.unadmitted != "shared":
            return -1
        if self._shared < 0:
            self.shared_row(None)
            if self._shared < 0:
                self._make_shared_row(None)
        return self._shared

    def map_to_shared(self, rows: np.ndarray, admitted: np.ndarray) -> None:
        """``unadmitted="shared"``: the rows (int64, in place) that are unknown (-1) or not admitted
        become the shared row, which is made now if the table has none yet (an evaluation before
        any training step: as training would make it); ``admitted[i]`` is set: every row is trained."""
        K.admit_rows(rows, admitted, self._meta, self.min_count, self._make_shared_row(None))

    def _make_shared_row(self, step: int | None) -> int:
        """The shared row, inserted (and admitted) if missing; ``last_seen = step`` if given."""
        if self._shared < 0:  # a row at once, whatever min_count (the shared row is always admitted)
            n0 = self._n
            self._shared = int(self.claim_rows(np.array([SHARED_KEY], dtype=np.int64))[0])
            if self._n > n0:
                self._meta[n0:self._n] = 0
                self._init_rows(n0, self._n)
                self.admitted_total += self.min_count <= 1
        K.use_shared_row(self._meta, self._shared, self.min_count, 0 if step is None else step, step is not None)
        return self._shared

    def _lookup(self, keys: np.ndarray, *, insert: bool, step: int = 0) -> np.ndarray:
        keys = as_keys(keys)
        flat = keys.reshape(-1)
        out = np.empty(flat.shape[0], dtype=np.int64)
        if insert:
            step = check_step(step)
            if flat.shape[0] and (flat == K.EMPTY).any():  # checked up front: no partial update
                raise sentinel_error(flat)
            # the distinct keys, each counted once by its occurrences: a key's row is made when its
            # count reaches min_count, in first-occurrence order (as the fused lookup makes them)
            ukeys = np.empty(flat.shape[0], dtype=np.int64)
            inverse = np.empty(flat.shape[0], dtype=np.int32)
            u, amounts = K.batch_distinct(flat, ukeys, inverse)
            rows = np.empty(u, dtype=np.int64)
            n0 = self._n

            def insert(pos: int) -> tuple[int, int, int]:
                pos, self._n, fill, status, admitted = K.lookup_insert(
                    self._idx, ukeys[:u], rows, pos, self._n, self._n + self._pending, self._row_cap, self._max_fill,
                    self._keys, self._meta, step, self.min_count, True, amounts)
                self.admitted_total += admitted
                return pos, fill, status

            status, _ = self._with_growth(insert)
            self._init_rows(n0, self._n)
            if status != K.OK:  # unreachable after the check above; the table is consistent anyway
                raise sentinel_error(flat)
            np.take(rows, inverse, out=out)
        else:  # read-only: ranges of keys on numba's thread count
            bad: list[int] = []
            _threads.run(lambda lo, hi: bad.append(K.lookup_only(self._idx, self._keys, flat[lo:hi], out[lo:hi])),
                         flat.shape[0], _MIN_PARALLEL_KEYS)
            if max(bad) >= 0:
                raise sentinel_error(flat)
        return out.reshape(keys.shape)

    def gather(self, block: str, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``[n, dim]`` values of block ``block`` for these keys and their ``lookup`` rows.

        Rows -1, and not-yet-admitted rows, give the key's deterministic initial value
        (``unadmitted="init"``) or zeros (``unadmitted="zero"``).
        """
        b = self.block_index(block)
        spec = self.blocks[b]
        keys = as_keys(keys).reshape(-1)
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if keys.shape != rows.shape:
            raise ValueError(f"gather: {keys.shape[0]} keys but {rows.shape[0]} rows")
        out = np.empty((rows.shape[0], spec.dim), dtype=self.dtype)
        bad = K.gather_rows(self._data[b], spec.dim, self._value_args[b], rows, keys, self._n, self._meta,
                            self.min_count, self.unadmitted == "zero", self._bases[b],
                            spec.init.code, spec.init.scale, out)
        if bad >= 0:
            raise ValueError(f"gather: row {rows[bad]} at position {bad} is not a row of this "
                             f"table ({self._n} rows)")
        return out

    # ---------------------------------------------------------------- optimizer application (updates.py)

    def apply_gradients(self, block: str, rows: np.ndarray, grads: np.ndarray, step: int,
                        lr_scale: float = 1.0) -> None:
        """Block ``block``'s optimizer on these rows, in place: :meth:`updates.RowUpdates.apply_gradients`."""
        self._updates.apply_gradients(self, block, rows, grads, step, lr_scale)

    def catch_up(self, steps_done: int, lr_scale: float = 1.0) -> None:
        """Deferred optimizer work up to ``steps_done`` global steps: :func:`updates.catch_up`."""
        updates.catch_up(self, steps_done, lr_scale)

    # ---------------------------------------------------------------- eviction (eviction.py)

    def evict(self, ttl: int | None, step: int, max_rows: int = 0) -> int:
        """Remove the keys unseen for more than ``ttl`` steps, then the least recently seen over
        ``max_rows``; returns how many: :meth:`eviction.Eviction.evict`."""
        return self._eviction.evict(self, ttl, step, max_rows)

    def track_evictions(self) -> np.ndarray | None:
        """The keys evicted since the previous call: :meth:`eviction.Eviction.track_evictions`."""
        return self._eviction.track_evictions()

    def delete(self, keys: np.ndarray) -> int:
        """Remove these keys' rows, not counted as evicted; returns how many: :func:`eviction.delete`."""
        return eviction.delete(self, keys)

    # ---------------------------------------------------------------- removal and bulk writes of rows

    def remove_rows(self, dead: np.ndarray) -> int:
        """Remove the rows ``dead`` (a bool mask of the live rows) and their index slots: the index
        deletes by backward shift (no tombstones), the last rows move into the holes (rows stay
        dense; earlier :meth:`lookup` results become stale) and oversized storage shrinks; pending
        keys stay. Returns how many were removed."""
        n = self._n
        src, dst, n_live = K.evict_plan(self._idx, self._keys, n, dead)
        if src.shape[0]:
            for a in self._row_arrays():
                a[dst] = a[src]
        self._n = n_live
        self._shared = -1  # rows moved
        self._maybe_shrink()
        return n - n_live

    def claim_rows(self, keys: np.ndarray) -> np.ndarray:
        """int64 rows of these int64 keys (no sentinel), a missing or pending key inserted with its
        key and index slot only: its count, ``last_seen``, values, slots and step counts are the
        caller's to write (every column, before the row is read), as loading an increment's rows does."""
        rows = np.empty(keys.shape[0], dtype=np.int64)

        def insert(pos: int) -> tuple[int, int, int]:  # count=False: inserts missing keys, leaves meta to the caller
            pos, self._n, fill, status, _ = K.lookup_insert(
                self._idx, keys, rows, pos, self._n, self._n + self._pending, self._row_cap, self._max_fill,
                self._keys, self._meta, 0, self.min_count, False, K.ONE_EACH)
            return pos, fill, status

        status, _ = self._with_growth(insert)
        if status != K.OK:
            raise sentinel_error(keys)
        self._shared = -1
        return rows

    def _with_growth(self, step: Callable[[int], tuple[int, int, int]]) -> tuple[int, int]:
        """Run a resumable index kernel to its end: ``step(position)`` -> ``(position, fill, status)``
        (``fill``: rows plus pending keys), the table grown and the kernel called again from
        ``position`` whenever the index is full (everything before it is done). Returns the final
        status (``K.OK``, or ``K.BAD_KEY``) and the position it stopped at."""
        pos = 0
        while True:
            pos, fill, status = step(pos)
            self._pending = fill - self._n
            if status != K.NEED_GROWTH:
                return status, pos
            self.grow()

    def reserve_rows(self, n_rows: int) -> None:
        """Row capacity for ``n_rows`` rows (at least ``MIN_CAPACITY``) in an empty table, to be
        written through :attr:`arrays` and taken by :meth:`adopt_rows` (loading a file)."""
        if self._n:
            raise ValueError(f"reserve_rows: the table has {self._n} rows")
        self._resize_rows(max(MIN_CAPACITY, int(n_rows)))

    def adopt_rows(self, n_rows: int) -> int:
        """Rows ``[0, n_rows)``, every column written through :attr:`arrays` into an empty table
        (:meth:`reserve_rows`), become its rows: indexed by their keys. Returns -1, or the first row
        whose key is an earlier row's or the sentinel (the table then keeps no row)."""
        bad = K.rebuild_index(self._keys, n_rows, self._idx)
        if bad < 0:
            self._n = int(n_rows)
            self._shared = -1
        return bad

    def pending(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, counts)`` of the pending keys (seen, fewer than ``min_count`` times, no row), by
        key; empty in a table whose keys all have rows."""
        if not self._pending:
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        keys, counts = K.pending_entries(self._idx)
        order = np.argsort(keys, kind="stable")
        return keys[order], counts[order]

    def set_pending(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """These keys (none with a row) pending with these counts (each in [1, ``min_count``)), as
        :meth:`pending` gives them: a checkpoint's pending keys into the table."""
        keys = as_keys(keys).reshape(-1)
        counts = np.asarray(counts).reshape(-1)
        if counts.shape != keys.shape:
            raise ValueError(f"set_pending: {keys.shape[0]} keys but {counts.shape[0]} counts")
        if keys.shape[0] and (not self.counters or counts.min() < 1 or counts.max() >= self.min_count):
            raise ValueError(f"pending counts must be in [1, {self.min_count}) in a table with counters: "
                             f"field {self.field} got [{counts.min()}, {counts.max()}]")
        counts = counts.astype(np.int32)
        status, pos = self._with_growth(lambda pos: K.set_pending(self._idx, self._keys, keys, counts, pos,
                                                                   self._n + self._pending, self._max_fill))
        if status != K.OK:
            raise ValueError(f"set_pending: key {int(keys[pos])} of field {self.field} has a row or is the sentinel")

    def _maybe_shrink(self) -> None:
        target = max(MIN_CAPACITY, math.ceil(self._n * ROW_GROWTH))
        if self._row_cap > target * ROW_GROWTH:
            self._resize_rows(target)
        fill = self._n + self._pending
        if fill < self.capacity * self.max_load / 4 and self.capacity > 4 * MIN_CAPACITY:
            self._rehash(math.ceil(fill / (self.max_load / INDEX_GROWTH)) + MIN_CAPACITY)

    # ---------------------------------------------------------------- kernels of many tables (fused.py)

    @property
    def arrays(self) -> TableArrays:
        """The index and row arrays, as kernels read and write them: the rows ``[0, len(self))``
        are the table's; valid until :attr:`version` changes."""
        return TableArrays(self._idx, self._keys, self._meta, tuple(self._data),
                           tuple(_NO_STEPS if s is None else s for s in self._steps))

    @property
    def fill_limit(self) -> int:
        """Keys (rows and pending keys) the index may hold before it must :meth:`grow`."""
        return self._max_fill

    @property
    def pending_count(self) -> int:
        """Keys held in the index without a row (seen fewer than ``min_count`` times)."""
        return self._pending

    @property
    def stream_bases(self) -> tuple[np.uint64, ...]:
        """Per block, the base of its keys' initial-value streams (``Initializer.stream_base``)."""
        return tuple(self._bases)

    def commit_rows(self, n_rows: int, pending: int | None = None) -> None:
        """Rows ``[len(self), n_rows)`` were inserted into :attr:`arrays` by a kernel (their keys,
        ``meta`` and index slots, as ``_index.insert_keys`` writes them), and the index holds
        ``pending`` pending keys (default: as many as before): they are the table's now. Their
        values and slots are the caller's to initialize (``init.init_block_rows``) before they
        are read; a :meth:`grow` in between keeps them."""
        n_rows = int(n_rows)
        pending = self._pending if pending is None else int(pending)
        if not self._n <= n_rows <= self._row_cap or not 0 <= pending or n_rows + pending > self._max_fill:
            raise ValueError(f"commit_rows({n_rows}, {pending}): the table has {self._n} rows and room for "
                             f"{self._row_cap} rows and {self._max_fill} keys")
        self._n, self._pending = n_rows, pending

    # ---------------------------------------------------------------- inspection

    def __len__(self) -> int:
        return self._n

    @property
    def admitted_count(self) -> int:
        """Live rows that are admitted (trained). ``admitted_total`` counts admissions ever made
        (the counterpart of ``evicted_count``; a key evicted and admitted again counts twice)."""
        if not self.counters:
            return self._n
        return int(np.count_nonzero(self._meta[:self._n, K.COUNT] >= self.min_count))

    @property
    def capacity(self) -> int:
        """Index slots."""
        return int(self._idx.shape[0])

    def keys(self) -> np.ndarray:
        """The live keys, in row order (a copy)."""
        return self._keys[:self._n].copy()

    def metadata(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """``count``, ``last_seen`` and ``admitted`` of these rows (all must be valid rows); a
        table without counters has only ``admitted`` (every row)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self._n):
            raise ValueError("metadata: rows out of range")
        if not self.counters:
            return {"admitted": np.ones(rows.shape, dtype=np.bool_)}
        count = self._meta[rows, K.COUNT]
        return {"count": count, "last_seen": self._meta[rows, K.LAST], "admitted": count >= self.min_count}

    def initial_values(self, block: str, keys: np.ndarray) -> np.ndarray:
        """The deterministic initial values ``[n, dim]`` of these keys in block ``block``."""
        spec = self.blocks[self.block_index(block)]
        return spec.init.values(as_keys(keys).reshape(-1), spec.dim, seed=self.seed,
                                field=self.field, block=spec.name, dtype=self.dtype)

    @property
    def row_capacity(self) -> int:
        """Rows the row arrays hold before they grow (address space may be reserved beyond)."""
        return self._row_cap

    def payload_bytes_per_row(self) -> int:
        """Raw payload of one row: :func:`footprint.payload_bytes_per_row`."""
        return footprint.payload_bytes_per_row(self)

    def estimated_bytes(self, rows: int, capacity: int | None = None, initial_rows: int | None = None) -> int:
        """Memory at ``rows`` keys without growth slack: :func:`footprint.estimated_bytes`."""
        return footprint.estimated_bytes(self, rows, capacity, initial_rows)

    def memory(self) -> dict[str, Any]:
        """Allocated bytes by part, rows, capacity and load: :func:`footprint.memory`."""
        return footprint.memory(self)

    def __repr__(self) -> str:
        blocks = ", ".join(f"{b.name}[{b.dim}]:{b.optimizer.kind}" for b in self.blocks)
        return (f"EmbeddingTable(field={self.field}, rows={self._n}, capacity={self.capacity}, "
                f"blocks=({blocks}), dtype={self.dtype.name}, table_dtype={self.table_dtype}, "
                f"counters={self.counters})")

    # ---------------------------------------------------------------- persistence (persistence.py)

    def to_arrays(self, since: int | None = None) -> dict[str, np.ndarray]:
        """The live rows (with ``since``, those looked up since) by file array: :func:`persistence.to_arrays`."""
        return persistence.to_arrays(self, since)

    def save(self, path: str | os.PathLike, since: int | None = None) -> None:
        """Write the table (with ``since``, its rows looked up since) atomically: :func:`persistence.save`."""
        persistence.save(self, path, since)

    def upsert(self, arrays: dict[str, np.ndarray]) -> int:
        """Rows as :meth:`to_arrays` gives them, replacing or added; returns the new: :func:`persistence.upsert`."""
        return persistence.upsert(self, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, capacity: int | None = None,
             table_dtype: str | None = None, counters: bool | None = None,
             computed: Sequence[bool] | None = None) -> "EmbeddingTable":
        """Read a table written by :meth:`save`; ``capacity`` (index slots) is a lower bound, the
        default fits the rows at about ``max_load / 1.5``; ``table_dtype``: stored so, ``counters``:
        with or without counters, ``computed``: per block, values computed from the slots or
        stored (default: as saved). Raises :class:`TableFormatError`."""
        return persistence.load_parts(cls, [(path, None)], capacity, table_dtype, counters, computed)

    @classmethod
    def load_parts(cls, parts: Sequence[tuple[str | os.PathLike, KeyFilter | None]],
                   capacity: int | None = None, table_dtype: str | None = None,
                   counters: bool | None = None, computed: Sequence[bool] | None = None) -> "EmbeddingTable":
        """One table of the rows that each part ``(path, keep)`` keeps, stored as ``table_dtype``,
        with or without ``counters`` and each block's values ``computed`` or stored (default: the
        files'): :func:`persistence.load_parts`."""
        return persistence.load_parts(cls, parts, capacity, table_dtype, counters, computed)
