"""The notebook's surface: ``des.train.run`` (one process), ``des.load(...)`` with ``.predict``,
``.evaluate`` and ``.importance`` on pandas DataFrames, ``des.data.prepare_frame``, and
``des.evaluate --importance``.

A tiny DeepFM trained in this process on Criteo rows and one on a small CSV schema
(``tests/data/three_fields.toml``: string and int categoricals, a mean-pooled list, a dense
number): ``predict`` on the DataFrame of a request file gives ``des.evaluate --predictions`` on the
file (ids never seen, missing values, odd values); permutation importance is the same through the
API and the command line, and on 1 and 2 ranks (one launch); ``--resume`` of a checkpoint without
``--output`` continues in its run folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import des
from des.data.tsv import COLUMN_NAMES
from tests.conftest import REPO, criteo_head, run_mpi, schema_requests

THREE = REPO / "tests" / "data" / "three_fields.toml"
TINY = {"model": "deepfm", "hidden": [16, 8], "embedding_dim": 4, "batch_size": 64, "eval_batch_size": 1024,
        "progress": False, "dtype": "float64", "unadmitted": "init", "max_steps": 4}
STEP4 = Path("checkpoints") / "step-00000004"
# Criteo rows a service may get: every value missing; negative integers, upper-case hex, ids never seen
CRITEO_EDITED = ["\t".join(["1"] + [""] * 39),
                 "\t".join(["0", "-3", "-1", "123456789"] + ["7"] * 10 + ["ABCDEF12", "00000000"] * 13)]
# (rating, user, item, genres, age): never seen, all missing, a list longer than max_length
THREE_EDITED = [["5", "nobody", "987654321", "new1|new2|new3|new4|new5", "95"], ["1", "", "", "", ""],
                ["4", "héllo", "-5", "a||b", "-1e3"]]


@pytest.fixture(scope="module")
def criteo(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("api-criteo")
    lines = criteo_head(root / "head.tsv", 600).read_text().splitlines()
    (root / "train.tsv").write_text("\n".join(lines[:300]) + "\n")
    (root / "requests.tsv").write_text("\n".join(lines[300:] + CRITEO_EDITED) + "\n")
    summary = des.train.run({**TINY, "data": str(root / "train.tsv"), "cache_dir": str(root / "cache"),
                             "output": str(root / "run")})
    checkpoint = Path(summary["run_folder"]) / STEP4
    des.evaluate.main(["--checkpoint", str(checkpoint), "--data", str(root / "requests.tsv"), "--cache-dir",
                       str(root / "cache"), "--predictions", str(root / "evaluate.txt"), "--importance"])
    return {"root": root, "summary": summary, "checkpoint": checkpoint, "model": des.load(summary["run_folder"])}


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("api-three")
    schema_requests(root, THREE, 400, 3, 200, THREE_EDITED)
    summary = des.train.run(["--data", str(root / "train.csv"), "--schema", str(THREE), "--cache-dir",
                             str(root / "cache"), "--output", str(root / "run"), *des.train.flags_of(TINY)])
    des.evaluate.main(["--checkpoint", summary["run_folder"], "--data", str(root / "requests.csv"), "--cache-dir",
                       str(root / "cache"), "--predictions", str(root / "evaluate.txt"), "--importance"])
    return {"root": root, "summary": summary, "model": des.load(Path(summary["run_folder"]) / "checkpoints")}


def criteo_frame(path: Path, model) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t", header=None, names=list(COLUMN_NAMES), dtype=model.dtypes)


def test_criteo_predictions_equal_des_evaluate(criteo: dict) -> None:
    model = criteo["model"]
    assert model.checkpoint == criteo["checkpoint"].resolve() and model.step == 4
    frame = criteo_frame(criteo["root"] / "requests.tsv", model)
    expected = np.loadtxt(criteo["root"] / "evaluate.txt")
    predicted = model.predict(frame)
    assert predicted.shape == expected.shape == (300 + len(CRITEO_EDITED),)
    np.testing.assert_allclose(predicted, expected, rtol=0, atol=1e-6)
    # without the label, missing values as NaN, None or pd.NA, integers as floats: the same rows
    loose = frame.drop(columns="label").astype({"I1": "float64", "C3": object})
    loose.loc[loose.index[-2], "C5"] = None
    np.testing.assert_array_equal(model.predict(loose), predicted)  # and predicting changed nothing
    result = model.evaluate(frame)
    assert result["rows"] == predicted.size and 0 < result["auc"] < 1
    assert model.evaluate(frame.drop(columns="label"), label=frame["label"].to_numpy()) == result
    with pytest.raises(des.data.DataError, match=r"^DataFrame:row 2: column C5: 'xyz' is not 8 hex digits$"):
        model.predict(frame.head(3).assign(C5=["68fd1e64", "xyz", None]))


def test_importance_through_the_api_is_the_command_line_s(criteo: dict) -> None:
    model, root = criteo["model"], criteo["root"]
    table = model.importance(criteo_frame(root / "requests.tsv", model))
    written = json.loads((root / "importance.json").read_text())["inputs"]  # next to --predictions
    assert (root / "importance.csv").is_file()
    assert len(table) == len(written) == 40 and table["input"][0] == "(none)"
    assert table["auc_drop"].iloc[1:].is_monotonic_decreasing
    by_name = table.set_index("input")
    for record in written:
        for column in ("auc", "auc_drop", "logloss", "logloss_rise"):
            assert by_name.loc[record["input"], column] == pytest.approx(record[column], rel=1e-12, abs=1e-15)


def test_schema_predictions_equal_des_evaluate(three: dict) -> None:
    model, root = three["model"], three["root"]
    assert model.columns == {"rating": "float", "user": "string", "item": "int", "genres": "string", "age": "float"}
    frame = pd.read_csv(root / "requests.csv", dtype=model.dtypes, keep_default_na=False, na_values=[""])
    expected = np.loadtxt(root / "evaluate.txt")
    predicted = model.predict(frame)
    assert predicted.shape == expected.shape == (200 + len(THREE_EDITED),)
    np.testing.assert_allclose(predicted, expected, rtol=0, atol=1e-6)
    # a frame made by hand: "" and None are missing text, NaN a missing number, pd.NA a missing integer
    rows = pd.DataFrame({"user": ["nobody", None, "héllo"], "item": pd.array([987654321, pd.NA, -5], "Int64"),
                         "genres": ["new1|new2|new3|new4|new5", "", "a||b"], "age": [95.0, np.nan, -1e3]})
    np.testing.assert_array_equal(model.predict(rows), predicted[-3:])
    with pytest.raises(des.data.DataError, match=r"^DataFrame:row 2: column item: '1.5' is not an integer$"):
        model.predict(rows.assign(item=["1", "1.5", "2"]))
    with pytest.raises(des.data.DataError, match="no column 'age', which schema three_fields declares"):
        model.predict(rows.drop(columns="age"))


def test_importance_is_the_same_on_two_ranks(three: dict) -> None:
    root = three["root"]
    run_mpi(2, ["-m", "des.evaluate", "--checkpoint", three["summary"]["run_folder"], "--data",
                str(root / "requests.csv"), "--cache-dir", str(root / "cache"), "--importance", str(root / "two")])
    one = json.loads((root / "importance.json").read_text())["inputs"]
    two = json.loads((root / "two" / "importance.json").read_text())["inputs"]
    assert [r["input"] for r in one] == ["(none)", "user", "item", "genres", "age"] == [r["input"] for r in two]
    for a, b in zip(one, two):
        for column in ("auc", "auc_drop", "logloss", "logloss_rise"):
            assert b[column] == pytest.approx(a[column], rel=1e-9, abs=1e-12), (a["input"], column)


def test_prepare_frame_is_prepare_of_the_file(three: dict, criteo: dict, tmp_path: Path) -> None:
    from des.data import ColumnStore, prepare, prepare_frame

    model = three["model"]
    cases = [(three["root"] / "train.csv", str(THREE),
              pd.read_csv(three["root"] / "train.csv", dtype=model.dtypes, keep_default_na=False, na_values=[""])),
             (criteo["root"] / "train.tsv", None, criteo_frame(criteo["root"] / "train.tsv", criteo["model"]))]
    for i, (path, schema, frame) in enumerate(cases):
        a = prepare(path, tmp_path / f"file-{i}", schema=schema)
        b = prepare_frame(frame, schema, tmp_path / f"frame-{i}")
        assert isinstance(b, ColumnStore) and b.num_rows == a.num_rows == len(frame)
        assert a.schema == b.schema  # the training statistics too
        for name in ("train", "validation", "test"):
            np.testing.assert_array_equal(a.split_rows(name), b.split_rows(name))
        rows = np.arange(a.num_rows)
        np.testing.assert_array_equal(a.take_labels(rows), b.take_labels(rows))
        for f in range(a.num_fields):
            x, y = a.gather(f, rows), b.gather(f, rows)
            np.testing.assert_array_equal(x.keys, y.keys)
            np.testing.assert_array_equal(x.offsets, y.offsets)
            assert (x.weights is None) == (y.weights is None)
            if x.weights is not None:
                np.testing.assert_array_equal(x.weights, y.weights)
        if a.num_dense:
            np.testing.assert_array_equal(a.take_dense(rows), b.take_dense(rows))


def test_resume_without_output_continues_in_the_run_folder(criteo: dict) -> None:
    """``--resume CHECKPOINT`` without ``--output`` continues the run that holds the checkpoint (last:
    it moves the run's ``latest``)."""
    root, folder = criteo["root"], criteo["summary"]["run_folder"]
    summary = des.train.run({**TINY, "data": str(root / "train.tsv"), "cache_dir": str(root / "cache"),
                             "resume": str(criteo["checkpoint"]), "max_steps": 6})
    assert summary["run_folder"] == folder and summary["steps"] == 6 and summary["steps_this_run"] == 2
    assert (Path(folder) / "checkpoints" / "latest").read_text().strip() == "step-00000006"
    assert json.loads((Path(folder) / "config.json").read_text())["config"]["resume"] == str(criteo["checkpoint"])


def test_importance_files_without_matplotlib(tmp_path: Path, monkeypatch) -> None:
    import sys

    from des.importance import format_table, write_importance

    records = [{"input": "(none)", "kind": "baseline", "auc": None, "auc_drop": None, "logloss": 0.5,
                "logloss_rise": 0.0},
               {"input": "user", "kind": "categorical", "auc": None, "auc_drop": None, "logloss": 0.75,
                "logloss_rise": 0.25}]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    written = write_importance(records, tmp_path / "out", about={"seed": 0})
    assert [p.name for p in written] == ["importance.csv", "importance.json"]
    assert json.loads(written[1].read_text())["inputs"][1]["auc_drop"] is None
    assert "n/a" in format_table(records).splitlines()[2]
