"""Deterministic initialization: the documented formula, and independence from insertion order,
batching, capacity, block width and rank (two tables simulating two ranks)."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import numpy as np
import pytest

from des.hashtable import FTRL, SGD, Adam, BlockSpec, EmbeddingTable, Initializer
from des.splitmix import splitmix64_of

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def splitmix64_py(z: int) -> int:
    """SplitMix64's step in plain Python (the reference for ``des.splitmix.splitmix64``)."""
    z = (z + GAMMA) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def turn(v: float) -> tuple[float, float]:
    """``(cos, sin)(2 pi v)`` as the docstring reduces it: ``4 v = q + r``, ``q`` the nearest integer,
    then quadrant ``q`` of ``(cos, sin)(r pi/2)``."""
    q = math.floor(4.0 * v + 0.5)
    c, s = math.cos((4.0 * v - q) * math.pi / 2), math.sin((4.0 * v - q) * math.pi / 2)
    return [(c, s), (-s, c), (-c, -s), (s, -c)][q % 4]


def reference_init(kind: str, scale: float, seed: int, field: int, block: str, key: int,
                   dim: int) -> list[float]:
    """The formula of des/hashtable/init.py's docstring, in plain Python."""
    sm = splitmix64_py
    name_h = int.from_bytes(hashlib.sha256(block.encode()).digest()[:8], "little")
    base = sm(sm(sm(seed & M64) ^ (field & M64)) ^ name_h)
    kh = sm(base ^ (key & M64))

    def d(p: int, j: int) -> float:
        cs = sm((kh + p * GAMMA) & M64)
        return ((sm((cs + j * GAMMA) & M64) >> 11) + 0.5) * 2.0**-53

    if kind == "zeros":
        return [0.0] * dim
    if kind == "uniform":
        return [scale * (2.0 * d(c, 0) - 1.0) for c in range(dim)]
    out = []
    for c in range(dim):
        p, which = divmod(c, 2)
        a = 0
        while True:
            r = math.sqrt(-2.0 * math.log(d(p, 2 * a)))
            z = r * turn(d(p, 2 * a + 1))[which]
            if kind == "normal" or abs(z) <= 2.0:
                break
            a += 1
        out.append(scale * z)
    return out


def test_splitmix64_known_answer() -> None:
    # first output of SplitMix64 seeded with 0 (Steele et al.; Java's SplittableRandom)
    assert splitmix64_py(0) == splitmix64_of(0) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("kind", ["zeros", "uniform", "normal", "truncated_normal"])
def test_matches_documented_formula(kind: str) -> None:
    keys = np.array([1, 2, (5 << 40) | 17, -3, 2**63 - 1, -(2**63) + 1], dtype=np.int64)
    init = Initializer(kind, 0.75)
    got = init.values(keys, 5, seed=42, field=7, block="embedding", dtype=np.float64)
    for i, k in enumerate(keys):
        ref = reference_init(kind, 0.75, 42, 7, "embedding", int(k), 5)
        np.testing.assert_allclose(got[i], ref, rtol=1e-13, atol=1e-15)


def _table(capacity: int, seed: int = 5, field: int = 3) -> EmbeddingTable:
    return EmbeddingTable(field=field, seed=seed, capacity=capacity, blocks=[
        BlockSpec("linear", 1, FTRL(0.1), Initializer("uniform", 0.1)),
        BlockSpec("embedding", 6, Adam(0.01), Initializer("truncated_normal", 0.05))])


def _values(table: EmbeddingTable, keys: np.ndarray) -> dict[str, np.ndarray]:
    rows = table.lookup(keys, insert=False)
    assert (rows >= 0).all()
    return {b: table.gather(b, keys, rows) for b in ("linear", "embedding")}


def test_independent_of_order_batching_capacity_and_rank() -> None:
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(1, 2**50, 5000))
    # "rank 0": one batch, tiny capacity (many rehashes); "rank 1": shuffled small batches, big capacity
    t0 = _table(capacity=16)
    t0.lookup(keys, insert=True, step=1)
    t1 = _table(capacity=1 << 16)
    shuffled = rng.permutation(np.repeat(keys, 2))
    for chunk in np.array_split(shuffled, 37):
        t1.lookup(chunk, insert=True, step=2)
    v0, v1 = _values(t0, keys), _values(t1, keys)
    for b in v0:
        np.testing.assert_array_equal(v0[b], v1[b])
        np.testing.assert_array_equal(v0[b], t0.initial_values(b, keys))
    # unknown keys in gather get the same values without being inserted
    fresh = keys + 1
    fresh = fresh[~np.isin(fresh, keys)]
    np.testing.assert_array_equal(t1.gather("embedding", fresh, np.full(fresh.size, -1)),
                                  t0.initial_values("embedding", fresh))
    # other seeds, fields and blocks give other values
    assert not np.array_equal(_table(16, seed=6).initial_values("embedding", keys), v0["embedding"])
    assert not np.array_equal(_table(16, field=4).initial_values("embedding", keys), v0["embedding"])


def test_column_values_do_not_depend_on_width() -> None:
    keys = np.arange(1, 200, dtype=np.int64)
    for kind in ("uniform", "normal", "truncated_normal"):
        wide = Initializer(kind, 1.0).values(keys, 9, seed=1, field=0, block="b", dtype=np.float64)
        narrow = Initializer(kind, 1.0).values(keys, 4, seed=1, field=0, block="b", dtype=np.float64)
        np.testing.assert_array_equal(wide[:, :4], narrow)


