"""All the tables of one rank's fields driven together: one kernel call per step for the key->row
lookup of every field, for the gather and pooling into ``[B, F, dim]`` and for un-pooling +
duplicate sums + the sparse optimizers (every value block in each), and one per block for the
initialization of new rows.

Each field keeps its own :class:`~des.hashtable.table.EmbeddingTable` (checkpointed and re-sharded
by field, grown and evicted on its own), used through its public surface only (``arrays``,
``row_capacity``, ``fill_limit``, ``pending_count``, ``grow``, ``commit_rows``, the shared row);
:class:`ShardTables` holds the addresses
of the tables' arrays in one ``int64`` table (``_views.py``), pins those arrays, and refreshes a
field's row when its table replaced an array (``EmbeddingTable.version``) or was itself replaced (a
checkpoint load puts new tables into the shard's dict). The kernels take their arguments grouped
in named tuples (below). The kernels release the GIL and run ranges of fields on
numba's thread count of the calling thread (``_threads.py``: ``NUMBA_NUM_THREADS`` /
``numba.set_num_threads``); each field writes only its own rows and its own column of the output
(the gather's one-hot copy: its own samples), so the result does not depend on the thread count.

The lookup also numbers each field's distinct trained rows in order of first occurrence
(``Touched.distinct``, ``distinct_rows``; in a pipelined step on the background thread),
and a training lookup looks up and inserts only the distinct keys (``distinct_keys``) and
raises the counts once per distinct key by its occurrences (``K.insert_keys``' amounts: one meta
cache line per row, not per id; the same counts and the same pending keys). Both later
passes work by that number: the gather reads each distinct row from its table once (a batch has
~6 ids per distinct row on Criteo, ~12 on heavy multi-hot data: the random reads of the large
tables were most of the gather) and copies or pools the ids from those few rows; the update adds
each id's gradient straight into its row's sum (no per-id copy, no hashing after the step), two
value blocks in one pass over the ids (DeepFM's order-1 and embedding blocks; the common widths
1, 8 and 16 as compile-time constants, so the loops vectorize), and runs the optimizer on the rows. One-hot fields (one id per sample, no weight: all of
Criteo's) are written and read in ``[B, F, dim]`` tile of samples by tile (``_TILE``), so each
cache line of the batch array is used whole while it is cached, not one strided column per field;
the gather copies them in a second pass split by samples, so each thread writes whole rows of the
batch array.

A pipelined step's update and the next batch's gather run as one pass over the fields
(:meth:`ShardTables.apply_then_gather`): a field's rows are updated, then caught up and read, by
the same thread, with one thread hand-off for both.

The per-field work is the same inlined code as one table's methods (``_index.py``, ``init.py``,
``pooling.py``, ``optimizers.py``), in the same order, so the results are bit-identical to
calling ``lookup``/``gather``/``pool``/``unpool``/``apply_gradients`` field by field. One
difference by design: admission is decided at lookup (``Touched.admitted``: count >= min_count once
the whole batch is counted) and the later gather and update use that decision instead of reading
the counts again, so a lookup of the next batch in between (a pipelined step) cannot admit a key
retroactively.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numba import njit

from . import _index as K
from . import _threads
from ._prefetch import prefetch2
from .._views import view1, view2
from .distinct import distinct_keys, distinct_rows
from .bfloat16 import columns, init_stored, read_value, update_stored, value_terms
from .init import ZEROS, init_row
from .optimizers import StepArgs, catch_up_rows
from .pooling import one_hot_fields, pool_or_unpool, pool_samples, unpool_rows
from .layout import check_rate
from .table import EmbeddingTable, as_keys, check_step, sentinel_error

# columns of the address table: index, row keys, meta, then per block its values+slots and steps;
# per array its address, rows and width (1 for vectors)
_IDX, _KEYS, _META, _BLOCKS = 0, 1, 2, 3
_ADDR, _ROWS, _WIDTH = 0, 1, 2
PENDING = -1  # a field's lookup status before (and, after growth, again until) it completes
_MAX_SLOTS = 2  # optimizer slots per block at most (Adam: m, v; FTRL: z, n)
_DERIVE = 5  # BlockSpec.value_args of a block computing its values (FTRL: 1, alpha, l1, l2, beta)
_MIN_PARALLEL = 20_000  # ids of work below which one thread does it all (a hand-off costs more than it saves)
# The threads split the fields by their work in ids, a distinct row counting as this many ids (its
# cache lines in the tables). A field's time on one thread is a + b x its distinct rows, closely
# (the fit per pass is in docs/benchmarks.md); each constant is the ratio of a distinct row's cost
# to an id's in its pass. Weighted by ids alone, the thread with the large tables finishes last.
_LOOKUP_ROW_COST = 5.0  # per distinct row of the field's previous training lookup
_GATHER_ROW_COST = 3.5
_UPDATE_ROW_COST = 2.0  # per distinct row and block (the ids are summed once for all blocks)
_CATCH_UP_ROW_COST = 24.0  # a zero-gradient step per idle step, up to Adam's horizon
# One-hot fields are gathered and summed tile of samples by tile: [B, F, dim] is read and written
# a row of fields at a time while its cache lines are in L1/L2, not one strided column per field
# (a column pass over a 4096-row batch costs about what a whole row-major pass does).
_TILE = 128


# ------------------------------------------------------------------------ the kernels' arguments
# The kernels take their arrays grouped: a batch's ids (TouchedArrays), the shard's tables
# (_Tables), one value block of every field (_Block) and its initial values (_Init), the state of a
# lookup (_Lookup), the update's sums (_Sums) and an optimizer step (optimizers.StepArgs). Each group
# is built once (the tables' and blocks' when the shard is made, then updated in place; a batch's by
# its lookup) and goes in as a plain tuple, which each kernel names on entry (``_Tables(*shard)``):
# numba types a plain tuple of arrays as fast as the arrays themselves, a named tuple in Python at
# every call. A function called once per field takes that field's slices and values, not the
# groups, which would be copied into every such call.


class TouchedArrays(NamedTuple):
    """A :class:`Touched` batch as the kernels read it."""

    keys: np.ndarray
    key_offsets: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray
    weighted: np.ndarray
    hot: np.ndarray
    rows: np.ndarray
    admitted: np.ndarray
    uniq: np.ndarray  # Distinct
    count: np.ndarray
    inverse: np.ndarray


class _Tables(NamedTuple):
    """The shard's tables as the kernels see them, field j in row j: the addresses of their arrays
    (``_views.py``) and what the kernels need of each table."""

    views: np.ndarray  # int64 [F, cols, 3]: per array (_IDX, _KEYS, _META, then per block its values+slots
    # and steps) its address, first dimension and second dimension (1 for vectors): _ADDR, _ROWS, _WIDTH
    n_rows: np.ndarray  # int64 [F]: the table's rows (the lookup's kernel counts its inserts here)
    min_count: np.ndarray  # int64 [F]
    zero: np.ndarray  # bool [F]: unadmitted="zero"
    stored: np.ndarray  # [0, 0] of the tables' stored dtype (``bfloat16.py``): the type of the block views
    index: np.ndarray  # [0, 0] of the tables' index dtype (``_index.new_index``: int32 wide, uint32 compact)


class _Block(NamedTuple):
    """One value block of every field: its arrays in the address table, its width."""

    col: int  # the values' column in _Tables.views (the steps': col + 1)
    dims: np.ndarray  # int64 [F]
    slot_widths: np.ndarray  # int64 [F, _MAX_SLOTS]: columns of each optimizer slot (dim, or 1: row-wise)
    value_columns: np.ndarray  # int64 [F]: stored value columns (dim, or 0: computed, BlockSpec.value_columns)
    derive: np.ndarray  # [F, _DERIVE] of the tables' dtype: BlockSpec.value_args (row j all 0: stored values)


class _Init(NamedTuple):
    """One value block's initial values and slots of every field (``init.init_block_rows``)."""

    bases: np.ndarray  # uint64 [F]: the initial values' stream bases
    kinds: np.ndarray  # int64 [F]: Initializer codes
    scales: np.ndarray  # float64 [F]
    slot_init: np.ndarray  # float64 [F, _MAX_SLOTS * max dim]: initial value of each slot column
    n_slots: np.ndarray  # int64 [F]: slot columns (``BlockSpec.slot_column_values``)


