"""DIN: a sequence read item by item (``pooling = "none"``: fields ``name@1`` .. ``name@L``, the same
keys prepared and served; DIN's activation unit: tests/test_layers.py), and the ``din`` model
trained on N ranks equal to 1 rank in float64 under the partials, the exchanged plan and alltoall
(with DeepFM's linear and FM terms beside the MLP, and with the activation unit reading each slot's
position), exported and served equal to ``des.evaluate``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from des.data.features import ServingFeatures, encode_rows, int_keys
from des.data.schema import Schema
from des.errors import ConfigError

COLUMNS = [
    {"name": "movie", "kind": "categorical", "dtype": "int"},
    {"name": "user", "kind": "categorical"},
    {"name": "history", "kind": "sequence", "max_length": 3, "dtype": "int", "pooling": "none", "table": "movie"},
]
SCHEMA = """name = "din"
[format]
type = "csv"
[label]
column = "y"
[[columns]]
name = "movie"
kind = "categorical"
dtype = "int"
[[columns]]
name = "user"
kind = "categorical"
[[columns]]
name = "history"
kind = "sequence"
dtype = "int"
max_length = 3
pooling = "none"
table = "movie"
"""


def _schema() -> Schema:
    return Schema.from_dict({"name": "seq", "format": {"type": "csv"}, "label": {"column": "y"}, "columns": COLUMNS},
                            source="seq.toml")


def test_a_sequence_read_item_by_item_is_a_field_per_slot_most_recent_first():
    schema = _schema()
    assert schema.field_names == ("movie", "user", "history@1", "history@2", "history@3")
    assert schema.shared_tables == {"movie": ("history@1", "history@2", "history@3")}
    columns = {"movie": pa.array([7, 8, 9], pa.int64()), "user": pa.array(["a", "b", "c"]),
               "history": pa.array(["1|2|3|4|5", "", "6"])}
    slots = encode_rows(schema, columns, 3).columns[2:]
    np.testing.assert_array_equal(slots[0].offsets, [0, 1, 1, 2])  # an empty history: no id in any slot
    np.testing.assert_array_equal(slots[0].keys, int_keys(np.array([5, 6])))
    np.testing.assert_array_equal(slots[2].offsets, [0, 1, 1, 1])
    np.testing.assert_array_equal(slots[2].keys, int_keys(np.array([3])))  # over-long: the last 3 kept
    assert all(s.weights is None for s in slots)


def test_served_slots_are_keyed_as_prepared():
    tf = pytest.importorskip("tensorflow")
    schema = _schema()
    cells = ["1|2|3|4|5", "", "6", "10|11"]
    prepared = encode_rows(schema, {"movie": pa.array([1, 2, 3, 4], pa.int64()), "user": pa.array(list("abcd")),
                                    "history": pa.array(cells)}, 4).columns
    served = ServingFeatures(schema)({"movie": tf.constant([1, 2, 3, 4], tf.int64), "user": tf.constant(list("abcd")),
                                      "history": tf.constant(cells)}).keys
    for j, name in enumerate(schema.field_names[2:], start=2):
        np.testing.assert_array_equal(served[name].row_splits.numpy(), prepared[j].offsets)
        np.testing.assert_array_equal(served[name].flat_values.numpy(), prepared[j].keys)


def test_an_item_sequence_names_its_candidate():
    bad = [*COLUMNS[:2], {**COLUMNS[2], "table": None}]
    bad[2].pop("table")
    with pytest.raises(Exception, match=r"columns\[2\]\.table: missing \(a sequence read item by item"):
        Schema.from_dict({"name": "s", "format": {"type": "csv"}, "label": {"column": "y"}, "columns": bad})


def test_din_needs_a_sequence_sharing_its_candidates_table():
    from des.building import build_model
    from des.config import TrainConfig

    with pytest.raises(ConfigError, match="--model din: din attends over a sequence's items"):
        build_model(TrainConfig(model="din", shared_tables="none"), 5)
    model = build_model(TrainConfig(model="din", shared_tables="2:0,3:0"), 5)
    assert model.groups == [(0, (2, 3))] and model.substitutions()[0].fields == (0, 1, 4)


def test_dins_fm_takes_the_pooled_history_as_one_more_field():
    """``wide = "fm"``: the reduced sums of the fields but the items plus FM's partials of ``v_h`` in
    the top network give FM's pairwise sum over those fields and ``v_h``, each product once."""
    tf = pytest.importorskip("tensorflow")
    from des.building import build_model
    from des.config import TrainConfig
    from des.substitutions import FMOrder2

    model = build_model(TrainConfig(model="din", shared_tables="2:0,3:0", embedding_dim=3, hidden="4",
                                    model_options="attention_hidden=2;wide=fm"), 5, num_dense=1)
    linear, sums = model.substitutions()[2:]
    assert (linear.block, linear.fields, sums.inner.fields, sums.width) == ("linear", (0, 1, 4), (0, 1, 4), 4)
    rng = np.random.default_rng(0)
    emb, pooled = tf.constant(rng.normal(size=(6, 5, 3))), tf.constant(rng.normal(size=(6, 3)))
    fields = tf.concat([tf.gather(emb, [0, 1, 4], axis=1), pooled[:, None, :]], axis=1)
    np.testing.assert_allclose(model.pairwise(sums.reference(emb, {}), pooled).numpy(),
                               FMOrder2(4, 3).reference(fields, {})[:, 0].numpy(), rtol=1e-12)
    bare = build_model(TrainConfig(model="din", shared_tables="2:0,3:0", model_options="wide=none"), 5)
    assert bare.attention.unit.recency == "none" and "attention_position" not in bare.attention.field_params()
    assert [b.name for b in bare.blocks()] == ["embedding"] and len(bare.substitutions()) == 2
    with pytest.raises(ConfigError, match="--model din: wide must be one of none, linear, fm, got 'deep'"):
        build_model(TrainConfig(model="din", shared_tables="2:0,3:0", model_options="wide=deep"), 5)


