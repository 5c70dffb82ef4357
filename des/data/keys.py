"""The feature-key scheme: how a (field, value) pair becomes one int64 key.

This module is the single definition of the scheme; every other module of ``des`` (hash tables,
checkpoints, models) relies on it, so it must not change without bumping ``KEY_SCHEME["version"]``.

Fields are numbered 0..38: 0..12 are the integer columns I1..I13, 13..38 the categorical columns
C1..C26 (``FIELD_NAMES``, ``NUM_FIELDS = 39``). A key is::

    key = ((field + 1) << 40) | u          with u in [0, 2^40)

where ``u`` is

* categorical value (8 hex digits): ``u = int(hex, 16)`` (< 2^32); missing: ``u = 2^32``;
* integer value ``v``: token ``t = v if v <= 2 else floor(ln(v)^2)`` (the Criteo winners'
  transform), then ``u = clip(t, -2^31, 2^31 - 1) + 2^31``; missing: ``u = 2^32``;
* synthetic or multi-hot id: ``u = id`` (< 2^32).

So a key is a positive int64, never 0, unique per field (the same hex value in two fields gives two
keys), and the field is recovered as ``(key >> 40) - 1``. An integer above 2^63 counts as 2^63
(``v`` is taken as a float64, as a served request's int64 always was).

This is the built-in ``criteo`` schema's key scheme (``key_scheme = 1``): ``features.py`` computes
it, on both sides, as key scheme 2's key of a hex id or a ``log_squared`` bucket tagged with the
field number; this module keeps its record (``KEY_SCHEME``, in every store prepared with it) and
the helpers of single keys (the synthetic generator's, tests').
"""

from __future__ import annotations

import math

import numba
import numpy as np

NUM_INT_FIELDS = 13
NUM_CAT_FIELDS = 26
NUM_FIELDS = NUM_INT_FIELDS + NUM_CAT_FIELDS
FIELD_NAMES: tuple[str, ...] = tuple(
    [f"I{i}" for i in range(1, NUM_INT_FIELDS + 1)] + [f"C{i}" for i in range(1, NUM_CAT_FIELDS + 1)]
)
FIELD_SHIFT = 40
VALUE_MASK = (1 << FIELD_SHIFT) - 1
MISSING_VALUE = 1 << 32
INT_TOKEN_MIN = -(1 << 31)
INT_TOKEN_MAX = (1 << 31) - 1
INT_TOKEN_OFFSET = 1 << 31
ID_LIMIT = 1 << 32

KEY_SCHEME: dict = {
    "name": "des-field-key",
    "version": 1,
    "formula": "key = ((field + 1) << 40) | u; field = (key >> 40) - 1",
    "fields": "0..12 = I1..I13 (integer), 13..38 = C1..C26 (categorical)",
    "categorical": "u = int(hex8, 16); missing u = 2^32",
    "integer": "t = v if v <= 2 else floor(ln(v)^2); u = clip(t, -2^31, 2^31-1) + 2^31; missing u = 2^32",
    "synthetic_or_multi_hot": "u = id (< 2^32)",
}


def field_index(field: int | str) -> int:
    """The field number (0..38) of a field given by number or name (``"I1"`` .. ``"C26"``)."""
    if isinstance(field, str):
        try:
            return FIELD_NAMES.index(field)
        except ValueError:
            raise ValueError(f"unknown field name {field!r} (expected I1..I13 or C1..C26)") from None
    index = int(field)
    if not 0 <= index < NUM_FIELDS:
        raise ValueError(f"field number {index} out of range 0..{NUM_FIELDS - 1}")
    return index


@numba.njit(cache=True, inline="always")
def token_of_float(x: float) -> int:
    """``floor(ln(x)^2)`` for x > 2: the integer transform of a large value (given as a float)."""
    log = math.log(x)
    return int(math.floor(log * log))


@numba.njit(cache=True, inline="always")
def token_of_int(v: int) -> int:
    """The integer transform ``v if v <= 2 else floor(ln(v)^2)`` of an int64 value."""
    if v <= 2:
        return v
    return token_of_float(float(v))