class _Lookup(NamedTuple):
    """A lookup in progress (it resumes after a table grew)."""

    rows: np.ndarray  # int64 [nnz]: the ids' rows
    admitted: np.ndarray  # bool [nnz]
    pos: np.ndarray  # int64 [F]: where the field resumes (its ids, or its distinct keys)
    max_rows: np.ndarray  # int64 [F]: rows the field may hold before it must grow (its row capacity)
    fill: np.ndarray  # int64 [F]: the field's index slots in use (rows and pending keys)
    max_fill: np.ndarray  # int64 [F]: slots it may use before it must grow
    status: np.ndarray  # int64 [F]: PENDING, K.OK, K.NEED_GROWTH or K.BAD_KEY
    admissions: np.ndarray  # int64 [F]: rows admitted in this lookup
    outside: np.ndarray  # bool [F]: an id is neither admitted nor mapped to the shared row
    uniq: np.ndarray  # int64 [nnz]: per field its distinct keys, then rows (training: Distinct.uniq)
    count: np.ndarray  # int64 [F]: their number (Distinct.count)
    inverse: np.ndarray  # int32 [nnz]: each id's place among them (Distinct.inverse)


class _Sums(NamedTuple):
    """The update's gradients and their sums per distinct row, block by block."""

    grad_addr: np.ndarray  # int64 [blocks]: address of the block's gradients [B, F, dim]
    acc_addr: np.ndarray  # int64 [blocks]: address of its sums [base[-1], dim]
    dims: np.ndarray  # int64 [blocks]
    base: np.ndarray  # int64 [F + 1]: field j's sums are rows base[j] .. base[j + 1]


class Pieces(NamedTuple):
    """How a pass over a shard's fields is cut for the threads: field after field, each in one
    piece or in several pieces of its distinct rows (piece k of n: rows ``count·k//n`` ..
    ``count·(k+1)//n``)."""

    pieces: np.ndarray  # int64 [P, 3]: per piece its field, k and n
    parts: np.ndarray  # int64 [F]: each field's n
    work: np.ndarray  # float64 [P]: each piece's share of its field's work


def pieces(work: np.ndarray, splittable: np.ndarray) -> Pieces:
    """Fields whose work is more than half a thread's share of the pass (``splittable`` ones: not
    one-hot) cut into pieces of their rows, so one large field does not keep one thread busy while
    the others wait (on a rank holding a few fields, one of them may be most of its work). Rows
    are independent in every pass (a row's sum, update, catch-up and read touch that row only,
    and the pooling of a cut field runs by samples afterwards), so the results do not depend on
    the cut, nor on the threads."""
    return Pieces(*_cut(np.asarray(work, dtype=np.float64), np.asarray(splittable, dtype=np.bool_),
                        _threads.threads(), _MIN_PARALLEL))


@njit(cache=True, nogil=True)
def _cut(work, splittable, threads, min_parallel):
    """:func:`pieces`' arrays in one call (a step's Python runs with caches TF has left cold)."""
    n = work.shape[0]
    parts = np.ones(n, dtype=np.int64)
    total = 0.0
    for j in range(n):
        total += work[j]
    if threads > 1 and total >= min_parallel:
        share = total / (2 * threads)
        for j in range(n):
            if splittable[j] and work[j] > share:
                parts[j] = min(np.int64(np.ceil(work[j] / share)), 2 * threads)
    count = 0
    for j in range(n):
        count += parts[j]
    cut = np.empty((count, 3), dtype=np.int64)
    share_of = np.empty(count, dtype=np.float64)
    i = 0
    for j in range(n):
        for k in range(parts[j]):
            cut[i, 0], cut[i, 1], cut[i, 2] = j, k, parts[j]
            share_of[i] = work[j] / parts[j]
            i += 1
    return cut, parts, share_of


@dataclass
class _Pass:
    """One pass of the shard's kernels planned for a batch: ``run(pieces, i0, i1)`` on the threads
    (over :class:`Pieces`), then ``finish(pieces)``; ``work`` per field, and which fields may be cut."""

    run: Any
    work: np.ndarray
    splittable: np.ndarray
    finish: Any


@dataclass
class Distinct:
    """Per field of a :class:`Touched`, its distinct trained (present and admitted) rows in order
    of first occurrence (``distinct.distinct_rows``)."""

    uniq: np.ndarray  # int64 [nnz]: field j's rows are uniq[key_offsets[j]:key_offsets[j] + count[j]]
    count: np.ndarray  # int64 [F]
    inverse: np.ndarray  # int32 [nnz]: each id's place among its field's rows (-1: not trained)

    @classmethod
    def empty(cls, ids: int, fields: int) -> "Distinct":
        return cls(np.empty(ids, dtype=np.int64), np.zeros(fields, dtype=np.int64), np.empty(ids, dtype=np.int32))

    @classmethod
    def of(cls, rows: np.ndarray, admitted: np.ndarray, key_offsets: np.ndarray) -> "Distinct":
        """Each field's distinct trained rows (field j's ids are ``key_offsets[j]:key_offsets[j + 1]``)."""
        d = cls.empty(rows.shape[0], len(key_offsets) - 1)
        _threads.run(lambda j0, j1: _distinct_fields(j0, j1, rows, admitted, key_offsets, d.uniq, d.count, d.inverse),
                     np.diff(key_offsets), _MIN_PARALLEL)
        return d


@dataclass
class Touched:
    """What :meth:`ShardTables.touch` found for a batch, fields in shard order: all a later
    :meth:`ShardTables.gather_pooled` and :meth:`ShardTables.apply_pooled` need. ``hot`` and
    ``distinct`` are computed when not given (by the lookup: on the thread that runs it, so a
    pipelined step finds them ready)."""

    keys: np.ndarray  # int64 [nnz]: every field's ids, field after field
    key_offsets: np.ndarray  # int64 [F + 1]: field j's ids are keys[key_offsets[j]:key_offsets[j + 1]]
    offsets: np.ndarray  # int64 [F, B + 1]: per field, CSR row pointers into its ids
    weights: np.ndarray  # float64 [nnz]: the ids' weights where ``weighted`` (empty if no field is)
    weighted: np.ndarray  # bool [F]: the field has weights
    rows: np.ndarray  # int64 [nnz]: table rows (-1: unknown at evaluation)
    admitted: np.ndarray  # bool [nnz]: the row is trained (see the module docstring)
    train: bool
    step: int
    #: bool [F]: the field has one id per sample and no weights (its pooling is a copy)
    hot: np.ndarray | None = field(default=None, repr=False, compare=False)
    #: each field's distinct trained rows and each id's place among them: what the gather reads
    #: and the update sums by
    distinct: Distinct | None = field(default=None, repr=False, compare=False)
    #: the lookups of the parts it was composed from, where several tables' lookups make one (a shard
    #: whose fields share tables: ``des/strategies/table_groups.py``), kept for the later passes
    parts: tuple | None = field(default=None, repr=False, compare=False)
    arrays: tuple = field(init=False, repr=False, compare=False)  # TouchedArrays, as the kernels take it

    def __post_init__(self) -> None:
        if self.hot is None:
            self.hot = one_hot_fields(self.offsets, self.weighted)
        if self.distinct is None:
            self.distinct = Distinct.of(self.rows, self.admitted, self.key_offsets)
        d = self.distinct
        self.arrays = tuple(TouchedArrays(self.keys, self.key_offsets, self.offsets, self.weights, self.weighted,
                                          self.hot, self.rows, self.admitted, d.uniq, d.count, d.inverse))

    @property
    def size(self) -> int:
        """Samples in the batch."""
        return int(self.offsets.shape[1] - 1)


