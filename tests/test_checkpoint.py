"""Checkpoint atomicity, in one process: a save that dies half-way leaves the previous checkpoint
intact and current, and saving the same step again replaces it without a moment where ``latest``
points at nothing loadable."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from mpi4py import MPI

from des.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint, save_checkpoint
from des.collectives import Communicator
from des.data import prepare
from des.data.batch_reader import BatchReader
from des.options import Optimizers
from des.strategies.des import DES
from des.hashtable import FTRL, AdaGrad, Adam, EmbeddingTable
from des.models import get_model
from des.placement import place_fields
from tests.conftest import criteo_head


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoint-data")
    return prepare(criteo_head(root / "head.tsv", 600), root / "store", split=(0.9, 0.1, 0.0), seed=1)


def make_engine(store, model_name: str = "fm", embedding_dim: int = 4) -> DES:
    model = get_model(model_name)(num_fields=store.num_fields, embedding_dim=embedding_dim)
    optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": AdaGrad(0.1)}, dense=Adam(0.01))
    return DES.build(model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1), optimizers,
                     seed=5, dtype=np.float64)


def train(engine: DES, store, steps: int) -> None:
    batches = iter(BatchReader(store, "train", batch_size=64, seed=0, start_batch=engine.step_count,
                               **engine.reader_options()))
    for _ in range(steps):
        engine.train_step(next(batches))


def state(engine: DES) -> dict[str, np.ndarray]:
    out = {f"top/{k}": v.copy() for k, v in engine.dense.top_params.items()}
    out.update({f"field/{k}": v.copy() for k, v in engine.dense.field_params.items()})
    for field, table in engine.shard.tables.items():
        keys = np.sort(table.keys())
        out[f"table{field}"] = table.gather("embedding", keys, table.lookup(keys, insert=False))
    return out


def save(engine: DES, root) -> object:
    return save_checkpoint(engine, root, epoch=0, next_batch=engine.step_count, config={})


def test_a_save_that_dies_half_way_leaves_the_previous_checkpoint(store, tmp_path, monkeypatch) -> None:
    engine = make_engine(store)
    train(engine, store, 2)
    save(engine, tmp_path)
    saved = state(engine)
    train(engine, store, 2)

    real_save, calls = EmbeddingTable.save, []

    def dies_on_the_third_table(table, path):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        real_save(table, path)

    monkeypatch.setattr(EmbeddingTable, "save", dies_on_the_third_table)
    with pytest.raises(OSError, match="simulated"):
        save(engine, tmp_path)
    monkeypatch.undo()

    assert resolve_checkpoint(tmp_path).name == "step-00000002"  # `latest` did not move
    assert not (tmp_path / "step-00000004").exists()  # the half-written one is not a checkpoint
    restored = make_engine(store)
    load_checkpoint(restored, tmp_path)
    assert restored.step_count == 2
    for key, value in saved.items():
        np.testing.assert_array_equal(state(restored)[key], value, err_msg=key)
    # The next save cleans up after the crash and works.
    save(engine, tmp_path)
    assert resolve_checkpoint(tmp_path).name == "step-00000004"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000002", "step-00000004"]


def test_saving_the_same_step_again_replaces_it(store, tmp_path) -> None:
    engine = make_engine(store)
    train(engine, store, 3)
    first = save(engine, tmp_path)
    second = save(engine, tmp_path)
    assert first == second and resolve_checkpoint(tmp_path) == second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000003"]
    restored = make_engine(store)
    load_checkpoint(restored, tmp_path)
    for key, value in state(engine).items():
        np.testing.assert_array_equal(state(restored)[key], value, err_msg=key)


def test_resume_needs_the_same_batch_order(store, tmp_path) -> None:
    engine = make_engine(store)
    train(engine, store, 1)
    save_checkpoint(engine, tmp_path, epoch=0, next_batch=1, config={},
                    data_order={"data_fingerprint": "abc", "batch_size": 64, "seed": 0})
    load_checkpoint(make_engine(store), tmp_path, data_order={"data_fingerprint": "abc", "batch_size": 64, "seed": 0})
    with pytest.raises(CheckpointError, match=r"another batch order \(batch_size 64 vs 32; seed 0 vs 1\)"):
        load_checkpoint(make_engine(store), tmp_path,
                        data_order={"data_fingerprint": "abc", "batch_size": 32, "seed": 1})
    # Evaluation does not care about the order in which the model was trained.
    load_checkpoint(make_engine(store), tmp_path)


def test_evaluation_lookups_do_not_insert(store) -> None:
    engine = make_engine(store)
    train(engine, store, 2)
    sizes = {field: len(table) for field, table in engine.shard.tables.items()}
    held_out = next(iter(BatchReader(store, "validation", batch_size=60, shuffle=False, drop_last=False,
                                     **engine.reader_options())))
    unseen = sum(int(np.count_nonzero(engine.shard.tables[f].lookup(held_out.fields[f].keys, insert=False) < 0))
                 for f in engine.shard.tables)
    assert unseen > 0  # the validation rows do hold ids training never saw
    engine.predict(held_out)
    assert {field: len(table) for field, table in engine.shard.tables.items()} == sizes


def test_checkpoints_that_do_not_fit_are_refused(store, tmp_path) -> None:
    engine = make_engine(store)
    train(engine, store, 1)
    save(engine, tmp_path / "run")
    with pytest.raises(CheckpointError, match="holds a fm model, not deepfm"):
        load_checkpoint(make_engine(store, "deepfm"), tmp_path / "run")
    with pytest.raises(CheckpointError, match="other model settings: embedding_dim"):
        load_checkpoint(make_engine(store, embedding_dim=8), tmp_path / "run")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(make_engine(store), tmp_path / "no-such-checkpoint")
    manifest_path = resolve_checkpoint(tmp_path / "run") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["model"]  # valid JSON, but not a whole manifest (its checksum made to match)
    manifest_path.write_text(json.dumps(manifest))
    (manifest_path.parent / "manifest.sha256").write_text(hashlib.sha256(manifest_path.read_bytes()).hexdigest())
    with pytest.raises(CheckpointError, match="is corrupt: 'model' is missing"):
        load_checkpoint(make_engine(store), tmp_path / "run")


def test_a_tampered_manifest_is_refused_and_old_format_loads(store, tmp_path) -> None:
    engine = make_engine(store)
    train(engine, store, 2)
    folder = save(engine, tmp_path / "run")
    manifest_path = folder / "manifest.json"
    original = manifest_path.read_text()
    manifest = json.loads(original)
    assert manifest["format"] == "des-checkpoint/2" and (folder / "manifest.sha256").is_file()
    manifest["next_batch"] += 1  # would silently shift the data order of a resume
    manifest_path.write_text(json.dumps(manifest, indent=1))
    with pytest.raises(CheckpointError, match="manifest.json was modified or is corrupt"):
        load_checkpoint(make_engine(store), folder)
    manifest_path.write_text(original)
    (folder / "manifest.sha256").unlink()
    with pytest.raises(CheckpointError, match="has no manifest.sha256 .required by its format des-checkpoint/2"):
        load_checkpoint(make_engine(store), folder)
    # A checkpoint written before the checksum existed (format 1, no sidecar) still loads.
    manifest = json.loads(original)
    manifest["format"] = "des-checkpoint/1"
    manifest_path.write_text(json.dumps(manifest, indent=1))
    assert load_checkpoint(make_engine(store), folder)["step"] == 2


def test_a_checkpoint_loads_into_the_runs_table_dtype(store, tmp_path) -> None:
    """Float32 rows saved, loaded by a run of bfloat16 rows (--table-dtype bfloat16 on --resume):
    its tables hold the checkpoint's rows rounded to nearest and train on; and back, exactly."""
    from des.hashtable.bfloat16 import convert
    from des.options import TableOptions

    def engine(table_dtype: str) -> DES:
        model = get_model("fm")(num_fields=store.num_fields, embedding_dim=4)
        optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": AdaGrad(0.1)}, dense=Adam(0.01))
        return DES.build(model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1), optimizers,
                         seed=5, dtype=np.float32, tables=TableOptions(table_dtype=table_dtype))

    wide = engine("float32")
    train(wide, store, 3)
    save(wide, tmp_path / "f32")
    narrow = engine("bfloat16")
    load_checkpoint(narrow, resolve_checkpoint(tmp_path / "f32"))
    for field, table in narrow.shard.tables.items():
        saved = wide.shard.tables[field]
        n = len(saved)
        assert table.table_dtype == "bfloat16" and len(table) == n
        assert table.arrays.blocks[1][:n].tobytes() == convert(saved.arrays.blocks[1][:n], "bfloat16").tobytes()
    train(narrow, store, 2)  # the shard's kernels take the loaded bfloat16 tables
    save(narrow, tmp_path / "bf16")
    again = engine("float32")
    load_checkpoint(again, resolve_checkpoint(tmp_path / "bf16"))
    for field, table in again.shard.tables.items():
        n = len(table)
        assert table.table_dtype == "float32"
        assert table.arrays.blocks[1][:n].tobytes() == convert(narrow.shard.tables[field].arrays.blocks[1][:n],
                                                                 "float32").tobytes()


