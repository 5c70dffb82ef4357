"""The TensorFlow twin of ``keys.py``'s Criteo keys: a request's raw Criteo columns -> int64 keys,
in TF ops, for served models (``des/serving``). Exact: the integer transform is a table of the
thresholds of des's own :func:`keys.integer_token` (its float64 ``ln`` rounding included, no
logarithm in the graph), the hex parsing and the field bits are integer ops
(``tests/test_export.py`` compares them to ``keys.py``). TensorFlow is imported only when used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .features import MISSING_INT  # an integer column's "missing" in a request
from .keys import (FIELD_SHIFT, INT_TOKEN_MAX, INT_TOKEN_MIN, INT_TOKEN_OFFSET, MISSING_VALUE, NUM_CAT_FIELDS,
                   NUM_INT_FIELDS, integer_token)


def integer_token_thresholds() -> np.ndarray:
    """``t[i]``: the smallest int64 ``v >= 3`` whose token (des's own ``integer_token``) is at least
    ``i + 2``. For ``v >= 3`` the token is then ``1 + #{i: t[i] <= v}``: an exact copy of training's
    transform (float64 ``ln`` rounding included) without a logarithm in the graph."""
    top = integer_token(2**63 - 1)
    thresholds = []
    lo = 3
    for token in range(2, top + 1):
        hi = 2**63 - 1
        while lo < hi:  # smallest v in [lo, hi] with integer_token(v) >= token
            mid = (lo + hi) // 2
            if integer_token(mid) >= token:
                hi = mid
            else:
                lo = mid + 1
        thresholds.append(lo)
    out = np.array(thresholds, dtype=np.int64)
    # The transform must be monotone for a threshold table to be exact; check around each step.
    for i, v in enumerate(thresholds):
        if integer_token(v) != i + 2 or integer_token(v - 1) != i + 1:
            raise AssertionError(f"integer transform is not a step function at {v}")
    return out


def _hex_digit_table() -> list[int]:
    table = [-1] * 256
    for text in ("0123456789abcdef", "0123456789ABCDEF"):
        for value, char in enumerate(text):
            table[ord(char)] = value
    return table


class CriteoKeys:
    """The raw Criteo columns of a batch -> int64 keys ``[B, 39]``, in TF ops (``keys.py``)."""

    def __init__(self) -> None:
        import tensorflow as tf

        self.num_int, self.num_cat = NUM_INT_FIELDS, NUM_CAT_FIELDS
        self.shift, self.missing = FIELD_SHIFT, MISSING_VALUE
        self.token_min, self.token_max, self.offset = INT_TOKEN_MIN, INT_TOKEN_MAX, INT_TOKEN_OFFSET
        self.thresholds = tf.constant(integer_token_thresholds())
        self.hex_digits = tf.constant(_hex_digit_table(), tf.int64)

    def integer(self, fields: list[int], values: Any) -> Any:
        """Keys ``[B, n]`` of int64 columns ``[B, n]`` of fields ``fields`` (``MISSING_INT`` = missing)."""
        import tensorflow as tf

        flat = tf.reshape(values, [1, -1])  # searchsorted wants one row of values per sequence
        large = 1 + tf.reshape(tf.searchsorted(self.thresholds[None, :], flat, side="right", out_type=tf.int64),
                               tf.shape(values))
        token = tf.where(values <= 2, values, large)
        u = tf.clip_by_value(token, self.token_min, self.token_max) + self.offset
        u = tf.where(values == MISSING_INT, tf.constant(self.missing, tf.int64), u)
        return tf.bitwise.bitwise_or(self._field_bits(fields), u)

    def categorical(self, fields: list[int], names: list[str], values: Any) -> Any:
        """Keys ``[B, n]`` of hex-string columns ``[B, n]`` (``""`` = missing); a value other than 8
        hex digits fails with an error naming its column."""
        import tensorflow as tf

        length = tf.strings.length(values)
        raw = tf.io.decode_raw(tf.reshape(values, [-1]), tf.uint8, fixed_length=8)  # [B * n, 8], zero-padded
        digits = tf.reshape(tf.gather(self.hex_digits, tf.cast(raw, tf.int32)), tf.concat([tf.shape(values), [8]], 0))
        valid = tf.logical_or(length == 0, tf.logical_and(length == 8, tf.reduce_all(digits >= 0, axis=2)))
        first_bad = tf.where(tf.logical_not(valid))[:1]  # [row, column] of the first bad value, if any
        check = tf.debugging.Assert(tf.reduce_all(valid), [
            "request column", tf.gather(tf.constant(names), first_bad[:, 1]),
            "has a value that is not 8 hex digits or empty (missing):", tf.gather_nd(values, first_bad)])
        with tf.control_dependencies([check]):
            powers = tf.constant([16**i for i in range(7, -1, -1)], tf.int64)
            u = tf.reduce_sum(tf.maximum(digits, 0) * powers, axis=2)
        u = tf.where(length == 0, tf.constant(self.missing, tf.int64), u)
        return tf.bitwise.bitwise_or(self._field_bits(fields), u)

    def _field_bits(self, fields: list[int]) -> Any:
        import tensorflow as tf

        return tf.constant([(f + 1) << self.shift for f in fields], tf.int64)[None, :]