class ShardTables:
    """The tables of ``fields`` (looked up in the live mapping ``tables`` at every call), with
    value blocks ``blocks`` (the same names and dims in every table), driven by fused kernels:
    :meth:`touch` (a batch's key -> row lookup), :meth:`gather_pooled` and :meth:`gather_ids`
    (values), :meth:`apply_pooled` (the sparse optimizers) and :meth:`apply_then_gather`. Block
    arguments are positions in ``blocks``.

    Not thread-safe: one call at a time per shard (see ``FieldShard`` for the pipelining contract).
    """

    def __init__(self, tables: Mapping[int, EmbeddingTable], fields: Sequence[int], blocks: Sequence[str]) -> None:
        self.tables = tables
        self.fields = [int(f) for f in fields]
        self.blocks = list(blocks)
        n, cols = len(self.fields), _BLOCKS + 2 * len(self.blocks)
        first = tables.get(self.fields[0]) if self.fields else None
        stored = np.empty((0, 0), dtype=first.stored_dtype if first is not None else np.float32)
        index = np.empty((0, 0), dtype=first.arrays.index.dtype if first is not None else np.int32)
        self._tables = _Tables(np.zeros((n, cols, 3), dtype=np.int64), np.zeros(n, dtype=np.int64),
                               np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_), stored, index)
        dtype = first.dtype if first is not None else np.dtype(np.float32)
        self._blocks = [_Block(_BLOCKS + 2 * b, np.zeros(n, dtype=np.int64), np.zeros((n, _MAX_SLOTS), dtype=np.int64),
                               np.zeros(n, dtype=np.int64), np.zeros((n, _DERIVE), dtype=dtype))
                        for b in range(len(self.blocks))]
        self._inits = [_Init(np.zeros(n, dtype=np.uint64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.float64),
                             np.zeros((n, _MAX_SLOTS), dtype=np.float64), np.zeros(n, dtype=np.int64))
                       for _ in self.blocks]
        # the same arrays, as the kernels take them
        self._tables_arg = tuple(self._tables)
        self._block_args = [(tuple(b), tuple(i)) for b, i in zip(self._blocks, self._inits)]
        self._seen: list[tuple[EmbeddingTable, int] | None] = [None] * n  # (table, version) held
        self._pinned: list[Any] = [None] * n  # each table's arrays, kept alive behind the addresses
        self._last_distinct = np.zeros(n, dtype=np.float64)  # per field, of the last training lookup
        self._groups: dict[int, list[tuple[Any, list[int], np.ndarray]]] = {}  # see _optimizer_groups

    # ---------------------------------------------------------------- addresses

    def _sync(self) -> list[EmbeddingTable]:
        """The current tables, with the address table and the row counts up to date."""
        tables = [self.tables[f] for f in self.fields]
        rows = []
        for j, t in enumerate(tables):
            seen = self._seen[j]
            if seen is None or seen[0] is not t or seen[1] != t.version:
                self._refresh(j, t)
            rows.append(len(t))
        self._tables.n_rows[:] = rows
        return tables

    def _optimizer_groups(self, block: int) -> list[tuple[Any, list[int], np.ndarray]]:
        """Block ``block``'s fields grouped by their optimizer (one kernel call each):
        ``(optimizer, field positions, bool mask of them)``, kept until a table is refreshed."""
        groups = self._groups.get(block)
        if groups is None:
            by_optimizer: dict[Any, list[int]] = {}
            for j, f in enumerate(self.fields):
                by_optimizer.setdefault(self.tables[f].blocks[block].optimizer, []).append(j)
            groups = []
            for optimizer, members in by_optimizer.items():
                member = np.zeros(len(self.fields), dtype=np.bool_)
                member[members] = True
                groups.append((optimizer, members, member))
            self._groups[block] = groups
        return groups

    def _refresh(self, j: int, t: EmbeddingTable) -> None:
        self._groups.clear()  # a table's optimizers may have changed (a checkpoint load replaces tables)
        names = [b.name for b in t.blocks]
        if names != self.blocks:
            raise ValueError(f"table of field {t.field} has blocks {names}, the shard expects {self.blocks}")
        if t.stored_dtype != self._tables.stored.dtype or (self._blocks and t.dtype != self._blocks[0].derive.dtype):
            raise ValueError(f"table of field {t.field} is {t.dtype.name} stored as {t.table_dtype}, the shard's tables "
                             f"{self._blocks[0].derive.dtype if self._blocks else '-'} stored as "
                             f"{self._tables.stored.dtype}")
        held = t.arrays
        if held.index.dtype != self._tables.index.dtype:
            raise ValueError(f"table of field {t.field} has {'' if t.counters else 'no '}counters, the shard's tables "
                             f"{'do not' if t.counters else 'do'}")
        arrays = [held.index, held.keys, held.meta]
        for values, steps in zip(held.blocks, held.steps):
            arrays += [values, steps]
        tables = self._tables
        for c, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise ValueError(f"table of field {t.field}: array {c} is not C-contiguous")
            tables.views[j, c] = a.ctypes.data, a.shape[0], a.shape[1] if a.ndim == 2 else 1
        self._pinned[j] = held  # keeps the memory behind the addresses alive
        for b, (spec, base) in enumerate(zip(t.blocks, t.stream_bases)):
            slots = spec.slot_column_values()
            if slots.shape[0] > self._inits[b].slot_init.shape[1]:
                self._widen_slot_init(b, slots.shape[0])
            block, init = self._blocks[b], self._inits[b]
            block.dims[j], init.bases[j], init.n_slots[j] = spec.dim, base, slots.shape[0]
            block.slot_widths[j, :] = 0
            block.slot_widths[j, :len(spec.slot_widths)] = spec.slot_widths
            args = spec.value_args(t.dtype)
            block.value_columns[j], block.derive[j, :] = spec.value_columns, 0
            block.derive[j, :args.shape[0]] = args
            init.kinds[j], init.scales[j] = spec.init.code, spec.init.scale
            init.slot_init[j, :slots.shape[0]] = slots
        tables.zero[j], tables.min_count[j] = t.unadmitted == "zero", t.min_count
        self._seen[j] = (t, t.version)

    def _widen_slot_init(self, b: int, columns: int) -> None:
        """Block ``b``'s initial slot columns made room for ``columns`` per field (the kernels' tuples too)."""
        init = self._inits[b]
        wider = np.zeros((init.slot_init.shape[0], columns), dtype=np.float64)
        wider[:, :init.slot_init.shape[1]] = init.slot_init
        self._inits[b] = init._replace(slot_init=wider)
        self._block_args[b] = (tuple(self._blocks[b]), tuple(self._inits[b]))

    # ---------------------------------------------------------------- lookup

    def touch(self, ids: Any, *, train: bool, step: int) -> Touched:
        """Rows of every field's ids: ``ids`` is keyed-jagged (``des.data.batch.KeyedIds``: ``keys``
        of every field, field after field, ``key_offsets [F + 1]``, CSR ``offsets [F, B + 1]``,
        ``weights`` and ``weighted [F]``; ``one_hot``), its fields this shard's, in order.
        ``train``: missing keys are inserted (initialized here, one kernel call per block), counts
        and ``last_seen`` updated, admissions counted, as :meth:`EmbeddingTable.lookup` does; else
        read-only. Never reads embedding values. The arrays are taken as they are (not copied)."""
        key_offsets, offsets = ids.key_offsets, ids.offsets
        if len(key_offsets) - 1 != len(self.fields) or offsets.shape[0] != len(self.fields):
            raise ValueError(f"{len(key_offsets) - 1} fields of ids for a shard of {len(self.fields)} fields")
        keys = as_keys(ids.keys)
        if not getattr(ids, "one_hot", False):
            bad = _bad_offsets(offsets, key_offsets)
            if bad >= 0:  # the kernels index with them unchecked
                raise ValueError(f"field at position {bad}: offsets are not CSR row pointers into its "
                                 f"{int(key_offsets[bad + 1] - key_offsets[bad])} ids")
        weighted = np.asarray(ids.weighted, dtype=np.bool_)
        weights = np.asarray(ids.weights, dtype=np.float64) if weighted.any() else np.ones(0, np.float64)
        step = check_step(step) if train else int(step)
        # per field, the shared out-of-vocabulary row or -1 (EmbeddingTable.shared_row: a training
        # lookup inserts a missing one and refreshes its count and last_seen, every field's in one
        # kernel call in _lookup)
        shared = np.array([self.tables[f].shared_row_made() if train else self.tables[f].shared_row(None)
                           for f in self.fields], dtype=np.int64)
        work, tables = self._lookup(keys, key_offsets, shared, step, train)
        rows, admitted = work.rows, work.admitted
        for j in np.flatnonzero(work.outside & (shared < 0)):
            if tables[j].unadmitted == "shared":  # evaluation before the shared row exists: made now
                tables[j].map_to_shared(rows[key_offsets[j]:key_offsets[j + 1]],
                                        admitted[key_offsets[j]:key_offsets[j + 1]])
        distinct = Distinct(work.uniq, work.count, work.inverse) if train else None
        return Touched(keys, key_offsets, offsets, weights, weighted, rows, admitted, bool(train), step,
                       hot=np.ones(len(tables), dtype=np.bool_) if getattr(ids, "one_hot", False) else None,
                       distinct=distinct)

    def _lookup(self, keys: np.ndarray, key_offsets: np.ndarray, shared: np.ndarray, step: int,
                train: bool) -> tuple[_Lookup, list[EmbeddingTable]]:
        """:meth:`touch`'s kernel over the fields, again for the fields that had to grow, until
        every field is done; the inserted rows committed to their tables and initialized. Returns
        the lookup and the tables."""
        tables = self._sync()
        if train:
            _use_shared_rows(self._tables_arg, shared, step)
        n = len(tables)
        n0 = self._tables.n_rows.copy()
        work = _Lookup(np.empty(keys.shape[0], dtype=np.int64), np.empty(keys.shape[0], dtype=np.bool_),
                       np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                       np.zeros(n, dtype=np.int64), np.full(n, PENDING, dtype=np.int64),
                       np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_), np.empty(keys.shape[0], dtype=np.int64),
                       np.zeros(n, dtype=np.int64), np.empty(keys.shape[0], dtype=np.int32))
        work_arg = tuple(work)
        while True:
            work.max_rows[:] = [t.row_capacity for t in tables]
            work.fill[:] = [len(t) + t.pending_count for t in tables]
            work.max_fill[:] = [t.fill_limit for t in tables]
            weight = np.where(work.status == PENDING,
                              np.diff(key_offsets) - work.pos + _LOOKUP_ROW_COST * self._last_distinct, 0)
            _threads.run(lambda j0, j1: _lookup_fields(j0, j1, self._tables_arg, keys, key_offsets, work_arg, shared,
                                                       step, train), weight, _MIN_PARALLEL)
            for j, t in enumerate(tables):
                if self._tables.n_rows[j] != len(t) or work.fill[j] != len(t) + t.pending_count:
                    t.commit_rows(self._tables.n_rows[j], work.fill[j] - self._tables.n_rows[j])
            bad = np.flatnonzero(work.status == K.BAD_KEY)
            if bad.size:
                j = int(bad[0])
                self._init_new_rows(n0)
                raise sentinel_error(keys[key_offsets[j]:key_offsets[j + 1]])
            grow = np.flatnonzero(work.status == K.NEED_GROWTH)
            if not grow.size:
                break
            for j in grow:
                tables[j].grow()
                work.status[j] = PENDING
            tables = self._sync()
        if train:
            self._init_new_rows(n0)
            for j in np.flatnonzero(work.admissions):
                tables[j].admitted_total += int(work.admissions[j])
            self._last_distinct = work.count.astype(np.float64)
        return work, tables

    def _init_new_rows(self, n0: np.ndarray) -> None:
        """Values and slots of the rows inserted since ``n0`` (per field), one call per block."""
        if not (self._tables.n_rows > n0).any():
            return
        self._sync()  # a field may have grown
        for block, init in self._block_args:
            # a new row costs ~10x a looked-up id (the normal draws)
            _threads.run(lambda j0, j1: _init_fields(j0, j1, self._tables_arg, block, init, n0),
                         10 * (self._tables.n_rows - n0), _MIN_PARALLEL)

    # ---------------------------------------------------------------- gather + pool

    def gather_pooled(self, touched: Touched, outs: Mapping[int, np.ndarray], catch_up_to: int | None = None,
                      lr_scale: float = 1.0) -> None:
        """Per block (``{block: out}``), its values of the touched ids pooled per sample into
        ``out[B, F, dim]`` (C-contiguous, the tables' dtype): rows not admitted give their key's
        initial value or zeros (``unadmitted``), as :meth:`EmbeddingTable.gather` + ``pooling.pool``.
        One split of the fields over the threads for all the blocks (a large field in pieces of its
        rows, :func:`pieces`). With ``catch_up_to``, each field's rows are first caught up to that
        step (:meth:`_catch_up_calls`, with ``lr_scale``) in the same pass, right before they are read."""
        gather = self._gather_plan(self._sync(), touched, outs, catch_up_to, lr_scale)
        cut = pieces(gather.work, gather.splittable)
        _threads.run(lambda i0, i1: gather.run(cut, i0, i1), cut.work, _MIN_PARALLEL)
        gather.finish(cut)

    def _gather_plan(self, tables: list[EmbeddingTable], touched: Touched, outs: Mapping[int, np.ndarray],
                     catch_up_to: int | None, lr_scale: float) -> "_Pass":
        """:meth:`gather_pooled` as a :class:`_Pass`: the pass over pieces of fields to run on the
        threads, then what follows it (by samples: the one-hot fields' copy and the pooling of the
        fields read in pieces; the row checks)."""
        bad = np.full(len(tables), -1, dtype=np.int64)
        ids = touched.arrays
        catch_calls, work = ([], np.zeros(len(tables))) if catch_up_to is None else self._catch_up_calls(
            tables, touched, catch_up_to, lr_scale)
        calls = []
        for block, out in outs.items():
            if out.shape[:2] != (touched.size, len(tables)) or not out.flags.c_contiguous:
                raise ValueError(f"gather_pooled: out must be C-contiguous [{touched.size}, {len(tables)}, dim]")
            if (self._blocks[block].dims != out.shape[2]).any() or any(t.dtype != out.dtype for t in tables):
                raise ValueError(f"gather_pooled: out {out.dtype}{out.shape} does not fit block {self.blocks[block]!r}")
            slot = np.empty(touched.keys.shape[0], dtype=np.int32)
            values = np.empty((touched.keys.shape[0], out.shape[2]), dtype=out.dtype)  # field j's from key_offsets[j]
            calls.append((self._block_args[block], out, slot, values))
        shard = self._tables_arg

        def run(cut: Pieces, i0: int, i1: int) -> None:
            for block, member, args in catch_calls:
                _catch_up_pieces(i0, i1, cut.pieces, shard, block, ids, member, args)
            for (block, init), out, slot, values in calls:
                _gather_pieces(i0, i1, cut.pieces, shard, block, init, ids, out, bad, slot, values)

        def by_samples(later: np.ndarray) -> Any:
            def kernel(b0: int, b1: int) -> None:
                for _, out, slot, values in calls:
                    _samples_of_pieces(b0, b1, touched.key_offsets, touched.hot, later, bad, slot, values, ids, out)
            return kernel

        def finish(cut: Pieces) -> None:
            # the rows by pieces, then the one-hot fields' samples and the pooling of the fields read
            # in pieces by samples: a thread writes whole rows of out (cache lines of out are not
            # shared between threads, and are written whole)
            later = (cut.parts > 1) & ~touched.hot
            if touched.hot.any() or later.any():
                per_sample = np.full(touched.size, int(touched.hot.sum()), dtype=np.int64)
                for j in np.flatnonzero(later):
                    per_sample += np.diff(touched.offsets[j])
                _threads.run(by_samples(later), len(calls) * per_sample, _MIN_PARALLEL)
            self._check_rows(tables, touched, bad)

        work += len(calls) * (np.diff(touched.key_offsets) + _GATHER_ROW_COST * touched.distinct.count)
        return _Pass(run, work, ~touched.hot, finish)

    def gather_ids(self, touched: Touched, block: int, out: np.ndarray) -> None:
        """Block ``block``'s values of every touched id, not pooled: ``out[nnz, dim]`` in the order of
        ``touched.keys`` (C-contiguous, the tables' dtype), each as :meth:`gather_pooled` reads it."""
        tables = self._sync()
        if out.shape[0] != touched.keys.shape[0] or not out.flags.c_contiguous:
            raise ValueError(f"gather_ids: out must be C-contiguous [{touched.keys.shape[0]}, dim]")
        if (self._blocks[block].dims != out.shape[1]).any() or any(t.dtype != out.dtype for t in tables):
            raise ValueError(f"gather_ids: out {out.dtype}{out.shape} does not fit block {self.blocks[block]!r}")
        bad = np.full(len(tables), -1, dtype=np.int64)
        _threads.run(lambda j0, j1: _gather_ids_fields(j0, j1, self._tables_arg, *self._block_args[block],
                                                       touched.arrays, out, bad), np.diff(touched.key_offsets),
                     _MIN_PARALLEL)
        self._check_rows(tables, touched, bad)

    # ---------------------------------------------------------------- catch-up before the forward

    def _catch_up_calls(self, tables: list[EmbeddingTable], touched: Touched, steps_done: int,
                        lr_scale: float) -> tuple[list[tuple], np.ndarray]:
        """Before a training step reads its rows (:meth:`gather_pooled` with ``catch_up_to``): the
        touched rows of every block whose optimizer defers work (Adam with ``catchup``) take the
        zero-gradient steps they skipped, up to global step ``steps_done``, so the forward sees what
        dense Adam would hold and the results do not depend on when validations and checkpoints
        (which catch every row up) happen. The :func:`_catch_up_pieces` calls (one per block and
        optimizer that defers work: ``(block, member fields, StepArgs)``) and their work per field."""
        calls, work = [], np.zeros(len(tables), dtype=np.float64)
        for block in range(len(self.blocks)):
            for optimizer, members, member in self._optimizer_groups(block):
                args = optimizer.catch_up_args(tables[0].dtype, int(steps_done), lr_scale)
                if args is None:
                    continue
                work[members] += _CATCH_UP_ROW_COST * touched.distinct.count[members]
                calls.append((self._block_args[block][0], member, tuple(args)))
        return calls, work

    # ---------------------------------------------------------------- un-pool + optimizer

    def apply_pooled(self, touched: Touched, grads: Mapping[int, np.ndarray], step: int, lr_scale: float = 1.0) -> None:
        """Per block (``{block: grads}``), its optimizer on the admitted touched rows, from pooled
        gradients ``grads[B, F, dim]`` (the tables' dtype): un-pooled to the ids, summed per row in
        occurrence order, as ``pooling.unpool`` + :meth:`EmbeddingTable.apply_gradients`. One split
        of the fields over the threads for all the blocks (a large field in pieces of its rows,
        :func:`pieces`), and one pass over the ids that sums every block's gradients
        (:func:`_sum_pieces`)."""
        update = self._apply_plan(self._sync(), touched, grads, step, lr_scale)
        cut = pieces(update.work, update.splittable)
        _threads.run(lambda i0, i1: update.run(cut, i0, i1), cut.work, _MIN_PARALLEL)
        update.finish(cut)

    def apply_then_gather(self, touched: Touched, grads: Mapping[int, np.ndarray], step: int, lr_scale: float,
                          following: Touched, outs: Mapping[int, np.ndarray], catch_up_to: int | None = None,
                          catch_up_scale: float = 1.0) -> None:
        """:meth:`apply_pooled` of one step, then :meth:`gather_pooled` of the following step's
        batch (``following``: looked up before this update), in ONE pass over the fields: a field's
        rows are updated, then caught up and read, on the same thread, while the other thread does
        the same for its fields. The same bytes as the two calls (a field's update and gather touch
        its own table only), with one thread hand-off and one split of the work fewer; the rows a
        field has just updated are read again while they are in cache. Where a large field is cut
        into pieces of rows (:func:`pieces`), a row the update of one piece writes may be one another
        piece reads: then the update's pass ends before the gather's starts."""
        tables = self._sync()
        update = self._apply_plan(tables, touched, grads, step, lr_scale)
        gather = self._gather_plan(tables, following, outs, catch_up_to, catch_up_scale)
        cut = pieces(update.work + gather.work, update.splittable & gather.splittable)
        if (cut.parts > 1).any():
            _threads.run(lambda i0, i1: update.run(cut, i0, i1), cut.work, _MIN_PARALLEL)
            _threads.run(lambda i0, i1: gather.run(cut, i0, i1), cut.work, _MIN_PARALLEL)
        else:
            _threads.run(lambda i0, i1: (update.run(cut, i0, i1), gather.run(cut, i0, i1)), cut.work, _MIN_PARALLEL)
        update.finish(cut)
        gather.finish(cut)

    def _apply_plan(self, tables: list[EmbeddingTable], touched: Touched, grads: Mapping[int, np.ndarray], step: int,
                    lr_scale: float) -> "_Pass":
        """:meth:`apply_pooled` as a :class:`_Pass` (see :meth:`_gather_plan`)."""
        dtype = tables[0].dtype if tables else np.dtype(np.float64)
        for t in tables if lr_scale != 1.0 else ():
            check_rate([t.blocks[block] for block in grads], lr_scale)
        bad = np.full(len(tables), -1, dtype=np.int64)
        ids, count = touched.arrays, touched.distinct.count
        base = np.zeros(len(tables) + 1, dtype=np.int64)  # field j's sums: rows base[j] .. base[j] + count[j]
        np.cumsum(count, out=base[1:])
        calls, work = [], np.zeros(len(tables), dtype=np.float64)
        arrays = []  # every block's gradients and sums, kept alive while the kernels use their addresses
        for block, g in grads.items():
            if g.shape[:2] != (touched.size, len(tables)):
                raise ValueError(f"apply_pooled: grads {g.shape}, expected [{touched.size}, {len(tables)}, dim]")
            if (self._blocks[block].dims != g.shape[2]).any():
                raise ValueError(f"apply_pooled: grads {g.shape} do not fit block {self.blocks[block]!r}")
            g = np.ascontiguousarray(g, dtype=dtype)
            acc = np.empty((int(base[-1]), g.shape[2]), dtype=dtype)
            if not arrays:
                work += np.diff(touched.key_offsets)
            arrays.append((g, acc))
            for optimizer, members, member in self._optimizer_groups(block):  # one kernel call per optimizer
                work[members] += _UPDATE_ROW_COST * count[members]
                calls.append((self._block_args[block], member, acc, tuple(optimizer.kernel_args(dtype, lr_scale,
                                                                                                 int(step) + 1))))
        sums = tuple(_Sums(np.array([g.ctypes.data for g, _ in arrays], dtype=np.int64),
                           np.array([a.ctypes.data for _, a in arrays], dtype=np.int64),
                           np.array([g.shape[2] for g, _ in arrays], dtype=np.int64), base))
        shard = self._tables_arg

        def run(cut: Pieces, i0: int, i1: int) -> None:
            if not arrays:
                return
            _sum_pieces(i0, i1, cut.pieces, sums, ids, arrays[0][0])
            for (block, init), member, acc, args in calls:
                _update_pieces(i0, i1, cut.pieces, shard, block, init, ids, member, base, acc, args, int(step) + 1, bad)

        def finish(cut: Pieces) -> None:
            arrays.clear()  # the kernels are done with the addresses
            self._check_rows(tables, touched, bad)
            for t in tables:
                t.last_update_step = int(step)

        # the threads split the work by ids (summed) and distinct rows (updated): large tables have
        # thousands of distinct rows per batch, small ones a few
        return _Pass(run, work, ~touched.hot, finish)

    def _check_rows(self, tables: list[EmbeddingTable], touched: Touched, bad: np.ndarray) -> None:
        for j in np.flatnonzero(bad >= 0):
            i = touched.key_offsets[j] + bad[j]
            raise ValueError(f"row {touched.rows[i]} at position {bad[j]} of field {tables[j].field} is not a row "
                             f"of its table ({len(tables[j])} rows): a table changed (evict, load) since the lookup")


