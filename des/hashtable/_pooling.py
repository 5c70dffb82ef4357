"""Sum-pooling of per-id rows per sample (CSR) and its adjoint: the one loop nest that
``des/pooling.py`` (rows that travel between ranks) and the fused shard kernels (``fused.py``) share.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .distinct import add_to_distinct

NO_INDEX = np.zeros(0, dtype=np.int32)  # pool_or_unpool's index when ids read their own rows


@njit(cache=True, nogil=True)
def pool_or_unpool(src, index, offsets, weights, has_weights, out, adjoint):  # pragma: no cover - numba
    """Pooling ``out[b] += w_t · src[s_t]`` over the ids t of sample b, or its adjoint (``adjoint``)
    ``out[s_t] += w_t · src[b]``: one loop nest, so the two stay each other's transpose. ``w_t`` is
    ``weights[t]`` (as float64) or 1.0. ``s_t`` is ``index[t]``, or ``t`` when ``index`` is empty.

    Pooling: products formed in float64 and added into out (rounded once per addition). With an
    index, the ids read their values from a table of distinct rows.
    Adjoint: each product rounded once into out's dtype, then summed per row ``s`` in id order, the
    first stored (``add_to_distinct``: ``index`` numbers rows in order of first occurrence, as
    ``distinct_rows`` does; ids with ``s_t < 0`` are skipped). Without an index every id has its own
    row: ``out[t] = w_t · src[b]``, the per-id gradients; with one, the sums per distinct row."""
    indexed = index.shape[0] > 0
    value = np.empty((1, src.shape[1]), dtype=out.dtype)
    filled = 0
    for b in range(offsets.shape[0] - 1):
        for t in range(offsets[b], offsets[b + 1]):
            w = weights[t] if has_weights else 1.0
            s = index[t] if indexed else t
            if adjoint:
                if s >= 0:
                    for c in range(src.shape[1]):
                        value[0, c] = w * src[b, c]
                    filled = add_to_distinct(out, 0, s, filled, value, 0)
            else:
                for c in range(src.shape[1]):
                    out[b, c] += w * src[s, c]


@njit(nogil=True, inline="always")
def one_hot(offsets, has_weights) -> bool:
    """Every sample has exactly one id and no weight: pooling is the identity (callers copy)."""
    if has_weights:
        return False
    for b in range(offsets.shape[0] - 1):
        if offsets[b + 1] - offsets[b] != 1:
            return False
    return True
