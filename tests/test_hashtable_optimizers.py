"""The optimizer kernels against Keras 3 optimizers on tf.Variables, for sparse table rows
(lazy, per-row) and for DenseOptimizerState, in float32 and float64.

Hyperparameters are exactly representable in float32 (0.125, 0.875, 1 - 2**-10, ...) because Keras
stores the learning rate in a float32 variable and casts Python-float constants through float32
even for float64 variables; with such values float64 agrees to 1e-12 and float32 bitwise (SGD,
AdaGrad, Adam). FTRL in float32 is compared relative to the weights' scale: Keras computes
n ** 0.5 with tf.pow, which is up to 2 ulp off on CPU, and FTRL's sqrt(n') - sqrt(n) cancels.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from des.hashtable import (FTRL, SGD, AdaGrad, Adam, BlockSpec, DenseOptimizerState, EmbeddingTable,
                           Initializer, RowwiseAdaGrad, RowwiseAdam, optimizer_from_dict, optimizer_from_spec)

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

B2 = 1.0 - 2.0**-10

CASES = {
    "sgd": (SGD(0.125), lambda: keras.optimizers.SGD(0.125)),
    "adagrad": (AdaGrad(0.125, initial_accumulator=0.125),
                lambda: keras.optimizers.Adagrad(0.125, initial_accumulator_value=0.125)),
    "adam": (Adam(0.0625, beta1=0.875, beta2=B2),
             lambda: keras.optimizers.Adam(0.0625, beta_1=0.875, beta_2=B2)),
    "ftrl": (FTRL(0.125, beta=1.0, l1=0.0625, l2=0.03125, initial_accumulator=0.125),
             lambda: keras.optimizers.Ftrl(0.125, beta=1.0, l1_regularization_strength=0.0625,
                                           l2_regularization_strength=0.03125,
                                           initial_accumulator_value=0.125)),
    "ftrl_no_reg": (FTRL(0.25, beta=0.5, initial_accumulator=0.125),
                    lambda: keras.optimizers.Ftrl(0.25, beta=0.5, initial_accumulator_value=0.125)),
}
# Keras slot variable name suffix -> our slot name, per optimizer kind
SLOT_NAMES = {"adagrad": {"accumulator": "accumulator"}, "adam": {"momentum": "m", "velocity": "v"},
              "ftrl": {"accumulator": "n", "linear": "z"}}


def assert_close(ours: np.ndarray, ref: np.ndarray, kind: str, dtype: type) -> None:
    if dtype == np.float64:
        np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(ref).max()))
    elif kind.startswith("ftrl"):
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6 * max(1.0, np.abs(ref).max()))
    else:
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=0)


def keras_slots(opt, kind: str) -> dict[str, np.ndarray]:
    out = {}
    for v in opt.variables:
        for suffix, name in SLOT_NAMES.get(kind, {}).items():
            if v.path.endswith("_" + suffix):
                out[name] = v.numpy()
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dense_state_matches_keras(case: str, dtype: type) -> None:
    opt, make_keras = CASES[case]
    rng = np.random.default_rng(1)
    p0 = rng.normal(size=(3, 5)).astype(dtype)
    ours = p0.copy()
    state = DenseOptimizerState(opt, p0.shape, dtype)
    var = tf.Variable(p0)
    kopt = make_keras()
    for _ in range(12):
        g = (rng.normal(size=p0.shape) * rng.choice([1e-3, 1.0, 10.0], size=p0.shape)).astype(dtype)
        state.apply(ours, g)
        kopt.apply([tf.constant(g)], [var])
    assert_close(ours, var.numpy(), case, dtype)
    ks = keras_slots(kopt, opt.kind)
    sd = state.state_dict()
    for name in opt.slot_names:
        assert_close(sd[name], ks[name], case, dtype)
    if opt.needs_step:
        assert state.step == 12 and int(sd["step"][0]) == 12


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sparse_rows_match_keras_lazily(case: str, dtype: type) -> None:
    """Each key is its own tf.Variable with its own Keras optimizer, stepped only when the key
    got gradients (so Adam's step count is per row), with the key's gradients summed first."""
    opt, make_keras = CASES[case]
    dim = 3
    table = EmbeddingTable(field=2, seed=11, dtype=dtype, capacity=16,
                           blocks=[BlockSpec("emb", dim, opt, Initializer("normal", 0.5))])
    rng = np.random.default_rng(7)
    universe = np.array([3, 10, 77, 2**40 + 5, -9, 123456789], dtype=np.int64)
    ref_vars: dict[int, tuple] = {}
    for step in range(8):
        keys = rng.choice(universe, size=int(rng.integers(1, 12)))  # duplicates on purpose
        rows = table.lookup(keys, insert=True, step=step)
        for k in np.unique(keys):
            if int(k) not in ref_vars:
                init = table.initial_values("emb", np.array([k]))[0]
                ref_vars[int(k)] = (tf.Variable(init), make_keras(), [0])
        scale = rng.choice([1e-2, 1.0], size=(keys.size, 1))
        grads = (rng.normal(size=(keys.size, dim)) * scale).astype(dtype)
        table.apply_gradients("emb", rows, grads, step)
        for k in np.unique(keys):
            g = np.zeros(dim, dtype=dtype)
            for i in np.flatnonzero(keys == k):  # occurrence order, in the table dtype
                g = g + grads[i]
            var, kopt, n = ref_vars[int(k)]
            kopt.apply([tf.constant(g)], [var])
            n[0] += 1
    keys = np.array(sorted(ref_vars), dtype=np.int64)
    rows = table.lookup(keys, insert=False)
    ours = table.gather("emb", keys, rows)
    for i, k in enumerate(keys):
        var, kopt, n = ref_vars[int(k)]
        assert_close(ours[i], var.numpy(), case, dtype)
        ks = keras_slots(kopt, opt.kind)
        data = table.arrays.blocks[0]
        for s, name in enumerate(opt.slot_names):
            assert_close(data[rows[i], dim * (s + 1):dim * (s + 2)], ks[name], case, dtype)
        if opt.needs_step:
            assert table.arrays.steps[0][rows[i]] == n[0] == int(kopt.iterations.numpy())


def test_dense_state_dict_round_trip_continues_identically() -> None:
    opt = Adam(0.01)
    rng = np.random.default_rng(3)
    grads = rng.normal(size=(10, 4, 2)).astype(np.float32)
    a = np.ones((4, 2), np.float32)
    sa = DenseOptimizerState(opt, a.shape)
    for g in grads:
        sa.apply(a, g)
    b = np.ones((4, 2), np.float32)
    sb = DenseOptimizerState(opt, b.shape)
    for g in grads[:5]:
        sb.apply(b, g)
    sc = DenseOptimizerState(opt, b.shape)
    sc.load_state_dict(sb.state_dict())
    for g in grads[5:]:
        sc.apply(b, g)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        sc.load_state_dict({"m": np.zeros((4, 2))})
    with pytest.raises(ValueError):
        sc.apply(b.astype(np.float64), grads[0])
    with pytest.raises(ValueError):
        sc.apply(b, grads[0][:2])
    with pytest.raises(ValueError):
        sc.apply(np.asfortranarray(np.ones((4, 2), np.float32))[:, :1], grads[0][:, :1])


@pytest.mark.parametrize("opt", [Adam(0.01), FTRL(0.05, 1.0, 1.0, 0.5, 0.0)], ids=["adam", "ftrl"])
def test_a_weights_state_saved_per_slice_continues_identically(opt) -> None:
    """A field weight ``[fields, k, H]`` has one state (one kernel call per step) that checkpoints
    save per field slice: states rebuilt from the slices, in another grouping of the fields (another
    rank count), continue exactly as one state per slice would."""
    rng = np.random.default_rng(5)
    grads = rng.normal(size=(8, 3, 2, 4))
    whole, w = DenseOptimizerState(opt, (3, 2, 4), np.float64), np.ones((3, 2, 4))
    per_field = [DenseOptimizerState(opt, (2, 4), np.float64) for _ in range(3)]
    v = np.ones((3, 2, 4))
    for g in grads[:4]:
        whole.apply(w, g)
        for j in range(3):
            per_field[j].apply(v[j], g[j])
    np.testing.assert_array_equal(w, v)
    for j in range(3):
        saved = whole.slice(j).state_dict()
        assert saved.keys() == per_field[j].state_dict().keys()
        for key, value in per_field[j].state_dict().items():
            np.testing.assert_array_equal(saved[key], value)
    # fields 2 and 0 regrouped into one weight (e.g. on another rank count)
    regrouped, r = DenseOptimizerState(opt, (2, 2, 4), np.float64), w[[2, 0]].copy()
    for j, field in enumerate((2, 0)):
        regrouped.slice(j).load_state_dict(whole.slice(field).state_dict())
    for g in grads[4:]:
        whole.apply(w, g)
        regrouped.apply(r, g[[2, 0]])
    np.testing.assert_array_equal(r, w[[2, 0]])
    with pytest.raises(ValueError, match="slot"):
        regrouped.slice(0).load_state_dict({k: np.zeros(3) for k in whole.slice(0).state_dict()})


@pytest.mark.parametrize("opt", [SGD(0.1), AdaGrad(0.05, 0.2, 1e-8), Adam(1e-3, 0.8, 0.99, 1e-8),
                                 FTRL(0.05, 1.0, 1.0, 0.5, 0.0), RowwiseAdaGrad(0.05, 0.1, 1e-6),
                                 RowwiseAdam(1e-3, 0.8, 0.99, 1e-8)])
def test_to_dict_round_trip(opt) -> None:
    import json
    d = json.loads(json.dumps(opt.to_dict()))
    assert optimizer_from_dict(d) == opt


def test_from_spec() -> None:
    assert optimizer_from_spec("adam:lr=0.001") == Adam(0.001)
    assert optimizer_from_spec("ftrl:alpha=0.05,l1=1") == FTRL(0.05, l1=1.0)
    assert optimizer_from_spec(" SGD : lr=0.5 ") == SGD(0.5)
    assert optimizer_from_spec("adagrad:lr=0.1,initial_accumulator=0") == AdaGrad(0.1, 0.0)
    assert Adam(0.1).num_slots == 2 and FTRL(0.1).num_slots == 2 and SGD(0.1).num_slots == 0
    for bad in ["adam", "nope:lr=1", "adam:lr", "adam:lr=x", "adam:lr=0.1,foo=2", "sgd:lr=-1",
                "adam:lr=0.1,beta1=1"]:
        with pytest.raises(ValueError):
            optimizer_from_spec(bad)
    with pytest.raises(ValueError, match=r"rowwise_adagrad needs lr= \(e.g. rowwise_adagrad:lr=0.05\)"):
        optimizer_from_spec("rowwise_adagrad")  # a required rate named, not a TypeError


def test_ftrl_computes_w_where_it_is_a_function_of_z_and_n() -> None:
    """FTRL rows hold z and n only on a zeros-initialized block (w = 0 at z = 0), unless store_w=1 or
    the formula is 0/0 on a new row (no initial_accumulator, beta nor l2); table files of earlier
    versions (no store_w) stored w."""
    assert optimizer_from_spec("ftrl:alpha=0.05,store_w=1") == FTRL(0.05, store_w=1.0)
    assert FTRL(0.05).computes_values(True) and not FTRL(0.05).computes_values(False)
    assert not FTRL(0.05, store_w=1).computes_values(True)
    assert not FTRL(0.05, beta=0.0, initial_accumulator=0.0).computes_values(True)
    assert FTRL(0.05, beta=0.0, initial_accumulator=0.0, l2=0.5).computes_values(True)
    assert not any(o.computes_values(True) for o in (SGD(0.1), AdaGrad(0.1), Adam(0.1)))
    assert FTRL(0.05).stored_values(True) == FTRL(0.05, store_w=1) and Adam(0.1).stored_values(True) == Adam(0.1)
    saved = {"type": "ftrl", "alpha": 0.05}
    assert optimizer_from_dict(saved) == FTRL(0.05) and optimizer_from_dict(saved, saved=True) == FTRL(0.05, store_w=1)
    with pytest.raises(ValueError, match="store_w must be 0 or 1"):
        optimizer_from_spec("ftrl:alpha=0.05,store_w=2")


def _rowwise_reference(opt, w, slots, t, g):
    """FBGEMM's row-wise AdaGrad / partial row-wise Adam on one row, written out in ``w``'s dtype:
    the mean square is the sum in column order over ``dim``."""
    dt = w.dtype.type
    ms = g[0] * g[0]
    for x in g[1:]:
        ms = ms + x * x
    ms = ms / dt(g.shape[0])
    if opt.kind == "rowwise_adagrad":
        a = slots[0] + ms
        return w - g * (dt(opt.lr) / (np.sqrt(a) + dt(opt.epsilon))), (a,)
    b1, b2, lr, eps = dt(opt.beta1), dt(opt.beta2), dt(opt.lr), dt(opt.epsilon)
    alpha = lr * np.sqrt(dt(1) - b2 ** dt(t)) / (dt(1) - b1 ** dt(t))
    v = slots[1] + (ms - slots[1]) * dt(1.0 - opt.beta2)
    m = slots[0] + (g - slots[0]) * dt(1.0 - opt.beta1)
    return w - (m * alpha) / (np.sqrt(v) + eps), (m, v)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opt", [RowwiseAdaGrad(0.125, initial_accumulator=0.125), RowwiseAdam(0.0625, 0.875, B2)],
                         ids=["rowwise_adagrad", "rowwise_adam"])
def test_rowwise_optimizers_keep_one_value_per_row(opt, dtype: type) -> None:
    """Row-wise AdaGrad and partial row-wise Adam on sparse rows (lazy, per-row step count) equal the
    written-out FBGEMM formulas; the row-wise slot is one column of the row (the row is 4 B
    shorter per dim-1 columns than its per-element twin)."""
    dim = 5
    table = EmbeddingTable(field=2, seed=11, dtype=dtype, capacity=16,
                           blocks=[BlockSpec("emb", dim, opt, Initializer("normal", 0.5))])
    assert table.blocks[0].width == {"rowwise_adagrad": dim + 1, "rowwise_adam": 2 * dim + 1}[opt.kind]
    rng = np.random.default_rng(7)
    universe = np.array([3, 10, 77, 2**40 + 5, -9], dtype=np.int64)
    ref: dict[int, list] = {}
    for step in range(8):
        keys = rng.choice(universe, size=int(rng.integers(1, 9)))
        rows = table.lookup(keys, insert=True, step=step)
        grads = (rng.normal(size=(keys.size, dim)) * rng.choice([1e-2, 1.0], size=(keys.size, 1))).astype(dtype)
        table.apply_gradients("emb", rows, grads, step)
        for k in np.unique(keys):
            w0 = table.initial_values("emb", np.array([k]))[0]
            init = [np.zeros(dim, dtype), np.zeros((), dtype)] if opt.kind == "rowwise_adam" else \
                [np.full((), opt.initial_accumulator, dtype)]
            w, slots, t = ref.setdefault(int(k), [w0, tuple(init), 0])
            g = np.zeros(dim, dtype=dtype)
            for i in np.flatnonzero(keys == k):
                g = g + grads[i]
            ref[int(k)] = [*_rowwise_reference(opt, w, slots, t + 1, g), t + 1]
    keys = np.array(sorted(ref), dtype=np.int64)
    rows = table.lookup(keys, insert=False)
    values, slots = table.blocks[0].columns(table.arrays.blocks[0])
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(rtol=2e-6, atol=1e-7)
    for i, k in enumerate(keys):
        w, want, t = ref[int(k)]
        np.testing.assert_allclose(values[rows[i]], w, **tol)
        for got, exp in zip(slots, want):
            np.testing.assert_allclose(got[rows[i]], np.broadcast_to(exp, got[rows[i]].shape), **tol)
        if opt.needs_step:
            assert table.arrays.steps[0][rows[i]] == t
    assert [s.shape[1] for s in slots] == list(opt.slot_widths(dim))


def test_rowwise_optimizers_refuse_dense_weights_and_catchup() -> None:
    with pytest.raises(ValueError, match="rowwise_adam cannot take catchup=1"):
        optimizer_from_spec("rowwise_adam:lr=0.01,catchup=1")
    with pytest.raises(ValueError, match="embedding rows, not dense"):
        DenseOptimizerState(RowwiseAdaGrad(0.1), (3, 4))
    assert optimizer_from_spec("rowwise_adagrad:lr=0.1") == RowwiseAdaGrad(0.1)
    assert optimizer_from_spec("partial_rowwise_adam:lr=0.1") == RowwiseAdam(0.1)


def test_catchup_adam_equals_dense_adam_on_sparse_gradients() -> None:
    """``adam:catchup=1``: rows touched now and then, caught up lazily (on their next touch and by
    ``catch_up`` at the end), end where TensorFlow's dense Adam puts every row of the table after the
    same steps (a row without a gradient gets a zero gradient; float64)."""
    rng = np.random.default_rng(0)
    opt = Adam(0.01, catchup=1)
    R, D, T = 12, 3, 40
    w0 = rng.normal(size=(R, D))
    w, m, v, last = w0.copy(), np.zeros((R, D)), np.zeros((R, D)), np.zeros(R, np.int32)
    dw, dm, dv = w0.copy(), np.zeros((R, D)), np.zeros((R, D))
    seen = np.zeros(R, bool)
    for t in range(1, T + 1):
        rows = np.sort(rng.choice(R, size=3, replace=False)).astype(np.int64)
        g = rng.normal(size=(3, D))
        opt.apply_rows(w, (m, v), last, rows, g, step=t)
        seen[rows] = True
        full = np.zeros((R, D))
        full[rows] = g
        dm = dm + (full - dm) * 0.1
        dv = dv + (full * full - dv) * (1 - 0.999)
        alpha = 0.01 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        moved = seen[:, None]  # a row never touched has m = v = 0 in both
        dw = np.where(moved, dw - dm * alpha / (np.sqrt(dv) + 1e-7), dw)
    opt.catch_up(w, (m, v), last, R, T)
    np.testing.assert_allclose(w, dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m, dm, rtol=1e-12, atol=1e-15)
    assert optimizer_from_spec("adam:lr=0.001,catchup=1") == Adam(0.001, catchup=1)


def test_catchup_adam_past_the_horizon_and_wide_rows() -> None:
    """Rows idle longer than the horizon (~351 steps at the defaults: only the moments decay past
    it) and rows wider than a SIMD register (the catch-up runs a row's columns as SIMD lanes)
    still end where dense Adam puts them (float64)."""
    rng = np.random.default_rng(1)
    opt = Adam(0.01, catchup=1)
    assert 300 < opt.horizon() < 400
    R, D, T = 4, 19, 900
    touch = {1: [0, 1, 2, 3], 2: [0], 500: [1, 2], 880: [0, 2, 3]}  # row 3 idle 878 steps, row 1 400
    w0 = rng.normal(size=(R, D))
    w, m, v, last = w0.copy(), np.zeros((R, D)), np.zeros((R, D)), np.zeros(R, np.int32)
    dw, dm, dv = w0.copy(), np.zeros((R, D)), np.zeros((R, D))
    for t in range(1, T + 1):
        full = np.zeros((R, D))
        if t in touch:
            rows = np.array(touch[t], dtype=np.int64)
            g = rng.normal(size=(rows.size, D))
            opt.apply_rows(w, (m, v), last, rows, g, step=t)
            full[rows] = g
        dm = dm + (full - dm) * 0.1
        dv = dv + (full * full - dv) * (1 - 0.999)
        alpha = 0.01 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        dw = dw - dm * alpha / (np.sqrt(dv) + 1e-7)
    opt.catch_up(w, (m, v), last, R, T)
    np.testing.assert_allclose(w, dw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m, dm, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(v, dv, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dim", [1, 8, 19])
def test_catchup_of_many_rows_at_once_equals_one_row_at_a_time(dtype, dim) -> None:
    """The catch-up steps all the rows of an update (and of a flush) together, ordered by their
    last update and grouped (more rows than one group here). Each row must end bit for bit where
    it ends caught up alone: rows never updated, updated the step before, idle for a few steps
    and past the horizon, in any order."""
    from des.hashtable import optimizers as O

    rng = np.random.default_rng(dim)
    opt, t, R = Adam(0.01, catchup=1), 2000, 2500
    assert R > O._CATCH_UP_GROUP
    w0 = rng.normal(size=(R, dim)).astype(dtype)
    m0 = (rng.normal(size=(R, dim)) * 1e-3).astype(dtype)
    v0 = (rng.random(size=(R, dim)) * 1e-5).astype(dtype)
    code, hp, alphas, t_step, horizon = opt.kernel_args(np.dtype(dtype), 1.0, t)
    assert code == O.ADAM_CATCHUP_ROWS and 300 < horizon < 400
    idle = rng.choice([0, 1, 2, 5, 40, horizon - 1, horizon, horizon + 1, 1500], size=R)
    last0 = np.where(rng.random(R) < 0.05, 0, t - 1 - idle).astype(np.int32)  # 0: never updated
    rows = rng.permutation(R).astype(np.int64)
    g = rng.normal(size=(R, dim)).astype(dtype)

    def state():
        return w0.copy(), m0.copy(), v0.copy(), last0.copy()

    together, alone = state(), state()
    opt.apply_rows(together[0], together[1:3], together[3], rows, g, 1.0, t)  # the kernel_args above
    for i, r in enumerate(rows):
        opt.apply_rows(alone[0], alone[1:3], alone[3], rows[i:i + 1], g[i:i + 1], 1.0, t)
    for a, b in zip(together, alone):
        assert a.tobytes() == b.tobytes()
    assert (together[3][rows] == t).all()

    flushed, moved = _flush_together_and_alone(opt, state(), t)
    assert (flushed[3][moved] == t).all() and not np.array_equal(flushed[0][moved], w0[moved])


@pytest.mark.parametrize("n, low, upto", [(0, 1, 5), (1, 5, 5), (2600, 700, 1000), (5000, 1, 400),
                                           (40, 1, 10**7), (3000, 1, 10**6)])
def test_the_catchups_row_order_is_a_stable_sort_by_last_update(n, low, upto) -> None:
    """The catch-up takes its rows in the order of a stable sort by their last update (a counting
    sort over a short span of steps, a merge sort over a long one): NumPy's stable argsort."""
    from des.hashtable.optimizers import _stable_order

    rng = np.random.default_rng(n)
    since = rng.integers(low, upto + 1, n).astype(np.int64)
    since[rng.random(n) < 0.4] = upto  # many rows tie (nothing skipped)
    assert np.array_equal(_stable_order(since, upto), np.argsort(since, kind="mergesort"))


def _flush_together_and_alone(opt: Adam, state: tuple, t: int) -> tuple[tuple, np.ndarray]:
    """``opt.catch_up`` to step ``t`` of the table ``state`` (w, m, v, last), asserting that it
    equals each row caught up alone, bytewise; returns the flushed state and the rows it moved."""
    w, m, v, last = state
    last0, rows = last.copy(), len(last)
    alone = w.copy(), m.copy(), v.copy(), last.copy()
    opt.catch_up(w, (m, v), last, rows, t)
    for r in range(rows):
        opt.catch_up(alone[0][r:r + 1], (alone[1][r:r + 1], alone[2][r:r + 1]), alone[3][r:r + 1], 1, t)
    for a, b in zip(state, alone):
        assert a.tobytes() == b.tobytes()
    return state, (last0 > 0) & (last0 < t)


def test_catchup_flush_across_its_chunks_equals_one_row_at_a_time() -> None:
    """The flush before evaluation collects the rows to catch up in chunks (``_CATCH_UP_CHUNK``
    rows): a table of more rows than a chunk, rows to move on both sides of the boundary and in
    the last partial chunk, ends bit for bit as each row caught up alone."""
    from des.hashtable import optimizers as O

    rng = np.random.default_rng(7)
    opt, t, R, dim = Adam(0.01, catchup=1), 600, O._CATCH_UP_CHUNK + 3000, 2
    w0 = rng.normal(size=(R, dim))
    m0, v0 = rng.normal(size=(R, dim)) * 1e-3, rng.random(size=(R, dim)) * 1e-5
    last0 = np.where(rng.random(R) < 0.3, 0, t - rng.integers(0, 500, R)).astype(np.int32)  # 0 and t: stay
    flushed, moved = _flush_together_and_alone(opt, (w0.copy(), m0.copy(), v0.copy(), last0.copy()), t)
    assert moved[:O._CATCH_UP_CHUNK].any() and moved[O._CATCH_UP_CHUNK:].any()
    assert (flushed[3][moved] == t).all() and (flushed[0][moved] != w0[moved]).all()
    assert np.array_equal(flushed[0][~moved], w0[~moved])


def test_division_is_ieee_as_in_tensorflow() -> None:
    """The kernels divide as TensorFlow does (numba's numpy error model: 0/0 is NaN, no exception),
    which is also what lets LLVM vectorize them: Adam with epsilon 0 on a zero gradient gives NaN
    in Keras and here, sparse and dense."""
    opt, keras_opt = Adam(0.125, epsilon=0.0), keras.optimizers.Adam(0.125, epsilon=0.0)
    var = tf.Variable(np.ones((1, 4)))
    keras_opt.apply_gradients([(tf.constant(np.zeros((1, 4))), var)])
    assert np.isnan(var.numpy()).all()
    w, slots, steps = np.ones((3, 4)), (np.zeros((3, 4)), np.zeros((3, 4))), np.zeros(3, np.int32)
    opt.apply_rows(w, slots, steps, np.array([1], np.int64), np.zeros((1, 4)))
    assert np.isnan(w[1]).all() and (w[[0, 2]] == 1).all()
    dense = np.ones(5)
    DenseOptimizerState(opt, 5, np.float64).apply(dense, np.zeros(5))
    assert np.isnan(dense).all()
