"""A numba intrinsic for the CPU's software prefetch (``llvm.prefetch``, read, high locality).

Batched lookups touch one random cache line per key in an index far larger than the caches;
issuing the load for key ``i + D`` while key ``i`` is processed overlaps those misses (the
out-of-order window alone cannot look far enough ahead past the probe loop's branches).
A prefetch never faults, so a stale or out-of-range address only wastes the hint.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _emit_prefetch(context, builder, arrty, array, indices) -> None:
    ary = context.make_array(arrty)(context, builder, array)
    ptr = cgutils.get_item_pointer(context, builder, arrty, ary, indices, wraparound=False)
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    # rw = 0 (read), locality = 3 (keep in all cache levels), cache type = 1 (data)
    builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])


@intrinsic
def prefetch1(typingctx, arr, i):
    """Prefetch the cache line of ``arr[i]`` (1-D array)."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(i, types.Integer):
        return None
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        _emit_prefetch(context, builder, signature.args[0], args[0], [idx])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch2(typingctx, arr, i, j):
    """Prefetch the cache line of ``arr[i, j]`` (2-D array, any layout)."""
    if (not isinstance(arr, types.Array) or arr.ndim != 2 or not isinstance(i, types.Integer)
            or not isinstance(j, types.Integer)):
        return None
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):
        ii = context.cast(builder, args[1], signature.args[1], types.intp)
        jj = context.cast(builder, args[2], signature.args[2], types.intp)
        _emit_prefetch(context, builder, signature.args[0], args[0], [ii, jj])
        return context.get_dummy_value()

    return sig, codegen
