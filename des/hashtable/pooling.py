"""Sum-pooling of per-id rows per sample (CSR) and its adjoint: the one pooling of the engine.

``pooled[b] = Σ_{t in offsets[b]:offsets[b+1]} w_t · rows[s_t]`` (``w_t`` the id's weight or 1,
``s_t`` its row); a one-hot field (one id per sample, no weights) pools to its rows unchanged,
which callers copy. The loop nest exists once (``_pool_samples``, over a range of samples, behind
:func:`pool_or_unpool` and :func:`pool_fields`) and runs, in both directions:

* in the fused shard kernels (``fused.py``): a field's ids pooled from its distinct rows, the
  update's gradients un-pooled onto them;
* for the row owner of the planner's exchange (:func:`pool_fields`, ``des/strategies/exchange.py``):
  every field's ids of its rows, from the distinct ids' values that arrived;
* from Python (:func:`pool`, :func:`unpool`): rows that travel (``RowLayout``, ps) and the
  per-table path the fused kernels are tested against.

Forward, products are formed in float64 and added into the output (rounded once per addition;
at weight 1 that is the sum in the arrays' dtype); the adjoint rounds each product once into the
output's dtype and sums them per row in id order, the first stored (``distinct.add_to_distinct``:
rows numbered in order of first occurrence).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from . import _threads
from .distinct import add_to_distinct

NO_INDEX = np.zeros(0, dtype=np.int32)  # pool_or_unpool's index when ids read their own rows
_NO_WEIGHTS = np.zeros(0, dtype=np.float64)  # when a field has no weights (never read)
#: rows per tile of :func:`pool_fields`: a tile's rows of ``[rows, F, width]`` (64 x 39 x 9 floats
#: on Criteo) stay in cache while every field reads or writes its column of them, and each field's
#: ids and offsets are read in order (row by row over all fields, every field's next id was a
#: cache line of its own)
ROW_TILE = 64
ALL_ROWS = np.iinfo(np.int64).max  # the adjoint's rows by default: every row
_MIN_PARALLEL = 20_000  # ids below which one thread pools every field (a hand-off costs more)


@njit(nogil=True, inline="always")
def _pool_samples(rows, index, offsets, weights, has_weights, batch, g, adjoint, b0, b1, filled, value, r0=0,
                  r1=ALL_ROWS):
    """Samples ``[b0, b1)`` of :func:`pool_or_unpool`; ``filled``: the adjoint's rows stored so far
    (returned updated), or -1: every term is added into ``rows`` (zeroed by the caller; they may
    then be numbered in any order); ``value``: a ``[1, width]`` scratch row of rows' dtype. The
    adjoint adds only the ids of rows ``[r0, r1)`` (the others are skipped; ``filled`` then starts at
    ``r0``): a row's sum is the same whichever range of rows a call takes."""
    indexed = index.shape[0] > 0
    width = rows.shape[1]
    for b in range(b0, b1):
        for t in range(offsets[b], offsets[b + 1]):
            w = weights[t] if has_weights else 1.0
            s = index[t] if indexed else t
            if adjoint:  # each product rounded once into rows' dtype (by weight 1: the gradient itself)
                if s >= r0 and s < r1:
                    fresh = s == filled
                    for c in range(width):
                        value[0, c] = w * batch[b, g, c] if has_weights else batch[b, g, c]
                        rows[s, c] = add_to_distinct(rows[s, c], value[0, c], fresh)
                    filled += fresh
            elif has_weights:
                for c in range(width):
                    batch[b, g, c] += w * rows[s, c]
            else:  # weight 1: the same sums in the arrays' dtype (a float32 sum formed in float64 and
                for c in range(width):  # rounded once is the float32 sum)
                    batch[b, g, c] += rows[s, c]
    return filled


