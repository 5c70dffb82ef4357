"""numba kernels of the open-addressing index and of the row store.

Index: one int32 array ``idx[cap, 3]`` of 12-byte slots ``(key low 32 bits, key high 32 bits,
row)``, so a probe touches one cache line (two parallel int64/int32 arrays would touch two, and
16-byte int64 pairs would cost a third more memory). The *compact* index (``idx[cap, 1]``, a
table without per-row counters) holds only the row, 4 bytes a slot, and compares a probed slot's
key in ``row_keys``: a third of the index's memory for one more cache line per probe, the line
that a table with counters reads in ``meta`` instead (and prefetched the same way). The row is
stored plus one, so a free slot
is one whose row field (the last column) is 0 and zero-filled memory is an empty index: a new index is only
committed, never written before the rehash fills it. A wide slot whose row field is negative holds a
*pending* key: seen fewer than ``min_count`` times, it has no row yet, and the field holds its count,
negated (``-count``, at most ``min_count - 1``), so a pending key costs its slot alone; it gets a row
when its count reaches ``min_count`` (:func:`insert_keys`). A probe returns such a key's "row" as
``-count - 1`` (<= -2), which no caller reads as a row (:func:`find_keys` gives -1, as for an
absent key); a compact index has no pending keys (its table admits every key).
Linear probing; the home slot is Lemire's "fastrange" of
the high 32 bits of ``splitmix64(key)``, so the capacity need not be a power of two (the index can
grow by 1.5x) and the home slot is monotone in the hash (a rehash writes the new index almost
sequentially). Deletion is by backward shift: no tombstones, probe sequences stay as short as if
the deleted keys had never been inserted.

Rows: dense arrays indexed by row number ``0 <= r < n_rows``: ``row_keys`` (int64), ``meta[r] =
(count, last_seen)`` (int32 pair, one cache line per hit; ``[rows, 0]`` in a table without
counters, which the kernels then never touch: every row is admitted) and per block values+slots. A row is
*admitted* iff ``count >= min_count`` (count only grows and saturates, so this is the same as a
flag set when the count reaches min_count). Rows are appended on insert and compacted (last rows
moved into the holes) on eviction.

Kernels never raise (that would need the GIL); they return a status or a bad position that the
Python wrapper turns into an exception or a growth step. Batched loops prefetch the cache line of
item ``i + PF`` while working on item ``i``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ._memory import row_array
from ..splitmix import splitmix64
from .distinct import add_to_distinct, distinct_keys, distinct_rows
from ._prefetch import prefetch1, prefetch2
from .bfloat16 import read_value, value_terms
from .init import ZEROS, init_row

EMPTY = np.int64(-(2**63))  # the reserved sentinel key: marks free index slots
INT32_MAX = 2**31 - 1
COUNT, LAST = 0, 1  # columns of meta
PF = 16  # prefetch distance (items); ~16 outstanding misses cover DRAM latency on current x86
_S32 = np.uint64(32)
_LO32 = np.int64(0xFFFFFFFF)

_NO_META = np.zeros((0, 0), np.int32)  # the meta of a read-only probe (its prefetch reads no count)
ONE_EACH = np.zeros(0, np.int64)  # insert_keys' amounts: one occurrence per key
# statuses returned by lookup_insert
OK, BAD_KEY, NEED_GROWTH = 0, 1, 2


WIDE, COMPACT = 3, 1  # columns of an index slot: int32 (key low, key high, row + 1), or uint32 (row + 1)


def new_index(capacity: int, width: int = WIDE) -> np.ndarray:
    """An empty index of ``capacity`` slots of ``width`` columns: zeros (committed in bulk, see
    ``_memory.py``). A compact index is uint32, so that numba compiles the batched kernels once per
    layout (:func:`probe`), the slot's columns constants in each."""
    return row_array(capacity, (width,), np.uint32 if width == COMPACT else np.int32, reserve=False)


@njit(cache=True, nogil=True, inline="always")
def home_slot(key: np.int64, cap: int) -> int:
    """Lemire fastrange: ``(hi32(mix(key)) * cap) >> 32`` in [0, cap) for cap <= 2**32."""
    h = splitmix64(np.uint64(key)) >> _S32
    return np.int64((h * np.uint64(cap)) >> _S32)


