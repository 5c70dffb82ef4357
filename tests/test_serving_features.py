"""Key scheme 2 and the schema transforms: the TensorFlow side (served models) gives the same keys
(bit for bit), weights and dense values as the numpy/numba side (preparing) on the same raw rows."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from des.data.features import (MISSING_INT, ServingFeatures, encode_rows, hex_keys, int_keys, log_squared_keys,
                               string_keys)
from des.data.keys import integer_token
from des.data.schema import Schema

tf = pytest.importorskip("tensorflow")

LONG = "x" * 1000 + "é"
STRINGS = ["", "a", "abcdefgh", "abcdefghi", "ünïcødé ✓", "日本語のテキスト", LONG, "1fbe01fe", "\x00", "  "]
SCHEMA = {
    "name": "everything",
    "format": {"type": "csv"},
    "label": {"column": "y"},
    "columns": [
        {"name": "s", "kind": "categorical"},
        {"name": "i", "kind": "categorical", "dtype": "int"},
        {"name": "tags", "kind": "multi_valued", "separator": "|", "pooling": "mean", "max_length": 3},
        {"name": "scored", "kind": "multi_valued", "separator": ",", "weight_separator": ":"},
        {"name": "plain", "kind": "multi_valued", "separator": " "},
        {"name": "price", "kind": "numeric", "as": "bucketize", "buckets": "boundaries",
         "boundaries": [-1.5, 0.0, 10.0, 1e6]},
        {"name": "count", "kind": "numeric", "as": "bucketize", "buckets": "log_squared"},
        {"name": "age", "kind": "numeric", "as": "dense", "transform": "log1p", "standardize": True, "fill": 3.0,
         "mean": 1.25, "std": 0.75},
        {"name": "score", "kind": "numeric", "as": "dense"},
        {"name": "ts", "kind": "input", "dtype": "int"},
        {"name": "hour", "kind": "input", "dtype": "string"},
        {"name": "text", "kind": "input", "dtype": "string"},
        {"name": "noise", "kind": "ignored"},
    ],
    "derived": [
        {"name": "hod", "transform": "hour_of_day", "inputs": ["ts"]},
        {"name": "wd", "transform": "weekday", "inputs": ["ts"]},
        {"name": "hod_text", "transform": "hour_of_day", "inputs": ["hour"], "time_format": "%y%m%d%H"},
        {"name": "wd_text", "transform": "weekday", "inputs": ["hour"], "time_format": "%y%m%d%H"},
        {"name": "s_x_i", "transform": "cross", "inputs": ["s", "i"]},
        {"name": "hod_x_s", "transform": "cross", "inputs": ["hod", "s"]},
        {"name": "text_head", "transform": "prefix", "inputs": ["text"], "length": 2},
    ],
}


def _rows(n: int, seed: int = 0) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    pick = lambda options: [options[k] for k in rng.integers(0, len(options), n)]  # noqa: E731
    ints = [int(v) for v in rng.integers(-2**62, 2**62, n)]
    ints[:4] = [0, -1, 2**63 - 1, None]
    floats = rng.normal(0, 50, n).tolist()
    floats[:8] = [None, -1.5, 0.0, 2.0, 2.5, 1e300, -1e300, 10.0]
    counts = np.exp(rng.uniform(-2, 45, n)).tolist()
    counts[:6] = [None, 3.0, 2.718281828459045, 9.3e18, -7.0, 2.0]
    stamps = [int(v) for v in rng.integers(-2**40, 2**40, n)]
    stamps[:3] = [None, 0, -1]
    hours = [f"{y:02d}{m:02d}{d:02d}{h:02d}" for y, m, d, h in zip(rng.integers(0, 100, n), rng.integers(1, 13, n),
                                                                   rng.integers(1, 29, n), rng.integers(0, 24, n))]
    hours[:3] = [None, "14102100", "99123123"]
    return {
        "s": [None if v == "" else v for v in pick(STRINGS)],
        "i": ints,
        "tags": pick(["", "a", "a|b", "a|b|c|d|e", "|", "ü|" + LONG, "x||y"]),
        "scored": pick(["", "a:1.5", "a:0.25,b:2,c", "z:-3e-2", "q:1e10,,w:7"]),
        "plain": pick(["", "one", "one two", "日本 語"]),
        "price": floats, "count": counts, "age": floats[::-1], "score": pick(floats),
        "ts": stamps, "hour": hours, "text": [None if v == "" else v for v in pick(STRINGS)],
    }


def _arrow(schema: Schema, rows: dict[str, list]) -> dict[str, pa.Array]:
    types = {"string": pa.string(), "int": pa.int64(), "float": pa.float64()}
    return {c.name: pa.array(rows[c.name], types[c.value_dtype]) for c in schema.read_columns}


def _request(schema: Schema, rows: dict[str, list]) -> dict[str, object]:
    missing = {"string": "", "int": MISSING_INT, "float": math.nan}
    types = {"string": tf.string, "int": tf.int64, "float": tf.float64}
    return {c.name: tf.constant([missing[c.value_dtype] if v is None else v for v in rows[c.name]],
                                types[c.value_dtype]) for c in schema.read_columns}


def _assert_same_fields(schema: Schema, served, prepared) -> None:
    """Every field's served keys (and weights) are the prepared ones, in field order."""
    assert list(served.keys) == list(schema.field_names)
    for name, column in zip(schema.field_names, prepared.columns):
        got = served.keys[name]
        if isinstance(got, tf.RaggedTensor):
            np.testing.assert_array_equal(got.row_splits.numpy(), column.offsets, err_msg=name)
            np.testing.assert_array_equal(got.flat_values.numpy(), column.keys, err_msg=name)
            if column.weights is None:
                assert name not in served.weights
            else:
                np.testing.assert_array_equal(served.weights[name].flat_values.numpy(), column.weights, err_msg=name)
        else:
            np.testing.assert_array_equal(got.numpy(), column, err_msg=name)