@njit(cache=True, nogil=True)
def pool_or_unpool(rows, index, offsets, weights, has_weights, batch, g, adjoint):  # pragma: no cover - numba
    """Pooling ``batch[b, g] += w_t · rows[s_t]`` over the ids t of sample b (field ``g`` of a
    ``[B, F, dim]`` array), or its adjoint (``adjoint``) ``rows[s_t] += w_t · batch[b, g]``: one loop
    nest, so the two stay each other's transpose. ``w_t`` is ``weights[t]`` (as float64) or 1.0.
    ``s_t`` is ``index[t]``, or ``t`` when ``index`` is empty.

    Pooling: products formed in float64 and added into ``batch`` (rounded once per addition). With
    an index, the ids read their values from a table of distinct rows.
    Adjoint: each product rounded once into rows' dtype, then summed per row ``s`` in id order, the
    first stored (``add_to_distinct``: ``index`` numbers rows in order of first occurrence, as
    ``distinct_rows`` does; ids with ``s_t < 0`` are skipped). Without an index every id has its own
    row: ``rows[t] = w_t · batch[b, g]``, the per-id gradients; with one, the sums per distinct row."""
    value = np.empty((1, rows.shape[1]), dtype=rows.dtype)
    _pool_samples(rows, index, offsets, weights, has_weights, batch, g, adjoint, 0, offsets.shape[0] - 1, 0, value)


@njit(nogil=True)
def unpool_rows(rows, index, offsets, weights, has_weights, batch, g, r0, r1):  # pragma: no cover - numba
    """:func:`pool_or_unpool`'s adjoint (with an index) on the rows ``[r0, r1)`` only: every id of
    those rows in id order, each row's first stored, so the rows' sums are those of the whole call
    bit for bit. A field's distinct rows split into ranges are summed on several threads this way
    (``fused.py``), each range reading every id once."""
    value = np.empty((1, rows.shape[1]), dtype=rows.dtype)
    _pool_samples(rows, index, offsets, weights, has_weights, batch, g, True, 0, offsets.shape[0] - 1, r0, value, r0,
                  r1)


@njit(nogil=True)
def pool_samples(rows, index, offsets, weights, has_weights, batch, g, b0, b1):  # pragma: no cover - numba
    """:func:`pool_or_unpool`'s pooling (with an index) of the samples ``[b0, b1)`` only, added
    into ``batch[b0:b1, g]``: a field's samples split into ranges are pooled on several threads
    this way (``fused.py``), with the floats of the whole call."""
    value = np.empty((1, rows.shape[1]), dtype=rows.dtype)
    _pool_samples(rows, index, offsets, weights, has_weights, batch, g, False, b0, b1, 0, value)


@njit(nogil=True, inline="always")
def one_hot(offsets, has_weights) -> bool:
    """Every sample has exactly one id and no weight: pooling is the identity (callers copy)."""
    if has_weights:
        return False
    for b in range(offsets.shape[0] - 1):
        if offsets[b + 1] - offsets[b] != 1:
            return False
    return True


@njit(cache=True, nogil=True)
def one_hot_fields(offsets, weighted):  # pragma: no cover - numba
    """bool [F]: field ``j`` (CSR ``offsets[j]``, ``weighted[j]``) is :func:`one_hot`."""
    hot = np.empty(offsets.shape[0], dtype=np.bool_)
    for j in range(offsets.shape[0]):
        hot[j] = one_hot(offsets[j], weighted[j])
    return hot


class FieldIds(NamedTuple):
    """Several fields' ids of the same rows, each over its own distinct rows, fields side by side
    (the row owner's side of the exchange, :func:`pool_fields`)."""

    inverse: np.ndarray  # int64 [nnz]: each id's distinct row within its field
    base: np.ndarray  # int64 [F]: where field f's distinct rows start in the values
    id_start: np.ndarray  # int64 [F]: where field f's ids start in inverse (and weights)
    offsets: np.ndarray  # int64 [F, rows + 1]: CSR row pointers of each field, from its id_start
    weights: np.ndarray  # float64 [nnz] (empty when no field is weighted)
    weighted: np.ndarray  # bool [F]
    hot: np.ndarray  # bool [F]: one unweighted id per row (pooling copies)