@njit(cache=True, nogil=True, inline="always")
def is_free(idx, s: int) -> bool:
    return idx[s, idx.shape[1] - 1] == 0


@njit(cache=True, nogil=True, inline="always")
def slot_key(idx, row_keys, s: int) -> np.int64:
    """The key of an occupied slot (a compact index's is its row's)."""
    if idx.shape[1] == COMPACT:
        return row_keys[idx[s, 0] - 1]
    return (np.int64(idx[s, 1]) << 32) | (np.int64(idx[s, 0]) & _LO32)


@njit(cache=True, nogil=True, inline="always")
def set_slot(idx, s: int, key: np.int64, row) -> None:
    last = idx.shape[1] - 1
    if last:
        idx[s, 0] = np.int32(key)  # truncating casts: the low and high halves
        idx[s, 1] = np.int32(key >> 32)
    idx[s, last] = row + 1  # 0 marks a free slot


@njit(cache=True, nogil=True, inline="always")
def slot_row(idx, s: int):
    """The row of an occupied slot (a pending key's: its count, as :func:`pending_row` encodes it)."""
    return idx[s, idx.shape[1] - 1] - 1


@njit(cache=True, nogil=True, inline="always")
def pending_row(count):
    """The "row" a probe returns for a pending key of ``count`` (>= 1) occurrences: ``-count - 1``
    (its slot's row field ``-count``); :func:`pending_count` reads it back."""
    return -count - 1


@njit(cache=True, nogil=True, inline="always")
def pending_count(r):
    """The count held by a probe's result ``r``: a pending key's (``r <= -2``), else 0."""
    return -r - 1 if r < -1 else 0


# The batched kernels probe through :func:`probe` and :func:`ahead`, which numba resolves by the
# index's dtype when it compiles them: one loop body, compiled once per layout with the slot's
# columns as constants, and no per-key test of the layout.


@njit(cache=True, nogil=True, inline="always")
def probe_wide(idx, row_keys, key: np.int64):
    """``(slot, row)``: the slot holding ``key`` and its row, or the free slot where it would go
    and -1, in a wide index (``row_keys`` unread). ``key`` must not be EMPTY."""
    cap = idx.shape[0]
    lo = np.int32(key)
    hi = np.int32(key >> 32)
    s = home_slot(key, cap)
    while True:
        r = idx[s, 2]
        if r == 0:
            return s, -1
        if idx[s, 0] == lo and idx[s, 1] == hi:
            return s, r - 1
        s += 1
        if s == cap:
            s = 0


@njit(cache=True, nogil=True, inline="always")
def probe_compact(idx, row_keys, key: np.int64):
    """:func:`probe_wide` in a compact index: a slot's key is ``row_keys[row]``."""
    cap = idx.shape[0]
    s = home_slot(key, cap)
    while True:
        r = idx[s, 0]
        if r == 0:
            return s, -1
        if row_keys[r - 1] == key:
            return s, r - 1
        s += 1
        if s == cap:
            s = 0


@njit(cache=True, nogil=True, inline="always")
def ahead_wide(idx, row_keys, key):
    """The second stage of a batched probe's prefetch, once ``key``'s home index line has arrived
    (``key`` not EMPTY, a table with counters: :func:`ahead_wanted`): the row whose meta line to
    prefetch (row 0 where the key is absent: a prefetch is a hint), and -1 (:func:`prefetch_ahead`).
    The kernel's own loop body branches and prefetches: numba counts references to the arrays given
    to an inlined helper that branches around a loop or uses an array after one, atomic operations
    on every key (``bfloat16.read_value``), the cost of the lookup itself on a 16-core Xeon."""
    return max(probe_wide(idx, row_keys, key)[1], 0), -1


