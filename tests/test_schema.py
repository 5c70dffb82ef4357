"""Declared schemas: the built-ins, TOML files, one-line errors naming the schema file and key
path, the round trip through the manifest's form, and transforms added from a plugin file."""

from __future__ import annotations

import textwrap

import numpy as np
import pyarrow as pa
import pytest

from des.data import DataError
from des.data.features import TRANSFORMS, FeatureInput, encode_rows
from des.data.schema import Schema, load_schema
from des.plugins import load_plugins

MOVIELENS = """\
name = "movielens"
[format]
type = "csv"
delimiter = "\\t"
header = true
[label]
column = "rating"
rule = ">= 4"
[[columns]]
name = "user_id"
kind = "categorical"
dtype = "int"
[[columns]]
name = "genres"
kind = "multi_valued"
separator = "|"
pooling = "mean"
max_length = 6
[[columns]]
name = "age"
kind = "numeric"
as = "dense"
transform = "log1p"
standardize = true
[[columns]]
name = "price"
kind = "numeric"
as = "bucketize"
buckets = "quantiles"
count = 4
[[columns]]
name = "timestamp"
kind = "input"
dtype = "int"
[[columns]]
name = "title"
kind = "ignored"
[[derived]]
name = "hour"
transform = "hour_of_day"
inputs = ["timestamp"]
[[derived]]
name = "user_x_hour"
transform = "cross"
inputs = ["user_id", "hour"]
"""


