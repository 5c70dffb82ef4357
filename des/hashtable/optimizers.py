"""Optimizers for sparse embedding rows and for dense parameters, one row loop each.

Every optimizer is a frozen dataclass (its hyperparameters) plus one inlined row loop that updates
a set of rows of a 2-D parameter ``w[R, D]`` in place, given one (already summed) gradient row per
updated row; :func:`update_rows` dispatches on the optimizer's code. The sparse
:class:`~des.hashtable.table.EmbeddingTable` runs it on the unique rows of a batch, the fused shard
kernels (``fused.py``) on those of every field, and :class:`DenseOptimizerState` on the flattened
parameter as a single row ``w[1, P]``, so the update math exists exactly once.

The kernels reproduce Keras 3 (``keras/src/optimizers/{sgd,adagrad,adam,ftrl}.py``) operation by
operation, in the parameter's dtype (float32 arithmetic for float32 parameters, like TensorFlow),
so a row updated here equals ``keras.optimizers.X`` applied to a ``tf.Variable`` holding that row.
Notation: ``w`` parameter, ``g`` gradient, ``lr`` learning rate, ``t`` step count (from 1).

* SGD:      ``w <- w - g * lr``
* AdaGrad:  ``a <- a + g^2``;  ``w <- w - lr * g / sqrt(a + eps)``
  (Keras puts epsilon inside the square root; ``a`` starts at ``initial_accumulator``)
* Adam:     ``m <- m + (g - m)(1 - b1)``;  ``v <- v + (g^2 - v)(1 - b2)``;
  ``alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)``;  ``w <- w - m * alpha / (sqrt(v) + eps)``
  (Kingma & Ba 2015, "epsilon-hat" form as in Keras). Sparse rows are *lazy*: ``t`` is a per-row
  counter that advances only when the row gets a gradient, as if each row had its own Keras Adam.
  With ``catchup=1`` sparse rows follow Keras' dense semantics instead (every row of the table
  steps every step, ``t`` global): a row takes the zero-gradient steps it skipped when it is next
  touched, and :meth:`Adam.catch_up` brings all rows to the current step before evaluation.
* Row-wise AdaGrad (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``): one accumulator per row,
  ``a <- a + mean_j(g_j^2)``;  ``w <- w - g * lr / (sqrt(a) + eps)`` (epsilon outside the root, as
  FBGEMM; ``a`` starts at ``initial_accumulator``, 0 by default). 4 bytes of state per row.
* Partial row-wise Adam (FBGEMM's ``PARTIAL_ROWWISE_ADAM``): ``m`` per element as Adam's, ``v`` one
  per row fed with ``mean_j(g_j^2)``;  ``w <- w - m * alpha / (sqrt(v) + eps)``, ``alpha`` and the
  lazy per-row ``t`` as Adam's. ``catchup=1`` is refused: TensorFlow's dense Adam has a second
  moment per element, which a row-wise ``v`` cannot replay.
  The mean over a row's columns is the sum in column order divided by ``dim`` in the parameter's
  dtype: a row is owned by one rank, so it is the same on any number of ranks.
* FTRL-proximal (McMahan et al. 2013, "Ad Click Prediction: a View from the Trenches", Alg. 1,
  with Keras' parametrization and learning_rate_power = -1/2): slots ``z`` (Keras "linear") and
  ``n`` (Keras "accumulator", starts at ``initial_accumulator``),
  ``n' = n + g^2``;  ``sigma = (sqrt(n') - sqrt(n)) / alpha``;  ``z <- z + g - sigma * w``;
  ``w <- (clip(z, -l1, l1) - z) / (sqrt(n') / alpha + 2 * (l2 + beta / (2 alpha)))``;  ``n <- n'``.
  That is McMahan's ``w = -(z - sgn(z) l1) / ((beta + sqrt(n)) / alpha + lambda2)`` for
  ``|z| > l1`` (else 0) with ``lambda2 = 2 * l2`` (Keras' ``l2_regularization_strength``).
  ``w`` is a pure function of (z, n) (:func:`ftrl_weight`), so a table row of a zeros-initialized
  block holds only z and n (``store_w=0``, the default; ``BlockSpec.computed``): the update
  computes the old w from the old z and n (the bits it would have stored) and writes no w, every
  reader computes w the same way (McMahan's Algorithm 1 computes w at prediction time too).
  ``store_w=1`` stores w, as a rate schedule needs (the formula takes the rate).
  Keras evaluates ``n ** 0.5`` with ``tf.pow``, which on CPU is off by up to 2 ulp in float32;
  the kernel uses the correctly rounded ``sqrt``, so float32 FTRL agrees with Keras to about 1e-6
  of the weights' scale rather than bitwise (float64: ~1e-13; SGD, AdaGrad, Adam: bitwise).

Keras rounds some Python-float hyperparameters to float32 even for float64 variables (the learning
rate variable, ``Constant`` initial accumulators, ``cast(beta_1)`` inside Adam's powers), so a
float64 comparison with Keras is exact only for values representable in float32 (0.125, 0.875...).

Hyperparameters reach the kernels as a small array of the parameter dtype, so that no float64
constant promotes float32 arithmetic (numba follows numpy's scalar promotion rules).

The kernels are compiled with ``error_model="numpy"``: IEEE division as in TensorFlow (``0/0`` is
NaN, never an exception; possible only with ``epsilon=0`` or FTRL without ``beta``, ``l2`` and
initial accumulator), and no zero-division check per division, which would keep LLVM from turning
the column loops into SIMD (the results are the same either way).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any, ClassVar, NamedTuple, Union

import numpy as np
from numba import njit

from ._prefetch import prefetch1, prefetch2

_PF = 16  # rows prefetched ahead: a sparse update touches random rows of a large table
_ADAM_MEMO = 1024  # Adam step counts whose bias correction is memoized within one call
_ALPHA_CACHE: dict[tuple, np.ndarray] = {}  # catch-up Adam: bias corrections by global step

# --------------------------------------------------------------------------------------------
# kernels: w[R, D] (any strides), slot arrays shaped like w, rows[n] int64 (unique, >= 0),
# g[n, D] summed gradients, hp[...] hyperparameters in w's dtype.
# --------------------------------------------------------------------------------------------


@njit(inline="always", nogil=True)
def _prefetch_ahead(w, slot, rows, i, n):
    """Prefetch the weight row and the (last) slot row PF rows ahead: a row and its slots are
    co-located, so the pair spans two cache lines (near the end, the last row again). Without a
    branch: with its arrays used only under one, numba counted references to them on every row,
    atomic operations that cost an FTRL row 3x its time on a Xeon (the row loops below call
    helpers of scalars or of arrays without a branch, and compute per call what needs one per
    row: docs/design.md, "no reference counting in a row loop")."""
    r = rows[min(i + _PF, n - 1)]
    prefetch2(w, r, 0)
    prefetch2(slot, r, slot.shape[1] - 1)


@njit(inline="always", nogil=True)
def _accumulate_square(acc, r, j, gj):
    """``acc[r, j] += gj²`` (AdaGrad's accumulator, FTRL's ``n``); returns the old and new value."""
    old = acc[r, j]
    new = old + gj * gj
    acc[r, j] = new
    return old, new


# Row loops, inlined into the one update kernel below (dense parameters, one table's rows) and into
# the fused per-shard kernel (``fused.py``): the math of each optimizer exists once.


@njit(inline="always", nogil=True)
def _sgd_rows(w, rows, g, hp):
    lr = hp[0]
    n = rows.shape[0]
    for i in range(n):
        if i + _PF < n:
            prefetch2(w, rows[i + _PF], 0)
        r = rows[i]
        for j in range(w.shape[1]):
            w[r, j] = w[r, j] - g[i, j] * lr


@njit(inline="always", nogil=True)
def _adagrad_rows(w, acc, rows, g, hp):
    lr, eps = hp[0], hp[1]
    n = rows.shape[0]
    for i in range(n):
        _prefetch_ahead(w, acc, rows, i, n)
        r = rows[i]
        for j in range(w.shape[1]):
            a = _accumulate_square(acc, r, j, g[i, j])[1]
            w[r, j] = w[r, j] - (lr * g[i, j]) / np.sqrt(a + eps)


@njit(inline="always", nogil=True)
def _adam_alphas(steps, rows, hp, dtype):
    """Each row's step count advanced by one, and its bias-corrected rate
    ``lr * sqrt(1 - b2^t) / (1 - b1^t)`` (in ``rows``' order), memoized for small ``t`` (two pow()
    per row would dominate; the same values). A pass of its own before the rows' updates."""
    lr, b1, b2, one = hp[0], hp[1], hp[2], hp[6]
    tmp = np.empty(1, dtype)
    memo = np.zeros(_ADAM_MEMO, dtype)
    n = rows.shape[0]
    out = np.empty(n, dtype)
    for i in range(n):
        if i + _PF < n:
            prefetch1(steps, rows[i + _PF])
        t = steps[rows[i]] + 1
        steps[rows[i]] = t
        if t < _ADAM_MEMO and memo[t] != 0:
            out[i] = memo[t]
            continue
        tmp[0] = t  # int -> parameter dtype without a float64 detour
        tf = tmp[0]
        alpha = lr * np.sqrt(one - b2 ** tf) / (one - b1 ** tf)
        if t < _ADAM_MEMO:
            memo[t] = alpha
        out[i] = alpha
    return out


