"""16-bit table rows: a block's values and optimizer slots stored as bfloat16 (``--table-dtype``)
while every kernel computes in float32, as FBGEMM trains 16-bit weights.

A bfloat16 is the upper half of a float32's bits, so a stored row is held as ``uint16`` and read
exactly (:func:`load`: the bits shifted up). Writes round: a new row's initial values and slots to
nearest (ties to even: a pure function of the key, as the float32 draw is), an update's results
**stochastically** (:func:`narrow_rows`): the 16 bits below the cut are compared with 16 random
bits, so the stored value is unbiased (``E[stored] = computed``) and small updates are not lost
(round-to-nearest drops every step smaller than half a bf16 ulp, ~0.2 % of the weight). The random
bits are a pure function of (the block's stream base = seed, field, block; key; step; column)
(``splitmix64`` counters): they do not depend on N, placement, thread count or the order of the
rows in an update, so a row is rounded alike wherever and whenever it is updated; 1 rank and N
ranks differ only where float32 reassociation of the ranks' partial sums changes a gradient (then
a rounding may go the other way; ``docs/benchmarks.md`` measures it).

Updates widen the distinct rows of a step into float32 scratch, run the optimizer's row loop
(``optimizers.py``, unchanged) on it, and narrow back: the update math exists once. The kernels
dispatch on the stored array's dtype at compile time (:func:`load`, :func:`update_stored`,
:func:`init_stored`): a float32 or float64 table compiles to exactly the
code it ran before.

Adam with ``catchup=1`` is refused on bfloat16 rows: its catch-up before validations and checkpoints
would round the rows there, so the model would depend on ``--eval-every`` and ``--checkpoint-every``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from ..splitmix import mix64
from .init import init_block_rows
from . import _threads
from ._prefetch import prefetch1, prefetch2
from .optimizers import StepArgs, ftrl_terms, ftrl_weight, update_rows

#: table dtypes by name (``--table-dtype``) -> the dtype of the stored arrays
STORED = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64), "bfloat16": np.dtype(np.uint16)}
_ROUNDING_SALT = np.uint64(0x5D1E_0B5E_ED5F_0A7B)  # the rounding streams apart from the initial values'
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_PF = 16  # rows prefetched ahead


def checked_storage(table_dtype: str, dtype: np.dtype, blocks: Any) -> np.dtype:
    """The stored dtype of a table of ``dtype`` whose rows are ``table_dtype``; a ValueError where
    they cannot go together: 16-bit rows need dtype float32, float rows are stored in the dtype, and
    bfloat16 rows take no ``adam:catchup=1`` (a catch-up at validations and checkpoints would round
    the rows)."""
    stored = stored_dtype(table_dtype)
    if table_dtype != dtype.name and not (table_dtype == "bfloat16" and dtype == np.float32):
        raise ValueError(f"table dtype {table_dtype} with dtype {dtype.name}: 16-bit rows need "
                         "dtype float32, and float rows are stored in the dtype")
    for b in blocks if table_dtype == "bfloat16" else ():
        if getattr(b.optimizer, "catchup", 0.0):
            raise ValueError(f"block {b.name!r}: bfloat16 rows cannot take adam:catchup=1 (a catch-up at "
                             "validations and checkpoints would round the rows; docs/training.md)")
    return stored


def stored_dtype(table_dtype: str) -> np.dtype:
    """The stored arrays' dtype of ``table_dtype`` (a one-line error naming the choices)."""
    if table_dtype not in STORED:
        raise ValueError(f"table dtype must be one of {sorted(STORED)}, got {table_dtype!r}")
    return STORED[table_dtype]


@intrinsic
def _f32_bits(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, x):
    if x != types.uint32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@njit(nogil=True, inline="always")
def widen(h):
    """The float32 of bfloat16 bits ``h`` (exact)."""
    return _bits_f32(np.uint32(np.uint32(h) << np.uint32(16)))


@njit(nogil=True, inline="always")
def narrow(x, noise):
    """bfloat16 bits of float32 ``x``: ``noise`` (16 bits) added below the cut, then truncated.
    ``noise`` = 0x7FFF plus the kept half's last bit rounds to nearest, ties to even; uniform noise
    rounds stochastically. Infinities stay, NaN stays a (quiet) NaN."""
    b = _f32_bits(np.float32(x))
    if (b & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
        return np.uint16((b >> np.uint32(16)) | (np.uint32(0x40) if b & np.uint32(0x7FFFFF) else np.uint32(0)))
    return np.uint16((b + np.uint32(noise)) >> np.uint32(16))


@njit(nogil=True, inline="always")
def nearest(x):
    """bfloat16 bits of float32 ``x`` rounded to nearest, ties to even."""
    b = _f32_bits(np.float32(x))
    return narrow(x, np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))


