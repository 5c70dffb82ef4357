"""The elementary functions of the initializer's Box-Muller transform, written out in numba.

``ln(u)`` and ``(cos, sin)(2 pi v)`` for ``u, v`` in (0, 1]: fdlibm's (Sun's freely distributable
libm, the base of FreeBSD's and musl's) ``e_log.c`` and ``k_sin.c`` / ``k_cos.c`` polynomials, each
within 1 ulp. Why not the platform's libm: its results differ between libm versions and vendors
in the last bit, so the same key could start from different values on two machines, and a
libm call is an opaque function the compiler cannot vectorize or inline (the normal draws were
about half of inserting a key). These use only ``+ - * /``, ``sqrt`` and bit operations, all IEEE
exact-rounded without fast-math, so every machine computes the same bits.

The sine and cosine take the turn ``v`` (the angle over 2 pi), not the angle: ``4 v = q + r``
with ``q`` the nearest integer (an exact split), so the angle is ``q pi/2 + r pi/2`` with
``|r pi/2| <= pi/4``, where the kernels apply; the quadrant ``q`` permutes and negates. There is no
large-argument reduction and no rounding of ``2 pi v`` before it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic


def _bitcast(source: types.Type, target: types.Type) -> object:
    """An intrinsic that reinterprets a ``source`` value's bits as a ``target`` value."""

    @intrinsic
    def cast(typingctx, x):  # noqa: ANN001, ANN202
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(source), codegen

    return cast


_bits = _bitcast(types.float64, types.uint64)  # the IEEE bits of a float64
_float = _bitcast(types.uint64, types.float64)  # the float64 of these bits


@intrinsic
def _divide(typingctx, a, b):  # noqa: ANN001, ANN202
    """``a / b`` in IEEE arithmetic, whatever the caller's numba error model (the "python" model
    checks every divisor for zero, a branch that keeps the loop around it scalar)."""
    sig = types.float64(types.float64, types.float64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.fdiv(args[0], args[1])

    return sig, codegen


_LN2_HI = 6.93147180369123816490e-01  # 0x3fe62e42fee00000
_LN2_LO = 1.90821492927058770002e-10  # 0x3dea39ef35793c76
# e_log.c: ln(1 + f) = 2s + s R(s^2), s = f / (2 + f), R a minimax polynomial in s^2
_LG1, _LG2, _LG3, _LG4, _LG5, _LG6, _LG7 = (
    6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, 2.222219843214978396e-01,
    1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01)

# k_sin.c and k_cos.c: odd and even minimax polynomials on [-pi/4, pi/4]
_S1, _S2, _S3, _S4, _S5, _S6 = (
    -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04, 2.75573137070700676789e-06,
    -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_C1, _C2, _C3, _C4, _C5, _C6 = (
    4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05, -2.75573143513906633035e-07,
    2.08757232129817482790e-09, -1.13596475577881948265e-11)

_PIO2 = 1.57079632679489655800e+00  # pi/2 rounded to float64
_U32 = np.uint64(32)
_LO32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True, inline="always")
def log_unit(u: float) -> float:
    """``ln(u)`` for a normal, positive, finite ``u`` (fdlibm ``__ieee754_log``, its branches for
    zero, negative, subnormal, inf and NaN arguments left out: the draws are in (0, 1])."""
    bits = _bits(u)
    hx = np.int64(bits >> _U32)
    k = (hx >> 20) - 1023
    hx &= 0x000FFFFF
    i = (hx + 0x95F64) & 0x100000
    # normalize the mantissa into [sqrt(2)/2, sqrt(2)): x = 1 + f
    x = _float((np.uint64(hx | (i ^ 0x3FF00000)) << _U32) | (bits & _LO32))
    k += i >> 20
    f = x - 1.0
    dk = float(k)
    s = _divide(f, 2.0 + f)  # 2 + f >= 1.7
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    r = t2 + t1
    # fdlibm's two ways to finish, by the size of f; both computed and one selected (a random
    # mantissa makes a branch here a misprediction half the time)
    hfsq = 0.5 * f * f
    wide = dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)
    narrow = dk * _LN2_HI - ((s * (f - r) - dk * _LN2_LO) - f)
    return wide if ((hx - 0x6147A) | (0x6B851 - hx)) > 0 else narrow


@njit(cache=True, nogil=True, inline="always")
def _sin_kernel(x: float) -> float:
    """sin(x) for |x| <= pi/4 (fdlibm ``__kernel_sin`` with a zero tail)."""
    z = x * x
    v = z * x
    r = _S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))
    return x + v * (_S1 + z * r)


@njit(cache=True, nogil=True, inline="always")
def _cos_kernel(x: float) -> float:
    """cos(x) for |x| <= pi/4 (fdlibm ``__kernel_cos`` with a zero tail)."""
    z = x * x
    w = z * z
    r = z * (_C1 + z * (_C2 + z * _C3)) + w * w * (_C4 + z * (_C5 + z * _C6))
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + z * r)


@njit(cache=True, nogil=True, inline="always")
def cos_sin_turn(v: float) -> tuple[float, float]:
    """``(cos(2 pi v), sin(2 pi v))`` for ``0 <= v <= 1``."""
    q = np.floor(4.0 * v + 0.5)
    r = 4.0 * v - q  # exact: |r| <= 1/2
    x = r * _PIO2
    c = _cos_kernel(x)
    s = _sin_kernel(x)
    quadrant = np.int64(q)
    odd = (quadrant & 1) == 1
    # quadrant 0..3: cos = c, -s, -c, s and sin = s, c, -s, -c (selects and exact sign flips, no
    # branch: the quadrant is random)
    cos_sign = 1.0 - 2.0 * float(((quadrant + 1) >> 1) & 1)
    sin_sign = 1.0 - 2.0 * float((quadrant >> 1) & 1)
    return cos_sign * (s if odd else c), sin_sign * (c if odd else s)