@njit(inline="always", nogil=True)
def _adam_rows(w, m, v, steps, rows, g, hp):
    omb1, omb2, eps = hp[3], hp[4], hp[5]
    alphas = _adam_alphas(steps, rows, hp, w.dtype)
    n = rows.shape[0]
    for i in range(n):
        _prefetch_ahead(w, v, rows, i, n)
        r = rows[i]
        for j in range(w.shape[1]):
            w[r, j], m[r, j], v[r, j] = _adam_values(w[r, j], m[r, j], v[r, j], g[i, j], alphas[i], omb1, omb2, eps)


@njit(inline="always", nogil=True)
def _mean_squares(g, dtype):
    """``mean_j g[i, j]^2`` of each row ``i``: the sum in column order, divided by the row's width
    in g's dtype."""
    tmp = np.empty(1, dtype)
    tmp[0] = g.shape[1]
    out = np.empty(g.shape[0], dtype)
    for i in range(g.shape[0]):
        s = g[i, 0] * g[i, 0]
        for j in range(1, g.shape[1]):
            s += g[i, j] * g[i, j]
        out[i] = s / tmp[0]
    return out


@njit(inline="always", nogil=True)
def _rowwise_adagrad_rows(w, acc, rows, g, hp):
    lr, eps = hp[0], hp[1]
    squares = _mean_squares(g, w.dtype)
    n = rows.shape[0]
    for i in range(n):
        if i + _PF < n:
            prefetch2(w, rows[i + _PF], 0)
        r = rows[i]
        a = acc[r, 0] + squares[i]
        acc[r, 0] = a
        rate = lr / (np.sqrt(a) + eps)
        for j in range(w.shape[1]):
            w[r, j] = w[r, j] - g[i, j] * rate


@njit(inline="always", nogil=True)
def _rowwise_adam_rows(w, m, v, steps, rows, g, hp):
    omb1, omb2, eps = hp[3], hp[4], hp[5]
    alphas = _adam_alphas(steps, rows, hp, w.dtype)
    squares = _mean_squares(g, w.dtype)
    n = rows.shape[0]
    for i in range(n):
        _prefetch_ahead(w, m, rows, i, n)
        r = rows[i]
        alpha = alphas[i]
        vr = v[r, 0] + (squares[i] - v[r, 0]) * omb2
        v[r, 0] = vr
        denominator = np.sqrt(vr) + eps
        for j in range(w.shape[1]):
            mj = m[r, j] + (g[i, j] - m[r, j]) * omb1
            m[r, j] = mj
            w[r, j] = w[r, j] - (mj * alpha) / denominator


@njit(inline="always", nogil=True)
def _adam_values(wj, mj, vj, gj, alpha, omb1, omb2, eps):
    """One value's Adam update with gradient ``gj`` and bias-corrected rate ``alpha``: its new
    ``(w, m, v)`` (scalars: the row loops index the arrays themselves)."""
    mj = mj + (gj - mj) * omb1
    vj = vj + (gj * gj - vj) * omb2
    return wj - (mj * alpha) / (np.sqrt(vj) + eps), mj, vj