# -------------------------------------------------------------------- kernels


@njit(cache=True, nogil=True)
def _bad_offsets(offsets, key_offsets) -> int:
    """First field whose offsets do not run from 0 to its id count without decreasing, or -1."""
    for j in range(offsets.shape[0]):
        if offsets[j, 0] != 0 or offsets[j, offsets.shape[1] - 1] != key_offsets[j + 1] - key_offsets[j]:
            return j
        for b in range(offsets.shape[1] - 1):
            if offsets[j, b + 1] < offsets[j, b]:
                return j
    return -1


# Each kernel runs the fields [j0, j1); ``_threads.run`` gives each thread one such range.


@njit(nogil=True, inline="always")
def _values(shard, j, col, like):
    """Field j's block at column ``col`` of the address table: values and slots ``[rows, width]``."""
    v = shard.views
    return view2(v[j, col, _ADDR], v[j, col, _ROWS], v[j, col, _WIDTH], like)


@njit(nogil=True, inline="always")
def _steps(shard, j, col):
    """Field j's step counts of the block at column ``col`` (empty: none)."""
    return view1(shard.views[j, col + 1, _ADDR], shard.views[j, col + 1, _ROWS], np.int32)


@njit(nogil=True, inline="always")
def _row_keys(shard, j):
    """Field j's row keys."""
    return view1(shard.views[j, _KEYS, _ADDR], shard.views[j, _KEYS, _ROWS], np.int64)