@njit(nogil=True, inline="always")
def rounding_bits(base, key, step):
    """The row's rounding stream at ``step``: column c takes bits ``16 (c % 4)`` .. of
    ``mix64(stream + (c // 4 + 1) * gamma)`` (:func:`noise_word`, :func:`column_noise`)."""
    return mix64((base ^ _ROUNDING_SALT) + mix64(np.uint64(key) + np.uint64(step) * _GAMMA))


@njit(nogil=True, inline="always")
def noise_word(stream, c):
    """The 64 random bits of columns ``c - c % 4 .. c - c % 4 + 3`` from a row's stream
    (:func:`rounding_bits`); column c takes bits ``16 (c % 4)`` .. (:func:`column_noise`)."""
    return mix64(stream + np.uint64(c // 4 + 1) * _GAMMA)


@njit(nogil=True, inline="always")
def column_noise(word, c):
    """16 random bits of column ``c`` from its :func:`noise_word`."""
    return np.uint32((word >> np.uint64(16 * (c % 4))) & np.uint64(0xFFFF))


def load(data, r, c):
    """``data[r, c]`` as a number: a float table's value, a bfloat16 table's widened."""


@overload(load, inline="always")
def _load(data, r, c):
    if data.dtype == types.uint16:
        return lambda data, r, c: widen(data[r, c])
    return lambda data, r, c: data[r, c]


@njit(nogil=True, inline="always")
def value_terms(derive):
    """What :func:`read_value` needs of a block's ``derive`` (``BlockSpec.value_args``), taken once per
    field, outside its loop over rows: whether its rows' values are computed (``derive`` not empty
    nor 0 first: a row holds only FTRL's z, columns ``[0, dim)``, and n, ``[dim, 2 dim)``), and
    FTRL's terms (``optimizers.ftrl_terms`` of ``derive[1:]``, in its dtype; of ones where not)."""
    computed = derive.shape[0] > 0 and derive[0] != 0
    lr, l1, two_l2_reg = ftrl_terms(derive[1:] if computed else np.ones(4, derive.dtype))
    return computed, lr, l1, two_l2_reg


@njit(nogil=True, inline="always")
def read_value(data, r, c, dim, terms):
    """Value ``c`` of row ``r`` of a block's stored array ``data`` as :func:`load` reads it, or, where
    ``terms`` (its :func:`value_terms`) say the values are computed, computed from z and n by
    ``optimizers.ftrl_weight`` in the arithmetic of the update (the table's dtype; a bfloat16
    row's z and n widened to float32): the bits the update would have stored, unrounded.

    One value, no loop: a kernel loops over a row's values itself (``for c in range(dim): out[i, c]
    = read_value(...)``). numba counts references to the arrays given to an inlined helper with a
    loop, or a loop under a branch (two atomic operations per array on every call: about 8 ns each
    on a 16-core Xeon, 2 on the 2-core VM), where reading a row from memory costs about 5 ns."""
    computed, lr, l1, two_l2_reg = terms
    if computed:
        return ftrl_weight(load(data, r, c), np.sqrt(load(data, r, dim + c)), lr, l1, two_l2_reg)
    return load(data, r, c)


@njit(nogil=True)
def widen_rows(data, rows, out):
    """``out[i] = data[rows[i]]`` widened (the rows' values and slots, float32); rows prefetched
    ahead (an update's rows are random rows of a large table)."""
    n = rows.shape[0]
    for i in range(n):
        if i + _PF < n:
            prefetch2(data, rows[i + _PF], 0)
        for c in range(data.shape[1]):
            out[i, c] = widen(data[rows[i], c])


@njit(nogil=True)
def narrow_rows(src, data, rows, keys, base, step):
    """``data[rows[i]] = src[i]`` rounded stochastically by (``base``, the row's key, ``step``, column)."""
    n = rows.shape[0]
    for i in range(n):
        if i + _PF < n:
            prefetch1(keys, rows[i + _PF])
        r = rows[i]
        stream = rounding_bits(base, keys[r], step)
        word = np.uint64(0)
        for c in range(data.shape[1]):
            if c % 4 == 0:
                word = noise_word(stream, c)
            data[r, c] = narrow(src[i, c], column_noise(word, c))


@njit(cache=True, nogil=True)
def update_stored_rows(data, dim, w0, w1, steps, rows, g, args, keys, base, step):
    """:func:`update_stored` of one table's block (a kernel: callable from Python); ``args``: a plain
    tuple of ``optimizers.StepArgs``."""
    update_stored(data, dim, w0, w1, steps, rows, g, StepArgs(*args), keys, base, step)


@njit(nogil=True)
def _widened(data, steps, rows):
    """The rows widened into float32 scratch, their step counts copied, and their new numbers 0..n-1."""
    n = rows.shape[0]
    buf = np.empty((n, data.shape[1]), np.float32)
    widen_rows(data, rows, buf)
    local = np.arange(n)
    step_buf = np.empty(n if steps.shape[0] else 0, steps.dtype)
    for i in range(step_buf.shape[0]):
        step_buf[i] = steps[rows[i]]
    return buf, step_buf, local


@njit(nogil=True)
def _written_back(buf, step_buf, data, steps, rows, keys, base, step):
    for i in range(step_buf.shape[0]):
        steps[rows[i]] = step_buf[i]
    narrow_rows(buf, data, rows, keys, base, step)


@njit(nogil=True, inline="always")
def columns(data, dim, w0, w1):
    """A block's values and its two optimizer slots (``layout.BlockSpec.columns``: values, then each
    slot over its width ``w0``, ``w1``; an unused slot is empty)."""
    return data[:, :dim], data[:, dim:dim + w0], data[:, dim + w0:dim + w0 + w1]


def update_stored(data, dim, w0, w1, steps, rows, g, args, keys, base, step):
    """``update_rows`` on the stored block ``data`` (``dim`` stored value columns, then slots of
    widths ``w0``, ``w1``; ``dim`` 0: values computed from the slots, ``BlockSpec.value_columns``)."""


@overload(update_stored)
def _update_stored(data, dim, w0, w1, steps, rows, g, args, keys, base, step):
    if data.dtype == types.uint16:
        def impl(data, dim, w0, w1, steps, rows, g, args, keys, base, step):
            buf, step_buf, local = _widened(data, steps, rows)
            w, s0, s1 = columns(buf, dim, w0, w1)
            update_rows(w, s0, s1, step_buf if steps.shape[0] else steps, local, g, args)
            _written_back(buf, step_buf, data, steps, rows, keys, base, step)
        return impl

    def impl(data, dim, w0, w1, steps, rows, g, args, keys, base, step):
        w, s0, s1 = columns(data, dim, w0, w1)
        update_rows(w, s0, s1, steps, rows, g, args)
    return impl


def init_stored(data, dim, steps, keys, start, stop, base, kind, scale, slot_init):
    """``init_block_rows`` on the stored block ``data`` (a bfloat16 block: rounded to nearest)."""


@overload(init_stored)
def _init_stored(data, dim, steps, keys, start, stop, base, kind, scale, slot_init):
    if data.dtype == types.uint16:
        def impl(data, dim, steps, keys, start, stop, base, kind, scale, slot_init):
            buf = np.empty((max(stop - start, 0), data.shape[1]), np.float32)
            shifted = keys[start:stop]
            init_block_rows(buf, dim, steps[start:stop] if steps.shape[0] else steps, shifted, 0, stop - start,
                            base, kind, scale, slot_init)
            for i in range(stop - start):
                for c in range(data.shape[1]):
                    data[start + i, c] = nearest(buf[i, c])
        return impl

    def impl(data, dim, steps, keys, start, stop, base, kind, scale, slot_init):
        init_block_rows(data, dim, steps, keys, start, stop, base, kind, scale, slot_init)
    return impl


@njit(cache=True, nogil=True)
def init_new_rows(data, dim, steps, keys, start, stop, base, kind, scale, slot_init) -> None:
    """:func:`init_stored` of one table's block (a kernel: callable from Python)."""
    init_stored(data, dim, steps, keys, start, stop, base, kind, scale, slot_init)


_MIN_PARALLEL_ROWS = 4096  # new rows below which one thread initializes them all


def init_table_rows(arrays: Any, blocks: Any, bases: Any, slot_init: Any, start: int, stop: int) -> None:
    """New rows ``[start, stop)`` of one table (its ``TableArrays``, per block its ``BlockSpec``,
    stream base and slots' initial values): :func:`init_new_rows` of each block, the rows in parts
    on numba's thread count (normal draws make a new row costly; each row is written by one thread)."""
    if stop <= start:
        return
    for b, spec in enumerate(blocks):
        args = (arrays.blocks[b], spec.value_columns, arrays.steps[b], arrays.keys)
        init = (bases[b], spec.init.code, spec.init.scale, slot_init[b])
        _threads.run(lambda lo, hi: init_new_rows(*args, start + lo, start + hi, *init), stop - start,
                     _MIN_PARALLEL_ROWS)


@njit(cache=True, nogil=True)
def to_bfloat16(x):
    """float32 array -> bfloat16 bits (``uint16``, same shape), rounded to nearest (a conversion
    of a table's dtype)."""
    flat = x.reshape(-1)
    out = np.empty(flat.shape[0], np.uint16)
    for i in range(flat.shape[0]):
        out[i] = nearest(flat[i])
    return out.reshape(x.shape)


def convert(a: np.ndarray, to: str) -> np.ndarray:
    """A stored array (values or slots) as the stored array of table dtype ``to``: bfloat16 widens
    exactly; to bfloat16 rounds to nearest (a dtype conversion of a checkpoint's tables)."""
    target = stored_dtype(to)
    if a.dtype == target:
        return a
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(target)
    if target == np.uint16:
        return to_bfloat16(np.ascontiguousarray(a, dtype=np.float32))
    return a.astype(target)
