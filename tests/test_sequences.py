"""Sequence columns and shared tables: an ordered list cut to its most recent ``max_length`` ids,
keyed as the column whose table it shares (``table = "<column>"``), alike when prepared and when
served; the declarations checked with one-line errors and recorded; synthetic rows of such a
schema prepare into its synthetic store. In training, fields sharing a table train it as one
table read by each, placed together, checkpointed once and resumed on another rank count
(exactness over ranks under every plan: tests/test_exactness.py, on tests/data/every_kind.toml)."""

from __future__ import annotations

import json

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
    assert ("history          sequence      multi-hot mean     separator '|', last 4, int ids; the table of movie"
            in text)
    bad = tmp_path / "bad.csv"
    bad.write_text("y,movie,history,user\n5,1,1|x|3,u\n")
    with pytest.raises(DataError, match=r"bad.csv:2: column history: '1\|x\|3' has an element that is not an integer"):
        prepare(bad, tmp_path / "bad", schema=path)


def _shared_shard():
    from des.hashtable import Adam, AdaGrad
    from des.models.base import EmbeddingBlock
    from des.options import Optimizers, TableOptions
    from des.strategies.components import FieldShard

    blocks = [EmbeddingBlock("linear", 1, "zeros"), EmbeddingBlock("embedding", 3, "normal", 0.1)]
    optimizers = Optimizers(sparse={"linear": AdaGrad(0.1), "embedding": Adam(0.05)}, dense=Adam(0.01))
    tables = TableOptions(capacity=64, shared=((1, 0), (3, 0)))  # fields 1 and 3 use field 0's table
    return FieldShard([0, 1, 2, 3], blocks, optimizers, seed=5, dtype=np.float64, tables=tables), blocks


def _batch(rng, rows: int):
    from des.data.batch import FieldBatch, KeyedIds

    def field(low, high, weighted):
        lengths = rng.integers(low, high + 1, rows)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        keys = rng.integers(1, 9, offsets[-1]).astype(np.int64)
        return FieldBatch(offsets, keys, rng.uniform(0.5, 2, offsets[-1]).astype(np.float32) if weighted else None)

    class Batch:
        fields = KeyedIds.of([0, 1, 2, 3], [field(1, 1, False), field(0, 4, False), field(1, 2, True),
                                            field(0, 3, True)])
        labels = np.zeros(rows)
    return Batch


def test_fields_sharing_a_table_train_it_as_one_table_read_by_each():
    """Keys, rows and optimizer state once (the owner's table, its initial values); each field
    pools its own ids; an update sums every occurrence's gradient, whichever field it came from,
    before ONE optimizer step: what the table's own lookup, gather and apply_gradients give."""
    import copy

    shard, blocks = _shared_shard()
    assert sorted(shard.tables) == [0, 2] and shard.groups.shared == {1: 0, 3: 0}
    rng = np.random.default_rng(1)
    for step in (1, 2, 3):
        batch = _batch(rng, 5)
        reference = copy.deepcopy(shard.tables[0])
        touched = shard.touch(batch, train=True, step=step)
        pooled = shard.gather_pooled(touched)
        grads = [rng.normal(size=p.shape) for p in pooled]
        ids = [batch.fields[f] for f in (0, 1, 3)]
        keys = np.concatenate([f.keys for f in ids])
        rows = reference.lookup(keys, insert=True, step=step)
        starts = np.cumsum([0] + [f.keys.size for f in ids])
        for k, block in enumerate(blocks):
            values = reference.gather(block.name, keys, rows)
            summed = np.zeros((len(reference), block.dim))
            for f, (ids_f, a) in enumerate(zip(ids, starts)):
                sample = np.repeat(np.arange(5), np.diff(ids_f.offsets))
                weight = np.ones(ids_f.keys.size) if ids_f.weights is None else ids_f.weights.astype(np.float64)
                want = np.zeros((5, block.dim))
                np.add.at(want, sample, weight[:, None] * values[a:a + ids_f.keys.size])
                np.testing.assert_allclose(pooled[k][:, (0, 1, 3)[f], :], want, rtol=1e-12, atol=1e-15)
                np.add.at(summed, rows[a:a + ids_f.keys.size], weight[:, None] * grads[k][sample, (0, 1, 3)[f], :])
            touched_rows = np.unique(rows)
            reference.apply_gradients(block.name, touched_rows, summed[touched_rows], step)
        shard.apply_pooled(touched, grads, step)
        for name in ("linear", "embedding"):
            keys_all = reference.keys()
            table = shard.tables[0]
            np.testing.assert_allclose(table.gather(name, keys_all, table.lookup(keys_all, insert=False)),
                                       reference.gather(name, keys_all, reference.lookup(keys_all, insert=False)),
                                       rtol=1e-12, atol=1e-15)
    assert len(shard.tables[0]) == len(reference)