@njit(cache=True, nogil=True, inline="always")
def ahead_compact(idx, row_keys, key):
    """:func:`ahead_wide` in a compact index: the rows whose keys its compares read first, of the
    key's home slot and the next (linear probing finds most keys within two slots; an empty
    slot's: row 0)."""
    cap = idx.shape[0]
    s = home_slot(key, cap)
    following = s + 1 - cap * (s + 1 == cap)
    return max(np.int64(idx[s, 0]) - 1, 0), max(np.int64(idx[following, 0]) - 1, 0)


def probe(idx, row_keys, key):  # pragma: no cover - numba resolves it (below)
    """``(slot, row)`` of ``key`` in an index of either layout: :func:`probe_wide` or :func:`probe_compact`."""
    raise NotImplementedError("probe is for numba kernels")


def ahead(idx, row_keys, key):  # pragma: no cover - numba resolves it (below)
    """The second prefetch stage of either layout: :func:`ahead_wide` or :func:`ahead_compact`."""
    raise NotImplementedError("ahead is for numba kernels")


def prefetch_ahead(idx, meta, row_keys, first, second):  # pragma: no cover - numba resolves it (below)
    """Prefetch what :func:`ahead` found: a wide index's meta line of row ``first``, a compact
    one's row keys ``first`` and ``second``."""
    raise NotImplementedError("prefetch_ahead is for numba kernels")


def ahead_wanted(idx, counted):  # pragma: no cover - numba resolves it (below)
    """Whether :func:`ahead` has work in an index of this layout: a compact one's row keys always,
    a wide one's meta line where the table counts (``counted``)."""
    raise NotImplementedError("ahead_wanted is for numba kernels")


def _compact(idx) -> bool:
    return isinstance(idx, types.Array) and idx.dtype == types.uint32


@overload(probe, inline="always")
def _probe(idx, row_keys, key):
    if _compact(idx):
        return lambda idx, row_keys, key: probe_compact(idx, row_keys, key)
    return lambda idx, row_keys, key: probe_wide(idx, row_keys, key)


@overload(ahead, inline="always")
def _ahead(idx, row_keys, key):
    if _compact(idx):
        return lambda idx, row_keys, key: ahead_compact(idx, row_keys, key)
    return lambda idx, row_keys, key: ahead_wide(idx, row_keys, key)


def _prefetch_row_keys(idx, meta, row_keys, first, second):
    prefetch1(row_keys, first)
    prefetch1(row_keys, second)


@overload(prefetch_ahead, inline="always")
def _prefetch_ahead(idx, meta, row_keys, first, second):
    if _compact(idx):
        return _prefetch_row_keys
    return lambda idx, meta, row_keys, first, second: prefetch2(meta, first, 0)


@overload(ahead_wanted, inline="always")
def _ahead_wanted(idx, counted):
    if _compact(idx):
        return lambda idx, counted: True
    return lambda idx, counted: counted


@njit(cache=True, nogil=True, inline="always")
def find_slot(idx, row_keys, key: np.int64) -> int:
    """Slot holding ``key``, or the free slot where it would go, in an index of either layout.
    ``row_keys`` are read only by a compact index (``row_keys[r]`` must be row r's key)."""
    return probe(idx, row_keys, key)[0]


