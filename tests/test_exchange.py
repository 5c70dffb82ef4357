"""des/strategies/exchange.py, the planner's exchange mode, piece by piece in one process: the
distinct ids both sides number the same way without sending keys, the synthetic batch of distinct
ids, joining it to the real batch for one optimizer step per row, and pooling / gradient sums that
are each other's adjoint. (That every plan trains the same model on N ranks: tests/test_exactness.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from des.hashtable.distinct import distinct_in_segments
from des.hashtable.fused import Touched
from des.hashtable.pooling import ROW_TILE, FieldIds, one_hot_fields, pool_fields
from des.strategies.exchange import distinct_ids, join_samples


def _pool_received(values, base, inverse, id_start, offsets, weights, weighted, hot, field_ids, out) -> None:
    """The row owner's pooling (``BlockExchange.pool``): ``out [rows, F, width]`` from the distinct ids' values."""
    pool_fields(out, values, tuple(FieldIds(inverse, base, id_start, offsets, weights, weighted, hot)), field_ids,
                False)


def _sum_received(grads, base, inverse, id_start, offsets, weights, weighted, hot, field_ids, out) -> None:
    """Its adjoint (``BlockExchange.sum_gradients``): ``grads [rows, F, width]`` summed into the
    distinct ids' rows of ``out`` (zeroed)."""
    pool_fields(grads, out, tuple(FieldIds(inverse, base, id_start, offsets, weights, weighted, hot)), field_ids,
                True)