@njit(nogil=True, error_model="numpy")
def _adam_catchup_rows(w, m, v, last, rows, g, hp, alphas, t, horizon):
    """Adam with TensorFlow's dense semantics on sparse rows, lazily: ``last[r]`` is the global step
    of row r's last update. Before its update at global step ``t`` a row first takes the zero-
    gradient steps it skipped (``last[r]+1 .. t-1``: moments decay, the row keeps moving with its
    momentum), as ``tf.keras`` Adam moves every row of an embedding table on every step. Steps
    more than ``horizon`` after the last gradient move a row by < 1e-16 of its update and only
    decay the moments. ``alphas[s] = sqrt(1 - b2^s) / (1 - b1^s)`` (global bias correction)."""
    _catch_up(w, m, v, last, rows, t, g, True, hp, alphas, horizon)


#: rows caught up together (their m, v, w copied side by side: 3 x rows x dim values)
_CATCH_UP_CHUNK = 1 << 14
#: rows that take their skipped steps together, step after step (similar ``last``: sorted)
_CATCH_UP_GROUP = 1024


@njit(cache=True, nogil=True, error_model="numpy")
def _adam_flush_kernel(w, m, v, last, n_rows, hp, alphas, t, horizon):
    """Every row of ``[0, n_rows)`` takes its skipped zero-gradient steps up to ``t`` (before
    evaluation or a checkpoint: the table then holds what dense Adam holds after step ``t``)."""
    rows = np.empty(_CATCH_UP_CHUNK, np.int64)
    k = 0
    for r in range(n_rows):
        if last[r] > 0 and last[r] < t:
            rows[k] = r
            k += 1
        if k == _CATCH_UP_CHUNK or (r == n_rows - 1 and k > 0):
            # as if their next step were t + 1, with no gradient
            _catch_up(w, m, v, last, rows[:k], t + 1, w, False, hp, alphas, horizon)
            k = 0


@njit(nogil=True, error_model="numpy")
def catch_up_rows(w, m, v, last, rows, args):
    """Rows ``rows`` (distinct) take the zero-gradient steps they skipped up to global step
    ``t - 1`` (``args``: ``catch_up_args``' :class:`StepArgs`), as before a checkpoint, here before
    the rows are read for a step's forward: the values a dense Adam would hold then. Only the rows
    that skipped steps are passed on (most of a batch's rows were updated the step before)."""
    hp, alphas, t, horizon = args.hp, args.alphas, args.t, args.horizon
    behind = np.empty(rows.shape[0], np.int64)
    k = 0
    for i in range(rows.shape[0]):
        if i + _PF < rows.shape[0]:
            prefetch1(last, rows[i + _PF])
        lr_i = last[rows[i]]
        if lr_i != 0 and lr_i < t - 1:
            behind[k] = rows[i]
            k += 1
    _catch_up(w, m, v, last, behind[:k], t, w, False, hp, alphas, horizon)


@njit(nogil=True, error_model="numpy")
def _zero_gradient_step(mm, vv, ww, b1, b2, rate, eps):
    """One zero-gradient Adam step of the values ``mm``, ``vv``, ``ww`` (1-D, contiguous)."""
    for e in range(mm.shape[0]):
        mj = mm[e] * b1
        vj = vv[e] * b2
        mm[e] = mj
        vv[e] = vj
        ww[e] = ww[e] - (mj * rate) / (np.sqrt(vj) + eps)


@njit(nogil=True)
def _stable_order(since, upto):
    """``np.argsort(since, kind="mergesort")`` for values ``<= upto``: a counting sort (stable,
    so the same order) when they span at most a few times as many steps as there are values (a
    step's rows: one linear pass instead of a sort), else the merge sort."""
    n = since.shape[0]
    low = upto
    for i in range(n):
        low = min(low, since[i])
    span = upto - low + 1
    if span > 4 * n + 1024:
        return np.argsort(since, kind="mergesort")
    start = np.zeros(span + 1, np.int64)
    for i in range(n):
        start[since[i] - low + 1] += 1
    for k in range(span):
        start[k + 1] += start[k]
    order = np.empty(n, np.int64)
    for i in range(n):
        k = since[i] - low
        order[start[k]] = i
        start[k] += 1
    return order


@njit(nogil=True, error_model="numpy")
def _catch_up(w, m, v, last, rows, t, g, step, hp, alphas, horizon):
    """Rows ``rows`` (distinct) take the zero-gradient steps they skipped, ``last[r]+1 .. t-1``,
    then (``step``) their step ``t`` with gradient ``g[i]``; ``last[r]`` becomes ``t`` (without
    ``step``: ``t - 1``).

    The skipped steps run step by step over all the rows at once, not row after row: the rows
    are ordered by ``last`` and copied side by side (m, v, w each ``[n * dim]``), so at global step
    ``s`` the rows still catching up (``s - horizon <= last < s``) are one contiguous range and
    their values run as SIMD lanes, independent chains instead of one row's sqrt/divide latency
    chain. Each value takes exactly the scalar operations in the scalar order (bit-identical to
    a row-by-row loop)."""
    lr, b1, b2, omb1, omb2, eps = hp[0], hp[1], hp[2], hp[3], hp[4], hp[5]
    n, dim, upto = rows.shape[0], w.shape[1], t - 1
    if n == 0:
        return
    since = _skipped_since(last, rows, upto)
    if step and since.min() == upto:  # nothing skipped (the rows were caught up before the step's
        _step_in_place(w, m, v, last, rows, t, g, lr * alphas[t], omb1, omb2, eps)  # forward)
        return
    order = _stable_order(since, upto)
    mm, vv, ww = _side_by_side(m, v, w, rows, order)
    for c0 in range(0, n, _CATCH_UP_GROUP):  # a group's values stay in L1 over all its steps
        _skipped_steps(mm, vv, ww, since, order, c0, min(c0 + _CATCH_UP_GROUP, n), upto, horizon, dim, b1, b2, lr,
                       alphas, eps)
    for k in range(n):
        rest = upto - min(upto, since[order[k]] + horizon)  # steps past the horizon: only decay
        if rest > 0:
            for j in range(k * dim, (k + 1) * dim):
                mm[j] = mm[j] * b1 ** rest
                vv[j] = vv[j] * b2 ** rest
    alpha = lr * alphas[t]
    m2, v2, w2 = mm.reshape(n, dim), vv.reshape(n, dim), ww.reshape(n, dim)
    for k in range(n):
        i = order[k]
        r = rows[i]
        if step:
            for j in range(dim):
                w2[k, j], m2[k, j], v2[k, j] = _adam_values(w2[k, j], m2[k, j], v2[k, j], g[i, j], alpha, omb1, omb2,
                                                            eps)
        for j in range(dim):
            m[r, j], v[r, j], w[r, j] = mm[k * dim + j], vv[k * dim + j], ww[k * dim + j]
        last[r] = t if step else upto