@njit(cache=True, nogil=True)
def _use_shared_rows(shard, shared, step):
    """Each field's shared out-of-vocabulary row (``shared[j]`` >= 0) in use at ``step``: admitted
    and ``last_seen = step`` (``K.use_shared_row``, as ``EmbeddingTable.shared_row(step)``)."""
    shard = _Tables(*shard)
    v = shard.views
    for j in range(shared.shape[0]):
        if shared[j] >= 0:
            meta = view2(v[j, _META, _ADDR], v[j, _META, _ROWS], v[j, _META, _WIDTH], np.int32)
            K.use_shared_row(meta, shared[j], shard.min_count[j], step, True)


@njit(cache=True, nogil=True)
def _lookup_fields(j0, j1, shard, keys, key_offsets, work, shared, step, insert):
    shard, work = _Tables(*shard), _Lookup(*work)
    for j in range(j0, j1):
        if work.status[j] == PENDING:
            _lookup_field(shard, j, keys, key_offsets, work, shared, step, insert)


@njit(nogil=True)
def _lookup_field(shard, j, keys, key_offsets, work, shared, step, insert):
    """Field j: insert or find its keys from ``pos[j]`` on (``insert_keys``/``find_keys``), then,
    once complete, the admission of every occurrence. Inserting, the field's distinct keys are
    numbered first (``distinct_keys``, a batch-local hash set: a key is one row, so these are the
    distinct rows of :class:`Distinct`, in the same order) and only they are looked up and
    inserted (a Criteo batch has ~6 ids per distinct key: the index probes were half the lookup),
    in first-occurrence order as inserting every id would; the counts are raised once per
    distinct key by its occurrences (``insert_keys``' amounts: a key whose count stays below
    ``min_count`` stays pending, row -1); admission is then read once per distinct key and the
    admitted ones numbered again from those numbers (``admit_distinct``).
    Across a growth (``pos[j]`` > 0) ``uniq`` holds the distinct keys, ``count[j]`` their number
    and ``rows`` the rows found so far. Finding, every occurrence is admitted (``admit``). The
    inserted rows are counted in ``shard.n_rows[j]``."""
    pos, status, count, uniq, inverse = work.pos, work.status, work.count, work.uniq, work.inverse
    rows, admitted, n_rows, min_count = work.rows, work.admitted, shard.n_rows, shard.min_count
    lo, hi = key_offsets[j], key_offsets[j + 1]
    v = shard.views
    idx = view2(v[j, _IDX, _ADDR], v[j, _IDX, _ROWS], v[j, _IDX, _WIDTH], shard.index)  # wide or compact
    meta = view2(v[j, _META, _ADDR], v[j, _META, _ROWS], v[j, _META, _WIDTH], np.int32)  # no columns: no counters
    field_keys, field_rows = keys[lo:hi], rows[lo:hi]
    if insert:
        if pos[j] == 0:  # no partial update of a field with a bad key
            bad = K.first_sentinel(field_keys)
            if bad >= 0:
                pos[j], status[j] = bad, K.BAD_KEY
                return
            count[j] = distinct_keys(field_keys, uniq[lo:hi], inverse[lo:hi])
        u = count[j]
        p, n, f, st, a = K.insert_keys(idx, uniq[lo:lo + u], field_rows, pos[j], n_rows[j], work.fill[j],
                                       work.max_rows[j], work.max_fill[j], _row_keys(shard, j), meta, step,
                                       min_count[j], True, K.occurrences(inverse[lo:hi], u))
        pos[j], n_rows[j], work.fill[j] = p, n, f
        work.admissions[j] += a
        if st != K.OK:
            status[j] = st
            return
        uniq[lo:lo + u] = field_rows[:u]  # the distinct keys' rows, then every id's
        for i in range(lo, hi):
            rows[i] = uniq[lo + inverse[i]]
        status[j] = K.OK
        count[j], work.outside[j] = K.admit_distinct(field_rows, admitted[lo:hi], uniq[lo:hi], inverse[lo:hi], u,
                                                     meta, min_count[j], shared[j])
        return
    bad = K.find_keys(idx, _row_keys(shard, j), field_keys, field_rows)
    if bad >= 0:
        pos[j], status[j] = bad, K.BAD_KEY
        return
    status[j] = K.OK
    work.outside[j] = K.admit(field_rows, admitted[lo:hi], meta, min_count[j], shared[j])


