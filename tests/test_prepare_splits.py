"""Splits prepared together: ``des.data prepare --train FILES --validation FILES --test FILES``
makes one store whose training statistics come from the training files only, and split stores
prepared apart with their own statistics are refused by ``--train-data/--validation-data/--test-data``
in one line naming them (validation and test rows must be transformed with the training data's
statistics, as ``des.evaluate`` requires)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from des.data import ColumnStore, DataError, open_inputs, prepare
from des.data.__main__ import main

SCHEMA = """\
name = "standardized"
[format]
type = "csv"
[label]
column = "y"
[[columns]]
name = "x"
kind = "numeric"
as = "dense"
standardize = true
[[columns]]
name = "q"
kind = "numeric"
as = "bucketize"
count = 2
[[columns]]
name = "c"
kind = "categorical"
"""
ROWS = {"train": [(1, 1, 1, "a"), (0, 3, 2, "b"), (1, 5, 3, "a"), (0, 7, 4, "c")],
        "validation": [(1, 100, 50, "a"), (0, 200, 60, "b")], "test": [(1, -5, -9, "a")]}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "s.toml").write_text(SCHEMA)
    out = {"schema": tmp_path / "s.toml"}
    for role, rows in ROWS.items():
        out[role] = tmp_path / f"{role}.csv"
        out[role].write_text("y,x,q,c\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return out


def _prepare(files: dict[str, Path], output: Path, *extra: str) -> int:
    return main(["prepare", "--schema", str(files["schema"]), "--train", str(files["train"]), "--validation",
                 str(files["validation"]), "--test", str(files["test"]), "--output", str(output), *extra])


def test_one_store_with_the_training_files_statistics(files, tmp_path, capsys):
    assert _prepare(files, tmp_path / "store") == 0
    assert "prepared 7 rows (train 4, validation 2, test 1)" in capsys.readouterr().out
    store = ColumnStore.open(tmp_path / "store")
    assert np.asarray(store.split).tolist() == [0, 0, 0, 0, 1, 1, 2]
    train = np.array([r[1] for r in ROWS["train"]], dtype=np.float64)
    x = store.schema["columns"][0]
    assert (x["mean"], x["std"]) == (train.mean(), train.std())  # the training rows' alone
    assert store.schema["columns"][1]["boundaries"] == [2.5]  # the median of the training rows' 1..4
    everything = np.array([r[1] for rows in ROWS.values() for r in rows], dtype=np.float32)
    np.testing.assert_allclose(store.take_dense(np.arange(7))[:, 0], (everything - train.mean()) / train.std(),
                               rtol=1e-6)
    assert store.manifest["split"]["inputs"] == [["train", "train.csv"], ["validation", "validation.csv"],
                                                 ["test", "test.csv"]]
    assert _prepare(files, tmp_path / "store") == 0 and "already prepared: 7 rows" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "store")]) == 0
    assert "[by input: train train.csv, validation validation.csv, test test.csv]" in capsys.readouterr().out


def test_prepare_splits_options_are_checked(files, tmp_path, capsys):
    assert _prepare(files, tmp_path / "a", "--split", "0.5,0.5,0") == 2
    assert capsys.readouterr().err.startswith("des.data: error: --split and --seed split the rows of --input")
    assert main(["prepare", "--validation", str(files["validation"]), "--output", str(tmp_path / "b")]) == 2
    assert "give --input FILE.. (split by --split), or --train FILE.." in capsys.readouterr().err
    assert _prepare(files, tmp_path / "c") == 0
    (files["test"]).write_text("y,x,q,c\n0,1,1,z\n")  # another test file: not the same store
    assert _prepare(files, tmp_path / "c") == 2
    assert "prepared from other inputs or options (input sha256 " in capsys.readouterr().err
    assert not list(tmp_path.glob(".c.tmp-*"))


def test_split_stores_of_their_own_statistics_are_refused(files, tmp_path):
    stores = {role: prepare(files[role], tmp_path / role, schema=files["schema"], split=(1.0, 0.0, 0.0)).path
              for role in ROWS}
    with pytest.raises(DataError) as error:
        open_inputs({role: str(path) for role, path in stores.items()}, schema=files["schema"])
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"--validation-data: {stores['validation']} was prepared with "
                                                      "schema 'standardized' (fingerprint ")
    assert f"--train-data {stores['train']} with 'standardized' (fingerprint " in message
    # raw validation and test files are transformed with the training store's statistics: accepted
    parts = open_inputs({"train": str(stores["train"]), "validation": str(files["validation"]),
                         "test": str(files["test"])}, cache_dir=tmp_path / "cache", schema=files["schema"])
    assert [p.store.schema for p in parts.parts] == [ColumnStore.open(stores["train"]).schema] * 3
