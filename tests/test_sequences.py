"""Sequence columns and shared tables in a schema: an ordered list cut to its most recent
``max_length`` ids, keyed as the column whose table it shares (``table = "<column>"``), alike when
prepared and when served; the declarations checked with one-line errors and recorded; synthetic
rows of such a schema prepare into its synthetic store."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from des.data import ColumnStore, DataError, prepare
from des.data.__main__ import main
from des.data.features import ServingFeatures, encode_rows, int_keys, string_keys
from des.data.schema import Schema
from des.data.synth_schema import synthesize_schema

COLUMNS = [
    {"name": "movie", "kind": "categorical", "dtype": "int"},
    {"name": "history", "kind": "sequence", "max_length": 3, "dtype": "int", "table": "movie"},
    {"name": "tag", "kind": "categorical"},
    {"name": "tags_seen", "kind": "sequence", "separator": ",", "max_length": 2, "pooling": "sum", "table": "tag"},
    {"name": "tags", "kind": "multi_valued", "table": "tag"},
]


def _schema(columns=None, **top) -> Schema:
    return Schema.from_dict({"name": "seq", "format": {"type": "csv"}, "label": {"column": "y"},
                             "columns": COLUMNS if columns is None else columns, **top}, source="seq.toml")


def test_a_sequence_keeps_its_most_recent_ids_in_order_keyed_as_its_table():
    schema = _schema()
    assert schema.shared_tables == {"movie": ("history",), "tag": ("tags_seen", "tags")}
    assert schema.table_owner("history") == "movie" and schema.table_owner("movie") == "movie"
    assert schema.layout()[1] == ("history", "sequence", "multi-hot", True)  # mean pooling: weights 1/n
    columns = {"movie": pa.array([7, 8, None, 9], pa.int64()),
               "history": pa.array(["1|2|3|4|5", "", "6", "10|11|12"]),
               "tag": pa.array(["a", "b", "", "c"]), "tags_seen": pa.array(["a,b,c", "b", "", "x,,y"]),
               "tags": pa.array(["a|b|c", "", "z", "q"])}
    by_name = dict(zip(schema.field_names, encode_rows(schema, columns, 4).columns))
    history = by_name["history"]
    np.testing.assert_array_equal(history.offsets, [0, 3, 3, 4, 7])  # an empty row: no ids (masked)
    np.testing.assert_array_equal(history.keys, int_keys(np.array([3, 4, 5, 6, 10, 11, 12])))  # the last 3
    np.testing.assert_array_equal(history.weights, np.float32([1 / 3] * 3 + [1] + [1 / 3] * 3))
    np.testing.assert_array_equal(by_name["movie"][[0, 1, 3]], int_keys(np.array([7, 8, 9])))
    seen = by_name["tags_seen"]
    assert seen.weights is None  # sum pooling
    np.testing.assert_array_equal(seen.keys, string_keys(pa.array(["b", "c", "b", "", "y"])))
    np.testing.assert_array_equal(by_name["tag"][:2], string_keys(pa.array(["a", "b"])))


def test_served_sequences_are_keyed_as_prepared_bit_for_bit():
    tf = pytest.importorskip("tensorflow")
    schema = _schema()
    rng = np.random.default_rng(0)
    n = 97
    histories = ["|".join(map(str, rng.integers(-5, 10**12, rng.integers(0, 7)))) for _ in range(n)]
    seen = [",".join(rng.choice(["a", "b", "", "ü✓"], rng.integers(0, 4))) for _ in range(n)]
    rows = {"movie": rng.integers(0, 100, n), "history": histories, "tag": rng.choice(["a", "b"], n).tolist(),
            "tags_seen": seen, "tags": ["a|b"] * n}
    prepared = encode_rows(schema, {k: pa.array(v) for k, v in rows.items()}, n)
    served = ServingFeatures(schema)({k: tf.constant(v) for k, v in rows.items()})
    for name, column in zip(schema.field_names, prepared.columns):
        if schema.column(name).kind != "sequence":
            continue
        np.testing.assert_array_equal(served.keys[name].row_splits.numpy(), column.offsets, err_msg=name)
        np.testing.assert_array_equal(served.keys[name].flat_values.numpy(), column.keys, err_msg=name)
    np.testing.assert_array_equal(served.weights["history"].flat_values.numpy(), prepared.columns[1].weights)
    assert max(np.diff(prepared.columns[1].offsets)) == 3 and "tags_seen" not in served.weights


@pytest.mark.parametrize("change, expected", [
    ({"name": "history", "kind": "sequence"}, "columns[1].max_length: missing"),
    ({"name": "history", "kind": "sequence", "max_length": 0}, "columns[1].max_length: 0 is not an integer >= 1"),
    ({"name": "history", "kind": "sequence", "max_length": 3, "weight_separator": ":"},
     "columns[1].weight_separator: not an option of a sequence column"),
    ({"name": "history", "kind": "sequence", "max_length": 3, "dtype": "hex"},
     'columns[1].dtype: "hex" is not one of string, int'),
    ({"name": "history", "kind": "sequence", "max_length": 3, "table": "nope"},
     'columns[1].table: "nope" is not another categorical, multi_valued or sequence column'),
    ({"name": "history", "kind": "sequence", "max_length": 3, "table": "history"},
     'columns[1].table: "history" is not another'),
    ({"name": "history", "kind": "sequence", "max_length": 3, "table": "movie"},
     "columns[1].table: movie keys int ids, history string ids (a shared table needs one dtype)"),
    ({"name": "history", "kind": "sequence", "max_length": 3, "table": "tags"},
     'columns[1].table: "tags" shares the table of "tag": name that one'),
    ({"name": "history", "kind": "numeric", "as": "dense", "table": "movie"},
     "columns[1].table: not an option of a numeric dense column"),
])
def test_every_sequence_or_table_problem_is_one_line(change, expected):
    columns = [dict(c) for c in COLUMNS]
    columns[1] = change
    with pytest.raises(DataError, match="^schema seq.toml: ") as info:
        _schema(columns)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_the_declarations_are_recorded_and_read_back():
    schema = _schema()
    again = Schema.from_dict(schema.to_dict())
    assert again == schema and again.fingerprint == schema.fingerprint
    assert "table" not in _schema(COLUMNS[:1]).to_dict()["columns"][0]  # unshared: recorded as before
    with pytest.raises(DataError, match="key_scheme 1 tags each field's keys"):
        _schema([{"name": "a", "kind": "categorical", "dtype": "hex"},
                 {"name": "b", "kind": "categorical", "dtype": "hex", "table": "a"}], key_scheme=1)


SCHEMA_TOML = """\
[format]
type = "csv"
[label]
column = "y"
rule = ">= 4"
[[columns]]
name = "movie"
kind = "categorical"
dtype = "int"
[[columns]]
name = "history"
kind = "sequence"
max_length = 4
dtype = "int"
table = "movie"
[[columns]]
name = "user"
kind = "categorical"
"""


def test_synthetic_rows_with_a_sequence_prepare_into_the_synthetic_store(tmp_path, capsys):
    path = tmp_path / "seq.toml"
    path.write_text(SCHEMA_TOML)
    synthesize_schema(tmp_path / "s.csv", 2000, str(path), seed=3, file_format="raw")
    synthesize_schema(tmp_path / "store", 2000, str(path), seed=3)
    direct = ColumnStore.open(tmp_path / "store")
    prepared = prepare(tmp_path / "s.csv", tmp_path / "prepared", schema=path, seed=3)
    for f in range(direct.num_fields):
        for a, b in zip(direct.field(f), prepared.field(f)):
            np.testing.assert_array_equal(a, b)
    offsets = np.asarray(prepared.field(1)[0])
    lengths = np.diff(offsets)
    assert lengths.max() == 4 and (lengths == 0).any()  # cut to the most recent 4; empty histories
    movies = set(np.asarray(prepared.field(0)[1]).tolist())
    history = set(np.asarray(prepared.field(1)[1]).tolist())
    assert history <= movies and len(history) >= 5  # ids drawn, and keyed, as the movie column's
    assert direct.manifest["synthetic"]["oracle"]["auc"] > 0.55
    assert main(["inspect", str(tmp_path / "prepared")]) == 0
    text = capsys.readouterr().out
    assert "history          sequence      multi-hot mean     separator '|', last 4, int ids; the table of movie" in text
    bad = tmp_path / "bad.csv"
    bad.write_text("y,movie,history,user\n5,1,1|x|3,u\n")
    with pytest.raises(DataError, match=r"bad.csv:2: column history: '1\|x\|3' has an element that is not an integer"):
        prepare(bad, tmp_path / "bad", schema=path)


def test_training_refuses_a_shared_table_it_would_not_share(tmp_path):
    from des.errors import ConfigError
    from des.train import main as train_main

    path = tmp_path / "seq.toml"
    path.write_text(SCHEMA_TOML)
    synthesize_schema(tmp_path / "s.csv", 300, str(path), seed=3, file_format="raw")
    with pytest.raises(ConfigError, match=r"its schema shares tables \(history -> movie\), and training keeps one "
                                          r"table per field"):
        train_main(["--data", str(tmp_path / "s.csv"), "--schema", str(path), "--cache-dir", str(tmp_path / "c"),
                    "--output", str(tmp_path / "run"), "--max-steps", "1", "--no-progress"])
    assert not (tmp_path / "run").exists()
