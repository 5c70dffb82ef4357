"""``EmbeddingTable``: one field's dynamic embedding table (key -> row -> value blocks + slots).

Layout (see ``_index.py`` for the kernels):

* index: open addressing with linear probing over 12-byte slots (key, int32 row), load factor
  kept <= ``max_load``; grows by rehash to 1.5x capacity (``INDEX_GROWTH``), so the load stays in
  [max_load / 1.5, max_load].
* rows: densely packed, row ``r`` is the r-th live key. Per row: ``keys`` (int64), ``meta`` =
  (count, last_seen) (int32 pair), and per block one float array ``[rows, dim * (1 + num_slots)]``
  holding the values followed by the optimizer slots of that row (co-located, so an update
  touches one or two cache lines), plus an int32 step count for Adam blocks. A row is admitted iff
  its count >= ``min_count`` (the count only grows, so no separate flag is needed).
* growth: the row capacity grows by ``ROW_GROWTH`` = 1.15x, which bounds the row slack to 15%.
  The two slacks can peak together (a freshly grown index at load ``max_load / 1.5`` while the
  rows have just grown), so the worst case is ``1.15 * (payload + 8 B meta) + 12 B * 1.5 /
  max_load`` per row: for the benchmark's FTRL[1] + Adam[8] float32 row (payload 120 B: key 8 +
  12 + 96 + Adam step 4) that is (1.15 * 128 + 25.7) / 120 = 1.44x the raw payload at any size
  past the initial allocation (``docs/benchmarks.md`` has the measured figures). Large row arrays
  live in address-space reservations of 8x (``_memory.py``): growing inside a reservation commits
  the new rows in bulk and moves nothing; outgrowing it copies the live rows into a new
  reservation, so a row is copied a fraction of a time on average instead of at every growth
  step. The memory figures count the row
  capacity, never the reserved address space (which holds no memory until used); the next
  growth step's rows are committed in the background ahead of it, so the resident memory may run
  up to one step (15 % of the rows) ahead of the figures.

The reserved sentinel key is ``EMPTY_KEY = -2**63`` (int64 minimum); every other int64 is a valid
key. Rows handed out by :meth:`EmbeddingTable.lookup` stay valid until the next :meth:`evict`
(eviction compacts rows) or until the table is replaced by :meth:`load`. Not thread-safe; all
kernels release the GIL, so *different* tables may be used from different threads.

Kernels that drive many tables at once (``fused.py``) use the table through a small public
surface: :attr:`EmbeddingTable.arrays` (valid while :attr:`EmbeddingTable.version` is unchanged:
it changes whenever an array is replaced), :attr:`EmbeddingTable.row_limit`,
:meth:`EmbeddingTable.grow`, :meth:`EmbeddingTable.commit_rows` (rows such a kernel inserted), the
shared row (:meth:`EmbeddingTable.shared_row`, :meth:`EmbeddingTable.map_to_shared`) and
:attr:`EmbeddingTable.stream_bases`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from . import _index as K
from . import _threads
from ._memory import commit_ahead, grow_in_place, row_array
from .format import TableFormatError, read_table_file, write_table_file
from .init import Initializer, init_new_rows
from .optimizers import FTRL, SGD, AdaGrad, Adam, Optimizer, optimizer_from_dict

EMPTY_KEY: int = int(K.EMPTY)
SHARED_KEY: int = EMPTY_KEY + 1  # unadmitted="shared": the field's out-of-vocabulary row
INDEX_GROWTH = 1.5
ROW_GROWTH = 1.15
MIN_CAPACITY = 16
MAX_LOAD = 0.7  # the index's default load bound (keys per slot) before it grows
INITIAL_ROWS_MAX = 1 << 16
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
MAX_CAPACITY = 2**32  # fastrange uses 32 hash bits
_MAX_ROWS = 2**31 - 1  # row numbers are int32 in the index
_NO_STEPS = np.zeros(0, dtype=np.int32)  # a block without a step count
_MIN_PARALLEL_ROWS = 4096  # new rows below which one thread initializes them all
_MIN_PARALLEL_KEYS = 1 << 15  # keys below which one thread looks them all up (read-only)
#: which rows of a table file :meth:`EmbeddingTable.load_parts` keeps: int64 keys -> bool mask
KeyFilter = Callable[[np.ndarray], np.ndarray]


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
        if not isinstance(self.optimizer, (SGD, AdaGrad, Adam, FTRL)):
            raise TypeError(f"block {self.name!r}: optimizer must be SGD, AdaGrad, Adam or FTRL")
        if not isinstance(self.init, Initializer):
            raise TypeError(f"block {self.name!r}: init must be an Initializer")

    @property
    def width(self) -> int:
        """Columns of the co-located row: values then each slot."""
        return self.dim * (1 + self.optimizer.num_slots)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "optimizer": self.optimizer.to_dict(),
                "init": self.init.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BlockSpec":
        return cls(name=d["name"], dim=int(d["dim"]), optimizer=optimizer_from_dict(d["optimizer"]),
                   init=Initializer.from_dict(d["init"]))


class TableArrays(NamedTuple):
    """A table's arrays as kernels read and write them, each at least as long as the row capacity
    (address space may be reserved beyond it); replaced when :attr:`EmbeddingTable.version` changes."""

    index: np.ndarray  # int32 [capacity, 3]: the index's slots (key low, key high, row + 1)
    keys: np.ndarray  # int64 [rows]: each row's key
    meta: np.ndarray  # int32 [rows, 2]: each row's (count, last_seen)
    blocks: tuple[np.ndarray, ...]  # per block, [rows, dim * (1 + slots)]: values, then the optimizer's slots
    steps: tuple[np.ndarray, ...]  # per block, int32 [rows]: Adam's per-row step count (empty: none)


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
                 unadmitted: str = "init", rows: int | None = None) -> None:
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
        if not 0.1 <= float(max_load) <= 0.95:
            raise ValueError(f"max_load must be in [0.1, 0.95], got {max_load!r}")
        self.max_load = float(max_load)
        if int(min_count) < 0:
            raise ValueError(f"min_count must be >= 0, got {min_count!r}")
        self.min_count = int(min_count)
        if unadmitted not in ("init", "zero", "shared"):
            raise ValueError(f"unadmitted must be 'init', 'zero' or 'shared', got {unadmitted!r}")
        self.unadmitted = unadmitted
        self._bases = [Initializer.stream_base(self.seed, self.field, b.name) for b in self.blocks]
        self.evicted_count = 0
        self.admitted_total = 0  # admissions ever (a key evicted and admitted again counts twice)
        self.last_update_step: int | None = None
        self._evicted_keys: list[np.ndarray] | None = None  # kept while tracked (track_evictions)
        self._n = 0
        #: changes whenever an array of :attr:`arrays` is replaced (growth, eviction, loading); read only
        self.version = 0
        self._shared = -1  # row of SHARED_KEY once known (unadmitted="shared"); rows move on evict
        self._slot_init = [np.array(b.optimizer.slot_initial_values(), dtype=np.float64) for b in self.blocks]
        self._scratch_bufs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._committing: Any = None  # a background commit of the next growth step's rows
        self._alloc_index(self._clamp_capacity(capacity))
        # rows for the initial index, but a huge `capacity` does not commit memory up front
        self._alloc_rows(max(MIN_CAPACITY, min(self._max_fill, INITIAL_ROWS_MAX if rows is None else int(rows))))
        self._initial_capacity, self._initial_rows = self.capacity, self._row_cap

    # ---------------------------------------------------------------- storage management

    @staticmethod
    def _clamp_capacity(capacity: int) -> int:
        capacity = max(MIN_CAPACITY, int(capacity))
        if capacity > MAX_CAPACITY:
            raise ValueError(f"index capacity {capacity} exceeds {MAX_CAPACITY}")
        return capacity

    def _alloc_index(self, capacity: int) -> None:
        self._idx = K.new_index(capacity)
        # keep one slot free at least, so probing always terminates
        self._max_fill = min(capacity - 1, int(capacity * self.max_load))
        self.version += 1

    def _alloc_rows(self, row_cap: int) -> None:
        # row arrays may be longer than the capacity (address space reserved for growth)
        self._keys = row_array(row_cap, (), np.int64, reserve=True)
        self._meta = row_array(row_cap, (2,), np.int32, reserve=True)  # (count, last_seen)
        self._data = [row_array(row_cap, (b.width,), self.dtype, reserve=True) for b in self.blocks]
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
        K.rehash(old, self._idx)

    def grow(self) -> None:
        """Room for at least one more row (:attr:`row_limit` > ``len(self)``): the rows grow by
        ``ROW_GROWTH``, the index by ``INDEX_GROWTH``, as needed; :attr:`version` may change."""
        if self._n >= self._row_cap:
            if self._n >= _MAX_ROWS:
                raise ValueError(f"table of field {self.field} is full ({_MAX_ROWS} rows)")
            self._resize_rows(self._next_row_cap())
        if self._n >= self._max_fill:
            self._rehash(math.ceil(self.capacity * INDEX_GROWTH))

    def _init_rows(self, start: int, stop: int) -> None:
        """Values from the initializers and slots from the optimizers for rows [start, stop)."""
        if stop <= start:
            return
        for b, spec in enumerate(self.blocks):
            args = (self._data[b], spec.dim, self._steps_or_empty(b), self._keys)
            init = (self._bases[b], spec.init.code, spec.init.scale, self._slot_init[b])
            # the rows in parts on numba's thread count (normal draws make a new row costly)
            _threads.run(lambda lo, hi: init_new_rows(*args, start + lo, start + hi, *init), stop - start,
                         _MIN_PARALLEL_ROWS)

    def _steps_or_empty(self, b: int) -> np.ndarray:
        steps = self._steps[b]
        return _NO_STEPS if steps is None else steps

    def _block(self, name: str) -> int:
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
            K.lookup_only(self._idx, np.array([SHARED_KEY], dtype=np.int64), row)
            self._shared = int(row[0])
        if step is None:
            return self._shared
        return self._make_shared_row(step)

    def map_to_shared(self, rows: np.ndarray, admitted: np.ndarray) -> None:
        """``unadmitted="shared"``: the rows (int64, in place) that are unknown (-1) or not admitted
        become the shared row, which is made now if the table has none yet (an evaluation before
        any training step: as training would make it); ``admitted[i]`` is set: every row is trained."""
        K.admit_rows(rows, admitted, self._meta, self.min_count, self._make_shared_row(None))

    def _make_shared_row(self, step: int | None) -> int:
        """The shared row, inserted (and admitted) if missing; ``last_seen = step`` if given."""
        if self._shared < 0:
            self._shared = int(self._lookup(np.array([SHARED_KEY], dtype=np.int64), insert=True, step=step or 0)[0])
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
            n0, pos = self._n, 0
            while True:
                pos, self._n, status, admitted = K.lookup_insert(
                    self._idx, flat, out, pos, self._n, min(self._row_cap, self._max_fill),
                    self._keys, self._meta, step, self.min_count)
                self.admitted_total += admitted
                if status == K.NEED_GROWTH:
                    self.grow()
                elif status == K.OK:
                    break
                else:  # unreachable after the check above; keep the table consistent anyway
                    self._init_rows(n0, self._n)
                    raise sentinel_error(flat)
            self._init_rows(n0, self._n)
        else:  # read-only: ranges of keys on numba's thread count
            bad: list[int] = []
            _threads.run(lambda lo, hi: bad.append(K.lookup_only(self._idx, flat[lo:hi], out[lo:hi])),
                         flat.shape[0], _MIN_PARALLEL_KEYS)
            if max(bad) >= 0:
                raise sentinel_error(flat)
        return out.reshape(keys.shape)

    def gather(self, block: str, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``[n, dim]`` values of block ``block`` for these keys and their ``lookup`` rows.

        Rows -1, and not-yet-admitted rows, give the key's deterministic initial value
        (``unadmitted="init"``) or zeros (``unadmitted="zero"``).
        """
        b = self._block(block)
        spec = self.blocks[b]
        keys = as_keys(keys).reshape(-1)
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if keys.shape != rows.shape:
            raise ValueError(f"gather: {keys.shape[0]} keys but {rows.shape[0]} rows")
        out = np.empty((rows.shape[0], spec.dim), dtype=self.dtype)
        bad = K.gather_rows(self._data[b], spec.dim, rows, keys, self._n, self._meta,
                            self.min_count, self.unadmitted == "zero", self._bases[b],
                            spec.init.code, spec.init.scale, out)
        if bad >= 0:
            raise ValueError(f"gather: row {rows[bad]} at position {bad} is not a row of this "
                             f"table ({self._n} rows)")
        return out

    def apply_gradients(self, block: str, rows: np.ndarray, grads: np.ndarray, step: int,
                        lr_scale: float = 1.0) -> None:
        """Apply block ``block``'s optimizer to the rows, in place.

        ``grads`` is ``[n, dim]``, one row per occurrence: gradients of duplicate rows are summed
        first (in occurrence order), then the optimizer runs once per unique admitted row. Rows -1
        and unadmitted rows are skipped. ``step`` is recorded as ``last_update_step`` only (Adam's
        step count is per row, see ``optimizers.py``). ``lr_scale``: a schedule's factor of the rate.
        """
        b = self._block(block)
        spec = self.blocks[b]
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        grads = np.asarray(grads)
        if grads.shape != (rows.shape[0], spec.dim):
            raise ValueError(f"apply_gradients({block!r}): grads shape {grads.shape} != "
                             f"({rows.shape[0]}, {spec.dim})")
        grads = np.ascontiguousarray(grads, dtype=self.dtype)
        uniq, acc = self._scratch(rows.shape[0], spec.dim)
        u, bad = K.sum_duplicates(rows, grads, self._n, self._meta, self.min_count, uniq, acc)
        if bad >= 0:
            raise ValueError(f"apply_gradients: row {rows[bad]} at position {bad} is not a row of "
                             f"this table ({self._n} rows)")
        data, dim = self._data[b], spec.dim
        slots = tuple(data[:, dim * (s + 1):dim * (s + 2)] for s in range(spec.optimizer.num_slots))
        spec.optimizer.apply_rows(data[:, :dim], slots, self._steps[b], uniq[:u], acc[:u], lr_scale, int(step) + 1)
        self.last_update_step = int(step)

    def catch_up(self, steps_done: int, lr_scale: float = 1.0) -> None:
        """Rows whose optimizer defers work (Adam with ``catchup``) take it up to ``steps_done``
        global steps: before evaluation and checkpoints."""
        for b, spec in enumerate(self.blocks):
            data, dim = self._data[b], spec.dim
            slots = tuple(data[:, dim * (s + 1):dim * (s + 2)] for s in range(spec.optimizer.num_slots))
            spec.optimizer.catch_up(data[:, :dim], slots, self._steps[b], self._n, int(steps_done), lr_scale)

    def _scratch(self, n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """Reused buffers for the unique rows and summed gradients of one batch (fresh arrays of
        a few MB per call would cost page faults on every step)."""
        uniq, acc = self._scratch_bufs.get(dim, (None, None))
        if uniq is None or uniq.shape[0] < n:
            size = max(n, 1024)
            uniq = np.empty(size, dtype=np.int64)
            acc = np.empty((size, dim), dtype=self.dtype)
            self._scratch_bufs[dim] = (uniq, acc)
        return uniq, acc

    def evict(self, ttl: int | None, step: int, max_rows: int = 0) -> int:
        """Remove every key with ``step - last_seen > ttl`` (``ttl`` None: none by age), then, while
        more than ``max_rows`` > 0 rows remain, the least recently seen: the smallest ``last_seen``
        first, of equal ones the smaller key (as int64), so the rows kept depend on the table's rows alone.
        Returns how many were removed. The shared row (``unadmitted="shared"``) is the field's, not
        an id's: never removed (it counts toward ``max_rows``, which must then be at least 1).

        The index deletes by backward shift (no tombstones); the last rows move into the holes, so
        rows stay dense and earlier ``lookup`` results become stale. Oversized storage shrinks.
        """
        n = self._n
        if n == 0:
            return 0
        last = self._meta[:n, K.LAST]
        dead = np.zeros(n, dtype=np.bool_) if ttl is None else np.int64(step) - last > int(ttl)
        kept = self.shared_row(None)
        if kept >= 0:
            dead[kept] = False
        over = n - int(np.count_nonzero(dead)) - int(max_rows)
        if max_rows > 0 and over > 0:
            dead[self._least_recent(dead, kept, over)] = True
        if self._evicted_keys is not None:
            self._evicted_keys.append(self._keys[:n][dead])
        n_dead = self._remove(dead)
        self.evicted_count += n_dead
        return n_dead

    def _remove(self, dead: np.ndarray) -> int:
        """Remove the rows ``dead`` (a bool mask of the live rows) and their index slots; the last
        rows move into the holes. Returns how many were removed."""
        n = self._n
        src, dst, n_live = K.evict_plan(self._idx, self._keys, n, dead)
        if src.shape[0]:
            for a in self._row_arrays():
                a[dst] = a[src]
        self._n = n_live
        self._shared = -1  # rows moved
        self._maybe_shrink()
        return n - n_live

    def track_evictions(self) -> np.ndarray | None:
        """The keys :meth:`evict` removed since the previous call (None at the first: not tracked
        until then); from this call on, evicted keys are kept until the next (an incremental
        checkpoint records them, so that loading it deletes them)."""
        taken = self._evicted_keys
        self._evicted_keys = []
        return None if taken is None else (np.concatenate(taken) if taken else np.zeros(0, np.int64))

    def delete(self, keys: np.ndarray) -> int:
        """Remove these keys' rows (keys the table lacks are ignored), as :meth:`evict` removes rows
        but without counting them as evicted (replaying a checkpoint's evictions). Returns how many."""
        keys = as_keys(keys).reshape(-1)
        if self._n == 0 or keys.shape[0] == 0:
            return 0
        rows = np.empty(keys.shape[0], dtype=np.int64)
        if K.lookup_only(self._idx, keys, rows) >= 0:
            raise sentinel_error(keys)
        dead = np.zeros(self._n, dtype=np.bool_)
        dead[rows[rows >= 0]] = True
        return self._remove(dead) if dead.any() else 0

    def upsert(self, arrays: dict[str, np.ndarray]) -> int:
        """Rows given as :meth:`to_arrays` gives them (distinct keys): a key the table holds has
        its row replaced (counts, ``last_seen``, values, slots, step counts), a new key gets a new
        row. Counters (``evicted_count``, ``admitted_total``) are left alone. Returns the new rows."""
        _check_arrays(arrays, self.blocks, self.dtype, int(np.asarray(arrays["keys"]).shape[0]))
        keys = as_keys(arrays["keys"])
        if keys.shape[0] and (keys == K.EMPTY).any():
            raise sentinel_error(keys)
        rows = np.empty(keys.shape[0], dtype=np.int64)
        n0, pos = self._n, 0
        while True:  # count=False: inserts missing keys, leaves meta to the copy below
            pos, self._n, status, _ = K.insert_keys(self._idx, keys, rows, pos, self._n, self.row_limit,
                                                    self._keys, self._meta, 0, self.min_count, False)
            if status == K.NEED_GROWTH:
                self.grow()
            elif status == K.OK:
                break
            else:
                raise sentinel_error(keys)
        self._meta[rows, K.COUNT] = arrays["count"]
        self._meta[rows, K.LAST] = arrays["last_seen"]
        for b, spec in enumerate(self.blocks):
            data, dim = self._data[b], spec.dim
            data[rows, :dim] = arrays[f"block.{b}.values"]
            for s, name in enumerate(spec.optimizer.slot_names):
                data[rows, dim * (s + 1):dim * (s + 2)] = arrays[f"block.{b}.slot.{name}"]
            if self._steps[b] is not None:
                self._steps[b][rows] = arrays[f"block.{b}.steps"]
        self._shared = -1
        return self._n - n0

    def _least_recent(self, dead: np.ndarray, kept: int, count: int) -> np.ndarray:
        """The ``count`` live rows (not ``dead``, not row ``kept``) seen least recently, of equal
        ``last_seen`` the smaller keys: the count-th smallest ``last_seen`` by selection, then only the
        rows at it by key (linear time, where sorting every row by both would not be)."""
        rows = np.flatnonzero(~dead)
        if kept >= 0:
            rows = rows[rows != kept]
        last = self._meta[rows, K.LAST]
        cut = np.partition(last, count - 1)[count - 1]
        older, tied = rows[last < cut], rows[last == cut]
        need = count - older.shape[0]
        if need < tied.shape[0]:  # keys are distinct: the `need` smallest are one set
            tied = tied[np.argpartition(self._keys[tied], need - 1)[:need]]
        return np.concatenate([older, tied])

    def _maybe_shrink(self) -> None:
        target = max(MIN_CAPACITY, math.ceil(self._n * ROW_GROWTH))
        if self._row_cap > target * ROW_GROWTH:
            self._resize_rows(target)
        if self._n < self.capacity * self.max_load / 4 and self.capacity > 4 * MIN_CAPACITY:
            self._rehash(math.ceil(self._n / (self.max_load / INDEX_GROWTH)) + MIN_CAPACITY)

    # ---------------------------------------------------------------- kernels of many tables (fused.py)

    @property
    def arrays(self) -> TableArrays:
        """The index and row arrays, as kernels read and write them: the rows ``[0, len(self))``
        are the table's; valid until :attr:`version` changes."""
        return TableArrays(self._idx, self._keys, self._meta, tuple(self._data),
                           tuple(self._steps_or_empty(b) for b in range(len(self.blocks))))

    @property
    def row_limit(self) -> int:
        """Rows the table may hold before it must :meth:`grow`: its row capacity, or the index's
        fill bound if lower."""
        return min(self._row_cap, self._max_fill)

    @property
    def stream_bases(self) -> tuple[np.uint64, ...]:
        """Per block, the base of its keys' initial-value streams (``Initializer.stream_base``)."""
        return tuple(self._bases)

    def commit_rows(self, n_rows: int) -> None:
        """Rows ``[len(self), n_rows)`` were inserted into :attr:`arrays` by a kernel (their keys,
        ``meta`` and index slots, as ``_index.insert_keys`` writes them): they are the table's now.
        Their values and slots are the caller's to initialize (``init.init_block_rows``) before they
        are read; a :meth:`grow` in between keeps them."""
        n_rows = int(n_rows)
        if not self._n <= n_rows <= self.row_limit:
            raise ValueError(f"commit_rows({n_rows}): the table has {self._n} rows and room for {self.row_limit}")
        self._n = n_rows

    # ---------------------------------------------------------------- inspection

    def __len__(self) -> int:
        return self._n

    @property
    def admitted_count(self) -> int:
        """Live rows that are admitted (trained). ``admitted_total`` counts admissions ever made
        (the counterpart of ``evicted_count``; a key evicted and admitted again counts twice)."""
        return int(np.count_nonzero(self._meta[:self._n, K.COUNT] >= self.min_count))

    @property
    def capacity(self) -> int:
        """Index slots."""
        return int(self._idx.shape[0])

    def keys(self) -> np.ndarray:
        """The live keys, in row order (a copy)."""
        return self._keys[:self._n].copy()

    def metadata(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """``count``, ``last_seen`` and ``admitted`` of these rows (all must be valid rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self._n):
            raise ValueError("metadata: rows out of range")
        count = self._meta[rows, K.COUNT]
        return {"count": count, "last_seen": self._meta[rows, K.LAST], "admitted": count >= self.min_count}

    def initial_values(self, block: str, keys: np.ndarray) -> np.ndarray:
        """The deterministic initial values ``[n, dim]`` of these keys in block ``block``."""
        spec = self.blocks[self._block(block)]
        return spec.init.values(as_keys(keys).reshape(-1), spec.dim, seed=self.seed,
                                field=self.field, block=spec.name, dtype=self.dtype)

    def payload_bytes_per_row(self) -> int:
        """Raw payload of one row: key + values + slots (+ Adam step count)."""
        return 8 + sum(b.width * self.dtype.itemsize + (4 if b.optimizer.needs_step else 0)
                       for b in self.blocks)

    def estimated_bytes(self, rows: int, capacity: int | None = None, initial_rows: int | None = None) -> int:
        """Memory this table takes once it holds ``rows`` keys, without growth slack: row arrays
        of exactly ``rows`` rows and an index at its load bound (or the initial allocation, if
        larger: this table's, or a table of the same layout created with ``capacity`` slots and
        ``initial_rows`` rows). The real figure is at most ~``ROW_GROWTH`` = 1.15x (rows) and
        ``INDEX_GROWTH`` = 1.5x (index) above it."""
        row_bytes = (self._keys.itemsize + self._meta.itemsize * self._meta.shape[1]
                     + sum(d.itemsize * d.shape[1] for d in self._data)
                     + sum(s.itemsize for s in self._steps if s is not None))
        slot_bytes = self._idx.itemsize * self._idx.shape[1]
        slots = max(self._initial_capacity if capacity is None else capacity, math.ceil(rows / self.max_load) + 1)
        return max(rows, self._initial_rows if initial_rows is None else initial_rows) * row_bytes + slots * slot_bytes

    def memory(self) -> dict[str, Any]:
        """Allocated bytes by part, rows, capacity, load factor and the raw payload for comparison."""
        index = self._idx.nbytes
        cap = self._row_cap  # the arrays may reserve more address space; only capacity is memory
        values = cap * (sum(d.itemsize * d.shape[1] for d in self._data)
                        + sum(s.itemsize for s in self._steps if s is not None))
        meta = cap * (self._keys.itemsize + self._meta.itemsize * self._meta.shape[1])
        total = index + values + meta
        payload = self._n * self.payload_bytes_per_row()
        return {"bytes": total, "index_bytes": index, "values_bytes": values,
                "metadata_bytes": meta, "rows": self._n, "row_capacity": self._row_cap,
                "capacity": self.capacity, "load_factor": self._n / self.capacity,
                "payload_bytes": payload,
                "bytes_per_row": total / self._n if self._n else float("nan"),
                "overhead": total / payload if payload else float("nan")}

    def __repr__(self) -> str:
        blocks = ", ".join(f"{b.name}[{b.dim}]:{b.optimizer.kind}" for b in self.blocks)
        return (f"EmbeddingTable(field={self.field}, rows={self._n}, capacity={self.capacity}, "
                f"blocks=({blocks}), dtype={self.dtype.name})")

    # ---------------------------------------------------------------- persistence

    def to_arrays(self, since: int | None = None) -> dict[str, np.ndarray]:
        """The live rows as the arrays :meth:`save` writes (named as in ``format.py``): views, valid
        until the table next changes; with ``since``, copies of the rows looked up in training at
        step ``since`` or later (``last_seen >= since``, inserted rows included)."""
        n = self._n
        arrays: dict[str, np.ndarray] = {"keys": self._keys[:n], "count": self._meta[:n, K.COUNT],
                                         "last_seen": self._meta[:n, K.LAST]}
        for b, spec in enumerate(self.blocks):
            data, dim = self._data[b], spec.dim
            arrays[f"block.{b}.values"] = data[:n, :dim]
            for s, name in enumerate(spec.optimizer.slot_names):
                arrays[f"block.{b}.slot.{name}"] = data[:n, dim * (s + 1):dim * (s + 2)]
            if self._steps[b] is not None:
                arrays[f"block.{b}.steps"] = self._steps[b][:n]
        if since is not None:
            changed = arrays["last_seen"] >= since
            arrays = {name: a[changed] for name, a in arrays.items()}
        return arrays

    def save(self, path: str | os.PathLike, since: int | None = None) -> None:
        """Write the table atomically in the format of ``des/hashtable/format.py`` (no pickle); with
        ``since``, only the rows :meth:`to_arrays` gives for it (an incremental checkpoint's)."""
        arrays = self.to_arrays(since)
        header = {"field": self.field, "seed": self.seed, "dtype": self.dtype.name,
                  "min_count": self.min_count, "unadmitted": self.unadmitted,
                  "max_load": self.max_load, "n_rows": int(arrays["keys"].shape[0]),
                  "evicted_count": self.evicted_count, "admitted_total": self.admitted_total,
                  "last_update_step": self.last_update_step,
                  "blocks": [b.to_dict() for b in self.blocks]}
        write_table_file(path, header, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, capacity: int | None = None) -> "EmbeddingTable":
        """Read a table written by :meth:`save`; ``capacity`` (index slots) is a lower bound, the
        default fits the rows at about ``max_load / 1.5``. Raises :class:`TableFormatError`."""
        return cls.load_parts([(path, None)], capacity)

    @classmethod
    def load_parts(cls, parts: Sequence[tuple[str | os.PathLike, KeyFilter | None]],
                   capacity: int | None = None) -> "EmbeddingTable":
        """One table of the rows of several files written by :meth:`save` (the parts of one field,
        such as its shares): of each part ``(path, keep)`` the rows whose keys ``keep(keys)`` (a bool
        mask) selects, every row where ``keep`` is None. The parts must agree on field, seed, dtype,
        ``min_count``, ``unadmitted`` and blocks, and hold distinct keys; the one exception is the
        shared row (``SHARED_KEY``, ``unadmitted="shared"``): the field's, not a key's, so ``keep``
        never drops it and the first part holding it gives it. Counters: a part read whole adds its
        ``evicted_count`` and ``admitted_total``; a part cut by ``keep`` adds only its kept rows'
        admitted count (which of its keys it evicted or admitted before is not known: the lower
        bound a file without the counter loads with); ``last_update_step`` is the latest of the parts.
        ``capacity``: as :meth:`load`, for the rows kept. Raises :class:`TableFormatError` naming the file.
        """
        pieces: list[tuple[str, dict[str, np.ndarray]]] = []
        first: dict[str, Any] = {}
        evicted = admitted = 0
        last: int | None = None
        shared_seen = False
        for path, keep in parts:
            path = os.fspath(path)
            header, arrays = read_table_file(path)
            try:
                if not first:
                    first = {"path": path, "header": header, "dtype": np.dtype(header["dtype"]),
                             "blocks": [BlockSpec.from_dict(d) for d in header["blocks"]]}
                differ = [k for k in _PART_LAYOUT if header[k] != first["header"][k]]
                if differ:
                    raise TableFormatError(f"{path}: its {', '.join(differ)} differ from those of {first['path']}")
                n = int(header["n_rows"])
                _check_arrays(arrays, first["blocks"], first["dtype"], n)
                keys = arrays["keys"]
                mask = None if keep is None else np.asarray(keep(keys), dtype=np.bool_)
                if mask is not None and mask.shape != (n,):
                    raise ValueError(f"keep gave a mask of shape {mask.shape} for {n} keys")
                if header["unadmitted"] == "shared" and n:
                    shared = keys == SHARED_KEY
                    if shared.any():  # the first part's shared row, whatever its key's share
                        mask = np.ones(n, dtype=np.bool_) if mask is None else mask
                        mask[shared] = not shared_seen
                        shared_seen = True
                if mask is not None and not mask.all():
                    arrays = {name: a[mask] for name, a in arrays.items()}
                if keep is None:  # read whole: its counters
                    evicted += int(header["evicted_count"])
                    total = header.get("admitted_total")  # absent in files of older versions of des
                    admitted += _admitted(arrays, header) if total is None else int(total)
                else:
                    admitted += _admitted(arrays, header)
                step = header.get("last_update_step")
                if step is not None:
                    last = int(step) if last is None else max(last, int(step))
            except TableFormatError:
                raise
            except (KeyError, TypeError, ValueError) as e:
                raise TableFormatError(f"{path}: inconsistent table file "
                                       f"({type(e).__name__}: {e})".replace("\n", " ")) from e
            pieces.append((path, arrays))
        arrays = {}  # the parts' (kept) rows are the pieces', released as they are copied
        if not first:
            raise ValueError("load_parts: no parts")
        header = first["header"]
        n = sum(int(arrays["keys"].shape[0]) for _, arrays in pieces)
        max_load = float(header["max_load"])
        needed = math.ceil(n / max_load) + 1
        cap = max(needed, int(capacity) if capacity is not None else math.ceil(n * INDEX_GROWTH / max_load),
                  MIN_CAPACITY)
        try:
            table = cls(field=int(header["field"]), blocks=first["blocks"], seed=int(header["seed"]),
                        dtype=first["dtype"], capacity=cap, max_load=max_load,
                        min_count=int(header["min_count"]), unadmitted=header["unadmitted"])
        except (KeyError, TypeError, ValueError) as e:
            raise TableFormatError(f"{first['path']}: inconsistent table file "
                                   f"({type(e).__name__}: {e})".replace("\n", " ")) from e
        table.evicted_count, table.admitted_total, table.last_update_step = evicted, admitted, last
        table._fill_parts(pieces, n)
        return table

    def _fill_parts(self, pieces: list[tuple[str, dict[str, np.ndarray]]], n: int) -> None:
        """Rows ``[0, n)`` from the (checked) arrays of each part in turn, released once copied."""
        self._resize_rows(max(MIN_CAPACITY, n))
        starts = [0]
        for i, (_, arrays) in enumerate(pieces):
            lo = starts[-1]
            hi = lo + int(arrays["keys"].shape[0])
            self._keys[lo:hi] = arrays["keys"]
            self._meta[lo:hi, K.COUNT] = arrays["count"]
            self._meta[lo:hi, K.LAST] = arrays["last_seen"]
            for b, spec in enumerate(self.blocks):
                data, dim = self._data[b], spec.dim
                data[lo:hi, :dim] = arrays[f"block.{b}.values"]
                for s, name in enumerate(spec.optimizer.slot_names):
                    data[lo:hi, dim * (s + 1):dim * (s + 2)] = arrays[f"block.{b}.slot.{name}"]
                if self._steps[b] is not None:
                    self._steps[b][lo:hi] = arrays[f"block.{b}.steps"]
            pieces[i] = (pieces[i][0], {})  # the part's arrays may go
            starts.append(hi)
        bad = K.rebuild_index(self._keys, n, self._idx)
        if bad >= 0:
            key = int(self._keys[bad])
            part = int(np.searchsorted(starts, bad, side="right")) - 1
            first = int(np.flatnonzero(self._keys[:n] == key)[0])
            other = int(np.searchsorted(starts, first, side="right")) - 1
            where = f" (also in {pieces[other][0]})" if other != part else ""
            raise TableFormatError(f"{pieces[part][0]}: inconsistent table file (ValueError: key {key} (row "
                                   f"{bad - starts[part]}) is duplicated or the sentinel{where})")
        self._n = n
        self._shared = -1


#: the header entries the parts of one table (:meth:`EmbeddingTable.load_parts`) must agree on
_PART_LAYOUT = ("field", "seed", "dtype", "min_count", "unadmitted", "blocks")


def _admitted(arrays: dict[str, np.ndarray], header: dict[str, Any]) -> int:
    """Admitted rows among a table file's (kept) rows."""
    return int(np.count_nonzero(arrays["count"] >= int(header["min_count"])))


def _check_arrays(arrays: dict[str, np.ndarray], blocks: Sequence[BlockSpec], dtype: np.dtype, n: int) -> None:
    """A table file's arrays are those of ``n`` rows of these blocks (ValueError if not)."""
    expected = {"keys": (np.int64, (n,)), "count": (np.int32, (n,)), "last_seen": (np.int32, (n,))}
    for b, spec in enumerate(blocks):
        expected[f"block.{b}.values"] = (dtype, (n, spec.dim))
        for name in spec.optimizer.slot_names:
            expected[f"block.{b}.slot.{name}"] = (dtype, (n, spec.dim))
        if spec.optimizer.needs_step:
            expected[f"block.{b}.steps"] = (np.int32, (n,))
    if set(arrays) != set(expected):
        raise ValueError(f"arrays {sorted(arrays)} do not match the blocks ({sorted(expected)})")
    for name, (kind, shape) in expected.items():
        a = arrays[name]
        if a.dtype != np.dtype(kind) or a.shape != shape:
            raise ValueError(f"array {name} is {a.dtype}{a.shape}, expected {np.dtype(kind)}{shape}")
