"""Column store: prepare of the shipped sample, idempotency, split, validation on open, cache."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import des.data.build as build
from des.data import BatchReader, ColumnStore, DataError, atomic_directory, field_of_key, open_dataset, prepare
from des.data.split import assign_splits
from des.data.testing import random_criteo_lines, write_lines

SAMPLE = Path(__file__).resolve().parents[1] / "datasets" / "criteo_sample.txt.gz"
SAMPLE_SHA256 = "d0ed5344e837506fdae74cd1c86db676c65a6a6b5b928ce9d4d6495291bedc6d"


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory):
    return prepare(SAMPLE, tmp_path_factory.mktemp("sample") / "store")


@pytest.fixture
def small_file(tmp_path):
    return write_lines(tmp_path / "small.tsv", random_criteo_lines(300, seed=5))


def store_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_shipped_sample(sample_store):
    manifest = sample_store.manifest
    assert sample_store.num_rows == manifest["num_rows"] == 32852
    assert manifest["num_positives"] == int(np.asarray(sample_store.labels).sum()) == 7617
    assert abs(manifest["positive_rate"] - 7617 / 32852) < 1e-12
    assert manifest["sources"] == [
        {"name": "criteo_sample.txt.gz", "sha256": SAMPLE_SHA256, "lines": 32852, "rows": 32852, "skipped": 0}
    ]
    assert sum(manifest["split"]["rows"].values()) == 32852
    for name, count in manifest["split"]["rows"].items():
        assert len(sample_store.split_rows(name)) == count
    assert manifest["hotness"] == ["one-hot"] * 39 and sample_store.num_fields == 39
    for field in range(39):
        offsets, keys, weights = sample_store.field(field)
        assert weights is None and keys.shape == (32852,) and (offsets == np.arange(32853)).all()
        assert (field_of_key(np.asarray(keys)) == field).all()
        assert sample_store.distinct_count(field) == len(np.unique(keys))
    # C3 has 16759 distinct non-empty values in the shared README, plus the missing key
    assert sample_store.distinct_count("C3") == 16760


def test_prepare_is_idempotent_and_chunk_independent(tmp_path, small_file):
    prepare(small_file, tmp_path / "a")
    prepare(small_file, tmp_path / "b")
    prepare(small_file, tmp_path / "c", chunk_rows=7)
    files = store_files(tmp_path / "a")
    assert sorted(files) == ["labels.bin", "manifest.json", "one_hot.keys.bin", "split.bin"]
    assert files == store_files(tmp_path / "b") == store_files(tmp_path / "c")


def test_existing_output_is_kept_unless_forced(tmp_path, small_file):
    prepare(small_file, tmp_path / "out", seed=1)
    with pytest.raises(DataError, match="already exists"):
        prepare(small_file, tmp_path / "out")
    assert prepare(small_file, tmp_path / "out", overwrite=True).manifest["split"]["seed"] == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a prepared dataset"):
        prepare(small_file, tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").exists()


def test_split_is_a_pure_function_of_seed_and_row():
    whole = assign_splits(7, (0.8, 0.1, 0.1), 0, 200_000)
    pieces = np.concatenate([assign_splits(7, (0.8, 0.1, 0.1), start, 1000) for start in range(0, 200_000, 1000)])
    assert (whole == pieces).all()
    assert (assign_splits(8, (0.8, 0.1, 0.1), 0, 200_000) != whole).mean() > 0.2
    fractions = np.bincount(whole, minlength=3) / whole.size
    assert np.allclose(fractions, [0.8, 0.1, 0.1], atol=0.005)
    assert (assign_splits(7, (0, 0, 1), 0, 10_000) == 2).all()
    assert (assign_splits(7, (1, 0, 0), 0, 10_000) == 0).all()


def test_split_rows_are_disjoint_and_cover(tmp_path, small_file):
    store = prepare(small_file, tmp_path / "s", split=(0.5, 0.25, 0.25), seed=3)
    parts = [store.split_rows(name) for name in ("train", "validation", "test")]
    assert (np.sort(np.concatenate(parts)) == store.split_rows("all")).all()
    assert all(len(p) > 30 for p in parts)
    assert (np.asarray(store.split)[parts[1]] == 1).all()
    everything_test = prepare(small_file, tmp_path / "t", split=(0, 0, 1))
    assert len(everything_test.split_rows("test")) == 300 and len(everything_test.split_rows("train")) == 0
    with pytest.raises(DataError, match="sum to 1"):
        prepare(small_file, tmp_path / "u", split=(0.5, 0.5, 0.5))
    with pytest.raises(DataError, match="unknown split"):
        store.split_rows("dev")


def test_open_validates_store(tmp_path, small_file):
    with pytest.raises(DataError, match=r"missing: no such dataset directory"):
        ColumnStore.open(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty/manifest.json: missing"):
        ColumnStore.open(tmp_path / "empty")
    store_dir = tmp_path / "store"
    prepare(small_file, store_dir)
    manifest_path = store_dir / "manifest.json"
    original = manifest_path.read_text()
    manifest_path.write_text(original.replace('"format_version": 2', '"format_version": 99'))
    with pytest.raises(DataError, match=r"manifest.json: format version 99, expected 1 or 2"):
        ColumnStore.open(store_dir)
    manifest_path.write_text("{not json")
    with pytest.raises(DataError, match=r"manifest.json: not valid JSON"):
        ColumnStore.open(store_dir)
    manifest_path.write_text(original)
    manifest_path.write_text(original.replace('"column": 16', '"column": 39'))
    with pytest.raises(DataError, match=r"manifest.json: field C4 at column 39 of 39 one-hot keys"):
        ColumnStore.open(store_dir)
    manifest_path.write_text(original.replace('"file": "one_hot.keys.bin"', '"file": "16_C4.keys.bin"', 1))
    with pytest.raises(DataError, match=r"manifest.json: field I1's one-hot keys are in '16_C4.keys.bin', not"):
        ColumnStore.open(store_dir)
    manifest_path.write_text(original.replace('"column": 16', '"column": 15'))
    with pytest.raises(DataError, match=r"columns \[0, 1, .*15, 15, 17.*\] are not each of the 39 columns"):
        ColumnStore.open(store_dir)
    manifest_path.write_text(original)
    keys_file = store_dir / "one_hot.keys.bin"
    data = keys_file.read_bytes()
    keys_file.write_bytes(data[:-8])
    with pytest.raises(DataError, match=r"one_hot.keys.bin: 93592 bytes, expected 93600"):
        ColumnStore.open(store_dir)
    keys_file.unlink()
    with pytest.raises(DataError, match=r"one_hot.keys.bin: array file is missing"):
        ColumnStore.open(store_dir)


def test_one_hot_keys_are_stored_row_major(sample_store):
    """A row's keys of every one-hot field side by side (a batch reads random rows), and a batch's
    fields read together equal the fields read one by one."""
    matrix = np.fromfile(sample_store.path / "one_hot.keys.bin", dtype="<i8").reshape(32852, 39)
    for field in range(39):
        assert sample_store.manifest["fields"][field]["keys"]["column"] == field
        assert (np.asarray(sample_store.field(field)[1]) == matrix[:, field]).all()
    rows = sample_store.split_rows("train")[[5, 17, 3, 17]]
    got = sample_store.gather_fields([38, 0, 20], rows)
    assert list(got) == [38, 0, 20]
    for field, block in got.items():
        alone = sample_store.gather(field, rows)
        assert (block.keys == matrix[rows, field]).all() and (block.keys == alone.keys).all()
        assert (block.offsets == np.arange(5)).all() and block.weights is None
    with pytest.raises(ValueError, match="read-only"):
        got[0].offsets[1] = 7  # the fields share one offsets array
    assert got.one_hot and got.keys.shape == (12,)  # the keys are the [fields, B] block, rows in the order asked
    block = got.keys.reshape(3, 4)
    assert all(np.shares_memory(b.keys, block) and (b.keys == block[i]).all() for i, b in enumerate(got.values()))


def test_sample_keeps_the_fingerprint_of_its_version_1_store(sample_store):
    """Runs record the data's fingerprint and resume only on the same data: the shipped sample as
    des prepared it before the row-major layout (format version 1) had this one."""
    assert sample_store.fingerprint == "914ee92b639b2fdf"


def test_version_1_store_reads_the_same(tmp_path, small_file):
    """A store of format version 1 (a keys file per one-hot field) opens and gives the same batches
    and fingerprint as the version 2 store of the same input."""
    new = prepare(small_file, tmp_path / "v2", split=(0.6, 0.2, 0.2))
    old_dir = tmp_path / "v1"
    shutil.copytree(new.path, old_dir)
    matrix = np.fromfile(old_dir / "one_hot.keys.bin", dtype="<i8").reshape(new.num_rows, 39)
    manifest = json.loads((old_dir / "manifest.json").read_text())
    manifest["format_version"] = 1
    for entry in manifest["fields"]:
        name = f"{entry['index']:02d}_{entry['name']}.keys.bin"
        np.ascontiguousarray(matrix[:, entry["index"]]).tofile(old_dir / name)
        entry["keys"] = {"file": name, "dtype": "<i8", "shape": [new.num_rows]}
    (old_dir / "one_hot.keys.bin").unlink()
    (old_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    old = ColumnStore.open(old_dir)
    assert old.manifest["format_version"] == 1 and new.manifest["format_version"] == 2
    assert old.fingerprint == new.fingerprint
    pairs = list(zip(BatchReader(old, "train", batch_size=32, seed=1), BatchReader(new, "train", batch_size=32, seed=1)))
    assert len(pairs) == 5
    for a, b in pairs:
        assert (a.rows == b.rows).all() and (a.labels == b.labels).all() and a.fields.fields == b.fields.fields
        for field in a.fields:
            assert (a.fields[field].keys == b.fields[field].keys).all()
            assert (a.fields[field].offsets == b.fields[field].offsets).all()


def test_open_dataset_prepares_once_and_reuses(tmp_path, small_file, monkeypatch):
    cache = tmp_path / "cache"
    first = open_dataset(small_file, cache_dir=cache)
    entries = list(cache.iterdir())
    assert len(entries) == 1 and first.path == entries[0]
    assert hashlib.sha256(small_file.read_bytes()).hexdigest()[:16] in entries[0].name
    calls = []
    monkeypatch.setattr(build, "_write_store", lambda *args: calls.append(args))
    again = open_dataset(small_file, cache_dir=cache)
    assert again.path == first.path and calls == []
    assert open_dataset(first.path).path == first.path  # a prepared directory opens directly
    assert open_dataset(small_file, cache_dir=cache, split=None).path == first.path  # None = default split
    monkeypatch.undo()
    other = open_dataset(small_file, cache_dir=cache, split=(0.8, 0.1, 0.1), seed=2)
    assert other.path != first.path and len(list(cache.iterdir())) == 2
    with pytest.raises(DataError, match="no such file or dataset directory"):
        open_dataset(tmp_path / "absent.tsv", cache_dir=cache)


def test_open_dataset_uses_entry_made_by_another_process(tmp_path, small_file, monkeypatch):
    cache = tmp_path / "cache"
    reference = open_dataset(small_file, cache_dir=cache)
    target = reference.path
    saved = tmp_path / "saved"
    os.rename(target, saved)

    def racing_writer(schema, paths, directory, *args):
        """Another process finishes first while we are still writing."""
        os.rename(saved, target)
        (directory / "partial.bin").write_bytes(b"x")

    monkeypatch.setattr(build, "_write_store", racing_writer)
    store = open_dataset(small_file, cache_dir=cache)
    assert store.path == target and store.num_rows == 300
    assert sorted(p.name for p in cache.iterdir()) == [target.name]  # our temporary copy is gone


def test_atomic_directory_removes_temporary_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_directory(tmp_path / "out") as directory:
            (directory / "half.bin").write_bytes(b"123")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_manifest_is_deterministic_json(sample_store):
    text = (sample_store.path / "manifest.json").read_text()
    manifest = json.loads(text)
    assert manifest["key_scheme"]["formula"].startswith("key = ((field + 1) << 40) | u")
    assert manifest["split"]["fractions"] == [0.9, 0.05, 0.05] and manifest["split"]["seed"] == 0
    assert str(sample_store.path) not in text and "time" not in text