@njit(nogil=True)
def insert_keys(idx, keys, out, start, n_rows, fill, row_cap, max_fill, row_keys, meta, step, min_count,
                count, amounts):
    """Rows of ``keys[start:]`` into ``out``, inserting missing keys as rows ``n_rows, ...``.

    Each key counts ``amounts[i]`` occurrences (one each when ``amounts`` is empty, ``ONE_EACH``): its ``count``
    rises by them (saturating) and ``last_seen = step``. With counters and ``min_count > 1`` a key
    whose count stays below ``min_count`` gets no row: it stays *pending* in its index slot (``out``
    -1) and gets its row, count and all, when the count reaches ``min_count``, so only admitted keys
    have rows. ``count=False`` (bulk writes) counts nothing and gives every key a row, a pending key
    its pending count (``last_seen`` and the rest of the row are the caller's). ``fill``: the
    index's occupied slots (rows and pending keys), ``max_fill`` its bound, ``row_cap`` the rows'.
    Returns ``(position, n_rows, fill, status, admitted)``, ``admitted`` = keys whose count reached
    ``min_count`` in this call (new rows, for ``min_count`` 0 or a table without counters); on
    NEED_GROWTH the caller grows and calls again from ``position`` (everything before it is done).
    Two-stage prefetch: the index line of key ``i + PF``, and of key ``i + PF/2`` (its index line has
    arrived by then) what :func:`ahead` says the probe reads next. A table without counters (``meta``
    of no columns) counts nothing.
    """
    n = keys.shape[0]
    cap = idx.shape[0]
    half = PF // 2
    admitted = 0
    counted = meta.shape[1] != 0
    count = count and counted
    pend = count and min_count > 1
    each = amounts.shape[0] == 0
    for i in range(start, n):
        if i + PF < n:
            prefetch2(idx, home_slot(keys[i + PF], cap), 0)
        if i + half < n and keys[i + half] != EMPTY and ahead_wanted(idx, count):
            first, second = ahead(idx, row_keys, keys[i + half])
            prefetch_ahead(idx, meta, row_keys, first, second)
        key = keys[i]
        if key == EMPTY:
            return i, n_rows, fill, BAD_KEY, admitted
        a = np.int64(1) if each else np.int64(amounts[i])
        s, r = probe(idx, row_keys, key)
        if r < 0:
            c0 = pending_count(r)
            if r == -1 and fill >= max_fill:
                return i, n_rows, fill, NEED_GROWTH, admitted
            if pend and c0 + a < min_count:  # pending: its count in its slot, no row
                fill += r == -1
                set_slot(idx, s, key, pending_row(c0 + a))
                out[i] = -1
                continue
            if n_rows >= row_cap:
                return i, n_rows, fill, NEED_GROWTH, admitted
            fill += r == -1
            r = n_rows
            n_rows += 1
            row_keys[r] = key
            set_slot(idx, s, key, r)
            if counted:
                meta[r, COUNT] = c0
            if min_count == 0 or not counted:
                admitted += 1
        out[i] = r
        if not count:
            continue
        c = np.int64(meta[r, COUNT])
        new = min(c + a, INT32_MAX)  # saturate instead of wrapping
        meta[r, COUNT] = new
        if c < min_count <= new:
            admitted += 1
        meta[r, LAST] = step
    return n, n_rows, fill, OK, admitted


@njit(nogil=True)
def occurrences(inverse, u):
    """How often each of ``u`` distinct keys occurs, from each position's number ``inverse`` (as
    :func:`distinct_keys` numbers them): :func:`insert_keys`' ``amounts`` for a batch's distinct keys."""
    out = np.zeros(u, np.int64)
    for i in range(inverse.shape[0]):
        out[inverse[i]] += 1
    return out


@njit(cache=True, nogil=True)
def set_pending(idx, row_keys, keys, counts, start, fill, max_fill):
    """Keys ``keys[start:]`` pending with ``counts`` (each in [1, min_count), checked by the caller):
    a pending key's count replaced, a missing key added. Returns ``(position, fill, status)``:
    NEED_GROWTH when the index is full (grow, call again from ``position``), BAD_KEY at a key that
    has a row or is the sentinel."""
    for i in range(start, keys.shape[0]):
        key = keys[i]
        if key == EMPTY:
            return i, fill, BAD_KEY
        s, r = probe(idx, row_keys, key)
        if r >= 0:
            return i, fill, BAD_KEY
        if r == -1:
            if fill >= max_fill:
                return i, fill, NEED_GROWTH
            fill += 1
        set_slot(idx, s, key, pending_row(np.int64(counts[i])))
    return keys.shape[0], fill, OK


@njit(cache=True, nogil=True)
def pending_entries(idx):
    """``(keys, counts)`` of the pending keys of a wide index, in slot order."""
    n = 0
    for s in range(idx.shape[0]):
        n += idx[s, 2] < 0
    keys = np.empty(n, np.int64)
    counts = np.empty(n, np.int32)
    n = 0
    for s in range(idx.shape[0]):
        if idx[s, 2] < 0:
            keys[n] = (np.int64(idx[s, 1]) << 32) | (np.int64(idx[s, 0]) & _LO32)
            counts[n] = -idx[s, 2]
            n += 1
    return keys, counts