@njit(cache=True, nogil=True)
def _pool_fields(pooled, values, ids, field_ids, adjoint, f0, f1):  # pragma: no cover - numba
    """Fields ``[f0, f1)`` of :func:`pool_fields`: every field's ids (:class:`FieldIds`, a plain
    tuple of its arrays) pooled per row, ``pooled[r, field_ids[f]] = Σ w · values[base[f] +
    inverse[id]]``, or (``adjoint``) the transpose: ``pooled`` (the gradients) added into those rows
    of ``values`` (zeroed by the caller), in row order whatever the tiling: :func:`pool_or_unpool`'s
    two directions. Pooling writes every ``pooled[r, field_ids[f]]`` (a row without ids: zeros) and
    copies a single unweighted id; a one-hot field (``hot``: one such id in every row) is copied or
    added row by row. Tile of rows by tile (:data:`ROW_TILE`)."""
    ids = FieldIds(*ids)
    rows, width = pooled.shape[0], values.shape[1]
    value = np.empty((1, width), dtype=values.dtype)
    for r0 in range(0, rows, ROW_TILE):
        r1 = min(rows, r0 + ROW_TILE)
        for f in range(f0, f1):
            g, start, offsets, weighted = field_ids[f], ids.id_start[f], ids.offsets[f], ids.weighted[f]
            end = start + offsets[rows]
            index, table, weights = ids.inverse[start:end], values[ids.base[f]:], ids.weights[start:end]
            if ids.hot[f]:  # id r is row r's, weight 1: a copy, or an addition of the row's gradient
                for r in range(r0, r1):
                    k = index[r]
                    if adjoint:
                        for c in range(width):
                            table[k, c] += pooled[r, g, c]
                    else:
                        for c in range(width):
                            pooled[r, g, c] = table[k, c]
            elif adjoint:
                _pool_samples(table, index, offsets, weights, weighted, pooled, g, True, r0, r1, -1, value)
            else:
                for r in range(r0, r1):
                    if offsets[r + 1] - offsets[r] == 1 and not weighted:
                        k = index[offsets[r]]
                        for c in range(width):
                            pooled[r, g, c] = table[k, c]
                        continue
                    for c in range(width):
                        pooled[r, g, c] = 0.0
                    _pool_samples(table, index, offsets, weights, weighted, pooled, g, False, r, r + 1, 0, value)


def pool_fields(pooled: np.ndarray, values: np.ndarray, ids: tuple, field_ids: np.ndarray, adjoint: bool) -> None:
    """:func:`_pool_fields` of every field, ranges of fields on the caller's threads
    (``_threads.run``, by their ids): a field reads and writes only its own column of ``pooled``
    and its own rows of ``values`` (from ``base[f]``), in the same order on any split, so the
    result is the same bytes on any number of threads. The row owner's pooling of 4096 rows of
    DeepFM on the Criteo-shaped store took 2.1 -> 1.3 ms on two threads, its adjoint 2.2 -> 1.7 ms
    (2-core VM, one job each, the medians of their steps)."""
    fields = FieldIds(*ids)
    work = (fields.offsets[:, -1] + pooled.shape[0]).astype(np.float64) if fields.offsets.shape[0] else 0
    _threads.run(lambda f0, f1: _pool_fields(pooled, values, ids, field_ids, adjoint, f0, f1), work, _MIN_PARALLEL)


def is_one_hot(offsets: np.ndarray, weights: np.ndarray | None) -> bool:
    """True when every sample has exactly one id of weight 1 (pooling is the identity)."""
    return weights is None and offsets[-1] == offsets.shape[0] - 1 and (
        offsets.shape[0] < 2 or bool(np.all(np.diff(offsets) == 1))
    )


def pool(values: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None, out: np.ndarray,
         index: np.ndarray | None = None) -> None:
    """Write the pooled rows ``[B, dim]`` into ``out`` (which may be a strided view). ``values``
    holds a row per id, or, with ``index`` (id -> row), the rows the ids read."""
    if is_one_hot(offsets, weights):
        out[...] = values if index is None else values[index]
        return
    tmp = np.zeros((out.shape[0], 1, out.shape[1]), dtype=values.dtype)
    pool_or_unpool(values, NO_INDEX if index is None else np.ascontiguousarray(index), offsets,
                   _NO_WEIGHTS if weights is None else weights, weights is not None, tmp, 0, False)
    out[...] = tmp[:, 0]


def unpool(grad: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Per-id gradients ``[nnz, dim]`` from the pooled gradient ``[B, dim]`` (the adjoint of :func:`pool`)."""
    if is_one_hot(offsets, weights):
        return np.ascontiguousarray(grad)
    out = np.empty((int(offsets[-1]), grad.shape[1]), dtype=grad.dtype)
    pool_or_unpool(out, NO_INDEX, offsets, _NO_WEIGHTS if weights is None else weights, weights is not None,
                   np.ascontiguousarray(grad)[:, None, :], 0, True)
    return out
