"""A table's rows as files and back: dump (:func:`to_arrays`, :func:`save`), load and merge of a
field's parts (:func:`load_parts`), and an incremental checkpoint's rows into a live table
(:func:`upsert`). The file format is ``format.py``'s (a JSON header and named arrays, no pickle);
``docs/design.md``, sections 4 and 11.

Exact: a file holds every column of its rows (keys, count, last_seen, values, each slot, Adam's
step counts) as the table holds them (no values where they are computed from the slots:
``BlockSpec.computed``), and loading writes them back into rows of a table of the same layout, so
a loaded table is the saved one bit for bit (its rows in file order); loaded into the other form,
FTRL's stored w is dropped or computed from z and n (the update's formula: the same bits in float
rows trained at a constant rate; bfloat16 rows stored w rounded, and read it unrounded once dropped). A table
without counters writes no count or last_seen (its header says ``"counters": false``); loaded into
a table with counters, its rows are admitted (count ``max(min_count, 1)``) and last seen at its
``last_update_step``; a file with counters loads into a table without by dropping them. Pending keys
(seen fewer than ``min_count`` times, no row: ``table.py``) are saved as two arrays of their keys
and counts (by key), by every save, an incremental one too (a pending key has no last-seen step);
a file of an earlier version that holds such keys as rows (count below ``min_count``) loads them as
pending keys, as the table would hold them now. This module
acts on the storage (``table.py``) through its public surface and builds a new table through the
class it is given: it never imports the table, which delegates to it.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence

import numpy as np

from . import _index as K
from .bfloat16 import convert, stored_dtype
from .format import TableFormatError, read_table_file, write_table_file
from .layout import INDEX_GROWTH, MIN_CAPACITY, SHARED_KEY, BlockSpec, as_keys, sentinel_error

#: the arrays of a table file holding its pending keys and their counts (``format.py``)
PENDING_KEYS, PENDING_COUNTS = "pending.keys", "pending.counts"

#: which rows of a table file :func:`load_parts` keeps: int64 keys -> bool mask
KeyFilter = Callable[[np.ndarray], np.ndarray]
#: the header entries the parts of one table (:func:`load_parts`) must agree on
_PART_LAYOUT = ("field", "seed", "dtype", "table_dtype", "min_count", "unadmitted", "blocks")


def row_columns(table: Any) -> dict[str, np.ndarray]:
    """The table's row arrays by the names of a table file (``format.py``), in the file's order:
    views over every row of the storage (its capacity and beyond), valid while ``table.version``
    holds. Dump, load and upsert all read or write rows through these."""
    arrays = table.arrays
    views = {"keys": arrays.keys}
    if table.counters:
        views.update({"count": arrays.meta[:, K.COUNT], "last_seen": arrays.meta[:, K.LAST]})
    for b, spec in enumerate(table.blocks):
        values, slots = spec.columns(arrays.blocks[b])
        if not spec.computed:
            views[f"block.{b}.values"] = values
        views.update({f"block.{b}.slot.{name}": s for name, s in zip(spec.optimizer.slot_names, slots)})
        if spec.optimizer.needs_step:
            views[f"block.{b}.steps"] = arrays.steps[b]
    return views


def to_arrays(table: Any, since: int | None = None) -> dict[str, np.ndarray]:
    """The live rows as the arrays :func:`save` writes (named as in ``format.py``): views, valid
    until the table next changes; with ``since``, copies of the rows looked up in training at
    step ``since`` or later (``last_seen >= since``, inserted rows included: a table with counters)."""
    if since is not None and not table.counters:
        raise ValueError(f"table of field {table.field} has no last-seen steps (made without counters): "
                         "no incremental save")
    n = len(table)
    arrays = {name: a[:n] for name, a in row_columns(table).items()}
    if since is not None:
        changed = arrays["last_seen"] >= since
        arrays = {name: a[changed] for name, a in arrays.items()}
    if table.pending_count:
        arrays[PENDING_KEYS], arrays[PENDING_COUNTS] = table.pending()
    return arrays


def save(table: Any, path: str | os.PathLike, since: int | None = None) -> None:
    """Write the table atomically in the format of ``format.py`` (no pickle); with ``since``, only
    the rows :func:`to_arrays` gives for it (an incremental checkpoint's)."""
    arrays = to_arrays(table, since)
    header = {"field": table.field, "seed": table.seed, "dtype": table.dtype.name, "table_dtype": table.table_dtype,
              "min_count": table.min_count, "unadmitted": table.unadmitted, "counters": table.counters,
              "max_load": table.max_load, "n_rows": int(arrays["keys"].shape[0]),
              "n_pending": int(arrays[PENDING_KEYS].shape[0]) if PENDING_KEYS in arrays else 0,
              "evicted_count": table.evicted_count, "admitted_total": table.admitted_total,
              "last_update_step": table.last_update_step,
              "blocks": [b.to_dict() for b in table.blocks]}
    write_table_file(path, header, arrays)


def upsert(table: Any, arrays: dict[str, np.ndarray]) -> int:
    """Rows given as :func:`to_arrays` gives them (distinct keys) into ``table``: a key it holds
    has its row replaced (counts, ``last_seen``, values, slots, step counts), a new key gets a new
    row; pending keys given (``PENDING_KEYS``, ``PENDING_COUNTS``) become or stay pending with
    their counts. Counters (``evicted_count``, ``admitted_total``) are left alone. Returns the new rows."""
    arrays, pending = split_pending(arrays)
    n = int(np.asarray(arrays["keys"]).shape[0])
    _check_arrays(arrays, table.blocks, table.stored_dtype, n, "count" in arrays)
    arrays = with_counters(arrays, table, n)
    keys = as_keys(arrays["keys"])
    if keys.shape[0] and (keys == K.EMPTY).any():
        raise sentinel_error(keys)
    n0 = len(table)
    rows = table.claim_rows(keys)
    for name, column in row_columns(table).items():
        if name != "keys":  # claim_rows wrote them
            column[rows] = arrays[name]
    table.set_pending(*pending)
    return len(table) - n0


def split_pending(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A file's arrays as ``(row arrays, (pending keys, their counts))`` (none: empty)."""
    rows = {k: a for k, a in arrays.items() if k not in (PENDING_KEYS, PENDING_COUNTS)}
    keys = np.asarray(arrays.get(PENDING_KEYS, np.zeros(0, np.int64)))
    counts = np.asarray(arrays.get(PENDING_COUNTS, np.zeros(0, np.int32)))
    if keys.dtype != np.int64 or counts.dtype != np.int32 or keys.shape != counts.shape or keys.ndim != 1:
        raise ValueError(f"pending keys {keys.dtype}{list(keys.shape)} and counts {counts.dtype}{list(counts.shape)} "
                         "are not int64 [n] and int32 [n]")
    return rows, (keys, counts)


def load_parts(new_table: Callable[..., Any], parts: Sequence[tuple[str | os.PathLike, KeyFilter | None]],
               capacity: int | None = None, table_dtype: str | None = None, counters: bool | None = None,
               computed: Sequence[bool] | None = None) -> Any:
    """One table (made by ``new_table``, the table's class) of the rows of several files written by
    :func:`save` (the parts of one field, such as its shares): of each part ``(path, keep)`` the rows
    whose keys ``keep(keys)`` (a bool mask) selects, every row where ``keep`` is None. The parts must
    agree on field, seed, dtype, ``min_count``, ``unadmitted`` and blocks, and hold distinct keys;
    the one exception is the shared row (``SHARED_KEY``, ``unadmitted="shared"``): the field's, not
    a key's, so ``keep`` never drops it and the first part holding it gives it. Counters: a part
    read whole adds its ``evicted_count`` and ``admitted_total``; a part cut by ``keep`` adds only
    its kept rows' admitted count (which of its keys it evicted or admitted before is not known: the
    lower bound a file without the counter loads with); ``last_update_step`` is the latest of the
    parts. ``capacity`` (index slots) is a lower bound, the default fits the rows kept at about
    ``max_load / 1.5`` (pending keys at ``max_load``). ``table_dtype``: how the loaded rows are
    stored (default: as the files
    say), converted where it differs (``bfloat16.convert``: widening is exact, narrowing rounds to
    nearest). ``counters``: whether the table keeps counts and last-seen steps (default: as the
    files; always with a ``min_count`` above 1). ``computed``: per block, whether its rows hold only
    the optimizer's slots, the values computed when read (``BlockSpec.computed``, where the block
    allows; default: as the files): a file's stored values are dropped (FTRL's are the function of
    z and n the table computes), or computed from the slots where the file holds none (rounded to
    nearest into bfloat16 rows). Raises :class:`TableFormatError` naming the file.
    """
    read = _Parts()
    for path, keep in parts:
        read.add(os.fspath(path), keep)
    if not read.first:
        raise ValueError("load_parts: no parts")
    header = read.first["header"]
    n = sum(int(arrays["keys"].shape[0]) for _, arrays in read.pieces)
    pending = sum(int(p[0].shape[0]) for p in read.pending)  # keys in the index without a row
    max_load = float(header["max_load"])
    needed = math.ceil((n + pending) / max_load) + 1
    # room for new keys as a growth leaves it (INDEX_GROWTH) by the rows; a pending key takes its
    # slot alone, and its admission no other
    cap = max(needed, int(capacity) if capacity is not None else math.ceil((n * INDEX_GROWTH + pending) / max_load),
              MIN_CAPACITY)
    blocks = read.first["blocks"]
    if computed is not None:
        if len(computed) != len(blocks):
            raise _inconsistent(read.first["path"], ValueError(f"{len(blocks)} blocks, {len(computed)} wanted"))
        blocks = [b.with_computed(c) for b, c in zip(blocks, computed)]
    try:
        table = new_table(field=int(header["field"]), blocks=blocks, seed=int(header["seed"]),
                          dtype=np.dtype(header["dtype"]), capacity=cap, max_load=max_load,
                          min_count=int(header["min_count"]), unadmitted=header["unadmitted"],
                          table_dtype=header["table_dtype"] if table_dtype is None else table_dtype,
                          counters=(header["counters"] if counters is None else counters) or int(header["min_count"]) > 1)
    except (KeyError, TypeError, ValueError) as e:
        raise _inconsistent(read.first["path"], e) from e
    table.evicted_count, table.admitted_total, table.last_update_step = read.evicted, read.admitted, read.last
    _fill(table, read.pieces, n)
    _computed_values(table, read.first["blocks"], n)
    for path, (pending_keys, counts) in zip((p for p, _ in read.pieces), read.pending):
        try:
            table.set_pending(pending_keys, counts)
        except ValueError as e:
            raise _inconsistent(path, e) from e
    return table


class _Parts:
    """The parts of one table read so far: each one's kept rows, and the counters they add up to."""

    def __init__(self) -> None:
        self.pieces: list[tuple[str, dict[str, np.ndarray]]] = []
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # each part's kept pending keys and counts
        self.first: dict[str, Any] = {}  # the first part's path, header, dtype and blocks
        self.evicted = self.admitted = 0
        self.last: int | None = None
        self._shared_seen = False

    def add(self, path: str, keep: KeyFilter | None) -> None:
        """Read the part at ``path`` and keep its rows ``keep`` selects (see :func:`load_parts`)."""
        header, arrays = read_table_file(path)
        try:
            arrays, pending = split_pending(arrays)
            arrays = self._kept_rows(path, header, arrays, keep)
            arrays, pending = _unadmitted_as_pending(arrays, pending, header, keep)
            if keep is None:  # read whole: its counters
                self.evicted += int(header["evicted_count"])
                total = header.get("admitted_total")  # absent in files of older versions of des
                self.admitted += _admitted(arrays, header) if total is None else int(total)
            else:
                self.admitted += _admitted(arrays, header)
            step = header.get("last_update_step")
            if step is not None:
                self.last = int(step) if self.last is None else max(self.last, int(step))
        except TableFormatError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise _inconsistent(path, e) from e
        self.pieces.append((path, arrays))
        self.pending.append(pending)

    def _kept_rows(self, path: str, header: dict[str, Any], arrays: dict[str, np.ndarray],
                   keep: KeyFilter | None) -> dict[str, np.ndarray]:
        """The part's arrays, checked against the first part's layout, cut to the rows kept."""
        header.setdefault("table_dtype", header["dtype"])  # files of older versions: rows in the dtype
        header.setdefault("counters", True)  # and every row with its count and last_seen
        if not self.first:
            self.first = {"path": path, "header": header, "stored": stored_dtype(header["table_dtype"]),
                          "blocks": [BlockSpec.from_dict(d) for d in header["blocks"]]}
        differ = [k for k in _PART_LAYOUT if header[k] != self.first["header"][k]]
        if differ:
            raise TableFormatError(f"{path}: its {', '.join(differ)} differ from those of {self.first['path']}")
        n = int(header["n_rows"])
        _check_arrays(arrays, self.first["blocks"], self.first["stored"], n, bool(header["counters"]))
        keys = arrays["keys"]
        mask = None if keep is None else np.asarray(keep(keys), dtype=np.bool_)
        if mask is not None and mask.shape != (n,):
            raise ValueError(f"keep gave a mask of shape {mask.shape} for {n} keys")
        if header["unadmitted"] == "shared" and n:
            shared = keys == SHARED_KEY
            if shared.any():  # the first part's shared row, whatever its key's share
                mask = np.ones(n, dtype=np.bool_) if mask is None else mask
                mask[shared] = not self._shared_seen
                self._shared_seen = True
        if mask is not None and not mask.all():
            arrays = {name: a[mask] for name, a in arrays.items()}
        return arrays


def _unadmitted_as_pending(arrays: dict[str, np.ndarray], pending: tuple[np.ndarray, np.ndarray],
                           header: dict[str, Any], keep: KeyFilter | None) -> tuple[dict[str, np.ndarray], tuple]:
    """A part's kept rows and pending keys as the table holds them now: its pending keys that
    ``keep`` keeps, and its rows counted below ``min_count`` (a file of an earlier version: no
    shared row among them) moved to the pending keys."""
    keys, counts = pending
    if keep is not None and keys.shape[0]:
        mask = np.asarray(keep(keys), dtype=np.bool_)
        keys, counts = keys[mask], counts[mask]
    min_count = int(header["min_count"])
    if "count" in arrays and min_count > 1:
        low = (arrays["count"] < min_count) & (arrays["keys"] != SHARED_KEY)
        if low.any():
            keys = np.concatenate([keys, arrays["keys"][low]])
            counts = np.concatenate([counts, np.maximum(arrays["count"][low], 1).astype(np.int32)])
            arrays = {name: a[~low] for name, a in arrays.items()}
    return arrays, (keys, counts)


def _fill(table: Any, pieces: list[tuple[str, dict[str, np.ndarray]]], n: int) -> None:
    """Rows ``[0, n)`` of the new ``table`` from the (checked) arrays of each part in turn, each
    part's released once copied; then indexed (a key duplicated across parts is an error naming both)."""
    table.reserve_rows(n)
    columns = row_columns(table)
    starts = [0]
    for i, (path, arrays) in enumerate(pieces):
        lo = starts[-1]
        hi = lo + int(arrays["keys"].shape[0])
        arrays = with_counters(arrays, table, hi - lo)
        for name, column in columns.items():
            a = arrays.get(name)
            if a is None:  # values the file computes from its slots: _computed_values
                continue
            column[lo:hi] = a if a.dtype == column.dtype else convert(a, table.table_dtype)
        pieces[i] = (path, {})  # the part's arrays may go
        starts.append(hi)
    bad = table.adopt_rows(n)
    if bad >= 0:
        keys = columns["keys"]
        key = int(keys[bad])
        part = int(np.searchsorted(starts, bad, side="right")) - 1
        first = int(np.flatnonzero(keys[:n] == key)[0])
        other = int(np.searchsorted(starts, first, side="right")) - 1
        where = f" (also in {pieces[other][0]})" if other != part else ""
        raise TableFormatError(f"{pieces[part][0]}: inconsistent table file (ValueError: key {key} (row "
                               f"{bad - starts[part]}) is duplicated or the sentinel{where})")


def _computed_values(table: Any, saved: Sequence[BlockSpec], n: int) -> None:
    """Rows ``[0, n)`` of ``table`` store the values of each block the file (its blocks ``saved``)
    computed from the slots: read from the slots as the file's table read them (``K.gather_rows``
    over the slot columns, with the file's block's ``value_args``)."""
    columns = row_columns(table)
    for b, (spec, was) in enumerate(zip(table.blocks, saved)):
        if spec.computed or not was.computed or not n:
            continue
        values = np.empty((n, spec.dim), dtype=table.dtype)
        slots = table.arrays.blocks[b][:, spec.value_columns:]
        K.gather_rows(slots, spec.dim, was.value_args(table.dtype), np.arange(n, dtype=np.int64), columns["keys"],
                      n, table.arrays.meta, 0, False, np.uint64(0), 0, 0.0, values)
        columns[f"block.{b}.values"][:n] = convert(values, table.table_dtype)


def _inconsistent(path: str, e: Exception) -> TableFormatError:
    """The error naming the file whose header or arrays raised ``e``."""
    return TableFormatError(f"{path}: inconsistent table file ({type(e).__name__}: {e})".replace("\n", " "))


def _admitted(arrays: dict[str, np.ndarray], header: dict[str, Any]) -> int:
    """Admitted rows among a table file's (kept) rows (every row of a file without counters)."""
    if "count" not in arrays:
        return int(arrays["keys"].shape[0])
    return int(np.count_nonzero(arrays["count"] >= int(header["min_count"])))


def with_counters(arrays: dict[str, np.ndarray], table: Any, n: int) -> dict[str, np.ndarray]:
    """A file's ``n`` rows with the count and last_seen columns ``table`` has: dropped for a table
    without counters; for a table with counters, where the file has none (its rows were all
    admitted), count ``max(min_count, 1)`` and last_seen the table's ``last_update_step`` (or 0)."""
    if not table.counters:
        return {k: a for k, a in arrays.items() if k not in ("count", "last_seen")}
    if "count" in arrays:
        return arrays
    last = table.last_update_step or 0
    return {**arrays, "count": np.full(n, max(table.min_count, 1), np.int32), "last_seen": np.full(n, last, np.int32)}


def _check_arrays(arrays: dict[str, np.ndarray], blocks: Sequence[BlockSpec], dtype: np.dtype, n: int,
                  counters: bool = True) -> None:
    """A table file's arrays are those of ``n`` rows of these blocks, with or without ``counters``
    (ValueError if not)."""
    expected = {"keys": (np.int64, (n,))}
    if counters:
        expected.update({"count": (np.int32, (n,)), "last_seen": (np.int32, (n,))})
    for b, spec in enumerate(blocks):
        if not spec.computed:
            expected[f"block.{b}.values"] = (dtype, (n, spec.dim))
        for name, width in zip(spec.optimizer.slot_names, spec.slot_widths):
            expected[f"block.{b}.slot.{name}"] = (dtype, (n, width))
        if spec.optimizer.needs_step:
            expected[f"block.{b}.steps"] = (np.int32, (n,))
    if set(arrays) != set(expected):
        raise ValueError(f"arrays {sorted(arrays)} do not match the blocks ({sorted(expected)})")
    for name, (kind, shape) in expected.items():
        a = arrays[name]
        if a.dtype != np.dtype(kind) or a.shape != shape:
            raise ValueError(f"array {name} is {a.dtype}{a.shape}, expected {np.dtype(kind)}{shape}")