@njit(cache=True, nogil=True)
def use_shared_row(meta, row, min_count, step, seen) -> None:
    """Row ``row`` of the shared out-of-vocabulary key is in use: admitted (its count at least
    ``min_count`` and 1) and, if ``seen``, ``last_seen = step`` (eviction keeps it); without
    counters every row is admitted already."""
    if meta.shape[1] == 0:
        return
    meta[row, COUNT] = max(min_count, meta[row, COUNT], 1)
    if seen:
        meta[row, LAST] = step


@njit(cache=True, nogil=True)
def lookup_insert(idx, keys, out, start, n_rows, fill, row_cap, max_fill, row_keys, meta, step, min_count, count,
                  amounts):
    """:func:`insert_keys` on one table."""
    return insert_keys(idx, keys, out, start, n_rows, fill, row_cap, max_fill, row_keys, meta, step, min_count,
                       count, amounts)


@njit(cache=True, nogil=True)
def batch_distinct(keys, ukeys, inverse):
    """``(u, amounts)``: a batch's distinct keys in first-occurrence order into ``ukeys[:u]``, each
    position's place among them (``inverse``) and how often each occurs: one table's training
    lookup inserts and counts them so (as the fused lookup does, the same rows in the same order)."""
    u = distinct_keys(keys, ukeys, inverse)
    return u, occurrences(inverse, u)


@njit(nogil=True)
def find_keys(idx, row_keys, keys, out):
    """Rows of ``keys`` (-1 when absent or pending); read-only. Returns the first sentinel position or -1."""
    n = keys.shape[0]
    cap = idx.shape[0]
    half = PF // 2
    for i in range(n):
        if i + PF < n:
            prefetch2(idx, home_slot(keys[i + PF], cap), 0)
        if i + half < n and keys[i + half] != EMPTY and ahead_wanted(idx, False):
            first, second = ahead(idx, row_keys, keys[i + half])
            prefetch_ahead(idx, _NO_META, row_keys, first, second)
        key = keys[i]
        if key == EMPTY:
            return i
        out[i] = max(probe(idx, row_keys, key)[1], -1)
    return -1


@njit(cache=True, nogil=True)
def lookup_only(idx, row_keys, keys, out):
    """:func:`find_keys` on one table."""
    return find_keys(idx, row_keys, keys, out)


@njit(nogil=True)
def first_sentinel(keys) -> int:
    """Position of the first ``EMPTY`` key, or -1 (checked before inserting: no partial update)."""
    for i in range(keys.shape[0]):
        if keys[i] == EMPTY:
            return i
    return -1


@njit(nogil=True)
def admit(rows, adm, meta, min_count, shared) -> bool:
    """``adm[i]``: row ``rows[i]`` is present and admitted (count >= ``min_count``, read once the
    whole batch is counted). With a shared row (``shared >= 0``), the other keys are mapped to it
    (and count as admitted). Returns whether some key is neither admitted nor mapped."""
    outside = False
    for i in range(rows.shape[0]):
        r = rows[i]
        a = r >= 0 and (min_count <= 1 or meta[r, COUNT] >= min_count)
        if not a and shared >= 0:
            rows[i] = shared
            a = True
        adm[i] = a
        outside |= not a
    return outside