@njit(cache=True, nogil=True)
def _init_fields(j0, j1, shard, block, init, n0):
    """Per field, ``init_block_rows`` of its new rows ``[n0, n_rows)`` in block ``block`` (``init_stored``)."""
    shard, block, init = _Tables(*shard), _Block(*block), _Init(*init)
    for j in range(j0, j1):
        start, stop = n0[j], shard.n_rows[j]
        if stop > start:
            init_stored(_values(shard, j, block.col, shard.stored), block.value_columns[j], _steps(shard, j, block.col),
                            _row_keys(shard, j), start, stop, init.bases[j], init.kinds[j], init.scales[j],
                            init.slot_init[j, :init.n_slots[j]])


@njit(cache=True, nogil=True)
def _distinct_fields(j0, j1, rows, admitted, key_offsets, uniq, count, inverse):
    for j in range(j0, j1):
        lo, hi = key_offsets[j], key_offsets[j + 1]
        count[j] = distinct_rows(rows[lo:hi], admitted[lo:hi], True, uniq[lo:hi], inverse[lo:hi])


@njit(nogil=True, inline="always")
def _piece(pieces, i, count):
    """Piece ``i`` of :class:`Pieces` for a batch with ``count`` distinct rows per field: its field,
    its distinct rows ``[p0, p1)`` and whether it is the field's only piece and its last."""
    j, k, n = pieces[i, 0], pieces[i, 1], pieces[i, 2]
    c = count[j]
    return j, c * k // n, c * (k + 1) // n, n == 1, k == n - 1


