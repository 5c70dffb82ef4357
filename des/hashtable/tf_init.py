"""The TensorFlow twin of ``init.py``: a key's initial values as TF ops, for served models
(``des/serving``): the same uint64 streams in TF ops, the draws' transforms in float64 (TF's
``log``, ``cos`` and ``sin`` being the platform's, not ``_libm.py``'s, the values agree within a
few ulps: ``tests/test_export.py`` compares them to the tables' at 1e-12).

The same streams as :func:`init.init_row`: ``kh = splitmix64(base ^ key)``, stream ``p`` seeded
with ``splitmix64(kh + p * gamma)``, draw ``j`` mapped to (0, 1) as ``((d >> 11) + 0.5) * 2**-53``,
Box-Muller pairs with the angle reduced by the turn as ``_libm.cos_sin_turn`` reduces it, and the
truncated normal's rejection over at most ``init._MAX_ATTEMPTS`` attempts. TensorFlow is imported
only when a function here is called: ``des.hashtable`` never imports it.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError
from ..splitmix import GOLDEN_GAMMA
from .init import _MAX_ATTEMPTS

_GOLDEN = int(GOLDEN_GAMMA)


def tf_splitmix64(z: Any) -> Any:
    """The TensorFlow twin of ``des.splitmix.splitmix64`` on a uint64 tensor: ``mix64(z +
    GOLDEN_GAMMA)``, the finalizer being ``des.data.features.tf_mix64`` (bit for bit the numba
    functions: ``tests/test_export.py``)."""
    import tensorflow as tf

    from des.data.features import tf_mix64

    return tf_mix64(z + tf.constant(_GOLDEN, tf.uint64))


def _unit(cs: Any, j: Any) -> Any:
    """Draw ``j`` of stream ``cs`` in (0, 1), float64 (``des.hashtable.init._unit``)."""
    import tensorflow as tf

    u = tf_splitmix64(cs + tf.cast(j, tf.uint64) * tf.constant(_GOLDEN, tf.uint64))
    return (tf.cast(tf.bitwise.right_shift(u, tf.constant(11, tf.uint64)), tf.float64) + 0.5) * 2.0**-53


def _box_muller(cs: Any, attempt: Any) -> tuple[Any, Any]:
    import tensorflow as tf

    radius = tf.sqrt(-2.0 * tf.math.log(_unit(cs, 2 * attempt)))
    cos, sin = _cos_sin_turn(_unit(cs, 2 * attempt + 1))
    return radius * cos, radius * sin


def _cos_sin_turn(v: Any) -> tuple[Any, Any]:
    """``(cos, sin)(2 pi v)`` reduced by the turn as ``des.hashtable._libm.cos_sin_turn`` does:
    ``4 v = q + r`` exactly, then the quadrant ``q`` of ``(cos, sin)(r pi/2)``."""
    import tensorflow as tf

    q = tf.floor(4.0 * v + 0.5)
    x = (4.0 * v - q) * (math.pi / 2)
    c, s = tf.cos(x), tf.sin(x)
    quadrant = tf.bitwise.bitwise_and(tf.cast(q, tf.int64), 3)
    odd = tf.equal(tf.bitwise.bitwise_and(quadrant, 1), 1)
    one = tf.ones_like(v)
    cos_sign = tf.where(tf.logical_or(tf.equal(quadrant, 1), tf.equal(quadrant, 2)), -one, one)
    sin_sign = tf.where(quadrant >= 2, -one, one)
    return cos_sign * tf.where(odd, s, c), sin_sign * tf.where(odd, c, s)


def initial_values(keys: Any, bases: Any, kind: str, scale: float, dim: int) -> Any:
    """float64 ``[n, dim]`` initial values of int64 ``keys`` with per-key stream bases (uint64), the
    same streams as ``des.hashtable.init.init_row``."""
    import numpy as np
    import tensorflow as tf

    n = tf.shape(keys)[0]
    if kind == "zeros":
        return tf.zeros([n, dim], tf.float64)
    kh = tf_splitmix64(tf.bitwise.bitwise_xor(bases, tf.bitcast(keys, tf.uint64)))[:, None]
    golden = tf.constant(_GOLDEN, tf.uint64)
    if kind == "uniform":
        streams = kh + tf.constant(np.arange(dim, dtype=np.uint64))[None, :] * golden
        return scale * (2.0 * _unit(tf_splitmix64(streams), 0) - 1.0)
    pairs = (dim + 1) // 2
    cs = tf_splitmix64(kh + tf.constant(np.arange(pairs, dtype=np.uint64))[None, :] * golden)  # [n, pairs]
    z0, z1 = _box_muller(cs, 0)
    if kind == "truncated_normal":
        # Each output takes the first attempt with |z| <= 2, clipped after 64 attempts.
        def body(a, z0, z1):
            n0, n1 = _box_muller(cs, a)
            return a + 1, tf.where(tf.abs(z0) > 2.0, n0, z0), tf.where(tf.abs(z1) > 2.0, n1, z1)

        def more(a, z0, z1):
            return tf.logical_and(a < _MAX_ATTEMPTS, tf.reduce_any(tf.abs(tf.concat([z0, z1], 1)) > 2.0))

        _, z0, z1 = tf.while_loop(more, body, (tf.constant(1, tf.int64), z0, z1))
        z0, z1 = tf.clip_by_value(z0, -2.0, 2.0), tf.clip_by_value(z1, -2.0, 2.0)
    elif kind != "normal":
        raise ConfigError(f"initializer {kind!r} cannot be exported")
    return scale * tf.reshape(tf.stack([z0, z1], axis=2), [n, 2 * pairs])[:, :dim]
