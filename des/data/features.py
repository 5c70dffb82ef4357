"""The key schemes and the feature transforms of declared schemas, both sides next to each other.

Every schema (the built-in ``criteo`` too) turns raw values into int64 keys and dense values here,
once as numpy/numba code used when preparing data (``des.data prepare``) and once as TensorFlow ops
used by a served model (:class:`ServingFeatures`), each TF twin (``tf_*``) right after its numpy
function, so that one is not changed without the other; the tests check that both give the same
keys (bit for bit), weights and dense values. TensorFlow is imported only inside the TF side, so
preparing data never loads it.

Key scheme 2 (a field's keys only need to be unique within the field: one table per field):

* a missing value (null, empty string) of a categorical column or of a multi-valued element: key 0;
* a string: ``h = len(bytes) * GOLDEN``; for each 8-byte little-endian word ``w`` of its UTF-8
  bytes (the last one zero-padded) ``h = mix64(h ^ w)``; ``key = h >> 1``, and 1 where that is 0;
* an integer ``v`` (a categorical column of ``dtype = "int"``): ``key = mix64(v ^ INT_SALT) >> 1``,
  1 where that is 0;
* 8 hex digits (either case; a categorical column of ``dtype = "hex"``): ``key = int(hex, 16) + 1``;
* a bucketized number: ``key = bucket + 1`` (missing: 0);
* a derived value (hour of day 0..23, weekday 0..6 from Monday): ``key = value + 1``;
* a cross of two fields' keys ``a`` and ``b``: ``key = mix64(mix64(a) ^ b) >> 1``, 1 where that is 0.
  A missing key (0) is crossed like any other: "missing x b" is a value of its own.

Key scheme 1 (``key_scheme = 1``, the built-in ``criteo``'s, ``keys.KEY_SCHEME``: the keys of
stores prepared before schemas existed) tags the scheme 2 key ``k`` of field number ``f`` (hex ids
and buckets only: ``k <= 2^32``) with the field: ``key = ((f + 1) << 40) | u``, ``u = k - 1``, and
``u = 2^32`` for a missing value (``k = 0``). So an integer column's ``u`` is ``clip(t, -2^31,
2^31 - 1) + 2^31`` of its ``log_squared`` token ``t`` and a hex id's is its value, as ``keys.py``
documents.

``mix64`` is the SplitMix64 finalizer (``des.splitmix.mix64``). Keys are 63-bit, so they are never
negative and never one of the hash tables' two reserved values; among ``n`` distinct values of a
field about ``n^2 / 2^64`` pairs collide (about 5e-4 pairs at 10^8 values).

Numbers: a bucketized column's bucket is ``i`` where ``boundaries[i-1] <= v < boundaries[i]``
(``fixed`` boundaries, or ``quantiles`` computed from the training rows); ``log_squared`` is
Criteo's transform: ``t = floor(v)`` if ``v <= 2`` else ``floor(ln(v)^2)`` (``v`` above 2^63 counts
as 2^63), the bucket ``clip(t, -2^31, 2^31 - 1) + 2^31``. Both sides find ``floor(ln(v)^2)`` in
one table of the exact thresholds of the numba transform, so they agree bit for bit. A dense column
gives ``x = fill`` where missing (NaN), then ``log1p(max(x, 0))`` when ``transform = "log1p"``, then
``(x - mean) / std`` when standardized, in float64, stored as float32.

Multi-valued columns: a null or empty cell has no ids; the cell is split at ``separator``, cut to
its first ``max_length`` elements, each element is ``id`` or (with ``weight_separator``) ``id:weight``
(weight 1 where it has none); an empty id is key 0. Pooling ``mean`` stores the weights ``w_i / n``
with ``n`` the row's number of (kept) elements.

Derived fields come from a registry of transforms (:class:`Transform`, :func:`register_transform`):
``hour_of_day`` and ``weekday`` of a timestamp given as unix seconds (``time_format = "unix"``, an
int column) or as text in a fixed-width ``strptime``-like format (``%Y %y %m %d %H %M %S`` and
literal characters, such as Avazu's ``%y%m%d%H``; ``%y`` is 2000-2068 for 00-68, else 19xx), and
``cross`` of two one-hot features. A user adds a transform from a plugin file (``--plugins``).

Numbers are read as float64 (a numeric column of ``dtype = "int"``: an int64 in a request, its
float64 value in the transform, the rounding of ``float(v)`` as ``keys.integer_token``'s).

Requests to a served model (:class:`ServingFeatures`) give each read column as a 1-D tensor of its
declared dtype: int64 (missing: ``MISSING_INT`` = -2**63), float64 (missing: NaN) or string
(missing: ``""``, a hex id too); a multi-valued column as its delimited string.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numba
import numpy as np

from des.registry import Registry

from .batch import FieldBatch
from .parallel import each
from .keys import FIELD_SHIFT, MISSING_VALUE
from ..splitmix import GOLDEN_GAMMA, mix64

if TYPE_CHECKING:
    import pyarrow as pa

# Columns, derived fields and schemas are ``des.data.schema``'s ColumnSpec, DerivedSpec and Schema
# (schema.py imports this module for its registry of transforms, so they are not imported here).
ColumnSpec = DerivedSpec = Schema = Any

KEY_SCHEME_2: dict[str, Any] = {
    "name": "des-schema-key",
    "version": 2,
    "missing": "key 0 (null or empty value, empty id of a multi-valued cell, missing number)",
    "string": "h = len(utf8) * 0x9E3779B97F4A7C15; h = mix64(h ^ w) per 8-byte little-endian word "
              "(zero-padded); key = h >> 1, 0 -> 1",
    "integer": "key = mix64(v ^ 0x243F6A8885A308D3) >> 1, 0 -> 1",
    "bucket": "key = bucket + 1",
    "derived": "key = value + 1",
    "cross": "key = mix64(mix64(a) ^ b) >> 1, 0 -> 1",
    "mix64": "SplitMix64 finalizer",
}
INT_SALT = np.uint64(0x243F6A8885A308D3)
MISSING_INT = -(2**63)  # an int64 request value that stands for "missing"
LOG_SQUARED_OFFSET = 1 << 31
_LOG_SQUARED_MAX = float(2**63)
_GOLDEN = int(GOLDEN_GAMMA)
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_ONE = np.uint64(1)
_SIXTY_THREE = np.uint64(63)


# ====================================================================== keys (each TF twin after its numpy side)
@numba.njit(cache=True, inline="always")
def finish_key(h: np.uint64) -> np.int64:
    """A key of a mixed 64-bit hash: its top 63 bits, 0 (the missing key) made 1."""
    key = np.int64(h >> _ONE)
    return key if key != 0 else np.int64(1)


def _tf_uint64(x: int) -> Any:
    import tensorflow as tf

    return tf.constant(x, tf.uint64)


def tf_mix64(z: Any) -> Any:
    """The SplitMix64 finalizer on a uint64 tensor (``des.splitmix.mix64``)."""
    import tensorflow as tf

    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _tf_uint64(30))) * _tf_uint64(_M1)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _tf_uint64(27))) * _tf_uint64(_M2)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _tf_uint64(31)))


def _tf_finish(h: Any) -> Any:
    import tensorflow as tf

    key = tf.bitcast(tf.bitwise.right_shift(h, _tf_uint64(1)), tf.int64)
    return tf.where(key == 0, tf.constant(1, tf.int64), key)


@numba.njit(cache=True, inline="always")
def string_key(data: np.ndarray, start: int, end: int) -> np.int64:
    """Key scheme 2 of the UTF-8 bytes ``data[start:end]`` (0 if empty)."""
    n = end - start
    if n == 0:
        return np.int64(0)
    h = np.uint64(n) * GOLDEN_GAMMA
    i = start
    while i < end:
        w = np.uint64(0)
        stop = min(i + 8, end)
        for j in range(stop - 1, i - 1, -1):
            w = (w << np.uint64(8)) | np.uint64(data[j])
        h = mix64(h ^ w)
        i += 8
    return finish_key(h)


@numba.njit(cache=True, inline="always")
def word_key(words: np.ndarray, start: int, n: int) -> np.int64:
    """:func:`string_key` of the ``n`` bytes (1 to 8) at byte ``start`` of ``words`` (bytes as
    aligned 8-byte words): one word from two aligned loads, without a loop over its bytes."""
    shift = np.uint64((start & 7) * 8)
    q = start >> 3
    w = (words[q] >> shift) | ((words[q + 1] << (_SIXTY_THREE - shift)) << _ONE)
    if n < 8:
        w &= (_ONE << np.uint64(8 * n)) - _ONE
    return finish_key(mix64((np.uint64(n) * GOLDEN_GAMMA) ^ w))


@numba.njit(cache=True, nogil=True)
def _string_keys_kernel(data, words, offsets, validity, has_validity, offset, out):
    """:func:`string_key` of each value; a value of at most 8 bytes whose word lies in ``words``
    (``data`` as aligned 8-byte words) is read as one word from two aligned loads, without a loop
    over its bytes whose length varies from value to value (1.75x on Avazu's short values)."""
    limit = words.shape[0] * 8 - 16  # a value starting here or before: both its words are in ``words``
    for i in range(out.shape[0]):
        position = offset + i
        start, end = offsets[position], offsets[position + 1]
        n = end - start
        if has_validity and not (validity[position >> 3] >> (position & 7)) & 1:
            out[i] = 0
        elif 0 < n <= 8 and start <= limit:
            out[i] = word_key(words, start, n)
        else:
            out[i] = string_key(data, start, end)


@numba.njit(cache=True, nogil=True)
def _int_keys_kernel(values, valid, out):
    for i in range(values.shape[0]):
        out[i] = finish_key(mix64(np.uint64(values[i]) ^ INT_SALT)) if valid[i] else 0


@numba.njit(cache=True, nogil=True)
def _cross_kernel(a, b, out):
    for i in range(a.shape[0]):
        out[i] = finish_key(mix64(mix64(np.uint64(a[i])) ^ np.uint64(b[i])))


def _arrow_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool, int]:
    """(data bytes, offsets, validity bitmap, has one, array offset) of an Arrow (large_)string array."""
    import pyarrow as pa

    validity, offsets, data = array.buffers()[:3]
    offset_type = np.int64 if pa.types.is_large_string(array.type) else np.int32
    count = len(array) + array.offset + 1
    offsets_np = np.frombuffer(offsets, dtype=offset_type, count=count) if offsets is not None else np.zeros(count,
                                                                                                          offset_type)
    data_np = np.frombuffer(data, dtype=np.uint8) if data is not None and data.size else np.zeros(1, np.uint8)
    has_validity = validity is not None and array.null_count > 0
    validity_np = np.frombuffer(validity, dtype=np.uint8) if has_validity else np.zeros(1, np.uint8)
    return data_np, offsets_np, validity_np, has_validity, array.offset