def test_the_placement_keeps_a_tables_fields_together():
    from des.errors import ConfigError
    from des.placement import parse_shared_tables, place_fields

    shared = parse_shared_tables("history:movie,3:0", ["movie", "history", "user", "tags", "city"])
    assert shared == {1: 0, 3: 0}
    assert place_fields(5, 2, "mod", None, "auto", shared=shared) == [[0, 1, 3, 4], [2]]
    balanced = place_fields(5, 3, "balanced", [10, 50, 20, 30, 40], "auto", shared=shared)
    assert sorted(map(tuple, balanced)) == [(0, 1, 3), (2,), (4,)]
    with pytest.raises(ConfigError, match="cannot split fields that share a table"):
        place_fields(5, 2, "split", [1] * 5, [1], shared=shared)
    for text, message in (("history", "is not FIELD:OWNER"), ("history:nope", "'nope' is not a field"),
                          ("history:history", "uses one other field's table"),
                          ("history:movie,movie:user", "movie uses another's table and cannot own one")):
        with pytest.raises(ConfigError, match=message):
            parse_shared_tables(text, ["movie", "history", "user"])


def test_a_strategy_that_moves_rows_by_field_refuses_shared_tables(tmp_path):
    from des.errors import ConfigError
    from des.train import main as train_main

    path = tmp_path / "seq.toml"
    path.write_text(SCHEMA_TOML)
    synthesize_schema(tmp_path / "s.csv", 300, str(path), seed=3, file_format="raw")
    with pytest.raises(ConfigError, match=r"--strategy ps keeps one table per field, and fields share tables "
                                          r"\(1:0\): use --strategy des, or --shared-tables none"):
        train_main(["--data", str(tmp_path / "s.csv"), "--schema", str(path), "--cache-dir", str(tmp_path / "c"),
                    "--output", str(tmp_path / "run"), "--max-steps", "1", "--no-progress", "--strategy", "ps"])
    assert not (tmp_path / "run").exists()


@pytest.mark.mpi
def test_a_shared_table_resumes_on_another_rank_count_where_the_straight_run_ends(tmp_path):
    """The owner's table file holds the table once; a resume on 2 ranks (the exchange plan) loads it
    and ends with the straight 1-rank run's every number; evaluation reads it for both fields."""
    import shutil

    from des.check import state_arrays
    from tests.conftest import assert_states_equal, run_job

    path = tmp_path / "seq.toml"
    path.write_text(SCHEMA_TOML)
    synthesize_schema(tmp_path / "s.csv", 1500, str(path), seed=3, file_format="raw")
    prepare(tmp_path / "s.csv", tmp_path / "store", schema=path, seed=1)
    flags = ["--data", str(tmp_path / "store"), "--dtype", "float64", "--embedding-dim", "4", "--hidden", "8",
             "--batch-size", "128", "--no-progress", "--max-steps", "6", "--checkpoint-every", "3",
             "--keep-checkpoints", "0", "--early-stop", "0"]
    run_job(1, ["-m", "des.train", *flags, "--output", str(tmp_path / "straight")])
    final = tmp_path / "straight" / "checkpoints" / "step-00000006"
    files = json.loads((final / "manifest.json").read_text())["files"]
    assert "field-000.table" in files and "field-001.table" not in files and "field-001.dense.npz" in files
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed", ignore=shutil.ignore_patterns(".lock"))
    run_job(2, ["-m", "des.train", *flags, "--output", str(tmp_path / "resumed"), "--plan", "exchange",
                "--resume", str(tmp_path / "resumed" / "checkpoints" / "step-00000003")])
    assert_states_equal(state_arrays(final), state_arrays(tmp_path / "resumed" / "checkpoints" / "step-00000006"))
    other = run_job(1, ["-m", "des.train", *flags, "--output", str(tmp_path / "other"), "--shared-tables", "none",
                        "--resume", str(final)], check=False)
    assert other.returncode != 0 and "was trained with shared tables 1:0 of these fields, the run with none" in \
        other.stderr, other.stderr