def _write(tmp_path, text: str, name: str = "movielens.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_toml_schema_gives_the_fields_in_store_order(tmp_path):
    schema = load_schema(_write(tmp_path, MOVIELENS))
    assert schema.name == "movielens" and schema.key_scheme == 2
    assert schema.field_names == ("user_id", "genres", "price", "hour", "user_x_hour")
    assert schema.dense_names == ("age",)
    assert [(s.hotness, s.weighted) for s in schema.field_specs()][:2] == [("one-hot", False), ("multi-hot", True)]
    assert not schema.resolved and {c.name for c in schema.statistics_columns} == {"age", "price"}
    resolved = schema.with_statistics({"age": {"mean": 1.5, "std": 2.0}, "price": {"boundaries": [1, 2, 3]}})
    assert resolved.resolved and resolved.fingerprint != schema.fingerprint
    again = Schema.from_dict(resolved.to_dict())
    assert again == resolved and again.fingerprint == resolved.fingerprint
    assert again.without_statistics().fingerprint == schema.fingerprint


def test_built_in_schemas():
    criteo = load_schema()
    assert criteo.format.type == "criteo" and criteo.key_scheme == 1 and len(criteo.field_names) == 39
    assert load_schema("criteo").layout()[0] == ("I1", "integer", "one-hot", False)
    avazu = load_schema("avazu")
    assert avazu.label.column == "click" and avazu.column("id").kind == "ignored"
    assert avazu.field_names[-2:] == ("hour_of_day", "weekday") and len(avazu.field_names) == 23
    assert avazu.resolved


@pytest.mark.parametrize("change, expected", [
    (('pooling = "mean"', 'pooling = "max"'), 'columns[1].pooling: "max" is not one of sum, mean'),
    (('kind = "input"', 'kind = "inptu"'), 'columns[4].kind: "inptu" is not one of categorical, multi_valued'),
    (('transform = "cross"', 'transform = "crossing"'), 'derived[1].transform: "crossing" is not one of '),
    (('max_length = 6', 'max_length = 6\nmax_lenght = 3'), "columns[1].max_lenght: not an option of a multi_valued"),
    (('rule = ">= 4"', 'rule = "at least 4"'), "label.rule: 'at least 4' is not OP NUMBER"),
    (('header = true', 'header = true\ncolour = 1'), "format.colour: unknown key"),
    (('name = "movielens"', 'name = "movielens"\nextra = 1'), "extra: unknown key"),
    (('buckets = "quantiles"', 'buckets = "boundaries"'), 'columns[3].count: only for buckets = "quantiles"'),
    (('inputs = ["timestamp"]', 'inputs = ["timestamp"]\ntime_format = "%y%q"'),
     "derived[0]: time_format: '%y%q': unsupported directive %q"),
    (('inputs = ["user_id", "hour"]', 'inputs = ["user_id", "genres"]'),
     'derived[1].inputs: "genres" is not a declared input column'),
    (('name = "title"', 'name = "user_id"'), 'columns[5].name: "user_id" is declared twice (also columns[0])'),
    (('transform = "log1p"', 'transform = "sqrt"'), 'columns[2].transform: "sqrt" is not one of none, log1p'),
    (('dtype = "int"\n[[columns]]\nname = "genres"', 'dtype = "float"\n[[columns]]\nname = "genres"'),
     'columns[0].dtype: "float" is not one of string, int'),
])
def test_every_schema_problem_is_one_line_naming_the_file_and_key(tmp_path, change, expected):
    old, new = change
    assert old in MOVIELENS
    path = _write(tmp_path, MOVIELENS.replace(old, new, 1))
    with pytest.raises(DataError) as error:
        load_schema(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith("schema movielens.toml: "), message
    assert expected in message, message


def test_not_a_schema(tmp_path):
    with pytest.raises(DataError, match="schema nothing: not a built-in schema .criteo, avazu, criteo_x1, avazu_x1, frappe_x1, movielenslatest_x1, kkbox_x1. nor a TOML file"):
        load_schema("nothing")
    with pytest.raises(DataError, match="schema broken.toml: not valid TOML"):
        load_schema(_write(tmp_path, "name = ", "broken.toml"))
    with pytest.raises(DataError, match=r"schema manifest: columns\[0\].kind: missing"):
        Schema.from_dict({"label": {"column": "y"}, "columns": [{"name": "x"}]})


def test_a_transform_from_a_plugin_file(tmp_path):
    plugin = tmp_path / "parity.py"
    plugin.write_text(textwrap.dedent("""
        import numpy as np
        from des.data import Transform, register_transform

        @register_transform
        class Parity(Transform):
            '''1 + (v mod m) of an int column (0 when missing).'''
            name = "parity"
            options = {"modulus": 2}

            def check(self, options, dtypes):
                return None if dtypes[0] == "int" else "parity needs an int column"

            def keys(self, inputs, options):
                values = inputs[0].values
                v = np.asarray(values.fill_null(0).to_numpy(), np.int64)
                return np.where(np.asarray(values.is_valid()), v % options["modulus"] + 1, 0)

            def tf_keys(self, inputs, options):
                import tensorflow as tf
                v = inputs[0].values
                return tf.where(v == -2**63, tf.zeros_like(v), tf.math.floormod(v, options["modulus"]) + 1)
    """))
    try:
        load_plugins(str(plugin))
        text = MOVIELENS.replace('transform = "hour_of_day"', 'transform = "parity"\nmodulus = 3')
        schema = load_schema(_write(tmp_path, text))
        assert schema.derived[0].options == {"modulus": 3}
        with pytest.raises(DataError, match=r"derived\[0\].time_format: unknown key"):
            load_schema(_write(tmp_path, text.replace("modulus = 3", 'time_format = "unix"')))
        resolved = schema.with_statistics({"age": {"mean": 0.0, "std": 1.0}, "price": {"boundaries": [0.0]}})
        columns = {"user_id": pa.array([1, 2, None]), "genres": pa.array(["a|b", None, ""]),
                   "age": pa.array([1.0, None, 3.0]), "price": pa.array([-1.0, 1.0, None]),
                   "timestamp": pa.array([7, 8, None], pa.int64())}
        encoded = encode_rows(resolved, columns, 3)
        assert encoded.columns[3].tolist() == [2, 3, 0]
        assert isinstance(FeatureInput("t", "int", columns["timestamp"]).keys, np.ndarray)
    finally:
        TRANSFORMS.unregister("parity")


def _criteo_layout(**changes) -> dict:
    """The built-in criteo schema's declaration with ``changes`` (column name -> its entry, or a
    top-level key -> its value)."""
    data = load_schema("criteo").to_dict()
    data["columns"] = [changes.pop(c["name"], c) for c in data["columns"]]
    return {**data, **changes}


@pytest.mark.parametrize("changes, expected", [
    ({"C3": {"name": "C3", "kind": "categorical"}}, 'columns[15]: key_scheme 1 takes categorical dtype "hex"'),
    ({"key_scheme": 3}, "key_scheme: 3 is not one of 1, 2"),
    ({"I2": {"name": "I2", "kind": "numeric", "as": "dense"}, "key_scheme": 2},
     'columns[1]: I2 of a "criteo" file is numeric of dtype "int"'),
    ({"C1": {"name": "C1", "kind": "categorical", "dtype": "string"}, "key_scheme": 2},
     'columns[13]: C1 of a "criteo" file is categorical of dtype "hex"'),
    ({"label": {"column": "clicked"}}, 'format.type: "criteo" reads the columns label, I1..I13, C1..C26'),
])
def test_key_scheme_1_and_the_criteo_layout_are_checked(changes, expected):
    with pytest.raises(DataError) as error:
        Schema.from_dict(_criteo_layout(**changes), source="s.toml")
    assert str(error.value).startswith(f"schema s.toml: {expected}")


def test_a_criteo_file_read_with_other_choices(tmp_path):
    """Criteo's reader under a schema of its own: integers as dense standardized numbers, a column
    ignored, hex ids as key scheme 2's (``value + 1``), prepared and served alike."""
    from des.data import prepare
    from des.data.features import ServingFeatures
    from des.data.testing import criteo_line, write_lines

    dense = {"kind": "numeric", "dtype": "int", "as": "dense", "transform": "log1p", "standardize": True}
    schema = Schema.from_dict(_criteo_layout(key_scheme=2, I1={"name": "I1", **dense},
                                             I2={"name": "I2", "kind": "ignored"}), source="mine")
    rows = [criteo_line(r % 2, [r * 7 - 3, 5, *([r] * 11)], [f"{r:08x}", *(["0000ABCD"] * 25)]) for r in range(12)]
    rows[3] = criteo_line(1, [None] * 13, [None] * 26)
    store = prepare(write_lines(tmp_path / "c.tsv", rows), tmp_path / "s", schema=schema, split=(1.0, 0.0, 0.0))
    resolved = Schema.from_dict(store.schema)
    assert store.dense_names == ("I1",) and store.field_names[:2] == ("I3", "I4") and store.num_fields == 37
    assert store.field("C1")[1].tolist() == [r + 1 if r != 3 else 0 for r in range(12)]
    tf = pytest.importorskip("tensorflow")
    request = {f"I{i}": tf.constant([r * 7 - 3 if i == 1 else r for r in range(12)], tf.int64) for i in range(1, 14)}
    request.update({f"C{i}": tf.constant([f"{r:08x}" if i == 1 else "0000ABCD" for r in range(12)])
                    for i in range(1, 27)})
    request["I1"] = tf.tensor_scatter_nd_update(request["I1"], [[3]], tf.constant([-2**63], tf.int64))
    served = ServingFeatures(resolved)({k: v for k, v in request.items() if k != "I2"})
    np.testing.assert_allclose(served.dense.numpy(), store.take_dense(np.arange(12)), rtol=0, atol=0)
