"""Sum-pooling of a field's looked-up rows per sample (CSR), and its adjoint for the backward pass.

``pooled[b] = Σ_{t in offsets[b]:offsets[b+1]} x_t · rows[t]``; a one-hot field (one id per sample,
weight 1) pools to its rows unchanged, which the callers short-cut.
"""

from __future__ import annotations

import numba
import numpy as np

_NO_WEIGHTS = np.zeros(0, dtype=np.float32)  # stands in for a field without weights (never read)


@numba.njit(cache=True, nogil=True)
def _pool_or_unpool(src, offsets, weights, has_weights, out, adjoint):  # pragma: no cover - numba
    """Pooling ``out[b] += w_t · src[t]`` over the ids t of sample b, or its adjoint (``adjoint``)
    ``out[t] = w_t · src[b]``: one loop nest, so the two stay each other's transpose."""
    for b in range(offsets.shape[0] - 1):
        for t in range(offsets[b], offsets[b + 1]):
            w = weights[t] if has_weights else 1.0
            if adjoint:
                for c in range(src.shape[1]):
                    out[t, c] = w * src[b, c]
            else:
                for c in range(src.shape[1]):
                    out[b, c] += w * src[t, c]


def is_one_hot(offsets: np.ndarray, weights: np.ndarray | None) -> bool:
    """True when every sample has exactly one id of weight 1 (pooling is the identity)."""
    return weights is None and offsets[-1] == offsets.shape[0] - 1 and (
        offsets.shape[0] < 2 or bool(np.all(np.diff(offsets) == 1))
    )


def pool(values: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None, out: np.ndarray) -> None:
    """Write the pooled rows ``[B, dim]`` into ``out`` (which may be a strided view)."""
    if is_one_hot(offsets, weights):
        out[...] = values
        return
    tmp = np.zeros(out.shape, dtype=values.dtype)
    _pool_or_unpool(values, offsets, _NO_WEIGHTS if weights is None else weights, weights is not None, tmp, False)
    out[...] = tmp


def unpool(grad: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Per-id gradients ``[nnz, dim]`` from the pooled gradient ``[B, dim]`` (the adjoint of pool)."""
    if is_one_hot(offsets, weights):
        return np.ascontiguousarray(grad)
    out = np.empty((int(offsets[-1]), grad.shape[1]), dtype=grad.dtype)
    _pool_or_unpool(np.ascontiguousarray(grad), offsets, _NO_WEIGHTS if weights is None else weights,
                    weights is not None, out, True)
    return out