@njit(nogil=True, inline="always")
def _skipped_since(last, rows, upto):
    """Per row, the last step it took; a row with nothing skipped (never updated: m = v = 0,
    nothing moves; or last step ``upto``) counts as ``upto`` (it sorts with the newest and never
    joins the catching-up range)."""
    n = rows.shape[0]
    since = np.empty(n, np.int64)
    for i in range(n):
        if i + _PF < n:
            prefetch1(last, rows[i + _PF])
        lr_i = np.int64(last[rows[i]])
        since[i] = lr_i if lr_i != 0 and lr_i < upto else upto
    return since


@njit(nogil=True, error_model="numpy", inline="always")
def _step_in_place(w, m, v, last, rows, t, g, alpha, omb1, omb2, eps):
    """Step ``t`` of rows that skipped nothing, in place (the same operations as after a catch-up)."""
    n = rows.shape[0]
    for i in range(n):
        if i + _PF < n:
            prefetch2(w, rows[i + _PF], 0)
            prefetch2(v, rows[i + _PF], v.shape[1] - 1)
        r = rows[i]
        for j in range(w.shape[1]):
            w[r, j], m[r, j], v[r, j] = _adam_values(w[r, j], m[r, j], v[r, j], g[i, j], alpha, omb1, omb2, eps)
        last[r] = t


@njit(nogil=True, inline="always")
def _side_by_side(m, v, w, rows, order):
    """The rows' m, v, w in ``order``, each as one ``[n * dim]`` array."""
    n, dim = rows.shape[0], w.shape[1]
    mm, vv, ww = np.empty(n * dim, w.dtype), np.empty(n * dim, w.dtype), np.empty(n * dim, w.dtype)
    for k in range(n):
        if k + _PF < n:  # a row and its slots are co-located: two cache lines
            prefetch2(w, rows[order[k + _PF]], 0)
            prefetch2(v, rows[order[k + _PF]], v.shape[1] - 1)
        r = rows[order[k]]
        for j in range(dim):
            mm[k * dim + j], vv[k * dim + j], ww[k * dim + j] = m[r, j], v[r, j], w[r, j]
    return mm, vv, ww


@njit(nogil=True, error_model="numpy", inline="always")
def _skipped_steps(mm, vv, ww, since, order, c0, c1, upto, horizon, dim, b1, b2, lr, alphas, eps):
    """The zero-gradient steps of the rows ``c0 .. c1`` (in order) up to the horizon, step by step
    over the rows still catching up at each step."""
    lo = hi = c0  # rows [lo, hi) (in order) take step s: last < s <= last + horizon
    s = since[order[c0]] + 1
    while s <= upto:
        while hi < c1 and since[order[hi]] < s:
            hi += 1
        while lo < hi and since[order[lo]] + horizon < s:
            lo += 1
        if lo == hi:  # nobody moves at s: on to the next row's first skipped step
            if hi == c1:
                break
            s = since[order[hi]] + 1
            continue
        _zero_gradient_step(mm[lo * dim:hi * dim], vv[lo * dim:hi * dim], ww[lo * dim:hi * dim], b1, b2,
                            lr * alphas[s], eps)
        s += 1


@njit(inline="always", nogil=True)
def ftrl_terms(hp):
    """FTRL's ``(alpha, l1, 2 * (l2 + beta / (2 alpha)))`` from its hyperparameters ``hp`` (alpha, l1,
    l2, beta in the parameter's dtype), formed as Keras forms them (``l2 + beta / (2.0 * lr)``)."""
    lr, l1, l2, beta = hp[0], hp[1], hp[2], hp[3]
    l2_reg = l2 + beta / (lr + lr)
    return lr, l1, l2_reg + l2_reg


@njit(inline="always", nogil=True)
def ftrl_weight(z, sqrt_n, lr, l1, two_l2_reg):
    """FTRL-proximal's weight of slots ``z`` and ``n`` (given as ``sqrt(n)``):
    ``(clip(z, -l1, l1) - z) / (sqrt(n) / alpha + 2 * (l2 + beta / (2 alpha)))``, the one place of
    this formula: the update writes it (stored form) or reads it (computed form), and every reader
    of a row holding only ``z`` and ``n`` computes it (``bfloat16.read_value``). A pure function
    of (z, n) and the hyperparameters, so a row whose weight starts at ``ftrl_weight(0, sqrt(n0))
    = 0`` (a zeros initializer) needs no stored weight: the same bits as one stored."""
    return (min(max(z, -l1), l1) - z) / (sqrt_n / lr + two_l2_reg)


@njit(inline="always", nogil=True)
def _ftrl_rows(w, z, n, rows, g, hp):
    """FTRL on rows of ``z`` and ``n``; ``w`` holds the weights (stored form) or has no columns
    (computed form: the old weight computed from the old z and n by :func:`ftrl_weight`, exactly
    the stored one's bits, and the new one not written)."""
    lr, l1, two_l2_reg = ftrl_terms(hp)
    stored = w.shape[1] > 0
    n_rows = rows.shape[0]
    for i in range(n_rows):
        _prefetch_ahead(z, n, rows, i, n_rows)
        r = rows[i]
        for j in range(z.shape[1]):
            gj = g[i, j]
            nj, new_n = _accumulate_square(n, r, j, gj)
            sq_old, sq_new = np.sqrt(nj), np.sqrt(new_n)
            w_old = w[r, j] if stored else ftrl_weight(z[r, j], sq_old, lr, l1, two_l2_reg)
            zj = z[r, j] + (gj - ((sq_new - sq_old) / lr) * w_old)
            z[r, j] = zj
            if stored:
                w[r, j] = ftrl_weight(zj, sq_new, lr, l1, two_l2_reg)


# kernel codes (``_OptimizerBase.kernel_args``)
SGD_ROWS, ADAGRAD_ROWS, ADAM_ROWS, ADAM_CATCHUP_ROWS, FTRL_ROWS, ROWWISE_ADAGRAD_ROWS, ROWWISE_ADAM_ROWS = range(7)


class StepArgs(NamedTuple):
    """What the row loops need of one update (:func:`update_rows`) or catch-up (:func:`catch_up_rows`),
    one argument of the kernels: the kernel ``code``, the hyperparameters ``hp`` in the parameter's
    dtype, Adam's bias corrections ``alphas`` by global step, the 1-based global step ``t`` and the
    catch-up ``horizon`` (the last three only for Adam with ``catchup``)."""

    code: int
    hp: np.ndarray
    alphas: np.ndarray
    t: int
    horizon: int