@numba.njit(cache=True, inline="always")
def int_value_code(token: int) -> int:
    """``u`` of an integer token: clipped to int32 range and shifted to be non-negative."""
    if token < INT_TOKEN_MIN:
        token = INT_TOKEN_MIN
    elif token > INT_TOKEN_MAX:
        token = INT_TOKEN_MAX
    return token + INT_TOKEN_OFFSET


@numba.njit(cache=True, inline="always")
def key_of(field: int, u: int) -> int:
    """The key of value code ``u`` in field ``field`` (no range checks; for kernels)."""
    return ((field + 1) << FIELD_SHIFT) | u


@numba.njit(cache=True)
def _integer_keys_kernel(field: int, values: np.ndarray, missing: np.ndarray, out: np.ndarray) -> None:
    for i in range(values.shape[0]):
        if missing[i]:
            out[i] = key_of(field, MISSING_VALUE)
        else:
            out[i] = key_of(field, int_value_code(token_of_int(values[i])))


def integer_token(v: int) -> int:
    """The integer transform of one value of any size: ``v if v <= 2 else floor(ln(v)^2)`` (above
    2^63: 2^63's)."""
    v = int(v)
    if v <= 2:
        return v
    return int(token_of_int(min(v, np.iinfo(np.int64).max)))  # above 2^63: 2^63's token


def make_key(field: int | np.ndarray, u: int | np.ndarray) -> int | np.ndarray:
    """``((field + 1) << 40) | u`` for scalars or arrays; checks 0 <= u < 2^40 and the field range."""
    if np.isscalar(field) and np.isscalar(u):
        f, value = field_index(field), int(u)
        if not 0 <= value <= VALUE_MASK:
            raise ValueError(f"value code {value} out of range [0, 2^40)")
        return ((f + 1) << FIELD_SHIFT) | value
    fields = np.asarray(field, dtype=np.int64)
    values = np.asarray(u, dtype=np.int64)
    if fields.size and (fields.min() < 0 or fields.max() >= NUM_FIELDS):
        raise ValueError(f"field numbers must be in 0..{NUM_FIELDS - 1}")
    if values.size and (values.min() < 0 or values.max() > VALUE_MASK):
        raise ValueError("value codes must be in [0, 2^40)")
    return ((fields + 1) << FIELD_SHIFT) | values


def field_of_key(key: int | np.ndarray) -> int | np.ndarray:
    """The field number of a key (``(key >> 40) - 1``), for a scalar or an array."""
    if np.isscalar(key):
        return (int(key) >> FIELD_SHIFT) - 1
    return (np.asarray(key, dtype=np.int64) >> FIELD_SHIFT) - 1


def value_of_key(key: int | np.ndarray) -> int | np.ndarray:
    """The value code ``u`` of a key (its low 40 bits)."""
    if np.isscalar(key):
        return int(key) & VALUE_MASK
    return np.asarray(key, dtype=np.int64) & VALUE_MASK


def missing_key(field: int | str) -> int:
    """The key that stands for a missing value in ``field``."""
    return make_key(field_index(field), MISSING_VALUE)


def integer_key(field: int | str, value: int | None) -> int:
    """The key of an integer-column value (``None`` = missing); any size of int is accepted."""
    f = field_index(field)
    if value is None:
        return missing_key(f)
    token = min(max(integer_token(value), INT_TOKEN_MIN), INT_TOKEN_MAX)
    return make_key(f, token + INT_TOKEN_OFFSET)


def integer_keys(field: int | str, values: np.ndarray, missing: np.ndarray | None = None) -> np.ndarray:
    """Vectorized ``integer_key`` for an int64 array (``missing``: optional bool mask)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    mask = np.zeros(values.shape[0], dtype=np.bool_) if missing is None else np.ascontiguousarray(missing, np.bool_)
    out = np.empty(values.shape[0], dtype=np.int64)
    _integer_keys_kernel(field_index(field), values, mask, out)
    return out


def categorical_key(field: int | str, value: str | None) -> int:
    """The key of a categorical value given as hex text (``None`` or ``""`` = missing)."""
    f = field_index(field)
    if not value:
        return missing_key(f)
    if len(value) != 8:
        raise ValueError(f"categorical value {value!r} is not 8 hex digits")
    return make_key(f, int(value, 16))
