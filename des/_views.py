"""Array views from raw addresses, so that one compiled kernel can take the arrays of any number of
tables: an ``int64`` table of addresses (and lengths) instead of a tuple of arrays (numba compiles
a tuple per length and unboxes it element by element: a compilation per new field count and a
per-call cost that grows with the fields) or a ``numba.typed.List`` (slow to create in each new
process).

The caller keeps every array whose address it passes alive and unmoved for the duration of the
call (``des/hashtable/fused.py`` pins the arrays and refreshes the addresses when a table replaces
one; ``des/data/store.py`` holds a chunk's key columns while they are interleaved).
"""

from __future__ import annotations

import numba
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def _pointer(typingctx, addr, like):
    """``addr`` as a pointer to ``like``'s dtype (``like``: an array, or a numpy scalar class)."""
    if not isinstance(addr, types.Integer):
        return None
    if isinstance(like, types.Array):
        dtype = like.dtype
    elif isinstance(like, types.NumberClass):
        dtype = like.instance_type
    else:
        return None
    sig = types.CPointer(dtype)(addr, like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@njit(nogil=True, inline="always")
def view1(addr, rows, like):
    """The C-contiguous ``[rows]`` array at ``addr``, of ``like``'s dtype."""
    return numba.carray(_pointer(addr, like), (rows,))


@njit(nogil=True, inline="always")
def view2(addr, rows, cols, like):
    """The C-contiguous ``[rows, cols]`` array at ``addr``, of ``like``'s dtype."""
    return numba.carray(_pointer(addr, like), (rows, cols))
