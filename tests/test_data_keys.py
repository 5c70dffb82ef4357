"""Key scheme and integer transform (des/data/keys.py)."""

import math

import numpy as np
import pytest

from des.data import FIELD_NAMES, NUM_FIELDS, field_of_key, make_key
from des.data.keys import (
    INT_TOKEN_OFFSET,
    MISSING_VALUE,
    categorical_key,
    integer_key,
    integer_keys,
    integer_token,
    missing_key,
    value_of_key,
)


def test_field_names():
    assert NUM_FIELDS == 39 == len(FIELD_NAMES)
    assert FIELD_NAMES[0] == "I1" and FIELD_NAMES[12] == "I13"
    assert FIELD_NAMES[13] == "C1" and FIELD_NAMES[38] == "C26"


@pytest.mark.parametrize(
    "value, token",
    [(0, 0), (1, 1), (2, 2), (3, 1), (4, 1), (5, 2), (6, 3), (-1, -1), (-5, -5), (100, 21), (10**18, 1717)],
)
def test_integer_transform_edge_values(value, token):
    assert integer_token(value) == token
    if value > 2:
        assert token == math.floor(math.log(value) ** 2)


def test_integer_keys_layout_and_clipping():
    assert integer_key(0, 0) == (1 << 40) | INT_TOKEN_OFFSET
    assert integer_key(0, -1) == (1 << 40) | (INT_TOKEN_OFFSET - 1)
    assert integer_key(2, None) == (3 << 40) | MISSING_VALUE == missing_key("I3")
    # tokens are clipped to int32 range: huge negatives all share the lowest code 0
    assert value_of_key(integer_key(0, -(10**12))) == 0 == value_of_key(integer_key(0, -(2**31)))
    # above 2^63 a value counts as 2^63 (it is taken as a float64)
    assert value_of_key(integer_key(0, 10**30)) == INT_TOKEN_OFFSET + math.floor(math.log(2**63) ** 2)
    values = np.array([0, 1, 2, 3, -1, 10**18, 7], dtype=np.int64)
    missing = np.array([0, 0, 0, 0, 0, 0, 1], dtype=bool)
    expected = [integer_key(4, int(v)) for v in values[:-1]] + [missing_key(4)]
    assert integer_keys(4, values, missing).tolist() == expected


def test_categorical_keys_unique_per_field():
    a, b = categorical_key("C1", "68fd1e64"), categorical_key("C2", "68fd1e64")
    assert a != b
    assert field_of_key(a) == 13 and field_of_key(b) == 14
    assert value_of_key(a) == value_of_key(b) == 0x68FD1E64
    assert categorical_key("C1", "68FD1E64") == a
    assert categorical_key("C1", None) == missing_key("C1")
    # missing, the largest hex value and integer codes never collide within a field
    assert value_of_key(categorical_key("C1", "ffffffff")) < MISSING_VALUE


def test_all_keys_positive_and_field_recoverable():
    fields = np.repeat(np.arange(NUM_FIELDS), 3)
    values = np.tile([0, MISSING_VALUE, (1 << 40) - 1], NUM_FIELDS)
    keys = make_key(fields, values)
    assert keys.dtype == np.int64 and (keys > 0).all()
    assert (field_of_key(keys) == fields).all()
    assert len(np.unique(keys)) == keys.size
    with pytest.raises(ValueError):
        make_key(39, 0)
    with pytest.raises(ValueError):
        make_key(0, 1 << 40)