@njit(nogil=True, error_model="numpy")
def update_rows(w, s0, s1, steps, rows, g, args):
    """The optimizer of :class:`StepArgs` ``args`` on ``w[rows]`` with gradients ``g``; ``s0``/``s1``
    its slots (``[R, dim]``, a row-wise slot ``[R, 1]``; unused ones: any array of w's type), ``steps`` Adam's per-row counter (else any
    int32 array)."""
    code, hp, alphas, t, horizon = args
    if code == SGD_ROWS:
        _sgd_rows(w, rows, g, hp)
    elif code == ADAGRAD_ROWS:
        _adagrad_rows(w, s0, rows, g, hp)
    elif code == ADAM_ROWS:
        _adam_rows(w, s0, s1, steps, rows, g, hp)
    elif code == ADAM_CATCHUP_ROWS:
        _adam_catchup_rows(w, s0, s1, steps, rows, g, hp, alphas, t, horizon)
    elif code == ROWWISE_ADAGRAD_ROWS:
        _rowwise_adagrad_rows(w, s0, rows, g, hp)
    elif code == ROWWISE_ADAM_ROWS:
        _rowwise_adam_rows(w, s0, s1, steps, rows, g, hp)
    else:
        _ftrl_rows(w, s0, s1, rows, g, hp)


@njit(cache=True, nogil=True)
def _update_rows_kernel(w, s0, s1, steps, rows, g, args):
    update_rows(w, s0, s1, steps, rows, g, StepArgs(*args))  # args: a plain tuple (see fused.py)


_NO_STEPS = np.zeros(0, dtype=np.int32)
_NO_ALPHAS = {np.dtype(np.float32): np.zeros(1, np.float32), np.dtype(np.float64): np.zeros(1, np.float64)}


# --------------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------------


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _finite_pos(name: str, x: float) -> float:
    x = float(x)
    _check(math.isfinite(x) and x > 0.0, f"{name} must be finite and > 0, got {x!r}")
    return x


def _finite_nonneg(name: str, x: float) -> float:
    x = float(x)
    _check(math.isfinite(x) and x >= 0.0, f"{name} must be finite and >= 0, got {x!r}")
    return x


def _check_adagrad(opt: Any) -> None:
    """An AdaGrad's (element- or row-wise) hyperparameters checked and made floats."""
    object.__setattr__(opt, "lr", _finite_pos("lr", opt.lr))
    object.__setattr__(opt, "initial_accumulator", _finite_nonneg("initial_accumulator", opt.initial_accumulator))
    object.__setattr__(opt, "epsilon", _finite_nonneg("epsilon", opt.epsilon))


def _check_adam(opt: Any) -> None:
    """An Adam's (element- or row-wise) rate, betas and epsilon checked and made floats."""
    object.__setattr__(opt, "lr", _finite_pos("lr", opt.lr))
    for name in ("beta1", "beta2"):
        b = float(getattr(opt, name))
        _check(0.0 <= b < 1.0, f"{name} must be in [0, 1), got {b!r}")
        object.__setattr__(opt, name, b)
    object.__setattr__(opt, "epsilon", _finite_nonneg("epsilon", opt.epsilon))


def _adam_hp(opt: Any, dtype: np.dtype) -> np.ndarray:
    """The row loops' hyperparameters of an Adam: (1 - beta) formed in Python floats and rounded
    once, as Keras does."""
    return np.array([opt.lr, opt.beta1, opt.beta2, 1.0 - opt.beta1, 1.0 - opt.beta2, opt.epsilon, 1.0], dtype=dtype)


