"""The BARS x1 datasets as built-in schemas (``des/data/bars.py``, ``docs/bars.md``): a few rows
in each published layout (``tests/data/bars``) prepare as one store of the published train, valid
and test files, each column its field, equal ids equal keys, Criteo_x1's numbers its dense
features; ``des.data prepare --schema NAME --train/--validation/--test`` and the trainer's
``--train-data/--validation-data/--test-data`` read them."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from des.data import open_inputs
from des.data.__main__ import main
from des.data.bars import BARS_SCHEMAS
from des.data.build import prepare_splits
from des.data.features import string_keys
from des.data.schema import BUILT_IN, load_schema

FIXTURES = Path(__file__).resolve().parent / "data" / "bars"


def _table(name: str) -> tuple[list[str], list[list[str]]]:
    with open(FIXTURES / f"{name}.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


@pytest.mark.parametrize("name", sorted(BARS_SCHEMAS))
def test_published_layout_prepares_as_one_store(tmp_path, name):
    assert name in BUILT_IN
    header, rows = _table(name)
    raw = FIXTURES / f"{name}.csv"
    store = prepare_splits({"train": [raw], "validation": [raw], "test": [raw]}, tmp_path / name, schema=name,
                           progress=False)
    schema = load_schema(name)
    assert store.num_rows == 3 * len(rows)
    assert [len(store.split_rows(split)) for split in ("train", "validation", "test")] == [len(rows)] * 3
    assert list(store.take_labels(np.arange(len(rows)))) == [int(row[0]) for row in rows]
    assert list(store.field_names) == list(schema.field_names)
    assert [c.name for c in schema.columns] == header[1:]  # every published column declared, in its order
    categorical = [c.name for c in schema.columns if c.kind == "categorical"]
    for field in categorical:
        values = [row[header.index(field)] for row in rows]
        keys = store.gather(field, np.arange(len(rows))).keys
        assert keys.tolist() == string_keys(pa.array(values)).tolist()  # the text of the id, hashed
    if schema.dense_names:
        dense = store.take_dense(np.arange(len(rows)))
        expected = [[float(row[header.index(n)]) for n in schema.dense_names] for row in rows]
        np.testing.assert_array_equal(dense, np.asarray(expected, dtype=np.float32))


def test_kkbox_lists_ages_and_country_codes(tmp_path):
    """KKBox_x1's FuxiCTR preprocessing: space-separated lists, the first 3 ids kept; ``bd`` in
    FuxiCTR's age buckets (below 1 and above 95 apart); ``isrc``'s first two characters a field."""
    header, rows = _table("kkbox_x1")
    raw = FIXTURES / "kkbox_x1.csv"
    store = prepare_splits({"train": [raw]}, tmp_path / "store", schema="kkbox_x1", progress=False)
    every = np.arange(len(rows))
    for column in ("genre_ids", "artist_name"):
        lists = [row[header.index(column)].split(" ")[:3] if row[header.index(column)] else [] for row in rows]
        got = store.gather(column, every)
        assert np.diff(got.offsets).tolist() == [len(ids) for ids in lists]
        assert got.keys.tolist() == string_keys(pa.array([i for ids in lists for i in ids], pa.string())).tolist()
    ages = [float(row[header.index("bd")]) for row in rows]  # 0, 24, 10, 96, 61, 11
    assert store.gather("bd", every).keys.tolist() == [1, 4, 2, 9, 8, 3]
    assert ages == [0, 24, 10, 96, 61, 11]
    codes = [row[header.index("isrc")][:2] for row in rows]
    assert store.gather("isrc_country", every).keys.tolist() == string_keys(pa.array(codes)).tolist()
    assert store.gather("isrc_country", every).keys[2] == 0  # no isrc: the missing key


def test_prepare_command_and_the_trainers_inputs(tmp_path):
    raw = str(FIXTURES / "frappe_x1.csv")
    main(["prepare", "--schema", "frappe_x1", "--train", raw, "--validation", raw, "--test", raw, "--output",
          str(tmp_path / "store"), "--no-progress"])
    inputs = open_inputs({"train": raw, "validation": raw, "test": raw}, cache_dir=tmp_path / "cache",
                         schema="frappe_x1")
    assert inputs.num_rows == 18 and inputs.num_fields == 10