def test_tensorflow_features_equal_the_prepared_ones_bit_for_bit():
    schema = Schema.from_dict(SCHEMA)
    rows = _rows(257)
    prepared = encode_rows(schema, _arrow(schema, rows), 257)
    served = ServingFeatures(schema)(_request(schema, rows))
    _assert_same_fields(schema, served, prepared)
    np.testing.assert_array_equal(served.dense.numpy(), prepared.dense)
    assert served.dense.dtype == tf.float32 and served.dense.shape == (257, 2)


def test_the_rows_cover_what_the_scheme_treats_specially():
    schema = Schema.from_dict(SCHEMA)
    rows = _rows(257)
    prepared = encode_rows(schema, _arrow(schema, rows), 257)
    by_name = dict(zip(schema.field_names, prepared.columns))
    assert (by_name["s"] == 0).any() and by_name["i"][3] == 0 and by_name["count"][0] == 0
    missing_price = np.array([v is None for v in rows["price"]])
    assert missing_price.any() and (by_name["price"][missing_price] == 0).all() and (by_name["price"] > 0).sum() > 200
    tags = by_name["tags"]
    assert np.diff(tags.offsets).max() == 3  # truncated to max_length
    lengths = np.repeat(np.diff(tags.offsets), np.diff(tags.offsets))
    np.testing.assert_array_equal(tags.weights, (1.0 / lengths).astype(np.float32))  # mean pooling as weights
    assert 0 in tags.keys  # "x||y" and "|" have empty ids
    assert by_name["hod"][0] == 0 and by_name["hod"][1] == 1 and by_name["hod"][2] == 24  # -1 s is 23:59:59
    assert by_name["wd"][1] == 4  # 1970-01-01 was a Thursday (Monday = 1)
    assert by_name["hod_text"][1] == 1 and by_name["wd_text"][1] == 2  # 2014-10-21 00h, a Tuesday (key 2)
    assert (by_name["hod"] > 0).sum() > 200 and (by_name["scored"].weights == 1.0).any()


def test_string_keys_follow_the_documented_chain():
    def reference(text: str) -> int:
        data = text.encode("utf-8")
        if not data:
            return 0
        mask = (1 << 64) - 1

        def mix(z: int) -> int:
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            return z ^ (z >> 31)

        h = (len(data) * 0x9E3779B97F4A7C15) & mask
        for i in range(0, len(data), 8):
            h = mix(h ^ int.from_bytes(data[i:i + 8].ljust(8, b"\0"), "little"))
        return (h >> 1) or 1

    keys = string_keys(pa.array(STRINGS))
    assert keys.tolist() == [reference(s) for s in STRINGS]
    assert keys.min() >= 0 and keys[0] == 0
    # a sliced Arrow array (an offset into its buffers) and nulls
    sliced = pa.array([None, *STRINGS]).slice(1, 5)
    assert string_keys(sliced).tolist() == [reference(s) for s in STRINGS[:5]]
    assert int_keys(np.array([5, MISSING_INT])).tolist()[1] == 0
    # short values read as words: every start within a word, the buffer's last bytes, an
    # unaligned buffer (read byte by byte), a slice
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(list("ab\u00e9\u65e5"), size=rng.integers(0, 11))) for _ in range(400)]
    assert string_keys(pa.array(texts)).tolist() == [reference(t) for t in texts]
    for tail in range(1, 10):
        assert string_keys(pa.array(["x" * 17, "y" * tail])).tolist() == [reference("x" * 17), reference("y" * tail)]
    data = b"".join(t.encode() for t in texts)
    offsets = np.cumsum([0] + [len(t.encode()) for t in texts]).astype(np.int32)
    unaligned = pa.py_buffer(b"." + data)[1:]
    array = pa.StringArray.from_buffers(len(texts), pa.py_buffer(offsets.tobytes()), unaligned)
    assert unaligned.address % 8 and string_keys(array).tolist() == [reference(t) for t in texts]
    assert string_keys(pa.array(texts).slice(3, 50)).tolist() == [reference(t) for t in texts[3:53]]
    # a dictionary array's values (a null among them): keyed through its dictionary, as their text
    coded = pa.array([*texts[:30], None, *texts[:30]]).dictionary_encode()
    assert string_keys(coded).tolist() == string_keys(coded.dictionary_decode()).tolist()
    hexes = pa.array(["1fbe01fe", None, "", "xyz", "1fbe01fe", "0000000a"]).dictionary_encode()
    assert hex_keys(hexes).tolist() == hex_keys(hexes.dictionary_decode()).tolist() == [0x1FBE01FE + 1, 0, 0, -1,
                                                                                          0x1FBE01FE + 1, 11]
    assert string_keys(pa.array([None, None], pa.string()).dictionary_encode()).tolist() == [0, 0]