class _OptimizerBase:
    """Shared plumbing: serialization and the row-update entry point."""

    kind: ClassVar[str]
    slot_names: ClassVar[tuple[str, ...]] = ()
    needs_step: ClassVar[bool] = False
    #: per slot, whether it holds one value per row (row-wise) instead of one per value column
    rowwise_slots: ClassVar[tuple[bool, ...]] = ()
    #: hyperparameters a table file of an earlier version leaves out, with what it meant by that
    saved_defaults: ClassVar[dict[str, float]] = {}

    @property
    def num_slots(self) -> int:
        """Slot arrays per value column (Adam 2 plus its per-row step count, see needs_step)."""
        return len(self.slot_names)

    def slot_widths(self, dim: int) -> tuple[int, ...]:
        """Columns of each slot in a row of ``dim`` values: ``dim``, or 1 for a row-wise slot."""
        rowwise = self.rowwise_slots or (False,) * self.num_slots
        return tuple(1 if r else int(dim) for r in rowwise)

    @property
    def rowwise(self) -> bool:
        """Whether a slot is row-wise (a statistic of the whole row: only for embedding rows)."""
        return any(self.rowwise_slots)

    def slot_initial_values(self) -> tuple[float, ...]:
        """Initial value of each slot, in ``slot_names`` order."""
        return (0.0,) * self.num_slots

    def computes_values(self, zero_init: bool) -> bool:
        """Whether table rows of a block (``zero_init``: initialized to zeros) hold only the slots,
        the values a function of them computed when read (FTRL); else the values are stored."""
        return False

    def stored_values(self, stored: bool) -> "Optimizer":
        """This optimizer with its table values stored (``stored``) or computed where it can
        (:meth:`computes_values`): itself where values are always stored."""
        return self  # type: ignore[return-value]

    def value_args(self, dtype: np.dtype) -> np.ndarray:
        """What a reader needs to compute a row's values from its slots; empty: values are stored."""
        return np.zeros(0, dtype)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description: ``{"type": kind, **hyperparameters}``."""
        return {"type": self.kind, **asdict(self)}  # type: ignore[call-overload]

    @staticmethod
    def from_spec(spec: str) -> "Optimizer":
        """Same as :func:`optimizer_from_spec`, e.g. ``Adam.from_spec("adam:lr=0.001")``."""
        return optimizer_from_spec(spec)

    def _hp(self, dtype: np.dtype) -> np.ndarray:
        raise NotImplementedError

    def _code(self, step: int) -> int:
        raise NotImplementedError

    def kernel_args(self, dtype: np.dtype, lr_scale: float = 1.0, step: int = 0) -> StepArgs:
        """The :class:`StepArgs` of one update for :func:`update_rows`: ``lr_scale`` multiplies the
        learning rate (FTRL: alpha), formed in Python floats and rounded once to ``dtype``;
        ``step`` the 1-based global step (Adam with ``catchup``; 0: unknown)."""
        hp = self._hp(np.dtype(dtype))
        if lr_scale != 1.0:  # hp[0] is every optimizer's rate (FTRL: alpha)
            hp[0] = float(getattr(self, "lr", getattr(self, "alpha", 0.0))) * lr_scale
        return StepArgs(self._code(step), hp, _NO_ALPHAS[np.dtype(dtype)], 0, 0)

    def apply_rows(self, w: np.ndarray, slots: tuple[np.ndarray, ...], steps: np.ndarray | None,
                   rows: np.ndarray, g: np.ndarray, lr_scale: float = 1.0, step: int = 0) -> None:
        """Update ``w[rows]`` (and its slots) in place with one gradient row per *unique* row.

        ``w`` and each slot are ``[R, D]`` arrays (views allowed) of one float dtype; ``steps`` is an
        int32 ``[R]`` per-row step counter when ``needs_step``; ``g`` is ``[len(rows), D]``.
        ``lr_scale`` multiplies the learning rate (FTRL: alpha) of this update (a schedule's
        factor): the product is formed in Python floats and rounded once to ``w``'s dtype.
        ``step``: the 1-based global step of this update (Adam with ``catchup``; 0: unknown).
        """
        if rows.shape[0] == 0:
            return
        g = np.ascontiguousarray(g, dtype=w.dtype)
        s0 = slots[0] if slots else w
        s1 = slots[1] if len(slots) > 1 else s0
        _update_rows_kernel(w, s0, s1, _NO_STEPS if steps is None else steps, rows, g,
                            tuple(self.kernel_args(w.dtype, lr_scale, step)))

    def catch_up(self, w: np.ndarray, slots: tuple[np.ndarray, ...], steps: np.ndarray | None, n_rows: int,
                 step: int, lr_scale: float = 1.0) -> None:
        """Bring rows ``[0, n_rows)`` up to global step ``step`` (only Adam with ``catchup`` defers work)."""

    def catch_up_args(self, dtype: np.dtype, step: int, lr_scale: float = 1.0) -> StepArgs | None:
        """The :class:`StepArgs` of :func:`catch_up_rows` bringing rows up to global step ``step``,
        or None: this optimizer defers no work."""
        return None


@dataclass(frozen=True)
class SGD(_OptimizerBase):
    """Plain SGD: ``w <- w - g * lr`` (``keras.optimizers.SGD`` without momentum)."""

    lr: float
    kind: ClassVar[str] = "sgd"

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _finite_pos("lr", self.lr))

    def _hp(self, dtype: np.dtype) -> np.ndarray:
        return np.array([self.lr], dtype=dtype)

    def _code(self, step: int) -> int:
        return SGD_ROWS


@dataclass(frozen=True)
class AdaGrad(_OptimizerBase):
    """AdaGrad as ``keras.optimizers.Adagrad``: ``a += g^2; w -= lr g / sqrt(a + eps)``."""

    lr: float
    initial_accumulator: float = 0.1
    epsilon: float = 1e-7
    kind: ClassVar[str] = "adagrad"
    slot_names: ClassVar[tuple[str, ...]] = ("accumulator",)

    def __post_init__(self) -> None:
        _check_adagrad(self)

    def slot_initial_values(self) -> tuple[float, ...]:
        return (self.initial_accumulator,)

    def _hp(self, dtype: np.dtype) -> np.ndarray:
        return np.array([self.lr, self.epsilon], dtype=dtype)

    def _code(self, step: int) -> int:
        return ADAGRAD_ROWS


@dataclass(frozen=True)
class Adam(_OptimizerBase):
    """Adam as ``keras.optimizers.Adam`` (amsgrad off); lazy per-row step count for sparse rows.

    ``m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
    w -= m * lr sqrt(1 - b2^t) / (1 - b1^t) / (sqrt(v) + eps)``.
    """

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-7
    #: 1: sparse rows follow TensorFlow's dense Adam (global step; rows without a gradient keep
    #: moving with their momentum), caught up lazily when next touched and before evaluation;
    #: 0: each row is its own Adam (per-row step count, rows without a gradient stay put)
    catchup: float = 0.0
    kind: ClassVar[str] = "adam"
    slot_names: ClassVar[tuple[str, ...]] = ("m", "v")
    needs_step: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_adam(self)
        _check(self.catchup in (0.0, 1.0), f"catchup must be 0 or 1, got {self.catchup!r}")
        object.__setattr__(self, "catchup", float(self.catchup))

    def alphas(self, t: int, dtype: np.dtype) -> np.ndarray:
        """``sqrt(1 - b2^s) / (1 - b1^s)`` for s = 0..t (entry 0 unused), cached and grown."""
        key = np.dtype(dtype).name
        cache = _ALPHA_CACHE.setdefault((self.beta1, self.beta2, key), np.zeros(1, dtype))
        if cache.size <= t:
            s = np.arange(max(2 * cache.size, t + 1), dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                cache = (np.sqrt(1.0 - self.beta2 ** s) / (1.0 - self.beta1 ** s)).astype(dtype)
            cache[0] = 0
            _ALPHA_CACHE[(self.beta1, self.beta2, key)] = cache
        return cache

    def horizon(self) -> int:
        """Skipped steps after which a row moves by < 1e-16 of an update: (b1 / sqrt(b2))^k < 1e-16."""
        q = self.beta1 / math.sqrt(self.beta2)
        return 1 << 30 if q >= 1.0 else max(1, math.ceil(math.log(1e-16) / math.log(q))) if q > 0 else 1

    def _hp(self, dtype: np.dtype) -> np.ndarray:
        return _adam_hp(self, dtype)

    def _code(self, step: int) -> int:
        # sparse rows at a known step; a dense parameter is one row, updated every step
        return ADAM_CATCHUP_ROWS if self.catchup and step > 0 else ADAM_ROWS

    def kernel_args(self, dtype: np.dtype, lr_scale: float = 1.0, step: int = 0) -> StepArgs:
        args = super().kernel_args(dtype, lr_scale, step)
        if args.code == ADAM_CATCHUP_ROWS:
            return StepArgs(args.code, args.hp, self.alphas(step, np.dtype(dtype)), int(step), self.horizon())
        return args

    def catch_up(self, w, slots, steps, n_rows, step, lr_scale=1.0):
        args = self.catch_up_args(w.dtype, step, lr_scale)
        if args is not None and step > 0 and n_rows > 0:
            _adam_flush_kernel(w, slots[0], slots[1], steps, n_rows, args.hp, args.alphas, step, args.horizon)

    def catch_up_args(self, dtype, step, lr_scale=1.0):
        if not self.catchup or step < 0:  # step 0: nothing to catch up, but the kernel compiles in step 1
            return None
        hp = self._hp(np.dtype(dtype))
        hp[0] = self.lr * lr_scale
        return StepArgs(ADAM_CATCHUP_ROWS, hp, self.alphas(step + 1, np.dtype(dtype)), step + 1, self.horizon())


@dataclass(frozen=True)
class FTRL(_OptimizerBase):
    """FTRL-proximal (McMahan et al. 2013) as ``keras.optimizers.Ftrl`` with power -0.5.

    ``alpha`` = Keras ``learning_rate``; ``l1``/``l2`` = Keras ``l1_/l2_regularization_strength``
    (McMahan's lambda2 = 2 * l2); ``beta`` = Keras ``beta`` (default 1.0 here, McMahan's choice;
    Keras' default is 0); ``initial_accumulator`` = Keras ``initial_accumulator_value``.
    """

    alpha: float
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0
    initial_accumulator: float = 0.1
    #: 0: a table row whose weights start at 0 (a zeros initializer) holds only ``z`` and ``n``, the
    #: weights computed when read (:meth:`computes_values`); 1: the weights stored beside them
    store_w: float = 0.0
    kind: ClassVar[str] = "ftrl"
    slot_names: ClassVar[tuple[str, ...]] = ("z", "n")
    #: what a table file written before ``store_w`` existed meant: its rows hold the weights
    saved_defaults: ClassVar[dict[str, float]] = {"store_w": 1.0}

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _finite_pos("alpha", self.alpha))
        for name in ("beta", "l1", "l2", "initial_accumulator"):
            object.__setattr__(self, name, _finite_nonneg(name, getattr(self, name)))
        _check(self.store_w in (0.0, 1.0), f"store_w must be 0 or 1, got {self.store_w!r}")
        object.__setattr__(self, "store_w", float(self.store_w))

    def slot_initial_values(self) -> tuple[float, ...]:
        return (0.0, self.initial_accumulator)

    def computes_values(self, zero_init: bool) -> bool:
        """Rows of a block initialized to zeros (``zero_init``) hold only z and n unless ``store_w``:
        w = :func:`ftrl_weight` (z, n) is then 0 at a new row (z = 0) as the initializer's, and
        every later w is that function's value. Not where the function is 0/0 at a new row (no
        ``initial_accumulator``, ``beta`` nor ``l2``: the stored form's w starts at 0 there)."""
        return (not self.store_w and zero_init
                and (self.initial_accumulator > 0 or self.beta > 0 or self.l2 > 0))

    def stored_values(self, stored: bool) -> "FTRL":
        """This FTRL storing its weights (``stored``) or computing them where it can."""
        return replace(self, store_w=1.0 if stored else 0.0)

    def value_args(self, dtype: np.dtype) -> np.ndarray:
        """What a reader of a row computing its weights needs (``bfloat16.read_value``): 1, then
        alpha, l1, l2, beta in the parameter's dtype (the update's ``hp``)."""
        return np.concatenate([np.ones(1, dtype), self._hp(np.dtype(dtype))])

    def _hp(self, dtype: np.dtype) -> np.ndarray:
        return np.array([self.alpha, self.l1, self.l2, self.beta], dtype=dtype)

    def _code(self, step: int) -> int:
        return FTRL_ROWS


@dataclass(frozen=True)
class RowwiseAdaGrad(AdaGrad):
    """FBGEMM's exact row-wise AdaGrad: one accumulator per row,
    ``a += mean_j(g_j^2); w -= g * lr / (sqrt(a) + eps)`` (4 bytes of state per float32 row).
    AdaGrad's hyperparameters and checks, FBGEMM's defaults, its own row loop."""

    lr: float
    initial_accumulator: float = 0.0
    epsilon: float = 1e-8
    kind: ClassVar[str] = "rowwise_adagrad"
    rowwise_slots: ClassVar[tuple[bool, ...]] = (True,)

    def _code(self, step: int) -> int:
        return ROWWISE_ADAGRAD_ROWS


@dataclass(frozen=True)
class RowwiseAdam(_OptimizerBase):
    """FBGEMM's partial row-wise Adam: Adam's first moment per element, the second one per row fed
    with ``mean_j(g_j^2)``; Adam's bias correction with a lazy per-row step count. ``catchup=1``
    is refused (TensorFlow's dense Adam needs a second moment per element)."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-7
    catchup: float = 0.0
    kind: ClassVar[str] = "rowwise_adam"
    slot_names: ClassVar[tuple[str, ...]] = ("m", "v")
    rowwise_slots: ClassVar[tuple[bool, ...]] = (False, True)
    needs_step: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_adam(self)
        _check(float(self.catchup) == 0.0, "rowwise_adam cannot take catchup=1: TensorFlow's dense Adam keeps a "
               "second moment per element (use adam:catchup=1, see docs/training.md)")
        object.__setattr__(self, "catchup", 0.0)

    def _hp(self, dtype: np.dtype) -> np.ndarray:
        return _adam_hp(self, dtype)

    def _code(self, step: int) -> int:
        return ROWWISE_ADAM_ROWS


Optimizer = Union[SGD, AdaGrad, Adam, FTRL, RowwiseAdaGrad, RowwiseAdam]
_BY_KIND: dict[str, type] = {c.kind: c for c in (SGD, AdaGrad, Adam, FTRL, RowwiseAdaGrad, RowwiseAdam)}
_ALIASES = {"ada_grad": "adagrad", "ftrl_proximal": "ftrl", "exact_rowwise_adagrad": "rowwise_adagrad",
            "partial_rowwise_adam": "rowwise_adam"}


def optimizer_from_dict(d: dict[str, Any], saved: bool = False) -> Optimizer:
    """Inverse of ``to_dict()``: ``{"type": "adam", "lr": 0.001, ...}`` -> ``Adam(...)``; ``saved``:
    ``d`` is a table file's, where a hyperparameter an earlier version did not write takes the
    value it meant (``saved_defaults``: an FTRL file without ``store_w`` stores its weights)."""
    if not isinstance(d, dict) or "type" not in d:
        raise ValueError(f"optimizer dict needs a 'type' entry, got {d!r}")
    kind = str(d["type"]).lower()
    cls = _BY_KIND.get(_ALIASES.get(kind, kind))
    if cls is None:
        raise ValueError(f"unknown optimizer type {d['type']!r}; expected one of {sorted(_BY_KIND)}")
    names = {f.name for f in fields(cls)}
    params = {**(cls.saved_defaults if saved else {}), **{k: v for k, v in d.items() if k != "type"}}
    unknown = sorted(set(params) - names)
    if unknown:
        raise ValueError(f"unknown {cls.kind} parameter(s) {unknown}; expected some of {sorted(names)}")
    missing = sorted(f.name for f in fields(cls) if f.name not in params and f.default is MISSING
                     and f.default_factory is MISSING and f.init)
    if missing:
        raise ValueError(f"{cls.kind} needs {', '.join(f'{name}=' for name in missing)} (e.g. {cls.kind}:"
                         f"{','.join(f'{name}=0.05' for name in missing)})")
    return cls(**params)


def optimizer_from_spec(spec: str) -> Optimizer:
    """Parse a CLI spec such as ``"adam:lr=0.001"``, ``"ftrl:alpha=0.05,l1=1"`` or ``"sgd:lr=0.1"``."""
    kind, _, rest = spec.strip().partition(":")
    d: dict[str, Any] = {"type": kind.strip()}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"bad optimizer spec {spec!r}: expected key=value, got {item!r}")
        try:
            d[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"bad optimizer spec {spec!r}: {key.strip()} is not a number") from None
    return optimizer_from_dict(d)


class DenseOptimizerState:
    """Optimizer state of one dense parameter, updated with the same kernels as sparse rows.

    The flattened parameter is treated as a single row ``[1, P]``, so every element is updated on
    every :meth:`apply` and Adam's step count is global (exactly Keras' dense semantics).
    """

    def __init__(self, optimizer: Optimizer, shape: tuple[int, ...] | int,
                 dtype: np.dtype | type = np.float32) -> None:
        _check(not optimizer.rowwise, f"{optimizer.kind} keeps row-wise state: it is for embedding rows, not dense "
               "weights")
        self.optimizer = optimizer
        self.shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        _check(self.dtype in (np.float32, np.float64), f"dtype must be float32 or float64, got {self.dtype}")
        size = int(np.prod(self.shape, dtype=np.int64))
        self._slots = tuple(np.full(size, v, dtype=self.dtype)
                            for v in optimizer.slot_initial_values())
        self._steps = np.zeros(1, dtype=np.int32) if optimizer.needs_step else None
        self._rows = np.zeros(1, dtype=np.int64)

    @property
    def step(self) -> int:
        """Number of Adam steps applied so far (0 for optimizers without a step count)."""
        return 0 if self._steps is None else int(self._steps[0])

    def apply(self, param: np.ndarray, grad: np.ndarray, lr_scale: float = 1.0) -> None:
        """Update ``param`` (C-contiguous, this state's shape and dtype) in place with ``grad``;
        ``lr_scale`` multiplies the learning rate (a schedule's factor)."""
        if not isinstance(param, np.ndarray) or param.shape != self.shape or param.dtype != self.dtype:
            raise ValueError(f"param must be an ndarray of shape {self.shape} and dtype {self.dtype}, "
                             f"got {getattr(param, 'shape', None)} {getattr(param, 'dtype', type(param))}")
        if not param.flags.c_contiguous or not param.flags.writeable:
            raise ValueError("param must be C-contiguous and writeable (it is updated in place)")
        grad = np.asarray(grad)
        if grad.shape != self.shape:
            raise ValueError(f"grad shape {grad.shape} != param shape {self.shape}")
        w = param.reshape(1, -1)
        slots = tuple(s.reshape(1, -1) for s in self._slots)
        self.optimizer.apply_rows(w, slots, self._steps, self._rows, grad.reshape(1, -1), lr_scale)

    def slot_arrays(self) -> list[np.ndarray]:
        """The slots, param-shaped, in ``slot_names`` order: views a caller may write (e.g. to
        average replicas' states)."""
        return self._slot_views()

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the slots (param-shaped, named by ``slot_names``) and ``step`` if any."""
        return self._state_dict(self._slot_views())

    def _slot_views(self, j: int | None = None) -> list[np.ndarray]:
        """The slots, param-shaped, or their leading-axis slice ``j`` (views: writable)."""
        views = [s.reshape(self.shape) for s in self._slots]
        return views if j is None else [v[j] for v in views]

    def _state_dict(self, views: list[np.ndarray]) -> dict[str, np.ndarray]:
        d = {name: v.copy() for name, v in zip(self.optimizer.slot_names, views)}
        if self._steps is not None:
            d["step"] = self._steps.copy()
        return d

    def _load_state_dict(self, views: list[np.ndarray], d: dict[str, np.ndarray]) -> None:
        expected = set(self.optimizer.slot_names) | ({"step"} if self._steps is not None else set())
        if set(d) != expected:
            raise ValueError(f"state dict keys {sorted(d)} != expected {sorted(expected)}")
        for name, view in zip(self.optimizer.slot_names, views):
            a = np.asarray(d[name])
            if a.shape != view.shape:
                raise ValueError(f"slot {name!r} has shape {a.shape}, expected {view.shape}")
            view[...] = a
        if self._steps is not None:
            self._steps[:] = np.asarray(d["step"], dtype=np.int64).reshape(-1)[:1]

    def slice(self, j: int) -> "DenseSliceState":
        """The state of ``param[j]`` (a field's slice of a weight kept as ``[fields, ...]``), for
        checkpoints that store it per field; the whole weight is still updated by one kernel call."""
        return DenseSliceState(self, int(j))

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        """Restore state produced by :meth:`state_dict` (shapes and names are checked)."""
        self._load_state_dict(self._slot_views(), d)


class DenseSliceState:
    """``state_dict``/``load_state_dict`` of one leading-axis slice of a :class:`DenseOptimizerState`
    (the slots' rows ``j``; Adam's step count is the weight's, the same for every slice: every
    slice is updated at every step)."""

    def __init__(self, whole: DenseOptimizerState, j: int) -> None:
        _check(len(whole.shape) >= 1 and 0 <= j < whole.shape[0], f"slice {j} of a state of shape {whole.shape}")
        self.whole, self.j = whole, j

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.whole._state_dict(self.whole._slot_views(self.j))

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        self.whole._load_state_dict(self.whole._slot_views(self.j), d)