@njit(cache=True, nogil=True)
def _gather_pieces(i0, i1, pieces, shard, block, init, ids, out, bad, slot, values):
    """Pieces [i0, i1), by distinct rows: each field's distinct trained rows are read from its table
    once, into ``values[key_offsets[j]:]``, a piece its range of them; the field's last piece gives
    each id that is not among them a row of its own there (as ``K.gather_rows`` reads it) and says in
    ``slot`` which row each id reads; a field in one piece that is not one-hot is then pooled from
    them into ``out[:, j]``. The one-hot fields and the fields read in several pieces are copied or
    pooled by samples (:func:`_samples_of_pieces`). The same floats as gathering every id: a table
    row's values, or an id's initial value or zeros."""
    shard, block, init, ids = _Tables(*shard), _Block(*block), _Init(*init), TouchedArrays(*ids)
    dim, inverse = out.shape[2], ids.inverse
    for i in range(i0, i1):
        j, p0, p1, whole, last = _piece(pieces, i, ids.count)
        lo, hi = ids.key_offsets[j], ids.key_offsets[j + 1]
        data = _values(shard, j, block.col, shard.stored)
        rows, admitted, u = ids.rows[lo:hi], ids.admitted[lo:hi], ids.count[j]
        derive = block.derive[j]
        found = _read_distinct(data, dim, derive, rows, admitted, ids.uniq[lo + p0:lo + p1], shard.n_rows[j],
                               values[lo + p0:])
        if found < 0 and last:
            m = u
            for t in range(lo, hi):
                if inverse[t] >= 0:
                    slot[t] = inverse[t]
                else:
                    slot[t] = m
                    m += 1
            found = _read_others(data, dim, derive, ids.keys[lo:hi], rows, admitted, u, shard.n_rows[j], shard.zero[j],
                                 init.bases[j], init.kinds[j], init.scales[j], slot[lo:hi], values[lo:hi])
        if found >= 0:
            bad[j] = found  # every piece of the field finds the same first bad position
        if whole and not ids.hot[j] and found < 0:
            dst = out[:, j, :]
            for b in range(dst.shape[0]):
                for c in range(dim):
                    dst[b, c] = 0
            pool_or_unpool(values[lo:hi], slot[lo:hi], ids.offsets[j], ids.weights[lo:hi], ids.weighted[j], out, j,
                           False)


@njit(cache=True, nogil=True)
def _samples_of_pieces(b0, b1, key_offsets, hot, later, bad, slot, values, ids, out):
    """Samples [b0, b1) of every one-hot field (one id per sample: sample b's is id
    ``key_offsets[j] + b``) copied from the rows :func:`_gather_pieces` read, tile of samples by tile
    (``_TILE``): each cache line of ``out`` is written whole while it is cached; then the fields read
    in several pieces (``later``) pooled over those samples as a field in one piece is."""
    ids = TouchedArrays(*ids)
    dim = out.shape[2]
    for t0 in range(b0, b1, _TILE):
        t1 = min(t0 + _TILE, b1)
        for j in range(out.shape[1]):
            if hot[j] and bad[j] < 0:
                lo = key_offsets[j]
                for b in range(t0, t1):
                    s = lo + slot[lo + b]
                    for c in range(dim):
                        out[b, j, c] = values[s, c]
    for j in range(out.shape[1]):
        if later[j] and bad[j] < 0:
            lo, hi = key_offsets[j], key_offsets[j + 1]
            for b in range(b0, b1):
                for c in range(dim):
                    out[b, j, c] = 0
            pool_samples(values[lo:hi], slot[lo:hi], ids.offsets[j], ids.weights[lo:hi], ids.weighted[j], out, j, b0,
                         b1)


@njit(nogil=True)
def _read_distinct(data, dim, derive, rows, admitted, uniq, n_rows, values):
    """Distinct trained rows ``uniq`` of one field (its ``rows``, ``admitted``; its table ``data`` of
    ``n_rows`` rows) into ``values[:len(uniq)]`` (``read_value``: stored, or computed by ``derive``).
    Returns the position of the field's first id whose row is not the table's, or -1."""
    u = uniq.shape[0]
    terms = value_terms(derive)
    for p in range(u):
        if p + K.PF < u:
            rp = uniq[p + K.PF]
            if rp >= 0 and rp < n_rows:
                prefetch2(data, rp, 0)
        r = uniq[p]
        if r < 0 or r >= n_rows:
            return K.first_bad_row(rows, admitted, False, n_rows)
        for c in range(dim):
            values[p, c] = read_value(data, r, c, dim, terms)
    return -1


@njit(nogil=True)
def _read_others(data, dim, derive, keys, rows, admitted, u, n_rows, zero, base, kind, scale, slot, values):
    """Each id of one field that is not among its ``u`` distinct trained rows into its own row
    ``values[slot[i]]`` (``read_value`` where present and admitted or not read as zero, else its
    initial value or zeros). Returns the position of the first id whose row is not the table's, or -1."""
    terms, unread = value_terms(derive), ZEROS if zero else kind
    for i in range(rows.shape[0]):
        s = slot[i]
        if s >= u:
            r = rows[i]
            if r >= n_rows or r < -1:
                return K.first_bad_row(rows, admitted, False, n_rows)
            if r >= 0 and (admitted[i] or not zero):
                for c in range(dim):
                    values[s, c] = read_value(data, r, c, dim, terms)
            else:
                init_row(values, s, dim, keys[i], base, unread, scale)
    return -1


@njit(cache=True, nogil=True)
def _gather_ids_fields(j0, j1, shard, block, init, ids, out, bad):
    """Fields [j0, j1): each id into its own row of ``out`` (no pooling, :func:`_read_ids`); at a row
    that is not the table's, ``bad[j]`` (its position in the field) and the field is left."""
    shard, block, init, ids = _Tables(*shard), _Block(*block), _Init(*init), TouchedArrays(*ids)
    for j in range(j0, j1):
        lo, hi = ids.key_offsets[j], ids.key_offsets[j + 1]
        bad[j] = _read_ids(_values(shard, j, block.col, shard.stored), block.derive[j], ids.keys[lo:hi],
                           ids.rows[lo:hi], ids.admitted[lo:hi], shard.n_rows[j], shard.zero[j], init.bases[j],
                           init.kinds[j], init.scales[j], out[lo:hi])


@njit(nogil=True)
def _read_ids(data, derive, keys, rows, admitted, n_rows, zero, base, kind, scale, out):
    """Each id of one field into its own row of ``out`` (``read_value`` where present and admitted or
    not read as zero, else its initial value or zeros); the position of the first id whose row is
    not the table's, or -1."""
    dim, n = out.shape[1], rows.shape[0]
    terms, unread = value_terms(derive), ZEROS if zero else kind
    for i in range(n):
        if i + K.PF < n:
            rp = rows[i + K.PF]
            if rp >= 0 and rp < n_rows:
                prefetch2(data, rp, 0)
        r = rows[i]
        if r >= n_rows or r < -1:
            return i
        if r >= 0 and (admitted[i] or not zero):
            for c in range(dim):
                out[i, c] = read_value(data, r, c, dim, terms)
        else:
            init_row(out, i, dim, keys[i], base, unread, scale)
    return -1


