"""Distinct values of a batch in order of first occurrence: the one batch-local hash set behind the
training lookup's distinct keys, each field's distinct trained rows (``fused.py``), the duplicate
sums of one table's update (``_index.py``) and the exchange's distinct ids per row block
(:func:`distinct_in_segments`, ``des/strategies/exchange.py``), and the sums in that order
(:func:`add_to_distinct`: the first term stored, the later ones added). The numbering depends on
the order of the values only, never on the hash: every side that numbers the same values in the
same order finds the same numbers.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..splitmix import GOLDEN_GAMMA


@njit(nogil=True)
def distinct_rows(rows, adm, use_adm, uniq, inverse) -> int:
    """The distinct rows of ``rows`` in first-occurrence order into ``uniq[:u]``, and for each
    position its place among them, ``inverse[i]`` (-1 for rows -1 and, with ``use_adm``, positions
    whose ``adm`` is False). Returns ``u``. A batch-local hash set: it never reads the table."""
    return first_occurrences(rows, adm, use_adm, True, uniq, inverse)


@njit(nogil=True)
def distinct_keys(keys, ukeys, inverse) -> int:
    """:func:`distinct_rows` of keys (every key counts, -1 too): the distinct keys in
    first-occurrence order into ``ukeys[:u]`` and each position's place among them. Returns ``u``."""
    return first_occurrences(keys, np.empty(0, np.bool_), False, False, ukeys, inverse)


@njit(nogil=True, inline="always")
def first_occurrences(values, adm, use_adm, skip_minus_one, uniq, inverse) -> int:
    """The distinct ``values`` in order of first occurrence into ``uniq[:u]`` and each position's
    number ``inverse[i]``, skipping (``inverse[i] = -1``) the values -1 where ``skip_minus_one`` and
    the positions whose ``adm`` is False where ``use_adm``. Returns ``u``. Open addressing over
    twice as many slots as values, Fibonacci hashing."""
    n = values.shape[0]
    bits = 4
    while (1 << bits) < 2 * n:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    pos = np.full(1 << bits, -1, dtype=np.int32)  # value -> its place in uniq
    u = 0
    for i in range(n):
        r = values[i]
        if (skip_minus_one and r == -1) or (use_adm and not adm[i]):
            inverse[i] = -1
            continue
        s = np.int64((np.uint64(r) * GOLDEN_GAMMA) >> shift)
        while True:
            p = pos[s]
            if p == -1:
                pos[s] = u
                uniq[u] = r
                inverse[i] = u
                u += 1
                break
            if uniq[p] == r:
                inverse[i] = p
                break
            s = (s + 1) & mask
    return u


@njit(nogil=True, inline="always")
def add_to_distinct(held, term, fresh):
    """A distinct row's sum with one more ``term``: the term itself where ``fresh`` (the row's first,
    ``p == filled`` as :func:`distinct_rows` numbers rows in first-occurrence order), else ``held``
    plus it, so each row's sum runs in occurrence order. One value: the caller loops over a row's
    values (``acc[p, c] = add_to_distinct(acc[p, c], src[i, c], fresh)``) and counts ``filled +=
    fresh``; numba counts references to the arrays given to an inlined helper with a loop, atomic
    operations on every call (``bfloat16.read_value``)."""
    return term if fresh else held + term


@njit(cache=True, nogil=True)
def _distinct_in_segments(keys, starts, ends, inverse, first, counts):  # pragma: no cover - numba
    longest = 0
    for s in range(starts.shape[0]):
        longest = max(longest, ends[s] - starts[s])
    uniq = np.empty(longest, dtype=np.int64)
    n_first = 0
    for s in range(starts.shape[0]):
        lo, hi = starts[s], ends[s]
        u = distinct_keys(keys[lo:hi], uniq[:hi - lo], inverse[lo:hi])
        counts[s] = u
        following = 0  # numbers come in increasing order: each first occurrence is the next number
        for i in range(lo, hi):
            if inverse[i] == following:
                first[n_first] = i
                n_first += 1
                following += 1
    return n_first


def distinct_in_segments(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each segment ``s`` (``keys[starts[s]:ends[s]]``, int64 keys): its distinct keys numbered
    in order of first occurrence (:func:`distinct_keys`). Returns ``(inverse, first, counts)``:
    ``inverse[i]`` the number of ``keys[i]`` in its segment (int64), ``first`` segment after
    segment the position of each distinct key's first occurrence, ``counts[s]`` the distinct keys
    of segment ``s``."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    inverse = np.zeros(keys.shape[0], dtype=np.int64)
    first = np.empty(int(np.sum(ends - starts)), dtype=np.int64)
    counts = np.zeros(starts.shape[0], dtype=np.int64)
    n = _distinct_in_segments(keys, starts, ends, inverse, first, counts)
    return inverse, first[:n], counts