@njit(nogil=True)
def admit_distinct(rows, adm, uniq, inverse, u, meta, min_count, shared):
    """:func:`admit` and then :func:`distinct_rows` of the admitted positions, for a training
    lookup's ``rows`` (all present) already numbered by :func:`distinct_keys` (``uniq[:u]``,
    ``inverse``): admission is read once per distinct row, and the admitted rows are numbered
    again from those numbers, in first-occurrence order, without a hash set. Keys mapped to the
    shared row (``shared >= 0``) take its number, as the key of the shared row itself would.
    Returns ``(distinct admitted rows, some key neither admitted nor mapped)``: the same
    ``rows``, ``adm``, ``uniq``, ``inverse`` as the two passes."""
    admitted = np.empty(u + 1, np.bool_)
    place = np.full(u + 1, -1, np.int64)  # distinct row p -> its number among the admitted ones
    mapped = u  # the shared row's distinct number: u (a number of its own) unless a key of the batch is it
    admitted[u] = True
    all_admitted = True
    for p in range(u):
        if p + PF < u and min_count > 1 and uniq[p + PF] >= 0:
            prefetch2(meta, uniq[p + PF], 0)
        r = uniq[p]
        admitted[p] = r >= 0 and (min_count <= 1 or meta[r, COUNT] >= min_count)
        all_admitted &= admitted[p]
        if r == shared:
            mapped = p
    if all_admitted:  # every position admitted, the numbers as they are
        adm[:] = True
        return u, False
    kept = 0
    outside = False
    for i in range(rows.shape[0]):
        p = inverse[i]
        if not admitted[p]:
            if shared < 0:
                adm[i] = False
                inverse[i] = -1
                outside = True
                continue
            rows[i] = shared
            p = mapped
        adm[i] = True
        q = place[p]
        if q < 0:
            q = place[p] = kept
            uniq[q] = rows[i]  # q <= the positions' distinct numbers seen so far: uniq is not read again
            kept += 1
        inverse[i] = q
    return kept, outside


@njit(cache=True, nogil=True)
def admit_rows(rows, adm, meta, min_count, shared) -> bool:
    """:func:`admit` on one table."""
    return admit(rows, adm, meta, min_count, shared)


@njit(cache=True, nogil=True)
def rebuild_index(row_keys, n_rows, idx):
    """Insert rows ``0..n_rows-1`` into an empty index. Returns the first bad row (duplicate key
    or the sentinel) or -1."""
    for r in range(n_rows):
        key = row_keys[r]
        if key == EMPTY:
            return r
        s = find_slot(idx, row_keys, key)
        if not is_free(idx, s):
            return r
        set_slot(idx, s, key, r)
    return -1


@njit(cache=True, nogil=True)
def rehash(old, idx, row_keys):
    """Move every entry of the old index into the (empty) new one, of the same width."""
    for s in range(old.shape[0]):
        if not is_free(old, s):
            key = slot_key(old, row_keys, s)
            set_slot(idx, find_slot(idx, row_keys, key), key, slot_row(old, s))


@njit(cache=True, nogil=True, inline="always")
def _delete_slot(idx, row_keys, s):
    """Backward-shift deletion of slot ``s`` (linear probing, no tombstones)."""
    cap = idx.shape[0]
    width = idx.shape[1]
    j = s
    while True:
        j += 1
        if j == cap:
            j = 0
        if is_free(idx, j):
            break
        home = home_slot(slot_key(idx, row_keys, j), cap)
        # the entry at j may move back to s iff s lies on its probe path home..j (cyclically)
        dist_home = j - home if j >= home else j - home + cap
        dist_s = j - s if j >= s else j - s + cap
        if dist_home >= dist_s:
            for c in range(width):
                idx[s, c] = idx[j, c]
            s = j
    for c in range(width):
        idx[s, c] = 0


@njit(cache=True, nogil=True)
def evict_plan(idx, row_keys, n_rows, dead):
    """Delete the keys of the rows marked ``dead`` (a bool per row, chosen by the caller: expired,
    over a budget) from the index and plan the compaction.

    Returns ``(src, dst, n_live)``: live rows ``src[i] >= n_live`` move into holes
    ``dst[i] < n_live``; their index entries already point to the new rows. The caller moves the
    row payloads. (A compact index compares keys in ``row_keys`` meanwhile: a slot pointing to a
    hole reads the hole's dead key, which is no live key, so every live key is still found.)
    """
    n_dead = 0
    for r in range(n_rows):
        if dead[r]:
            n_dead += 1
            _delete_slot(idx, row_keys, find_slot(idx, row_keys, row_keys[r]))
    n_live = n_rows - n_dead
    # holes below n_live and live rows at or above n_live come in equal numbers
    n_moves = 0
    for r in range(n_live):
        if dead[r]:
            n_moves += 1
    src = np.empty(n_moves, dtype=np.int64)
    dst = np.empty(n_moves, dtype=np.int64)
    hole = 0
    i = 0
    for r in range(n_live, n_rows):
        if not dead[r]:
            while not dead[hole]:
                hole += 1
            src[i] = r
            dst[i] = hole
            idx[find_slot(idx, row_keys, row_keys[r]), idx.shape[1] - 1] = hole + 1
            hole += 1
            i += 1
    return src, dst, n_live