def test_a_checkpoint_of_rows_with_counters_resumes_without_them_and_back(store, tmp_path) -> None:
    """A checkpoint of the layout with counters (count, last_seen) loads into a run whose tables
    have none (the compact layout, --min-count 1 without eviction) and trains on exactly as the run
    with counters does; the compact run's checkpoint loads back into tables with counters, its rows
    admitted and last seen at the last update."""
    from des.options import TableOptions

    def engine(counters: bool) -> DES:
        model = get_model("fm")(num_fields=store.num_fields, embedding_dim=4)
        optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": AdaGrad(0.1)}, dense=Adam(0.01))
        return DES.build(model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1), optimizers,
                         seed=5, dtype=np.float64, tables=TableOptions(counters=counters))

    wide = engine(True)
    train(wide, store, 3)
    save(wide, tmp_path / "counted")
    compact = engine(False)
    load_checkpoint(compact, resolve_checkpoint(tmp_path / "counted"))
    assert all(not t.counters and t.arrays.index.shape[1] == 1 for t in compact.shard.tables.values())
    train(wide, store, 2)
    train(compact, store, 2)
    expected, got = state(wide), state(compact)
    assert expected.keys() == got.keys() and all(expected[k].tobytes() == got[k].tobytes() for k in expected)
    save(compact, tmp_path / "compact")
    again = engine(True)
    load_checkpoint(again, resolve_checkpoint(tmp_path / "compact"))
    for field, table in again.shard.tables.items():
        rows = np.arange(len(table))
        assert table.counters and table.admitted_count == len(table) == len(compact.shard.tables[field])
        assert (table.metadata(rows)["last_seen"] == table.last_update_step).all()