def test_dins_recency_is_a_position_table_per_candidate_slice():
    """``recency``: the activation unit's ``[L, k]`` position vectors are a field parameter of the
    attention (the candidate's slice is the group's), drawn per field: N-independent."""
    from des.building import build_model
    from des.config import TrainConfig

    model = build_model(TrainConfig(model="din", shared_tables="2:0,3:0,4:1", embedding_dim=3,
                                    model_options="recency=concat"), 6)
    assert model.attention.unit.recency == "concat" and model.attention.unit.positions == 2
    assert model.attention.field_params()["attention_position"].shape == (2, 3)
    whole, some = (model.attention.init_field_params(0, fields)["attention_position"] for fields in (range(6), [4, 0]))
    np.testing.assert_array_equal(some, whole[[4, 0]])
    with pytest.raises(ConfigError, match="--model din: recency must be one of none, concat, add, got 'time'"):
        build_model(TrainConfig(model="din", shared_tables="2:0,3:0", model_options="recency=time"), 5)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    from des.data import prepare
    from des.data.synth_schema import synthesize_schema

    root = tmp_path_factory.mktemp("din")
    (root / "din.toml").write_text(SCHEMA)
    synthesize_schema(root / "din.csv", 600, str(root / "din.toml"), seed=3, file_format="raw")
    prepare(root / "din.csv", root / "store", schema=str(root / "din.toml"), split=(0.8, 0.1, 0.1), seed=1)
    return root


def test_din_on_two_ranks_equals_one_rank_float64(store):
    """Under the partials (the attention on its group's rank), the exchanged plan (the items' values
    moved to the row owners, the attention whole there) and alltoall, against one 1-rank run; with
    DeepFM's linear and FM terms (the pooled history's FM products in the top network), the
    exchanged plan also with the softmax over the present items, and the activation unit reading
    each slot's position."""
    from des.check import Case, check

    flags = ("--hidden", "6,4", "--model-options", "attention_hidden=4;wide=fm")
    softmax = ("--hidden", "6,4", "--model-options", "attention_hidden=4;wide=fm;attention_softmax=true")
    recency = ("--hidden", "6,4", "--model-options", "attention_hidden=4;wide=fm;recency=concat")
    partials = (*flags, "--plan", "partials")
    cases = [Case("din", "des", str(store / "store"), "float64", partials),
             Case("din", "des", str(store / "store"), "float64", (*softmax, "--plan", "exchange"),
                  reference_flags=(*softmax, "--plan", "partials")),
             Case("din", "des", str(store / "store"), "float64", (*recency, "--plan", "exchange"),
                  reference_flags=(*recency, "--plan", "partials")),
             Case("din", "alltoall", str(store / "store"), "float64", flags, reference_strategy="des",
                  reference_flags=partials)]
    results = check(cases, ranks=(2,), steps=4, batch_size=32, timeout=400)
    assert len(results) == 4 and all(not r.failures and r.arrays > 0 for r in results), \
        [(r.case.flags, r.failures[:2]) for r in results]


OPTIONS = ["wide=none", "wide=fm", "wide=fm;recency=add"]


@pytest.fixture(scope="module")
def served(store, tmp_path_factory) -> dict:
    """Each of OPTIONS trained, predicted by des.evaluate and exported; the exports served by one
    process without des (examples/serving_client.py): each one's probabilities by both signatures."""
    from des import evaluate, export, train
    from tests.conftest import REPO, mpi_env

    root, requests, models, out = tmp_path_factory.mktemp("din-served"), store / "din.csv", [], {}
    for i, options in enumerate(OPTIONS):
        run = root / f"run-{i}"
        train.main(["--model", "din", "--data", str(store / "store"), "--max-steps", "6", "--batch-size", "32",
                    "--hidden", "6,4", "--model-options", f"attention_hidden=4;{options}", "--output", str(run)])
        evaluate.main(["--checkpoint", str(run), "--data", str(requests), "--cache-dir", str(root / "cache"),
                       "--predictions", str(root / f"evaluate-{i}.txt")])
        export.main(["--checkpoint", str(run), "--output", str(root / f"model-{i}")])
        models.append(str(root / f"model-{i}"))
    done = subprocess.run([sys.executable, str(REPO / "examples" / "serving_client.py"), "--examples",
                           str(requests), str(root / "served-"), *models], cwd=root,
                          env=mpi_env(1), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    for i, options in enumerate(OPTIONS):
        out[options] = {kind: np.loadtxt(root / name) for kind, name in
                        (("evaluate", f"evaluate-{i}.txt"), ("served", f"served-{i}.txt"),
                         ("examples", f"served-{i}.examples.txt"))}
    return out


@pytest.mark.parametrize("options", OPTIONS)
def test_din_exported_serves_what_evaluate_predicts(store, served, options):
    """Served without des (examples/serving_client.py) == des.evaluate to 1e-6, on rows with empty
    and over-long histories (the synthetic sequences run 0 .. max_length + 2 ids), without and with
    DeepFM's linear and FM terms, and with the slots' positions."""
    requests = store / "din.csv"
    histories = [line.split(",")[-1] for line in requests.read_text().splitlines()[1:]]
    assert "" in histories and max(h.count("|") for h in histories) >= 3  # empty and over-long ones
    np.testing.assert_allclose(served[options]["served"], served[options]["evaluate"], atol=1e-6)
    # the same rows as serialized tf.Examples (the examples signature): the same probabilities
    np.testing.assert_array_equal(served[options]["examples"], served[options]["served"])