def _first_occurrence(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference: distinct keys numbered in order of first occurrence, and those positions."""
    numbers: dict[int, int] = {}
    first = []
    for i, k in enumerate(keys.tolist()):
        if k not in numbers:
            numbers[k] = len(numbers)
            first.append(i)
    return np.array([numbers[k] for k in keys.tolist()], dtype=np.int64), np.array(first, dtype=np.int64)


def test_distinct_ids_per_segment_in_order_of_first_occurrence() -> None:
    rng = np.random.default_rng(0)
    # hashed ids are any int64 (negative too); segments of 0, 1 and many occurrences, many repeats
    keys = np.concatenate([rng.integers(-2**62, 2**62, 40), rng.integers(0, 7, 300), [5], [],
                           rng.integers(-3, 3, 1000) * (2**40 + 1)]).astype(np.int64)
    starts = np.array([0, 40, 340, 341, 341], dtype=np.int64)
    ends = np.array([40, 340, 341, 341, 1341], dtype=np.int64)
    inverse, first, counts = distinct_in_segments(keys, starts, ends)
    offset = 0
    for s, (lo, hi) in enumerate(zip(starts, ends)):
        expected_inverse, expected_first = _first_occurrence(keys[lo:hi])
        np.testing.assert_array_equal(inverse[lo:hi], expected_inverse)
        np.testing.assert_array_equal(first[offset : offset + counts[s]], expected_first + lo)
        assert counts[s] == np.unique(keys[lo:hi]).size
        offset += counts[s]
    assert offset == first.size


def _touched(fields: list[list[list[int]]], weights: bool = False) -> Touched:
    """A lookup result for ``fields[f][row]`` = the ids of field f in that row (rows = keys * 10)."""
    keys = [np.array([k for row in col for k in row], dtype=np.int64) for col in fields]
    offsets = np.stack([np.concatenate([[0], np.cumsum([len(row) for row in col])]) for col in fields])
    key_offsets = np.concatenate([[0], np.cumsum([k.size for k in keys])])
    flat = np.concatenate(keys)
    return Touched(keys=flat, key_offsets=key_offsets, offsets=offsets.astype(np.int64),
                   weights=np.linspace(0.5, 1.5, flat.size) if weights else np.zeros(0),
                   weighted=np.full(len(fields), weights), rows=flat * 10, admitted=flat % 2 == 0, train=True, step=3)


def test_synthetic_batch_holds_each_row_blocks_distinct_ids_once() -> None:
    # 2 fields, 5 rows in row blocks [0, 2) and [2, 5); field 1 multi-hot
    touched = _touched([[[1], [1], [2], [3], [2]], [[7, 8], [8], [], [9, 9], [7]]])
    synthetic, counts = distinct_ids(touched, [0, 2, 5])
    np.testing.assert_array_equal(counts, [[1, 2], [2, 2]])  # U[field, block]
    assert synthetic.size == 4  # the most distinct ids of one field
    np.testing.assert_array_equal(synthetic.keys, [1, 2, 3, 7, 8, 9, 7])  # block 0's, then block 1's
    np.testing.assert_array_equal(synthetic.key_offsets, [0, 3, 7])
    np.testing.assert_array_equal(synthetic.offsets, [[0, 1, 2, 3, 3], [0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(synthetic.rows, synthetic.keys * 10)
    np.testing.assert_array_equal(synthetic.admitted, synthetic.keys % 2 == 0)


def test_join_keeps_every_fields_ids_and_weights() -> None:
    a = _touched([[[1], [2]], [[3, 4], []]], weights=True)
    b = _touched([[[5], [6], [7]], [[8], [], [9]]])
    joined = join_samples(a, b)
    assert joined.size == 5
    np.testing.assert_array_equal(joined.keys, [1, 2, 5, 6, 7, 3, 4, 8, 9])
    np.testing.assert_array_equal(joined.offsets, [[0, 1, 2, 3, 4, 5], [0, 2, 2, 3, 3, 4]])
    np.testing.assert_array_equal(joined.weights, [a.weights[0], a.weights[1], 1, 1, 1, a.weights[2], a.weights[3], 1, 1])
    np.testing.assert_array_equal(joined.rows, joined.keys * 10)


def test_pooling_and_gradient_sums_are_adjoint() -> None:
    """<pool(values), G> == <values, sum_gradients(G)> on multi-hot weighted ids, and a one-hot
    unweighted id is copied."""
    rng = np.random.default_rng(1)
    rows, fields, width = 6, 3, 4
    offsets = np.array([[0, 1, 2, 3, 4, 5, 6], [0, 2, 2, 5, 6, 6, 8], [0, 1, 2, 3, 4, 5, 6]], dtype=np.int64)
    id_start = np.array([0, 6, 14], dtype=np.int64)
    inverse = np.concatenate([[0, 1, 0, 2, 1, 0], [0, 1, 1, 2, 0, 3, 2, 0], [0, 0, 1, 1, 2, 2]]).astype(np.int64)
    distinct = np.array([3, 4, 3])
    base = np.cumsum(distinct) - distinct
    weights = rng.uniform(0.5, 1.5, inverse.size)
    weighted = np.array([False, True, False])
    field_ids = np.array([2, 0, 1], dtype=np.int64)  # receive order -> global field
    values = rng.standard_normal((distinct.sum(), width))
    pooled = np.full((rows, fields, width), np.nan)  # every entry is written
    hot = one_hot_fields(offsets, weighted)
    np.testing.assert_array_equal(hot, [True, False, True])
    _pool_received(values, base, inverse, id_start, offsets, weights, weighted, hot, field_ids, pooled)
    np.testing.assert_array_equal(pooled[:, 2], values[inverse[:6]])  # field 0 of the receive order, one-hot
    grads = rng.standard_normal((rows, fields, width))
    summed = np.zeros_like(values)
    _sum_received(grads, base, inverse, id_start, offsets, weights, weighted, hot, field_ids, summed)
    np.testing.assert_allclose(np.sum(pooled * grads), np.sum(values * summed), rtol=1e-12)


def test_one_id_per_row_fields_take_the_copy_path_with_the_same_bits() -> None:
    """The row owner's kernels over several row tiles: fields flagged one id per row (Criteo's)
    give bit for bit what the general path gives them, pooled and summed (a distinct id's terms in
    row order), and the general path zero-fills a row without ids."""
    rng = np.random.default_rng(2)
    rows, width = 2 * ROW_TILE + 17, 5
    ids = [rng.integers(0, 20, rows), rng.integers(0, 3, rows)]  # two one-hot fields
    lengths = rng.integers(0, 3, rows)  # and a multi-hot one with empty rows
    ids.append(rng.integers(0, 30, int(lengths.sum())))
    offsets = np.stack([np.arange(rows + 1), np.arange(rows + 1), np.concatenate([[0], np.cumsum(lengths)])])
    id_start = np.concatenate([[0], np.cumsum([len(i) for i in ids])[:-1]]).astype(np.int64)
    inverse = np.concatenate(ids).astype(np.int64)  # ids number themselves: 20, 3 and 30 distinct
    base = np.array([0, 20, 23], dtype=np.int64)
    weights, weighted = np.zeros(0), np.zeros(3, np.bool_)
    field_ids = np.array([1, 2, 0], dtype=np.int64)
    values = rng.standard_normal((53, width)).astype(np.float32)
    grads = rng.standard_normal((rows, 3, width)).astype(np.float32)
    hot = one_hot_fields(offsets, weighted)
    np.testing.assert_array_equal(hot, [True, True, False])
    results = []
    for flags in (hot, np.zeros(3, np.bool_)):
        pooled = np.full((rows, 3, width), np.nan, dtype=np.float32)
        _pool_received(values, base, inverse, id_start, offsets, weights, weighted, flags, field_ids, pooled)
        summed = np.zeros_like(values)
        _sum_received(grads, base, inverse, id_start, offsets, weights, weighted, flags, field_ids, summed)
        results.append((pooled, summed))
    (pooled, summed), (pooled_general, summed_general) = results
    np.testing.assert_array_equal(pooled, pooled_general)
    np.testing.assert_array_equal(summed, summed_general)
    np.testing.assert_array_equal(pooled[lengths == 0, 0], 0.0)  # field 2 lands in column 0
    expected = np.zeros_like(values)
    for r in range(rows):  # field 0 (column 1): one id per row, its terms in row order
        expected[inverse[r]] += grads[r, 1]
    np.testing.assert_array_equal(summed[:20], expected[:20])


def test_fields_pooled_on_several_threads_give_the_same_bytes() -> None:
    """pool_fields splits its fields over the caller's threads (each field its own column of the
    pooled rows and its own distinct rows): one thread and two give the same bytes, both ways, on
    enough ids for the split to happen."""
    import numba

    from des.hashtable import _threads, pooling

    rng = np.random.default_rng(3)
    rows, fields, width = 3000, 6, 3
    lengths = [np.ones(rows, np.int64) if f % 2 else rng.integers(0, 6, rows) for f in range(fields)]
    offsets = np.stack([np.concatenate([[0], np.cumsum(n)]) for n in lengths]).astype(np.int64)
    distinct = rng.integers(50, 500, fields)
    inverse = np.concatenate([rng.integers(0, d, int(n.sum())) for d, n in zip(distinct, lengths)]).astype(np.int64)
    id_start = np.concatenate([[0], np.cumsum([int(n.sum()) for n in lengths])[:-1]]).astype(np.int64)
    base = (np.cumsum(distinct) - distinct).astype(np.int64)
    weights = rng.uniform(0.5, 1.5, inverse.size)
    weighted = np.array([f == 2 for f in range(fields)])
    hot = one_hot_fields(offsets, weighted)
    field_ids = rng.permutation(fields).astype(np.int64)
    values = rng.standard_normal((int(distinct.sum()), width)).astype(np.float32)
    grads = rng.standard_normal((rows, fields, width)).astype(np.float32)
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two threads")
    work = (offsets[:, -1] + rows).astype(np.float64)  # pool_fields' weights: ids and rows of each field
    assert work.sum() > 2 * pooling._MIN_PARALLEL and len(_threads.split(work, 2)) == 2  # split on 2 threads
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            pooled = np.full((rows, fields, width), np.nan, np.float32)
            _pool_received(values, base, inverse, id_start, offsets, weights, weighted, hot, field_ids, pooled)
            summed = np.zeros_like(values)
            _sum_received(grads, base, inverse, id_start, offsets, weights, weighted, hot, field_ids, summed)
            results.append((pooled, summed))
    finally:
        numba.set_num_threads(before)
    assert not np.isnan(results[0][0]).any()
    for one, two in zip(*results):
        np.testing.assert_array_equal(one.view(np.uint32), two.view(np.uint32))
