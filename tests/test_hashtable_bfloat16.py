"""16-bit table rows (des/hashtable/bfloat16.py): bfloat16 storage of float32 values, rounded to
nearest at insertion and stochastically at updates with random bits that are a pure function of
(seed, field, block, key, step, column); conversions on load; the combinations refused."""

from __future__ import annotations

import numpy as np
import pytest

from des.hashtable import FTRL, Adam, BlockSpec, EmbeddingTable, Initializer, RowwiseAdaGrad
from des.hashtable.bfloat16 import convert, narrow_rows, to_bfloat16


def table(table_dtype="bfloat16", optimizer=None, seed=5):
    blocks = [BlockSpec("linear", 1, FTRL(0.05, l1=0.01), Initializer("zeros")),
              BlockSpec("emb", 8, optimizer or RowwiseAdaGrad(0.05), Initializer("normal", 0.1))]
    return EmbeddingTable(2, blocks, seed=seed, dtype=np.float32, capacity=64, table_dtype=table_dtype)


def widened(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_rounding_to_nearest_and_stochastic_rounding_is_unbiased() -> None:
    # bfloat16's spacing at 1 is 2^-7; ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (even:
    # 1), 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (even: the latter)
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -1 - 2**-9, -1 - 3 * 2**-9, np.inf, -np.inf], dtype=np.float32)
    np.testing.assert_array_equal(widened(to_bfloat16(x)), [1.0, 1.0, 1 + 2**-6, -1.0, -1 - 2**-7, np.inf, -np.inf])
    assert np.isnan(widened(to_bfloat16(np.float32([np.nan])))[0])
    # stochastic: each value goes to one of its two neighbours, unbiased over keys
    value = np.float32(1 + 2**-9)  # a quarter of the way from 1 to the next bfloat16 (1 + 2^-7)
    n = 20000
    src = np.full((n, 4), value, dtype=np.float32)
    out = np.zeros((n, 4), dtype=np.uint16)
    narrow_rows(src, out, np.arange(n), np.arange(n, dtype=np.int64) * 7919, np.uint64(12345), 3)
    got = widened(out)
    assert set(np.unique(got)) == {np.float32(1.0), np.float32(1 + 2**-7)}
    assert abs(got.astype(np.float64).mean() - float(value)) < 4 * 2**-7 * np.sqrt(0.25 * 0.75 / got.size)


def test_an_updates_rounding_depends_on_key_step_and_column_only() -> None:
    """The same rows updated in one call, in two calls in another order, and on a table that holds
    other keys too (other rows), at the same step: the same bits; at another step: other bits."""
    keys = np.arange(1, 41, dtype=np.int64) * 1000003
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(keys.size, 8)).astype(np.float32)
    a, b, c, d = table(), table(), table(), table()
    b.lookup(np.array([77, 78, 79], dtype=np.int64), insert=True, step=0)  # other rows first
    for t in (a, b, c, d):
        t.lookup(keys, insert=True, step=0)
    a.apply_gradients("emb", a.lookup(keys, insert=False), grads, step=4)
    order = rng.permutation(keys.size)
    for part in (order[:17], order[17:]):
        b.apply_gradients("emb", b.lookup(keys[part], insert=False), grads[part], step=4)
    c.apply_gradients("emb", c.lookup(keys, insert=False), grads, step=4)
    d.apply_gradients("emb", d.lookup(keys, insert=False), grads, step=5)
    rows = {t: t.lookup(keys, insert=False) for t in (a, b, c, d)}
    bits = {t: t.arrays.blocks[1][rows[t]] for t in (a, b, c, d)}
    assert bits[a].tobytes() == bits[b].tobytes() == bits[c].tobytes()
    assert bits[a].tobytes() != bits[d].tobytes()  # step 5's bits round some value the other way
    emb = a.gather("emb", keys, rows[a])
    assert emb.dtype == np.float32 and np.all(emb == widened(bits[a][:, :8]))


def test_bfloat16_rows_halve_the_payload_and_load_into_another_dtype(tmp_path) -> None:
    keys = np.arange(100, dtype=np.int64)
    t32, t16 = table("float32"), table("bfloat16")
    for t in (t32, t16):
        rows = t.lookup(keys, insert=True, step=0)
        t.apply_gradients("emb", rows, np.ones((100, 8), np.float32), step=0)
        t.apply_gradients("linear", rows, np.linspace(-2, 2, 100, dtype=np.float32)[:, None], step=0)
    # key 8 + FTRL (z, n; w computed when read) + row-wise AdaGrad (8 values + 1): 8 + 4 * 11 vs 8 + 2 * 11
    assert (t32.payload_bytes_per_row(), t16.payload_bytes_per_row()) == (52, 30)
    # a bfloat16 row's w: computed in float32 from its widened z and n (the update's arithmetic), unrounded
    z, n = (widened(t16.arrays.blocks[0][:100, c]) for c in (0, 1))
    two_l2 = np.float32(0.0) + np.float32(1.0) / (np.float32(0.05) + np.float32(0.05))
    l1 = np.float32(0.01)
    expected = (np.clip(z, -l1, l1) - z) / (np.sqrt(n) / np.float32(0.05) + (two_l2 + two_l2))
    linear = t16.gather("linear", keys, t16.lookup(keys, insert=False))[:, 0]
    assert linear.dtype == np.float32 and np.count_nonzero(linear) > 50
    np.testing.assert_array_equal(linear, expected)
    t16.save(tmp_path / "t16.npz")
    same = EmbeddingTable.load(tmp_path / "t16.npz")
    assert same.table_dtype == "bfloat16" and same.arrays.blocks[1][:100].tobytes() == t16.arrays.blocks[1][:100].tobytes()
    wide = EmbeddingTable.load(tmp_path / "t16.npz", table_dtype="float32")
    rows = wide.lookup(keys, insert=False)
    np.testing.assert_array_equal(wide.gather("emb", keys, rows), t16.gather("emb", keys, t16.lookup(keys, insert=False)))
    t32.save(tmp_path / "t32.npz")
    narrow = EmbeddingTable.load(tmp_path / "t32.npz", table_dtype="bfloat16")
    np.testing.assert_array_equal(narrow.arrays.blocks[1][:100], convert(t32.arrays.blocks[1][:100], "bfloat16"))


def test_refused_combinations() -> None:
    with pytest.raises(ValueError, match="cannot take adam:catchup=1"):
        table(optimizer=Adam(0.01, catchup=1))
    with pytest.raises(ValueError, match="16-bit rows need dtype float32"):
        EmbeddingTable(0, [BlockSpec("emb", 4, Adam(0.01), Initializer("zeros"))], seed=0, dtype=np.float64,
                       table_dtype="bfloat16")
    with pytest.raises(ValueError, match="table dtype must be one of"):
        table(table_dtype="float16")