def test_distributions() -> None:
    keys = np.arange(1, 100_001, dtype=np.int64)
    u = Initializer("uniform", 0.5).values(keys, 4, seed=1, field=0, block="b", dtype=np.float64)
    assert np.abs(u).max() < 0.5 and abs(u.mean()) < 0.005 and abs(u.std() - 0.5 / math.sqrt(3)) < 0.003
    n = Initializer("normal", 2.0).values(keys, 4, seed=1, field=0, block="b", dtype=np.float64)
    assert abs(n.mean()) < 0.02 and abs(n.std() - 2.0) < 0.02
    assert abs(np.corrcoef(n[:, 0], n[:, 1])[0, 1]) < 0.01  # the cos/sin pair is independent
    t = Initializer("truncated_normal", 2.0).values(keys, 4, seed=1, field=0, block="b", dtype=np.float64)
    assert np.abs(t).max() <= 4.0 and abs(t.std() - 2.0 * 0.8796) < 0.02
    z = Initializer("zeros").values(keys, 3, seed=1, field=0, block="b")
    assert z.dtype == np.float32 and not z.any()
    with pytest.raises(ValueError):
        Initializer("gaussian", 1.0)
    with pytest.raises(ValueError):
        Initializer("normal", -1.0)
    assert Initializer.from_dict(Initializer("normal", 0.25).to_dict()) == Initializer("normal", 0.25)


def test_block_spec_validation() -> None:
    with pytest.raises(ValueError):
        BlockSpec("", 1, SGD(0.1), Initializer())
    with pytest.raises(ValueError):
        BlockSpec("x", 0, SGD(0.1), Initializer())
    with pytest.raises(TypeError):
        BlockSpec("x", 1, "sgd", Initializer())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        EmbeddingTable(0, [BlockSpec("x", 1, SGD(0.1), Initializer())] * 2, seed=0)


def test_elementary_functions_are_accurate() -> None:
    """The initializer's own ln and (cos, sin)(2 pi v) against long-double references: ln within
    1 ulp, cos/sin within 2.5 ulp (and 2e-16 absolute near their zeros), on random draws and the
    edges of the reductions (mantissa near sqrt(2)/2, quadrant boundaries, 0 and 1)."""
    from numba import njit

    from des.hashtable._libm import cos_sin_turn, log_unit

    @njit
    def evaluate(u: np.ndarray, out: np.ndarray) -> None:
        for i in range(u.shape[0]):
            out[0, i] = log_unit(u[i])
            out[1, i], out[2, i] = cos_sin_turn(u[i])

    rng = np.random.default_rng(3)
    draws = (rng.integers(0, 2**53, 200_000).astype(np.float64) + 0.5) * 2.0**-53
    edges = np.array([2.0**-54, 2.0**-53 * 1.5, 0.5, 1.0, 0.7071067811865475, 0.7071067811865476,
                      np.nextafter(0.125, 0), 0.125, 0.25, np.nextafter(0.25, 1), 0.375, 0.5 - 2**-54,
                      0.75, np.nextafter(0.875, 1), 1.0 - 2**-53])
    u = np.concatenate([draws, edges])
    out = np.empty((3, u.size))
    evaluate(u, out)
    ld = u.astype(np.longdouble)
    log_ulps = np.abs((out[0] - np.log(ld)) / np.spacing(np.abs(out[0])).astype(np.longdouble))
    assert float(log_ulps[out[0] != 0].max()) <= 1.0 and out[0][u == 1.0][0] == 0.0
    angle = 2 * np.longdouble("3.14159265358979323846264338327950288") * ld
    for got, want in ((out[1], np.cos(angle)), (out[2], np.sin(angle))):
        err = np.abs(got - want)
        assert float(err.max()) <= 2e-16
        big = np.abs(got) > 1e-3
        assert float((err[big] / np.spacing(np.abs(got[big]))).max()) <= 2.5


def test_initial_values_are_the_same_bits_everywhere() -> None:
    """Known answers (float64 bits) for a few keys: the construction, including the elementary
    functions, is fixed; a change here changes every table's initial values."""
    keys = np.array([1, -7, 2**62 + 3], dtype=np.int64)
    got = Initializer("normal", 1.0).values(keys, 3, seed=2, field=5, block="embedding", dtype=np.float64)
    assert [v.hex() for v in got.reshape(-1)] == KNOWN_NORMAL_BITS


KNOWN_NORMAL_BITS = ['0x1.6daaefe196b09p-1', '0x1.9866561302eb5p-4', '-0x1.0b7d476560261p+1',
                     '-0x1.a32781db71525p-4', '0x1.2829e6181540bp+0', '0x1.5efa22a0d491dp-1',
                     '-0x1.b7cb1a5d094d8p-1', '-0x1.438e42c96eb5dp+0', '0x1.38151d52dbad7p+1']


def test_the_tables_load_tensorflow_only_when_a_twin_is_called() -> None:
    """``des.hashtable`` and its initializer's TF twin (``tf_init.py``) import without TensorFlow:
    training never pays for it."""
    code = "import sys, des.hashtable, des.hashtable.tf_init; assert 'tensorflow' not in sys.modules, 'TF loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
