"""Sum-pooling of a field's rows per sample and its adjoint, for fields with and without weights."""

from __future__ import annotations

import numpy as np
import pytest

from des.hashtable.pooling import pool, unpool


@pytest.mark.parametrize("weighted", [False, True])
def test_multi_hot_pooling_and_its_adjoint(weighted: bool) -> None:
    rng = np.random.default_rng(0)
    offsets = np.array([0, 2, 2, 5], dtype=np.int64)  # 2 ids, none (a missing value), 3 ids
    values = rng.normal(size=(5, 3))
    weights = rng.random(5).astype(np.float32) if weighted else None
    w = np.ones(5) if weights is None else weights.astype(np.float64)
    out = np.zeros((3, 3))
    pool(values, offsets, weights, out)
    expected = np.stack([(w[:, None] * values)[offsets[b]:offsets[b + 1]].sum(axis=0) for b in range(3)])
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    grad = rng.normal(size=(3, 3))
    # the adjoint: <pool(v), g> == <v, unpool(g)>
    np.testing.assert_allclose(np.sum(out * grad), np.sum(values * unpool(grad, offsets, weights)), rtol=1e-6)
