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
    categorical = [c.name for c in schema.sparse_columns]
    assert list(store.field_names) == categorical and set(categorical) | set(schema.dense_names) == set(header[1:])
    for field in categorical:
        values = [row[header.index(field)] for row in rows]
        keys = store.gather(field, np.arange(len(rows))).keys
        assert keys.tolist() == string_keys(pa.array(values)).tolist()  # the text of the id, hashed
    if schema.dense_names:
        dense = store.take_dense(np.arange(len(rows)))
        expected = [[float(row[header.index(n)]) for n in schema.dense_names] for row in rows]
        np.testing.assert_array_equal(dense, np.asarray(expected, dtype=np.float32))


def test_prepare_command_and_the_trainers_inputs(tmp_path):
    raw = str(FIXTURES / "frappe_x1.csv")
    main(["prepare", "--schema", "frappe_x1", "--train", raw, "--validation", raw, "--test", raw, "--output",
          str(tmp_path / "store"), "--no-progress"])
    inputs = open_inputs({"train": raw, "validation": raw, "test": raw}, cache_dir=tmp_path / "cache",
                         schema="frappe_x1")
    assert inputs.num_rows == 18 and inputs.num_fields == 10