@njit(cache=True, nogil=True)
def _catch_up_pieces(i0, i1, pieces, shard, block, ids, member, args):
    """The pieces [i0, i1) of ``member`` fields: ``catch_up_rows`` of their distinct rows (Adam's w,
    m, v side by side in the block, ``optimizers.StepArgs`` ``args``). A field with a row that is
    not its table's is left to the gather, which reports it."""
    shard, block, ids, args = _Tables(*shard), _Block(*block), TouchedArrays(*ids), StepArgs(*args)
    for i in range(i0, i1):
        j, p0, p1, _, _ = _piece(pieces, i, ids.count)
        if not member[j]:
            continue
        rows = ids.uniq[ids.key_offsets[j] + p0:ids.key_offsets[j] + p1]
        if rows.shape[0] and (rows.min() < 0 or rows.max() >= shard.n_rows[j]):
            continue
        w, s0, s1 = columns(_values(shard, j, block.col, args.hp), block.value_columns[j], block.slot_widths[j, 0],
                            block.slot_widths[j, 1])
        catch_up_rows(w, s0, s1, _steps(shard, j, block.col), rows, args)


@njit(nogil=True, inline="always")
def _store_or_add(acc, q, src, b, col, width, first):
    """``acc[q] = src[b, col:col + width]`` (``first``) or ``+=``: inlined with a constant
    ``width``, the compiler unrolls it into vector code."""
    if first:
        for c in range(width):
            acc[q, c] = src[b, col + c]
    else:
        for c in range(width):
            acc[q, c] += src[b, col + c]


@njit(nogil=True, inline="always")
def _add_id(acc, q, grads, b, j, dim, first):
    """:func:`_store_or_add` of field j's gradient of sample b, the common widths as constants."""
    if dim == 8:
        _store_or_add(acc, q, grads, b, j * 8, 8, first)
    elif dim == 1:
        _store_or_add(acc, q, grads, b, j, 1, first)
    elif dim == 16:
        _store_or_add(acc, q, grads, b, j * 16, 16, first)
    else:
        _store_or_add(acc, q, grads, b, j * dim, dim, first)


@njit(nogil=True, inline="always")
def _sum_one_hot(inverse, lo, q0, f, b0, b1, j, acc0, grads0, dim0, acc1, grads1, dim1, two):
    """Samples [b0, b1) of one-hot field j into the sums of one block, or of two (``two``) in the
    same pass; returns the rows numbered so far (``filled``)."""
    for b in range(b0, b1):
        p = inverse[lo + b]
        if p < 0:
            continue
        first = p == f
        if first:
            f += 1
        _add_id(acc0, q0 + p, grads0, b, j, dim0, first)
        if two:
            _add_id(acc1, q0 + p, grads1, b, j, dim1, first)
    return f


@njit(cache=True, nogil=True)
def _sum_pieces(i0, i1, pieces, sums, ids, like):
    """Pieces [i0, i1), every block ``k`` of :class:`_Sums` (gradients ``[size, n_fields, dims[k]]`` at
    ``grad_addr[k]``, sums ``[base[-1], dims[k]]`` at ``acc_addr[k]``): per distinct trained row
    p of the piece's rows of field j the sum of its ids' gradients into row ``base[j] + p`` of the
    block's sums, in occurrence order, the first stored (as ``add_to_distinct``). A one-hot field in
    one piece has ``grads[:, j]`` itself, read tile of samples by tile, two blocks in the same pass
    over the ids (DeepFM's and W&D's order-1 and embedding blocks: one pass instead of two); the
    other fields in one piece are un-pooled into the sums (``pool_or_unpool``), and a field in
    several pieces un-pools its range of rows from every id (``unpool_rows``: the same sums).
    Reads no table."""
    sums, ids = _Sums(*sums), TouchedArrays(*ids)
    grad_addr, acc_addr, dims, base = sums.grad_addr, sums.acc_addr, sums.dims, sums.base
    key_offsets, offsets, weights, weighted, hot, inverse = (ids.key_offsets, ids.offsets, ids.weights, ids.weighted,
                                                             ids.hot, ids.inverse)
    size, n_fields = offsets.shape[1] - 1, offsets.shape[0]
    nb = dims.shape[0]
    total = base[base.shape[0] - 1]
    filled = np.zeros(i1 - i0, dtype=np.int64)
    for k0 in range(0, nb, 2):  # blocks two by two
        two = k0 + 1 < nb
        k1 = k0 + 1 if two else k0
        grads0 = view2(grad_addr[k0], size, n_fields * dims[k0], like)
        grads1 = view2(grad_addr[k1], size, n_fields * dims[k1], like)
        acc0 = view2(acc_addr[k0], total, dims[k0], like)
        acc1 = view2(acc_addr[k1], total, dims[k1], like)
        filled[:] = 0
        for b0 in range(0, size, _TILE):
            b1 = min(b0 + _TILE, size)
            for i in range(i0, i1):
                j, _, _, whole, _ = _piece(pieces, i, ids.count)
                if hot[j] and whole:
                    filled[i - i0] = _sum_one_hot(inverse, key_offsets[j], base[j], filled[i - i0], b0, b1, j,
                                                  acc0, grads0, dims[k0], acc1, grads1, dims[k1], two)
        for i in range(i0, i1):
            j, p0, p1, whole, _ = _piece(pieces, i, ids.count)
            if hot[j] and whole:
                continue
            lo, hi = key_offsets[j], key_offsets[j + 1]
            for k in range(k0, k1 + 1):
                grads_k = grads0 if k == k0 else grads1
                acc_k = acc0 if k == k0 else acc1
                dim = dims[k]
                if whole:
                    pool_or_unpool(acc_k[base[j]:base[j + 1]], inverse[lo:hi], offsets[j], weights[lo:hi],
                                   weighted[j], grads_k.reshape((size, n_fields, dim)), j, True)
                else:
                    unpool_rows(acc_k[base[j]:base[j + 1]], inverse[lo:hi], offsets[j], weights[lo:hi], weighted[j],
                                grads_k.reshape((size, n_fields, dim)), j, p0, p1)


@njit(cache=True, nogil=True)
def _update_pieces(i0, i1, pieces, shard, block, init, ids, member, base, acc, args, step, bad):
    """The pieces [i0, i1) of ``member`` fields: the optimizer of ``optimizers.StepArgs`` ``args`` on
    the piece's distinct trained rows of field j with their gradient sums ``acc[base[j] + p]``
    (:func:`_sum_pieces`, ``update_stored``: 16-bit rows rounded by (stream base, key, ``step``,
    column): a row's update reads that row only, whichever piece takes it). A field with a row that
    is not its table's (``bad``) is left as it is."""
    shard, block, init, ids, args = _Tables(*shard), _Block(*block), _Init(*init), TouchedArrays(*ids), StepArgs(*args)
    key_offsets, uniq, n_rows = ids.key_offsets, ids.uniq, shard.n_rows
    for i in range(i0, i1):
        j, p0, p1, _, _ = _piece(pieces, i, ids.count)
        if not member[j]:
            continue
        lo = key_offsets[j]
        found = -1
        for p in range(p0, p1):  # rows checked once each; the first bad position is found only then
            r = uniq[lo + p]
            if r < 0 or r >= n_rows[j]:
                found = K.first_bad_row(ids.rows[lo:key_offsets[j + 1]], ids.admitted[lo:key_offsets[j + 1]], True,
                                        n_rows[j])
                break
        if found >= 0:
            bad[j] = found  # a field's pieces all find the same position: its first bad id
            continue
        update_stored(_values(shard, j, block.col, shard.stored), block.value_columns[j], block.slot_widths[j, 0],
                      block.slot_widths[j, 1], _steps(shard, j, block.col), uniq[lo + p0:lo + p1],
                      acc[base[j] + p0:base[j] + p1], args, _row_keys(shard, j), init.bases[j], step)