@njit(cache=True, nogil=True)
def gather_rows(data, dim, derive, rows, keys, n_rows, meta, min_count, zero_unadmitted, base, kind,
                scale, out):
    """``out[i]`` = row ``rows[i]``'s ``dim`` values (``bfloat16.read_value``: stored, or computed from
    its slots by ``derive``); absent rows (-1), and unadmitted rows when ``zero_unadmitted``, get
    the key's initial value or zeros. An unadmitted row's value is its initial value (written at
    insertion and never trained; a computed one is 0, the zeros initializer's), so it is read
    unless unadmitted rows read as zeros. Returns a bad position or -1."""
    n = rows.shape[0]
    terms = value_terms(derive)
    unread = ZEROS if zero_unadmitted else kind
    for i in range(n):
        if i + PF < n:
            rp = rows[i + PF]
            if rp >= 0 and rp < n_rows:
                prefetch2(data, rp, 0)
                if zero_unadmitted and min_count > 1:
                    prefetch2(meta, rp, 0)
        r = rows[i]
        if r >= n_rows or r < -1:
            return i
        if r >= 0 and (not zero_unadmitted or min_count <= 1 or meta[r, COUNT] >= min_count):
            for c in range(dim):
                out[i, c] = read_value(data, r, c, dim, terms)
        else:
            init_row(out, i, dim, keys[i], base, unread, scale)
    return -1


@njit(nogil=True)
def first_bad_row(rows, adm, use_adm, n_rows) -> int:
    """First position whose row is read (as :func:`distinct_rows` reads them) and is not a row of a
    table of ``n_rows`` rows, or -1."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if r == -1 or (use_adm and not adm[i]):
            continue
        if r < -1 or r >= n_rows:
            return i
    return -1


@njit(nogil=True)
def dedup_rows(rows, grads, adm, use_adm, n_rows, uniq, acc):
    """Unique rows in first-occurrence order into ``uniq[:u]`` and their summed gradients into
    ``acc[:u]`` (summed in occurrence order, in acc's dtype). Rows -1, and with ``use_adm``
    positions whose ``adm`` is False, are skipped. Returns ``(u, bad position or -1)``."""
    bad = first_bad_row(rows, adm, use_adm, n_rows)
    if bad >= 0:
        return 0, bad
    inverse = np.empty(rows.shape[0], dtype=np.int32)
    u = distinct_rows(rows, adm, use_adm, uniq, inverse)
    filled = 0
    for i in range(rows.shape[0]):
        p = inverse[i]
        if p >= 0:
            fresh = p == filled
            for c in range(acc.shape[1]):
                acc[p, c] = add_to_distinct(acc[p, c], grads[i, c], fresh)
            filled += fresh
    return u, -1


_NO_ADM = np.zeros(0, dtype=np.bool_)


@njit(cache=True, nogil=True)
def sum_duplicates(rows, grads, n_rows, meta, min_count, uniq, acc):
    """:func:`dedup_rows`, then only admitted rows kept. Returns ``(u, bad position or -1)``.

    Admission is checked once per unique row, after deduplication, and not at all when
    ``min_count <= 1`` (every present row has count >= 1): the count lives in a large random-access
    array, the batch-local hash set is small.
    """
    u, bad = dedup_rows(rows, grads, _NO_ADM, False, n_rows, uniq, acc)
    if bad >= 0 or min_count <= 1:
        return u, bad
    kept = 0
    dim = acc.shape[1]
    for j in range(u):
        if j + PF < u:
            prefetch2(meta, uniq[j + PF], 0)
        r = uniq[j]
        if meta[r, COUNT] >= min_count:
            if kept != j:
                uniq[kept] = r
                for c in range(dim):
                    acc[kept, c] = acc[j, c]
            kept += 1
    return kept, -1