def test_log_squared_is_the_criteo_integer_transform():
    values = np.array([-5, 0, 1, 2, 3, 7, 8, 20, 1000, 10**6, 2**40, 2**62], dtype=np.int64)
    keys = log_squared_keys(values.astype(np.float64))
    assert (keys - (1 << 31) - 1).tolist() == [integer_token(int(v)) for v in values]


def test_criteo_keys_on_both_sides_are_key_scheme_1():
    """The built-in criteo schema (key scheme 1: hex ids and log_squared buckets tagged with the field)
    gives keys.py's keys on both sides, on edge values (each step of the integer transform)."""
    from des.data.keys import MISSING_VALUE, categorical_key, integer_key, make_key
    from des.data.schema import load_schema

    schema = load_schema("criteo")
    values = [0, 1, 2, 3, 4, -1, -2, -(2**31), -(2**31) - 1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63) + 1,
              7, 8, 20, 21, 54, 55, 1000, 10**12]
    values += [v + d for v in (math.ceil(math.exp(math.sqrt(t))) for t in range(2, 1900, 7)) for d in (-1, 0, 1)]
    values += np.random.default_rng(0).integers(-(2**40), 2**62, 500).tolist()
    texts = ["00000000", "ffffffff", "FFFFFFFF", "0aBcDeF9", "68fd1e64", "", "80000000", "7fffffff"]
    n = len(values) + 1
    ints = values + [None]
    hexes = [texts[i % len(texts)] for i in range(n)]
    request = {name: ints if name.startswith("I") else hexes for name in schema.field_names}
    arrow = {k: pa.array(v, pa.int64()) if k.startswith("I") else pa.array([t or None for t in v], pa.string())
             for k, v in request.items()}
    numpy_keys = encode_rows(schema, arrow, n).columns
    tensors = {k: tf.constant([MISSING_INT if x is None else x for x in v], tf.int64) if k.startswith("I")
               else tf.constant(v) for k, v in request.items()}
    served = ServingFeatures(schema)(tensors)
    for f, name in enumerate(schema.field_names):
        if name.startswith("I"):
            want = [integer_key(f, v) for v in values] + [make_key(f, MISSING_VALUE)]
        else:
            want = [categorical_key(f, t or None) for t in hexes]
        np.testing.assert_array_equal(numpy_keys[f], want, err_msg=name)
        np.testing.assert_array_equal(served.keys[name].numpy(), want, err_msg=name)
    for bad in ["1234567", "123456789", "12345g78", " 2345678"]:
        with pytest.raises(tf.errors.InvalidArgumentError, match="C26"):
            ServingFeatures(schema)({**tensors, "C26": tf.constant([bad] + hexes[1:])})


def test_serving_needs_a_resolved_schema():
    unresolved = dict(SCHEMA, columns=[{"name": "x", "kind": "numeric", "as": "bucketize"}], derived=[])
    with pytest.raises(ValueError, match="statistics not resolved"):
        ServingFeatures(Schema.from_dict(unresolved))