def _words(array: pa.Array) -> np.ndarray:
    """The data buffer of a string array as whole 8-byte words, where it is 8-byte aligned (else
    none: every value is read byte by byte)."""
    data = array.buffers()[2]
    if data is None or data.size < 16 or data.address % 8:
        return _NO_WORDS
    return np.frombuffer(data, dtype=np.uint64, count=data.size // 8)


_NO_WORDS = np.zeros(0, dtype=np.uint64)


def by_indices(array: pa.DictionaryArray, keys: np.ndarray) -> np.ndarray:
    """The keys of a dictionary array's values from ``keys``, its dictionary's (a null: 0): text
    hashed once per distinct value, as a Parquet file's or a pandas categorical's dictionary holds
    it (2M Avazu-like rows in such a Parquet file prepared 1.16x faster than decoded to text)."""
    indices = array.indices
    if len(keys) == 0:  # every value null
        return np.zeros(len(array), dtype=np.int64)
    out = keys[np.asarray(indices.fill_null(0) if indices.null_count else indices, dtype=np.int64)]
    if indices.null_count:
        out[~np.asarray(indices.is_valid())] = 0
    return out


@dataclass(frozen=True)
class StringKeys:
    """A text column's :func:`string_keys`, taken where its rows were read (``tokenizer.py``):
    what a chunk's columns hold for it in place of the text."""

    keys: np.ndarray

    def __len__(self) -> int:
        return self.keys.shape[0]

    def filter(self, mask: Any) -> StringKeys:
        """The keys of the rows ``mask`` keeps (booleans, as ``pyarrow.Array.filter`` takes them)."""
        return StringKeys(self.keys[np.asarray(mask, dtype=bool)])


def string_keys(array: pa.Array | pa.ChunkedArray | StringKeys) -> np.ndarray:
    """Key scheme 2 of every value of an Arrow string array (null and ``""``: 0), int64 (of
    :class:`StringKeys`: its keys, as they are)."""
    import pyarrow as pa

    if isinstance(array, StringKeys):
        return array.keys
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    out = np.empty(sum(len(c) for c in chunks), dtype=np.int64)
    position = 0
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            out[position:position + len(chunk)] = by_indices(chunk, string_keys(chunk.dictionary))
            position += len(chunk)
            continue
        if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
            chunk = chunk.cast(pa.string())
        data, offsets, validity, has_validity, offset = _arrow_buffers(chunk)
        _string_keys_kernel(data, _words(chunk), offsets, validity, has_validity, offset,
                            out[position:position + len(chunk)])
        position += len(chunk)
    return out


def tf_string_keys(values: Any) -> Any:
    """Key scheme 2 of a string tensor of any shape (``""``: 0), int64 of its shape: every value
    hashed in one loop over 8-byte words (as many rounds as the longest value has words)."""
    import tensorflow as tf

    shape, values = tf.shape(values), tf.reshape(values, [-1])
    lengths = tf.cast(tf.strings.length(values), tf.int64)
    words = (tf.reduce_max(tf.concat([lengths, [0]], 0)) + 7) // 8
    raw = tf.io.decode_raw(values, tf.uint8, fixed_length=tf.cast(tf.maximum(words, 1) * 8, tf.int32))
    raw = tf.reshape(tf.cast(raw, tf.uint64), [tf.shape(values)[0], -1, 8])
    shifts = tf.constant([8 * i for i in range(8)], tf.uint64)
    packed = tf.reduce_sum(tf.bitwise.left_shift(raw, shifts), axis=2)  # [n, words]: disjoint bits
    count = (lengths + 7) // 8

    def step(j: Any, h: Any) -> tuple[Any, Any]:
        mixed = tf_mix64(tf.bitwise.bitwise_xor(h, packed[:, j]))
        return j + 1, tf.where(j < count, mixed, h)

    h0 = tf.cast(lengths, tf.uint64) * _tf_uint64(_GOLDEN)
    _, h = tf.while_loop(lambda j, h: j < words, step, (tf.constant(0, tf.int64), h0))
    return tf.reshape(tf.where(lengths == 0, tf.constant(0, tf.int64), _tf_finish(h)), shape)


def int_keys(values: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """Key scheme 2 of int64 values (``valid`` false, or ``MISSING_INT`` when no mask is given: 0)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    mask = values != MISSING_INT if valid is None else np.ascontiguousarray(valid, dtype=np.bool_)
    out = np.empty(values.shape[0], dtype=np.int64)
    _int_keys_kernel(values, mask, out)
    return out


def tf_int_keys(values: Any) -> Any:
    """Key scheme 2 of an int64 tensor of any shape (``MISSING_INT``: 0)."""
    import tensorflow as tf

    mixed = _tf_finish(tf_mix64(tf.bitwise.bitwise_xor(tf.bitcast(values, tf.uint64), _tf_uint64(int(INT_SALT)))))
    return tf.where(values == MISSING_INT, tf.constant(0, tf.int64), mixed)


def cross_keys(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The keys of the cross of two fields' keys."""
    out = np.empty(a.shape[0], dtype=np.int64)
    _cross_kernel(np.ascontiguousarray(a, np.int64), np.ascontiguousarray(b, np.int64), out)
    return out


def tf_cross_keys(a: Any, b: Any) -> Any:
    """The keys of the cross of two int64 key tensors."""
    import tensorflow as tf

    inner = tf_mix64(tf.bitcast(a, tf.uint64))
    return _tf_finish(tf_mix64(tf.bitwise.bitwise_xor(inner, tf.bitcast(b, tf.uint64))))


def _hex_digit_table() -> np.ndarray:
    table = np.full(256, -1, dtype=np.int64)
    for text in ("0123456789abcdef", "0123456789ABCDEF"):
        for value, char in enumerate(text):
            table[ord(char)] = value
    return table


HEX_DIGITS = _hex_digit_table()  # byte -> hex digit value, -1 if not a hex digit


@numba.njit(cache=True, nogil=True)
def _hex_keys_kernel(data, offsets, validity, has_validity, offset, digits, out):
    for i in range(out.shape[0]):
        position = offset + i
        start, end = offsets[position], offsets[position + 1]
        if (has_validity and not (validity[position >> 3] >> (position & 7)) & 1) or start == end:
            out[i] = 0
            continue
        if end - start != 8:
            out[i] = -1
            continue
        value = np.int64(0)
        for j in range(start, end):
            digit = digits[data[j]]
            if digit < 0:
                value = np.int64(-2)
                break
            value = value * 16 + digit
        out[i] = value + 1


@numba.njit(cache=True, nogil=True)
def _hex_value_keys_kernel(values, tag, out):
    for i in range(values.shape[0]):
        out[i] = _tagged(values[i] + 1 if values[i] >= 0 else 0, tag)


def hex_keys(values: Any, tag: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """Key scheme 2 of hex ids: an Arrow string array (null or ``""``: 0; not 8 hex digits: -1, a
    bad value) or the int64 values Criteo's reader gives (-1: missing); with a field's ``tag``, key
    scheme 1's (:func:`tagged_keys`; of the reader's values in the same pass, into ``out`` when
    given: the values' own memory may be it)."""
    if isinstance(values, np.ndarray):
        out = np.empty(values.shape[0], dtype=np.int64) if out is None else out
        _hex_value_keys_kernel(values, np.int64(tag), out)
        return out
    import pyarrow as pa

    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    out = np.empty(sum(len(c) for c in chunks), dtype=np.int64)
    position = 0
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            out[position:position + len(chunk)] = by_indices(chunk, hex_keys(chunk.dictionary))
            position += len(chunk)
            continue
        if not pa.types.is_string(chunk.type):
            chunk = chunk.cast(pa.string())
        data, offsets, validity, has_validity, offset = _arrow_buffers(chunk)
        _hex_keys_kernel(data, offsets, validity, has_validity, offset, HEX_DIGITS,
                         out[position:position + len(chunk)])
        position += len(chunk)
    return tagged_keys(out, tag)


def tf_hex_keys(values: Any, names: Sequence[str]) -> Any:
    """Key scheme 2 of hex ids, as :func:`hex_keys`: ``[B, k]`` strings of the ``k`` request
    columns ``names`` at once; a value other than 8 hex digits or empty fails with an error naming
    its column (the first such value's).

    Each value's first 8 bytes (zero-padded) are looked up in :data:`HEX_DIGITS`, the numpy side's
    table (-1: not a digit, the padding included), all in one gather: a value of 8 characters whose
    8 digits are all >= 0 spells ``Σ digit_i · 16^(7 - i)``, exactly the number the numpy side
    accumulates; any other non-empty value is refused."""
    import tensorflow as tf

    length = tf.strings.length(values)
    empty = length == 0
    digits = tf.gather(tf.constant(HEX_DIGITS), tf.cast(tf.io.decode_raw(values, tf.uint8, fixed_length=8), tf.int32))
    valid = tf.logical_or(empty, tf.logical_and(length == 8, tf.reduce_min(digits, axis=-1) >= 0))
    first_bad = tf.where(tf.logical_not(valid))[:1]  # [0 or 1, 2]: (row, column)
    check = tf.debugging.Assert(tf.reduce_all(valid), [
        "request column", tf.gather(tf.constant(list(names)), first_bad[:, 1]),
        "has a value that is not 8 hex digits or empty (missing):", tf.gather_nd(values, first_bad)])
    with tf.control_dependencies([check]):
        value = tf.reduce_sum(digits * tf.constant(16 ** np.arange(7, -1, -1, dtype=np.int64)), axis=-1)
    return tf.where(empty, tf.constant(0, tf.int64), value + 1)


@numba.njit(cache=True, inline="always")
def _tagged(key, tag):
    """Key scheme 1 of a scheme 2 key (at most 2^32) of the field of ``tag`` (0: the key itself)."""
    if tag == 0:
        return key
    return tag | ((key - 1) if key != 0 else MISSING_VALUE)


@numba.njit(cache=True, nogil=True)
def _tag_kernel(keys, tag, out):
    for i in range(keys.shape[0]):
        out[i] = _tagged(keys[i], tag)


def field_tag(field: int) -> int:
    """Key scheme 1's bits of field number ``field``: ``(field + 1) << 40``."""
    return (field + 1) << FIELD_SHIFT


def tagged_keys(keys: np.ndarray, tag: int) -> np.ndarray:
    """Key scheme 1 of a field's scheme 2 keys (at most 2^32), ``tag`` its :func:`field_tag`:
    ``tag | (k - 1)``, missing (0): ``tag | 2^32``; in place (``tag`` 0: the keys as they are)."""
    if tag:
        _tag_kernel(keys, np.int64(tag), keys)
    return keys


def tf_tagged_keys(keys: Any, tags: Sequence[int]) -> Any:
    """Key scheme 1 of ``[B, k]`` scheme 2 keys of ``k`` fields, ``tags`` their :func:`field_tag` s,
    as :func:`tagged_keys`."""
    import tensorflow as tf

    u = tf.where(keys == 0, tf.constant(MISSING_VALUE, tf.int64), keys - 1)
    return tf.bitwise.bitwise_or(tf.constant(np.asarray(tags, dtype=np.int64))[None, :], u)


# ====================================================================== numbers
@numba.njit(cache=True, nogil=True)
def _float_token(v: float) -> np.int64:
    log = math.log(v)
    return np.int64(math.floor(log * log))


@numba.njit(cache=True, nogil=True)
def _log_squared_thresholds_kernel(top: int) -> np.ndarray:
    """``t[k]``: the smallest float64 ``v > 2`` whose ``floor(ln(v)^2)`` is at least ``k + 1``,
    found by bisection over the (ordered) bit patterns of positive doubles."""
    out = np.empty(top, dtype=np.float64)
    bits = np.empty(1, dtype=np.int64)
    lo = np.int64(np.array([2.0]).view(np.int64)[0]) + 1
    for k in range(1, top + 1):
        hi = np.int64(np.array([_LOG_SQUARED_MAX]).view(np.int64)[0])
        while lo < hi:
            mid = lo + (hi - lo) // 2
            bits[0] = mid
            if _float_token(bits.view(np.float64)[0]) >= k:
                hi = mid
            else:
                lo = mid + 1
        bits[0] = lo
        out[k - 1] = bits.view(np.float64)[0]
    return out


_THRESHOLDS: list[np.ndarray] = []


def log_squared_thresholds() -> np.ndarray:
    """The thresholds of ``floor(ln(v)^2)`` for ``2 < v <= 2^63`` (float64, ascending): for such a
    ``v`` the token is ``#{k: t[k] <= v}``. Both sides bucket with this one table."""
    if not _THRESHOLDS:
        _THRESHOLDS.append(_log_squared_thresholds_kernel(int(_float_token(_LOG_SQUARED_MAX))))
    return _THRESHOLDS[0]


@numba.njit(cache=True, nogil=True)
def _log_squared_kernel(values, thresholds, small, tag, out):
    for i in range(values.shape[0]):
        v = values[i]
        if math.isnan(v):
            out[i] = _tagged(0, tag)
            continue
        if v <= 2.0:
            token = max(min(math.floor(v), LOG_SQUARED_OFFSET - 1.0), -float(LOG_SQUARED_OFFSET))
        elif v < small.shape[0] and v == math.floor(v):  # an integer count: the table's entry
            token = small[np.int64(v)]
        else:
            token = np.searchsorted(thresholds, min(v, _LOG_SQUARED_MAX), side="right")
        out[i] = _tagged(np.int64(token) + LOG_SQUARED_OFFSET + 1, tag)


_SMALL_TOKENS: list[np.ndarray] = []


def log_squared_keys(values: np.ndarray, tag: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """Keys of numbers bucketized by Criteo's transform (NaN: 0); with a field's ``tag``, key scheme
    1's (:func:`tagged_keys`, in the same pass). The tokens of the integers below 2^14 (most
    counts) are looked up in a table made by the same search of the thresholds. ``out``: where to
    write them (the values' own memory may be it)."""
    v = np.ascontiguousarray(values, dtype=np.float64)
    out = np.empty(v.shape[0], dtype=np.int64) if out is None else out
    if not _SMALL_TOKENS:
        _SMALL_TOKENS.append(np.searchsorted(log_squared_thresholds(), np.arange(1 << 14, dtype=np.float64),
                                             side="right").astype(np.int64))
    _log_squared_kernel(v, log_squared_thresholds(), _SMALL_TOKENS[0], np.int64(tag), out)
    return out


def tf_log_squared_keys(values: Any) -> Any:
    """Keys of numbers (a tensor of any shape) bucketized by Criteo's transform, as
    :func:`log_squared_keys`: a number above 2 by one search in the thresholds, one at most 2 as its
    floor (at least ``-LOG_SQUARED_OFFSET``), a missing one as 0. ``values``: float64 (missing:
    NaN) or an int64 request column (missing: ``MISSING_INT``), read as :func:`tf_float_values`
    reads it: ``float64(v) <= 2`` exactly when ``v <= 2``, such a ``v`` its own floor, and
    ``float64(v)`` never above the cap, so the int64 ops give the float64 ones' keys with fewer ops."""
    import tensorflow as tf

    if values.dtype == tf.int64:
        missing, at_most_2 = values == MISSING_INT, values <= 2
        small = tf.maximum(values, -LOG_SQUARED_OFFSET)
        numbers = tf.cast(values, tf.float64)
    else:
        missing, at_most_2 = tf.math.is_nan(values), values <= 2.0
        small = tf.cast(tf.maximum(tf.floor(tf.minimum(values, 2.0)), -float(LOG_SQUARED_OFFSET)), tf.int64)
        numbers = tf.minimum(values, _LOG_SQUARED_MAX)
    table = tf.constant(log_squared_thresholds().reshape(1, -1))
    large = tf.raw_ops.UpperBound(sorted_inputs=table, values=tf.reshape(numbers, [1, -1]), out_type=tf.int64)
    shape = [-1, values.shape[1]] if values.shape.rank == 2 and values.shape[1] is not None else tf.shape(values)
    token = tf.where(at_most_2, small, tf.reshape(large, shape))  # (UpperBound's [1, n] reshaped: no shape ops)
    return tf.where(missing, tf.constant(0, tf.int64), token + LOG_SQUARED_OFFSET + 1)


def bucket_keys(values: np.ndarray, boundaries: Sequence[float]) -> np.ndarray:
    """Keys of numbers bucketized at ``boundaries`` (bucket i: boundaries[i-1] <= v < boundaries[i]; NaN: 0)."""
    v = np.asarray(values, dtype=np.float64)
    buckets = np.searchsorted(np.asarray(boundaries, dtype=np.float64), v, side="right")
    return np.where(np.isnan(v), 0, buckets + 1).astype(np.int64)


def tf_bucket_keys(values: Any, boundaries: Sequence[Sequence[float]]) -> Any:
    """Keys of ``[B, k]`` float64 numbers of ``k`` columns, column ``j`` at ``boundaries[j]`` (NaN:
    0), as :func:`bucket_keys`: one search in the columns' boundaries padded with +inf to a common
    length, the count cut at the column's own (a +inf value counts the padding, nothing else does)."""
    import tensorflow as tf

    width = max([1, *(len(b) for b in boundaries)])
    table = np.full((len(boundaries), width), np.inf)
    for j, column in enumerate(boundaries):
        table[j, :len(column)] = column
    found = tf.searchsorted(tf.constant(table), tf.transpose(values), side="right", out_type=tf.int64)
    counts = tf.constant(np.array([len(b) for b in boundaries], dtype=np.int64))[None, :]
    buckets = tf.minimum(tf.transpose(found), counts)
    return tf.where(tf.math.is_nan(values), tf.constant(0, tf.int64), buckets + 1)


def dense_transform(values: np.ndarray, column: ColumnSpec) -> np.ndarray:
    """A dense column's values before standardizing (float64; ``fill`` for missing, then log1p)."""
    x = np.where(np.isnan(values), column.fill, np.asarray(values, dtype=np.float64))
    if column.transform == "log1p":
        x = np.log1p(np.maximum(x, 0.0))
    return x


def dense_values(values: np.ndarray, column: ColumnSpec) -> np.ndarray:
    """A dense column's model input (float32): ``dense_transform``, then ``(x - mean) / std``."""
    x = dense_transform(values, column)
    if column.standardize:
        x = (x - column.mean) / column.std
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf, as TensorFlow's cast gives
        return x.astype(np.float32)


def tf_dense_values(values: Any, columns: Sequence[ColumnSpec]) -> Any:
    """``[B, k]`` float64 values of the dense ``columns`` as the model's input (float32), as
    :func:`dense_values` column by column: each step on all columns at once, a column that has no
    log1p or standardization keeping its value (``where``, so the same float64 ops give the same bits)."""
    import tensorflow as tf

    def row(values: list[float]) -> Any:
        return tf.constant(np.asarray(values, dtype=np.float64))[None, :]

    x = tf.where(tf.math.is_nan(values), row([c.fill for c in columns]), values)
    logs = [c.transform == "log1p" for c in columns]
    if any(logs):
        x = tf.where(tf.constant(logs)[None, :], tf.math.log1p(tf.maximum(x, 0.0)), x)
    standard = [bool(c.standardize) for c in columns]
    if any(standard):
        mean, std = row([c.mean if c.standardize else 0.0 for c in columns]), row([c.std if c.standardize else 1.0
                                                                                   for c in columns])
        x = tf.where(tf.constant(standard)[None, :], (x - mean) / std, x)
    return tf.cast(x, tf.float32)


# ====================================================================== time
_TIME_DIRECTIVES = {"Y": (1, 4), "y": (2, 2), "m": (3, 2), "d": (4, 2), "H": (5, 2), "M": (6, 2), "S": (7, 2)}


@dataclass(frozen=True)
class TimeFormat:
    """A fixed-width time format: per position, a directive code (0 = literal byte) and its byte."""

    text: str
    codes: tuple[int, ...]
    widths: tuple[int, ...]
    literals: tuple[int, ...]

    @property
    def length(self) -> int:
        return sum(self.widths)


def parse_time_format(text: str) -> TimeFormat:
    """Compile ``%y%m%d%H``-like text; ValueError for an unsupported directive or no date part."""
    codes, widths, literals = [], [], []
    i = 0
    data = text.encode("utf-8")
    while i < len(data):
        if data[i] == ord("%"):
            directive = chr(data[i + 1]) if i + 1 < len(data) else ""
            if directive not in _TIME_DIRECTIVES:
                raise ValueError(f"unsupported directive %{directive} (supported: "
                                 f"{' '.join('%' + d for d in _TIME_DIRECTIVES)})")
            code, width = _TIME_DIRECTIVES[directive]
            codes.append(code), widths.append(width), literals.append(0)
            i += 2
        else:
            codes.append(0), widths.append(1), literals.append(data[i])
            i += 1
    present = set(codes)
    if not ({1, 2} & present and 3 in present and 4 in present):
        raise ValueError("needs a year (%Y or %y), a month (%m) and a day (%d)")
    return TimeFormat(text, tuple(codes), tuple(widths), tuple(literals))


@numba.njit(cache=True, inline="always")
def _days_from_civil(y, m, d):
    y -= 1 if m <= 2 else 0
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


@numba.njit(cache=True, nogil=True)
def _parse_times_kernel(data, offsets, validity, has_validity, offset, codes, widths, literals, length, short_year,
                        seconds, state):
    """Unix seconds of formatted times; ``state``: 0 ok, 1 missing, 2 does not match the format."""
    parts = np.zeros(8, dtype=np.int64)  # one for all values: one made per value took 1.45x as long
    for i in range(seconds.shape[0]):
        position = offset + i
        start, end = offsets[position], offsets[position + 1]
        seconds[i] = 0
        if (has_validity and not (validity[position >> 3] >> (position & 7)) & 1) or start == end:
            state[i] = 1
            continue
        if end - start != length:
            state[i] = 2
            continue
        parts[:] = 0
        parts[3] = 1
        parts[4] = 1
        ok = True
        p = start
        for j in range(codes.shape[0]):
            if codes[j] == 0:
                ok = ok and data[p] == literals[j]
            else:
                value = 0
                for q in range(p, p + widths[j]):
                    digit = np.int64(data[q]) - 48
                    ok = ok and 0 <= digit <= 9
                    value = value * 10 + digit
                parts[codes[j]] = value
            p += widths[j]
        year = parts[1]
        if short_year:
            year = parts[2] + (2000 if parts[2] < 69 else 1900)
        month, day = parts[3], parts[4]
        ok = ok and 1 <= month <= 12 and 1 <= day <= 31 and parts[5] <= 23 and parts[6] <= 59 and parts[7] <= 60
        if not ok:
            state[i] = 2
            continue
        state[i] = 0
        seconds[i] = (_days_from_civil(year, month, day) * 86400 + parts[5] * 3600 + parts[6] * 60 + parts[7])


_last_times = threading.local()  # per thread: the last array parsed, its format and its result


def parse_times(array: pa.Array, time_format: TimeFormat) -> tuple[np.ndarray, np.ndarray]:
    """``(unix seconds int64, state uint8: 0 ok, 1 missing, 2 not in the format)`` of a string array
    (the last array's result is kept, per thread: a chunk's times are checked, then read by each
    time part, in the thread that parsed the chunk while the others parse theirs)."""
    last_array, last_format, result = getattr(_last_times, "entry", (None, None, None))
    if array is last_array and time_format == last_format:
        return result
    result = _parse_times(array, time_format)
    for part in result:
        part.flags.writeable = False
    _last_times.entry = (array, time_format, result)
    return result


def _parse_times(array: pa.Array, time_format: TimeFormat) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa

    array = array.cast(pa.string()) if not pa.types.is_string(array.type) else array
    seconds = np.empty(len(array), dtype=np.int64)
    state = np.empty(len(array), dtype=np.uint8)
    if len(array):
        data, offsets, validity, has_validity, offset = _arrow_buffers(array)
        _parse_times_kernel(data, offsets, validity, has_validity, offset, np.array(time_format.codes, np.int64),
                            np.array(time_format.widths, np.int64), np.array(time_format.literals, np.int64),
                            time_format.length, 2 in time_format.codes, seconds, state)
    return seconds, state


def _tf_parse_times(values: Any, time_format: TimeFormat) -> tuple[Any, Any]:
    """(unix seconds, ok) of formatted times, as :func:`parse_times` (a value off the format: not ok)."""
    import tensorflow as tf

    length = tf.strings.length(values)
    raw = tf.cast(tf.io.decode_raw(values, tf.uint8, fixed_length=time_format.length), tf.int64)
    ok = tf.equal(length, time_format.length)
    parts = {code: tf.zeros_like(length, tf.int64) for code in range(1, 8)}
    parts[3] = tf.ones_like(parts[3])
    parts[4] = tf.ones_like(parts[4])
    position = 0
    for code, width, literal in zip(time_format.codes, time_format.widths, time_format.literals):
        if code == 0:
            ok = tf.logical_and(ok, tf.equal(raw[:, position], literal))
        else:
            value = tf.zeros_like(parts[1])
            for q in range(position, position + width):
                digit = raw[:, q] - 48
                ok = tf.logical_and(ok, tf.logical_and(digit >= 0, digit <= 9))
                value = value * 10 + digit
            parts[code] = value
        position += width
    year = parts[1]
    if 2 in time_format.codes:
        year = parts[2] + tf.where(parts[2] < 69, tf.constant(2000, tf.int64), 1900)
    month, day = parts[3], parts[4]
    in_range = [month >= 1, month <= 12, day >= 1, day <= 31]
    ok = tf.logical_and(ok, tf.reduce_all(tf.stack(in_range), axis=0))
    ok = tf.logical_and(ok, tf.logical_and(tf.logical_and(parts[5] <= 23, parts[6] <= 59), parts[7] <= 60))
    y = year - tf.cast(month <= 2, tf.int64)
    era = tf.math.floordiv(y, 400)
    yoe = y - era * 400
    doy = (153 * (month + tf.where(month > 2, tf.constant(-3, tf.int64), 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    seconds = days * 86400 + parts[5] * 3600 + parts[6] * 60 + parts[7]
    return tf.where(ok, seconds, tf.zeros_like(seconds)), ok


# ====================================================================== transforms
@dataclass
class FeatureInput:
    """One input of a derived field when preparing: a read column (``values``: an Arrow array of its
    declared dtype) or an earlier field (``dtype`` ``"key"``: only ``keys``)."""

    name: str
    dtype: str  # "string" | "int" | "float" | "key"
    values: Any = None
    field_keys: np.ndarray | None = None

    @cached_property
    def keys(self) -> np.ndarray:
        """The value's key (a field's own keys; a string or int column hashed by key scheme 2)."""
        if self.field_keys is not None:
            return self.field_keys
        if self.dtype == "string":
            return string_keys(self.values)
        if self.dtype == "int":
            return int_keys(_int_values(self.values), np.asarray(self.values.is_valid()))
        raise ValueError(f"{self.name}: a {self.dtype} column has no keys")


@dataclass
class TFInput:
    """One input of a derived field in a served model: a request column or an earlier field's keys."""

    name: str
    dtype: str
    values: Any = None
    field_keys: Any = None

    @cached_property
    def keys(self) -> Any:
        if self.field_keys is not None:
            return self.field_keys
        if self.dtype == "string":
            return tf_string_keys(self.values)
        if self.dtype == "int":
            return tf_int_keys(self.values)
        raise ValueError(f"{self.name}: a {self.dtype} column has no keys")


class Transform:
    """A derived categorical field computed from input columns or fields, on both sides.

    ``name`` is what a schema's ``[[derived]] transform`` names; ``options`` maps each option a
    ``[[derived]]`` entry may give to its default; ``inputs`` is how many inputs it takes. ``check``
    vets a declaration (returns a problem or None), ``keys`` computes int64 keys (0 = missing) from
    :class:`FeatureInput` s while preparing, ``invalid`` marks rows whose input cannot be read (bad
    rows; None: none), ``tf_keys`` does the same as ``keys`` on :class:`TFInput` s in TensorFlow.
    """

    name: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    inputs: ClassVar[int] = 1

    def check(self, options: Mapping[str, Any], dtypes: Sequence[str]) -> str | None:
        return None

    def keys(self, inputs: Sequence[FeatureInput], options: Mapping[str, Any]) -> np.ndarray:
        raise NotImplementedError

    def invalid(self, inputs: Sequence[FeatureInput], options: Mapping[str, Any]) -> np.ndarray | None:
        return None

    def tf_keys(self, inputs: Sequence[TFInput], options: Mapping[str, Any]) -> Any:
        raise NotImplementedError


class _TimePart(Transform):
    """hour_of_day / weekday of unix seconds (an int column) or of formatted text (a string column)."""

    options: ClassVar[dict[str, Any]] = {"time_format": "unix"}

    def check(self, options: Mapping[str, Any], dtypes: Sequence[str]) -> str | None:
        text = options["time_format"]
        if not isinstance(text, str):
            return f"time_format: {text!r} is not a string"
        if text == "unix":
            return None if dtypes[0] == "int" else f"time_format \"unix\" needs an int input, not {dtypes[0]}"
        try:
            parse_time_format(text)
        except ValueError as error:
            return f"time_format: {text!r}: {error}"
        return None if dtypes[0] == "string" else f"time_format {text!r} needs a string input, not {dtypes[0]}"

    @staticmethod
    def _seconds(column: FeatureInput, options: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        if options["time_format"] == "unix":
            valid = np.asarray(column.values.is_valid())
            return _int_values(column.values), np.where(valid, 0, 1).astype(np.uint8)
        return parse_times(column.values, parse_time_format(options["time_format"]))

    def keys(self, inputs: Sequence[FeatureInput], options: Mapping[str, Any]) -> np.ndarray:
        seconds, state = self._seconds(inputs[0], options)
        return np.where(state == 0, self.part(seconds) + 1, 0).astype(np.int64)

    def invalid(self, inputs: Sequence[FeatureInput], options: Mapping[str, Any]) -> np.ndarray | None:
        return self._seconds(inputs[0], options)[1] == 2

    def tf_keys(self, inputs: Sequence[TFInput], options: Mapping[str, Any]) -> Any:
        import tensorflow as tf

        if options["time_format"] == "unix":
            values = inputs[0].values
            seconds, ok = values, values != MISSING_INT
        else:
            seconds, ok = _tf_parse_times(inputs[0].values, parse_time_format(options["time_format"]))
        return tf.where(ok, self.tf_part(seconds) + 1, tf.zeros_like(seconds))

    @staticmethod
    def part(seconds: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def tf_part(seconds: Any) -> Any:
        raise NotImplementedError


class HourOfDay(_TimePart):
    """The hour of the day (0..23, UTC) of a timestamp."""

    name = "hour_of_day"

    @staticmethod
    def part(seconds: np.ndarray) -> np.ndarray:
        return (seconds // 3600) % 24

    @staticmethod
    def tf_part(seconds: Any) -> Any:
        import tensorflow as tf

        return tf.math.floormod(tf.math.floordiv(seconds, 3600), 24)


class Weekday(_TimePart):
    """The day of the week (0 Monday .. 6 Sunday, UTC) of a timestamp."""

    name = "weekday"

    @staticmethod
    def part(seconds: np.ndarray) -> np.ndarray:
        return (seconds // 86400 + 3) % 7

    @staticmethod
    def tf_part(seconds: Any) -> Any:
        import tensorflow as tf

        return tf.math.floormod(tf.math.floordiv(seconds, 86400) + 3, 7)


class Cross(Transform):
    """The cross of two one-hot features (their keys: ``mix64(mix64(a) ^ b) >> 1``)."""

    name = "cross"
    inputs = 2

    def check(self, options: Mapping[str, Any], dtypes: Sequence[str]) -> str | None:
        bad = [d for d in dtypes if d not in ("string", "int", "key")]
        return f"cross takes one-hot features or string/int columns, not {bad[0]}" if bad else None

    def keys(self, inputs: Sequence[FeatureInput], options: Mapping[str, Any]) -> np.ndarray:
        return cross_keys(inputs[0].keys, inputs[1].keys)

    def tf_keys(self, inputs: Sequence[TFInput], options: Mapping[str, Any]) -> Any:
        return tf_cross_keys(inputs[0].keys, inputs[1].keys)


class Prefix(Transform):
    """The first ``length`` characters of a text (an ISRC's country code: ``length = 2``), keyed as a
    string column's values are (missing, and an empty text: 0): the same slice of the same
    characters on both sides (Arrow's and TensorFlow's UTF-8 characters)."""

    name = "prefix"
    options: ClassVar[dict[str, Any]] = {"length": 2}

    def check(self, options: Mapping[str, Any], dtypes: Sequence[str]) -> str | None:
        length = options["length"]
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            return f"length: {length!r} is not a positive integer"
        return None if dtypes[0] == "string" else f"prefix takes a string column, not {dtypes[0]}"

    def keys(self, inputs: Sequence[FeatureInput], options: Mapping[str, Any]) -> np.ndarray:
        import pyarrow.compute as pc

        return string_keys(pc.utf8_slice_codeunits(inputs[0].values, 0, options["length"]))

    def tf_keys(self, inputs: Sequence[TFInput], options: Mapping[str, Any]) -> Any:
        import tensorflow as tf

        return tf_string_keys(tf.strings.substr(inputs[0].values, 0, options["length"], unit="UTF8_CHAR"))


TRANSFORMS: Registry = Registry("transform", Transform, lambda: [HourOfDay, Weekday, Cross, Prefix])


def register_transform(cls: type[Transform], *, replace: bool = False) -> type[Transform]:
    """Add a :class:`Transform` subclass under its ``name`` (usable as a decorator in a plugin file)."""
    return TRANSFORMS.register(cls, replace=replace)


def _int_values(array: Any) -> np.ndarray:
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(array, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def float_values(array: Any) -> np.ndarray:
    """A numeric column's float64 values (NaN: missing), from an Arrow array of numbers or the
    numpy array Criteo's reader gives."""
    if isinstance(array, np.ndarray):
        return array
    import pyarrow as pa

    # an int64 column: the float64 nearest to each value (an unchecked cast), as numba's float(v)
    return np.asarray(array.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False), dtype=np.float64)


def tf_float_values(values: Any) -> Any:
    """A numeric request column as float64 (an int64 one: ``MISSING_INT`` is NaN), as :func:`float_values`."""
    import tensorflow as tf

    if values.dtype == tf.float64:
        return values
    return tf.where(values == MISSING_INT, tf.constant(math.nan, tf.float64), tf.cast(values, tf.float64))


# ====================================================================== a schema's rows
@dataclass
class EncodedRows:
    """The store's columns of some rows: one per field (keys, or a FieldBatch for multi-valued
    fields) in the schema's field order, and the dense block ``[rows, D]`` float32 (None without)."""

    columns: list[np.ndarray | FieldBatch]
    dense: np.ndarray | None
    field_keys: dict[str, np.ndarray] = field(default_factory=dict)


def multi_valued_field(array: Any, column: ColumnSpec) -> FieldBatch:
    """A multi-valued or sequence column (an Arrow string array of delimited cells) as a FieldBatch
    of keys (and weights when weighted or mean-pooled), the ids of a row in their order; raises
    ValueError naming the first unreadable weight (or integer element of a sequence of dtype int).
    ``max_length`` keeps a multi-valued cell's first ids and a sequence's last (most recent) ones."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = array.cast(pa.string()) if not pa.types.is_string(array.type) else array
    cells = pc.if_else(pc.equal(array, ""), pa.scalar(None, pa.string()), array)
    lists = pc.split_pattern(cells, pattern=column.separator)
    if column.max_length is not None and column.kind != "sequence":
        lists = pc.list_slice(lists, 0, column.max_length)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False), np.int64)
    elements = pc.list_flatten(lists)
    if column.kind == "sequence":
        elements, lengths = _most_recent(elements, lengths, column.max_length)
    offsets = np.zeros(len(array) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    weights = None
    if column.weight_separator is not None:
        pairs = pc.split_pattern(elements, pattern=column.weight_separator, max_splits=1)
        ids = pc.list_element(pairs, 0)
        texts = _second_or_one(pairs)
        weights = _numbers(texts, pa.float64(), offsets, "weight")
    else:
        ids = elements
    keys = int_keys(_numbers(ids, pa.int64(), offsets, "element")) if column.key_dtype == "int" else string_keys(ids)
    if column.pooling == "mean":
        counts = np.repeat(lengths, lengths).astype(np.float64)
        weights = (np.ones(keys.shape[0]) if weights is None else weights) / np.maximum(counts, 1.0)
    return FieldBatch(offsets, keys, None if weights is None else weights.astype(np.float32))


def sequence_items(batch: FieldBatch, length: int) -> list[FieldBatch]:
    """A sequence's ids (oldest first, at most ``length`` a row) as ``length`` fields of one id or
    none: slot t (1: the most recent) holds a row's t-th id from its end (``ColumnSpec.items``)."""
    lengths = np.diff(batch.offsets)
    out = []
    for t in range(1, length + 1):
        has = lengths >= t
        offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(has, out=offsets[1:])
        out.append(FieldBatch(offsets, np.ascontiguousarray(batch.keys[batch.offsets[1:][has] - t]), None))
    return out


def tf_sequence_items(ids: Any, length: int) -> list[Any]:
    """:func:`sequence_items` in TensorFlow: a RaggedTensor ``[B, None]`` of keys -> ``length`` of them."""
    import tensorflow as tf

    lengths, limits = ids.row_lengths(), ids.row_limits()
    out = []
    for t in range(1, length + 1):
        has = lengths >= t
        values = tf.gather(ids.flat_values, tf.boolean_mask(limits - t, has))
        out.append(tf.RaggedTensor.from_row_lengths(values, tf.cast(has, tf.int64)))
    return out


def _most_recent(elements: Any, lengths: np.ndarray, keep: int) -> tuple[Any, np.ndarray]:
    """A sequence's elements (flattened, ``lengths`` per row) cut to each row's last ``keep``."""
    kept = np.minimum(lengths, keep)
    if np.array_equal(kept, lengths):
        return elements, lengths
    ends = np.cumsum(lengths)
    position = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(ends - lengths, lengths)
    mask = position >= np.repeat(lengths - kept, lengths)
    return elements.filter(mask), kept


def _numbers(texts: Any, type_: Any, offsets: np.ndarray, what: str) -> np.ndarray:
    """Arrow strings as numbers of ``type_``; ValueError naming the row of the first that is not one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        return np.asarray(pc.cast(texts, type_).to_numpy(zero_copy_only=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        bad = first_uncastable(texts, type_)
        row = int(np.searchsorted(offsets, bad, side="right") - 1)
        kind = "a number" if type_ == pa.float64() else "an integer"
        raise ValueError(f"row {row}: {what} {texts[bad].as_py()!r} is not {kind}") from None


def tf_multi_valued(values: Any, column: ColumnSpec) -> tuple[Any, Any]:
    """(ids, weights or None) of a multi-valued or sequence string column as RaggedTensors [B,
    None], as :func:`multi_valued_field`: the ids as strings, their keys being :func:`tf_string_keys`
    of them, or :func:`tf_int_keys` of their numbers for ``key_dtype = "int"`` (which the caller
    computes, string ids with other columns' strings in one loop)."""
    import tensorflow as tf

    parts = tf.strings.split(values, sep=column.separator)
    parts = tf.ragged.boolean_mask(parts, _row_mask(parts, values))  # an empty cell has no ids
    if column.kind == "sequence":
        parts = parts[:, -column.max_length:]  # the most recent
    elif column.max_length is not None:
        parts = parts[:, :column.max_length]
    flat = parts.flat_values
    weights = None
    if column.weight_separator is not None:
        pairs = tf.strings.split(flat, sep=column.weight_separator, maxsplit=1)
        padded = pairs.to_tensor(default_value="", shape=[None, 2])
        ids = padded[:, 0]
        second = tf.where(pairs.row_lengths() > 1, padded[:, 1], tf.fill(tf.shape(ids), "1"))
        weights = tf.strings.to_number(second, tf.float64)
    else:
        ids = flat
    if column.pooling == "mean":
        counts = tf.cast(tf.repeat(parts.row_lengths(), parts.row_lengths()), tf.float64)
        weights = (tf.ones_like(counts) if weights is None else weights) / tf.maximum(counts, 1.0)
    return parts.with_flat_values(ids), None if weights is None else parts.with_flat_values(tf.cast(weights, tf.float32))


def _row_mask(parts: Any, values: Any) -> Any:
    """A ragged mask that keeps the elements of non-empty cells (an empty cell has no ids)."""
    import tensorflow as tf

    keep = tf.repeat(tf.strings.length(values) > 0, parts.row_lengths())
    return parts.with_flat_values(keep)


def _second_or_one(pairs: Any) -> Any:
    """The second element of each list, "1" where it has none."""
    import pyarrow as pa
    import pyarrow.compute as pc

    second = pc.list_slice(pairs, 1, 2)
    present = pc.equal(pc.list_value_length(second), 1)
    ones = pc.fill_null(pa.nulls(len(pairs), pa.string()), "1")
    return pc.replace_with_mask(ones, present, pc.list_flatten(second))


def first_uncastable(texts: Any, type_: Any) -> int:
    """Index of the first value of the Arrow array ``texts`` that does not cast to ``type_`` (bisection;
    one cast error in it is assumed)."""
    lo, hi = 0, len(texts)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            texts.slice(lo, mid - lo).cast(type_)
            lo = mid
        except Exception:  # noqa: BLE001 - Arrow's cast errors
            hi = mid
    return lo


def encode_rows(schema: Schema, columns: Mapping[str, Any], num_rows: int, in_place: bool = False) -> EncodedRows:
    """The keys, weights and dense values of rows whose read columns are Arrow arrays of their
    declared dtypes (``columns``: name -> array; numbers as float64, int columns as int64) or the
    numpy arrays of Criteo's reader; ``in_place``: a field's keys may overwrite its numpy column
    (a reader's buffer, used once: no memory of its own to fault in per chunk)."""
    def sparse(item: tuple[int, ColumnSpec]) -> np.ndarray | FieldBatch:
        number, column = item
        values = columns[column.name]
        if column.is_list:
            batch = multi_valued_field(values, column)
            return sequence_items(batch, int(column.max_length)) if column.items else batch
        tag = field_tag(number) if schema.key_scheme == 1 else 0
        reuse = values.view(np.int64) if in_place and isinstance(values, np.ndarray) else None
        if column.kind == "categorical":
            return hex_keys(values, tag, reuse) if reuse is not None else categorical_keys(values, column, tag)
        if column.buckets == "log_squared":
            return log_squared_keys(float_values(values), tag, reuse)
        return tagged_keys(bucket_keys(float_values(values), column.boundaries), tag)

    encoded = each(sparse, enumerate(schema.sparse_columns))  # each column apart
    keys_of = {column.name: keys for column, keys in zip(schema.sparse_columns, encoded) if not column.is_list}
    out: list[np.ndarray | FieldBatch] = [f for column, e in zip(schema.sparse_columns, encoded)
                                          for f in (e if column.items else [e])]
    for derived in schema.derived:
        transform = TRANSFORMS.get(derived.transform)()
        keys = transform.keys(derived_inputs(schema, derived, columns, keys_of), derived.options)
        keys_of[derived.name] = keys
        out.append(np.ascontiguousarray(keys, dtype=np.int64))
    dense = None
    if schema.dense_columns:
        dense = np.empty((num_rows, len(schema.dense_columns)), dtype=np.float32)

        def fill(item: tuple[int, ColumnSpec]) -> None:
            dense[:, item[0]] = dense_values(float_values(columns[item[1].name]), item[1])

        each(fill, enumerate(schema.dense_columns))
    return EncodedRows(out, dense, keys_of)


def categorical_keys(values: Any, column: ColumnSpec, tag: int = 0) -> np.ndarray:
    """The keys of a categorical column's values (by its dtype), of key scheme 1 with a ``tag``."""
    if column.dtype == "hex":
        return hex_keys(values, tag)
    if column.dtype == "string":
        return tagged_keys(string_keys(values), tag)
    return tagged_keys(int_keys(_int_values(values), np.asarray(values.is_valid())), tag)


def derived_inputs(schema: Schema, derived: DerivedSpec, columns: Mapping[str, Any],
                   keys_of: Mapping[str, np.ndarray]) -> list[FeatureInput]:
    """The :class:`FeatureInput` s of a derived field (a field computed before it gives its keys)."""
    inputs = []
    for name in derived.inputs:
        if name in keys_of:
            inputs.append(FeatureInput(name, "key", columns.get(name), keys_of[name]))
        else:
            inputs.append(FeatureInput(name, schema.column(name).value_dtype, columns[name]))
    return inputs


# ====================================================================== a schema's requests, TensorFlow
def request_dtype(column: ColumnSpec) -> str:
    """The dtype (``"int64"``, ``"float64"``, ``"string"``) of a read column in a request."""
    return {"string": "string", "int": "int64", "float": "float64"}[column.value_dtype]


class ServingFeatures:
    """A resolved schema's features in TensorFlow: raw request columns -> keys, weights and dense.

    ``signature()`` gives the request's ``tf.TensorSpec`` per read column (1-D, the declared dtype);
    calling the object on a dict of such tensors returns :class:`ServedFeatures`. The one-hot
    fields' keys are computed a kind at a time (:meth:`key_groups`: every hex column in one
    ``[B, k]`` parse, every string column in one hashing loop, every ``log_squared`` number in one
    search, ...), each element by the same ops as one column alone would take, so the keys are
    the same bits; then tagged (key scheme 1) in one op and put in field order in one gather.
    """

    def __init__(self, schema: Schema) -> None:
        if not schema.resolved:
            raise ValueError(f"schema {schema.name}: statistics not resolved (prepare data with it first)")
        self.schema = schema

    def request_columns(self) -> dict[str, str]:
        """Name -> dtype (``int64``, ``float64``, ``string``) of every request column, in file order."""
        return {c.name: request_dtype(c) for c in self.schema.read_columns}

    def signature(self) -> dict[str, Any]:
        import tensorflow as tf

        return {name: tf.TensorSpec([None], getattr(tf, dtype), name=name)
                for name, dtype in self.request_columns().items()}

    def key_groups(self) -> dict[tuple[str, str], list[ColumnSpec]]:
        """The one-hot sparse columns by how their keys are computed, ``(kind, request dtype)``:
        ``hex``, ``string``, ``int`` (categoricals), ``log_squared``, ``bucket`` (numbers)."""
        groups: dict[tuple[str, str], list[ColumnSpec]] = {}
        for column in self.schema.sparse_columns:
            if column.kind == "categorical":
                kind = column.dtype
            elif column.kind == "numeric":
                kind = "log_squared" if column.buckets == "log_squared" else "bucket"
            else:
                continue
            groups.setdefault((kind, request_dtype(column)), []).append(column)
        return groups

    def __call__(self, request: Mapping[str, Any]) -> ServedFeatures:
        import tensorflow as tf

        schema = self.schema
        one_hot = [c.name for c in schema.sparse_columns if not c.is_list]
        rows = tf.shape(next(iter(request.values())))[0]
        texts, blocks, order = [], [], []  # texts: string columns stacked [B, k], hashed below
        for (kind, _), columns in self.key_groups().items():
            stacked = tf.stack([request[c.name] for c in columns], axis=1)
            if kind == "string":
                texts.append(stacked)
            else:
                blocks.append(_group_keys(kind, stacked, columns))
                order += [c.name for c in columns]
        ids, numbered, weights = {}, {}, {}  # list columns' ids: strings (hashed below), numbers (keyed here)
        for column in schema.sparse_columns:
            if column.is_list:
                parts, w = tf_multi_valued(request[column.name], column)
                if column.key_dtype == "int":
                    numbered[column.name] = parts.with_flat_values(
                        tf_int_keys(tf.strings.to_number(parts.flat_values, tf.int64)))
                else:
                    ids[column.name] = parts
                if w is not None:
                    weights[column.name] = w
        strings, hashed = self._string_keys(texts, ids)
        multi = {c.name: hashed[c.name] if c.name in hashed else numbered[c.name]
                 for c in schema.sparse_columns if c.is_list}
        for column in (c for c in schema.sparse_columns if c.items):  # its slots, a field each
            multi.update(zip(column.field_names, tf_sequence_items(multi.pop(column.name), int(column.max_length))))
        if strings is not None:
            blocks.append(strings)
            order += [c.name for c in self.key_groups()[("string", "string")]]
        keys = tf.concat(blocks, axis=1) if len(blocks) > 1 else blocks[0] if blocks else tf.zeros([rows, 0], tf.int64)
        if order != one_hot:
            keys = tf.gather(keys, [order.index(name) for name in one_hot], axis=1)
        if schema.key_scheme == 1 and one_hot:
            fields = [c.name for c in schema.sparse_columns]
            keys = tf_tagged_keys(keys, [field_tag(fields.index(name)) for name in one_hot])
        if schema.derived:
            keys = tf.concat([keys, self._derived_keys(request, keys, one_hot, multi)], axis=1)
        dense = tf.zeros([rows, 0], tf.float32)
        if schema.dense_columns:
            dense = tf_dense_values(_float_columns(request, schema.dense_columns), schema.dense_columns)
        return ServedFeatures(keys, (*one_hot, *(d.name for d in schema.derived)), multi, weights, dense,
                              schema.field_names)

    @staticmethod
    def _string_keys(texts: list[Any], ids: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The keys of the string categoricals (``texts``: ``[B, k]`` or none) and of the
        multi-valued columns' ids (ragged strings), all hashed in one :func:`tf_string_keys`."""
        import tensorflow as tf

        flat = [tf.reshape(t, [-1]) for t in texts] + [r.flat_values for r in ids.values()]
        if not flat:
            return None, {}
        keys = tf.split(tf_string_keys(tf.concat(flat, 0)), tf.concat([tf.shape(t, out_type=tf.int64) for t in flat], 0)
                        ) if len(flat) > 1 else [tf_string_keys(flat[0])]  # (eager split of [-1] fails)
        strings = tf.reshape(keys[0], tf.shape(texts[0])) if texts else None
        return strings, {name: r.with_flat_values(k) for (name, r), k in zip(ids.items(), keys[len(texts):])}

    def _derived_keys(self, request: Mapping[str, Any], keys: Any, one_hot: list[str], multi: Mapping[str, Any]) -> Any:
        """``[B, derived]``: the derived fields' keys, each from its inputs (a one-hot field's keys,
        an earlier derived field's, or a request column)."""
        import tensorflow as tf

        known = {name: keys[:, j] for j, name in enumerate(one_hot)}
        for derived in self.schema.derived:
            inputs = [TFInput(name, "key", request.get(name), known[name]) if name in known and name not in multi
                      else TFInput(name, self.schema.column(name).value_dtype, request[name])
                      for name in derived.inputs]
            known[derived.name] = TRANSFORMS.get(derived.transform)().tf_keys(inputs, derived.options)
        return tf.stack([known[d.name] for d in self.schema.derived], axis=1)


def _group_keys(kind: str, values: Any, columns: Sequence[ColumnSpec]) -> Any:
    """``[B, k]`` key scheme 2 keys of ``k`` request columns of one :meth:`ServingFeatures.key_groups`
    kind, stacked as ``values``."""
    if kind == "hex":
        return tf_hex_keys(values, [c.name for c in columns])
    if kind == "int":
        return tf_int_keys(values)
    if kind == "log_squared":
        return tf_log_squared_keys(values)
    return tf_bucket_keys(tf_float_values(values), [c.boundaries for c in columns])


def _float_columns(request: Mapping[str, Any], columns: Sequence[ColumnSpec]) -> Any:
    """``[B, k]`` float64 values of numeric ``columns`` (int64 ones converted together)."""
    import tensorflow as tf

    ints = [c for c in columns if request_dtype(c) == "int64"]
    floats = [c for c in columns if request_dtype(c) != "int64"]
    parts = [tf_float_values(tf.stack([request[c.name] for c in group], axis=1)) for group in (ints, floats) if group]
    values = tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]
    order = [c.name for c in (*ints, *floats)]
    if order != [c.name for c in columns]:
        values = tf.gather(values, [order.index(c.name) for c in columns], axis=1)
    return values


@dataclass
class ServedFeatures:
    """What :class:`ServingFeatures` returns: the one-hot fields' keys as one ``[B, k]`` int64
    matrix (``one_hot``, its columns the fields ``one_hot_names``, in field order), the
    multi-valued fields' keys (RaggedTensor [B, None] each), the weights of weighted or
    mean-pooled multi-valued fields (RaggedTensor float32), the dense block [B, D] float32, and
    ``keys``: every field's keys by name in the schema's field order (``[B]`` or ragged)."""

    one_hot: Any
    one_hot_names: tuple[str, ...]
    multi_valued: dict[str, Any]
    weights: dict[str, Any]
    dense: Any
    field_names: tuple[str, ...]

    @property
    def keys(self) -> dict[str, Any]:
        column = {name: j for j, name in enumerate(self.one_hot_names)}
        return {name: self.multi_valued[name] if name in self.multi_valued else self.one_hot[:, column[name]]
                for name in self.field_names}


__all__ = [
    "KEY_SCHEME_2", "MISSING_INT", "Transform", "TRANSFORMS", "register_transform", "FeatureInput", "TFInput",
    "string_keys", "int_keys", "cross_keys", "bucket_keys", "log_squared_keys", "dense_values", "encode_rows",
    "ServingFeatures", "ServedFeatures",
]
