"""Sum-pooling of a field's looked-up rows per sample (CSR), and its adjoint for the backward pass.

``pooled[b] = Σ_{t in offsets[b]:offsets[b+1]} x_t · rows[t]``; a one-hot field (one id per sample,
weight 1) pools to its rows unchanged, which the callers short-cut.
"""

from __future__ import annotations

import numpy as np

from des.hashtable._pooling import NO_INDEX as _NO_INDEX
from des.hashtable._pooling import pool_or_unpool as _pool_or_unpool

_NO_WEIGHTS = np.zeros(0, dtype=np.float32)  # placeholder when a field has no weights (never read)


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
    _pool_or_unpool(values, _NO_INDEX, offsets, _NO_WEIGHTS if weights is None else weights, weights is not None, tmp,
                    False)
    out[...] = tmp


def unpool(grad: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Per-id gradients ``[nnz, dim]`` from the pooled gradient ``[B, dim]`` (the adjoint of pool)."""
    if is_one_hot(offsets, weights):
        return np.ascontiguousarray(grad)
    out = np.empty((int(offsets[-1]), grad.shape[1]), dtype=grad.dtype)
    _pool_or_unpool(np.ascontiguousarray(grad), _NO_INDEX, offsets, _NO_WEIGHTS if weights is None else weights,
                    weights is not None, out, True)
    return out
