"""Sum-pooling of per-id rows per sample (CSR) and its adjoint: the one loop nest that
``des/pooling.py`` (rows that travel between ranks) and the fused shard kernels (``fused.py``) share.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def pool_or_unpool(src, offsets, weights, has_weights, out, adjoint):  # pragma: no cover - numba
    """Pooling ``out[b] += w_t · src[t]`` over the ids t of sample b, or its adjoint (``adjoint``)
    ``out[t] = w_t · src[b]``: one loop nest, so the two stay each other's transpose. ``w_t`` is
    ``weights[t]`` (as float64) or 1.0; products are formed in float64 and rounded once into out."""
    for b in range(offsets.shape[0] - 1):
        for t in range(offsets[b], offsets[b + 1]):
            w = weights[t] if has_weights else 1.0
            if adjoint:
                for c in range(src.shape[1]):
                    out[t, c] = w * src[b, c]
            else:
                for c in range(src.shape[1]):
                    out[b, c] += w * src[t, c]


@njit(nogil=True, inline="always")
def one_hot(offsets, has_weights) -> bool:
    """Every sample has exactly one id and no weight: pooling is the identity (callers copy)."""
    if has_weights:
        return False
    for b in range(offsets.shape[0] - 1):
        if offsets[b + 1] - offsets[b] != 1:
            return False
    return True