def test_a_checkpoint_of_ftrl_rows_storing_w_resumes_into_rows_of_z_and_n_and_back(store, tmp_path) -> None:
    """A checkpoint whose FTRL rows store w (ftrl:store_w=1, and every checkpoint of an earlier
    version) loads into a run whose rows hold z and n only (the default): w is dropped, and the run
    trains on exactly as the run storing w does; its checkpoint (z and n) loads back, w computed."""
    def engine(store_w: int) -> DES:
        model = get_model("fm")(num_fields=store.num_fields, embedding_dim=4)
        optimizers = Optimizers(sparse={"linear": FTRL(0.1, l1=0.01, store_w=store_w), "embedding": AdaGrad(0.1)},
                                dense=Adam(0.01))
        return DES.build(model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1), optimizers,
                         seed=5, dtype=np.float64)

    def linear(engine: DES) -> dict[int, bytes]:
        return {f: t.gather("linear", np.sort(t.keys()), t.lookup(np.sort(t.keys()), insert=False)).tobytes()
                for f, t in engine.shard.tables.items()}

    stored = engine(1)
    train(stored, store, 3)
    save(stored, tmp_path / "stored")
    computed = engine(0)
    load_checkpoint(computed, resolve_checkpoint(tmp_path / "stored"))
    assert all(t.blocks[0].computed and t.arrays.blocks[0].shape[1] == 2 for t in computed.shard.tables.values())
    assert linear(computed) == linear(stored)
    train(stored, store, 2)
    train(computed, store, 2)
    expected, got = state(stored), state(computed)
    assert expected.keys() == got.keys() and all(expected[k].tobytes() == got[k].tobytes() for k in expected)
    assert linear(computed) == linear(stored)
    save(computed, tmp_path / "computed")
    again = engine(1)
    load_checkpoint(again, resolve_checkpoint(tmp_path / "computed"))
    for field, table in again.shard.tables.items():
        n = len(table)
        assert not table.blocks[0].computed
        assert table.arrays.blocks[0][:n].tobytes() == stored.shard.tables[field].arrays.blocks[0][:n].tobytes()