# Columns of every kind interleaved, so each kind's columns are computed together and put back in
# field order: string, int and hex categoricals, buckets of different lengths (int and float
# columns), multi-valued columns between them, dense int and float columns.
MIXED = {
    "name": "mixed",
    "format": {"type": "csv"},
    "label": {"column": "y"},
    "columns": [
        {"name": "b1", "kind": "numeric", "as": "bucketize", "buckets": "boundaries", "boundaries": [0.5]},
        {"name": "s1", "kind": "categorical"},
        {"name": "m1", "kind": "multi_valued", "separator": "|", "pooling": "mean"},
        {"name": "d1", "kind": "numeric", "dtype": "int", "as": "dense", "transform": "log1p", "standardize": True,
         "mean": 2.0, "std": 3.0},
        {"name": "i1", "kind": "categorical", "dtype": "int"},
        {"name": "b2", "kind": "numeric", "dtype": "int", "as": "bucketize", "buckets": "boundaries",
         "boundaries": [-5.0, 0.0, 3.0, 1e9]},
        {"name": "h1", "kind": "categorical", "dtype": "hex"},
        {"name": "s2", "kind": "categorical"},
        {"name": "d2", "kind": "numeric", "as": "dense", "fill": -0.0},
        {"name": "m2", "kind": "multi_valued", "separator": ",", "weight_separator": ":"},
        {"name": "b3", "kind": "numeric", "as": "bucketize", "buckets": "log_squared"},
        {"name": "h2", "kind": "categorical", "dtype": "hex"},
        {"name": "d3", "kind": "numeric", "as": "dense", "standardize": True, "mean": -1.0, "std": 0.5},
    ],
    "derived": [{"name": "s1_x_h2", "transform": "cross", "inputs": ["s1", "h2"]}],
}


def _mixed_rows(n: int, seed: int) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    pick = lambda options: [options[k] for k in rng.integers(0, len(options), n)]  # noqa: E731
    floats = [None, math.inf, -math.inf, 0.5, 0.0, -0.0, 1e300, 2.0, 7.25, -3.0]
    ints = [None, 0, -5, 3, 2**62, -(2**62), 1000000000, 7]
    hexes = ["", "00000000", "ffffffff", "DEADbeef", "68fd1e64", "7fffffff"]
    return {"b1": pick(floats), "s1": pick([None, *STRINGS[1:]]), "m1": pick(["", "a", "a|b", "|", "x||y"]),
            "d1": pick(ints), "i1": pick(ints), "b2": pick(ints), "h1": pick(hexes), "s2": pick([None, "a", "b" * 20]),
            "d2": pick(floats), "m2": pick(["", "a:1.5", "a:0.25,b:2,c", ",,"]), "b3": pick(floats),
            "h2": pick(hexes), "d3": pick(floats)}


def _arrow_mixed(schema: Schema, rows: dict[str, list]) -> dict[str, pa.Array]:
    """The rows as preparing reads them (an empty hex id: null)."""
    return _arrow(schema, {k: [None if v == "" and schema.column(k).dtype == "hex" else v for v in values]
                           for k, values in rows.items()})


@pytest.mark.parametrize("n,seed", [(1, 0), (1, 1), (2, 2), (64, 3), (300, 4)])
def test_columns_of_one_kind_computed_together_equal_the_prepared_ones(n, seed):
    """Every kind's columns in one op each (a batch of 1 row too, empty strings, infinities, -0.0)
    give, in field order, the keys, weights and dense values that preparing gives bit for bit."""
    schema = Schema.from_dict(MIXED)
    rows = _mixed_rows(n, seed)
    if n == 1 and seed == 1:  # one row with everything missing or empty
        rows = {k: ["" if schema.column(k).value_dtype == "string" else None] for k in rows}
    prepared = encode_rows(schema, _arrow_mixed(schema, rows), n)
    served = ServingFeatures(schema)(_request(schema, {k: [None if v == "" and schema.column(k).value_dtype !=
                                                          "string" else v for v in vs] for k, vs in rows.items()}))
    _assert_same_fields(schema, served, prepared)
    np.testing.assert_array_equal(served.dense.numpy().view(np.uint32), prepared.dense.view(np.uint32))


def test_hex_ids_of_several_columns_parsed_at_once():
    """Each byte value at each of the 8 places: accepted exactly when it is a hex digit (either
    case), its value the number the digits spell; a bad value names its own column."""
    from des.data.features import HEX_DIGITS, tf_hex_keys

    texts, good = [], []
    for place in range(8):
        for byte in range(256):
            text = bytearray(b"0123abcd")
            text[place] = byte
            texts.append(bytes(text))
            good.append(HEX_DIGITS[byte] >= 0)
    ok = [t for t, g in zip(texts, good) if g]
    keys = tf_hex_keys(tf.constant([ok, ok[::-1], [b""] * len(ok)]).numpy().T, ["A", "B", "C"]).numpy()
    np.testing.assert_array_equal(keys[:, 0], [int(t, 16) + 1 for t in ok])
    np.testing.assert_array_equal(keys[:, 1], [int(t, 16) + 1 for t in ok[::-1]])
    assert (keys[:, 2] == 0).all()
    for text in [t for t, g in zip(texts, good) if not g][::7] + [b"0123abc", b"0123abcd0", b" 123abcd"]:
        with pytest.raises(tf.errors.InvalidArgumentError, match="(?s)request column.*b'B'"):
            tf_hex_keys(tf.constant([[b"00000000", text, b""]]), ["A", "B", "C"])
