"""``python -m des.export`` of a model trained on data of a declared schema
(``tests/data/every_kind.toml``: string and int categoricals, mean-pooled and weighted multi-valued
columns, a sequence sharing a categorical's table, quantile and log_squared buckets, dense features
with log1p and standardization, derived hour, weekday and cross fields): the SavedModel takes one
named input per raw column in its declared dtype, computes the keys, pooling weights and dense
features itself, and a process that never imports des gets ``des.evaluate --predictions``'
probabilities to 1e-6, for unknown values, missing values and over-long lists too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, mpi_env, run_mpi_many, schema_requests

EVERY_KIND = REPO / "tests" / "data" / "every_kind.toml"
SMALL = ["--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "128", "--eval-batch-size", "1024",
         "--no-progress", "--max-steps", "8"]
RUNS = [  # (name, model, ranks, flags)
    ("deepfm-1", "deepfm", 1, ["--unadmitted", "init"]),
    ("wdl-2", "wdl", 2, ["--strategy", "alltoall"]),  # its defaults: --min-count 2 --unadmitted shared
    ("lr-1", "lr", 1, []),
    # the dense features in x_0 and a mixture of low-rank experts; DLRM's bottom MLP on them
    ("dcnv2-2", "dcnv2", 2, ["--model-options", "cross_layers=2;cross=mix;low_rank=3;experts=2"]),
    ("dlrm-1", "dlrm", 1, ["--model-options", "bottom=8"]),
    # FinalMLP's gates and bilinear fusion; xDeepFM's CIN
    ("finalmlp-2", "finalmlp", 2, ["--model-options", "mlp2_hidden=8;fs_hidden=8;num_heads=2"]),
    ("xdeepfm-1", "xdeepfm", 1, ["--model-options", "cin_layers=4,3"]),
]
# Rows a service may receive (rating, row_id, user, item, tags, scores, price, clicks, age, income,
# time, recent): values never seen, every value missing, lists longer than max_length (a sequence
# keeps its most recent), weights given and not.
EDITED = [
    ["5", "-1", "nobody", "987654321", "new1|new2|new3|new4", "x:2.5;y;z:0.125", "1e6", "123456789", "95", "1e9",
     "1400000000", "1|2|3|4|5|6|7|8|9"],
    ["1", "-2", "", "", "", "", "", "", "", "", "", ""],
    ["4", "-3", "héllo wörld", "-5", "a||b", ":3", "-1e300", "-7", "-1", "0", "0", "987654321|-5|7"],
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    from des import evaluate, export, train

    root = tmp_path_factory.mktemp("export-schema")
    schema_requests(root, EVERY_KIND, 1500, 5, 300, EDITED)  # requests: the header, 300 rows, the edited ones
    args = {name: ["--data", str(root / "train.csv"), "--schema", str(EVERY_KIND), "--cache-dir", str(root / "cache"),
                   "--output", str(root / name), "--model", model, *SMALL, *flags] for name, model, _, flags in RUNS}
    # the 2-rank runs one after another in one job; the 1-rank ones in this process
    run_mpi_many(2, {name: ["-m", "des.train", *args[name]] for name, _, ranks, _ in RUNS if ranks == 2}, root / "jobs")
    expected, models = {}, []
    for name, _, ranks, _ in RUNS:
        if ranks == 1:
            train.main(args[name])
        evaluate.main(["--checkpoint", str(root / name), "--data", str(root / "requests.csv"), "--cache-dir",
                       str(root / "cache"), "--predictions", str(root / f"{name}.evaluate.txt")])
        expected[name] = np.loadtxt(root / f"{name}.evaluate.txt")
        export.main(["--checkpoint", str(root / name), "--output", str(root / f"{name}.savedmodel")])
        models.append(str(root / f"{name}.savedmodel"))
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "serving_client.py"), "--examples",
                           str(root / "requests.csv"), str(root / "served-"), *models], cwd=root, env=mpi_env(1),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    served = {name: np.loadtxt(root / f"served-{i}.txt") for i, (name, *_) in enumerate(RUNS)}
    examples = {name: np.loadtxt(root / f"served-{i}.examples.txt") for i, (name, *_) in enumerate(RUNS)}
    return {"root": root, "expected": expected, "served": served, "examples": examples}


@pytest.mark.parametrize("name", [r[0] for r in RUNS])
def test_served_probabilities_equal_evaluate(exported: dict, name: str) -> None:
    expected, served = exported["expected"][name], exported["served"][name]
    assert served.shape == expected.shape == (300 + len(EDITED),)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)
    assert len(set(np.round(served[-len(EDITED):], 7))) == len(EDITED)  # the edited rows are told apart


@pytest.mark.parametrize("name", [r[0] for r in RUNS])
def test_examples_signature_serves_the_same_probabilities(exported: dict, name: str) -> None:
    """Each row as one serialized ``tf.Example`` (float64 columns as their text, missing values
    left out): ``des.evaluate``'s probabilities, and exactly ``serving_default``'s."""
    served = exported["examples"][name]
    np.testing.assert_allclose(served, exported["expected"][name], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(served, exported["served"][name])


def test_examples_signature_names_a_float64_feature_that_is_not_a_number(exported: dict) -> None:
    import tensorflow as tf

    serve = tf.saved_model.load(str(exported["root"] / "deepfm-1.savedmodel")).signatures["examples"]

    def example(price: bytes) -> bytes:
        feature = {"price": tf.train.Feature(bytes_list=tf.train.BytesList(value=[price]))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    good = serve(examples=tf.constant([example(b" -1.5e2"), example(b"NaN"), example(b"")]))["probability"].numpy()
    assert good.shape[0] == 3 and np.isfinite(good).all()
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature price: not a decimal number.*12,5"):
        serve(examples=tf.constant([example(b"3"), example(b"12,5")]))


def test_one_named_input_per_raw_column(exported: dict) -> None:
    from tensorflow.python.tools import saved_model_utils

    meta_graph = saved_model_utils.get_meta_graph_def(str(exported["root"] / "deepfm-1.savedmodel"), "serve")
    inputs = meta_graph.signature_def["serving_default"].inputs
    dtypes = {name: tensor.dtype for name, tensor in inputs.items()}
    # the label and the ignored column are not inputs; every other column in its declared dtype
    assert set(dtypes) == {"user", "item", "tags", "scores", "price", "clicks", "age", "income", "time", "recent"}
    assert dtypes["user"] == dtypes["tags"] == dtypes["scores"] == dtypes["recent"] == 7  # DT_STRING
    assert dtypes["item"] == dtypes["time"] == 9  # DT_INT64
    assert dtypes["price"] == dtypes["age"] == 2  # DT_DOUBLE
    info = json.loads((exported["root"] / "deepfm-1.savedmodel" / "des_export.json").read_text())
    assert info["schema"]["name"] == "every_kind" and "tags string" in info["inputs"]


def test_another_schema_is_refused(exported: dict, tmp_path: Path) -> None:
    from des import export
    from des.errors import DesError

    with pytest.raises(DesError, match="trained on data of schema 'every_kind'"):
        export.main(["--checkpoint", str(exported["root"] / "lr-1"), "--output", str(tmp_path / "out"),
                     "--schema", "avazu"])
    assert not (tmp_path / "out").exists()


def test_the_serving_client_names_a_column_of_the_wrong_dtype(exported: dict, tmp_path: Path) -> None:
    """examples/serving_client.py builds each column in its signature's dtype: an int column's value
    that is not an integer is refused naming the column and row, not by TensorFlow's positional
    message."""
    import csv

    with open(exported["root"] / "requests.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))[:3]
    rows[1]["item"] = "twelve"
    with open(tmp_path / "bad.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "serving_client.py"), str(tmp_path / "bad.csv"),
                           str(tmp_path / "served-"), str(exported["root"] / "deepfm-1.savedmodel")],
                          env=mpi_env(1), capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0 and "column item, row 2: 'twelve' is not int64" in proc.stderr, proc.stderr
    assert not (tmp_path / "served-0.txt").exists()


def test_one_table_keeps_each_fields_keys_apart(exported: dict) -> None:
    """All fields share one table (key scheme 2's keys XORed with a salt per field): a stored key
    of another field, even one that lands on the same salted key, is unknown in this one."""
    import tensorflow as tf

    from des.building import build_model
    from des.checkpoint import read_manifest
    from des.config import TrainConfig
    from des.serving.model import ServedModel, field_salts
    from des.serving.state import read_checkpoint

    folder, manifest = read_manifest(exported["root"] / "deepfm-1")
    model = build_model(TrainConfig(**manifest["config"]), manifest["num_fields"], manifest["model"]["num_dense"])
    state = read_checkpoint(folder, manifest, model)
    served = ServedModel(model, state)
    assert served.salts.any()  # bucket keys 1, 2, ... are stored in several fields
    f, g = 0, len(state["keys"]) - 1
    stored = state["keys"][g][:3]
    clash = stored ^ served.salts[g] ^ served.salts[f]  # field f's keys that land on g's salted keys
    keys = np.concatenate([stored, clash, stored])
    fields = np.array([g] * 3 + [f] * 3 + [f] * 3)
    rows = served.rows(tf.constant(keys), lambda table: tf.constant(table[fields])).numpy()
    np.testing.assert_array_equal(rows[:3], state["offsets"][g] + np.arange(3))
    own = {k: state["offsets"][f] + i for i, k in enumerate(state["keys"][f])}
    np.testing.assert_array_equal(rows[3:], [own.get(k, -1) for k in keys[3:]])
    assert (rows[3:6] == -1).all()
    assert not field_salts([np.array([5, 6]), np.array([7])]).any()  # distinct keys: no salt
    salts = field_salts([np.array([5, 6]), np.array([6, 7])])
    assert len({5 ^ salts[0], 6 ^ salts[0], 6 ^ salts[1], 7 ^ salts[1]}) == 4
