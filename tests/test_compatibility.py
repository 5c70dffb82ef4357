"""What was written before declared schemas existed keeps working: a Criteo checkpoint of that
version (``tests/data/checkpoint-criteo-v2``: DeepFM, 2 steps on the shipped sample's first 160
rows, split 0.8,0.1,0.1) evaluates to the predictions that version recorded, exports a SavedModel
that serves what that version's export served, and resumes on the same data; the shipped sample
prepares to the same store as before; stores prepared before Criteo became a schema like any other
(``tests/data/prepared-f5f6551``: 40 rows each of the shipped Criteo and Avazu samples, split
0.5,0.25,0.25) read, and are the stores those rows prepare to now."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, mpi_env, run_here

CHECKPOINT = REPO / "tests" / "data" / "checkpoint-criteo-v2"
PREPARED = REPO / "tests" / "data" / "prepared-f5f6551"


def _rows(path: Path, first: int, count: int) -> Path:
    """Rows ``first`` .. ``first + count - 1`` (1-based) of the shipped Criteo sample."""
    with gzip.open(REPO / "datasets" / "criteo_sample.txt.gz", "rt") as source, open(path, "w") as out:
        for number, line in enumerate(source, start=1):
            if number >= first + count:
                break
            if number >= first:
                out.write(line)
    return path


def test_the_shipped_sample_prepares_as_before(tmp_path: Path) -> None:
    from des.data import open_dataset

    store = open_dataset(REPO / "datasets" / "criteo_sample.txt.gz", cache_dir=tmp_path)
    assert store.fingerprint == "914ee92b639b2fdf"
    assert store.schema is None and "schema" not in store.manifest and store.num_dense == 0


def test_an_older_criteo_checkpoint_evaluates_exports_and_resumes(tmp_path: Path) -> None:
    requests = _rows(tmp_path / "requests.tsv", 30001, 200)
    run_here(["-m", "des.evaluate", "--checkpoint", str(CHECKPOINT), "--data", str(requests), "--cache-dir",
              str(tmp_path / "cache"), "--predictions", str(tmp_path / "evaluate.txt")])
    recorded = np.loadtxt(REPO / "tests" / "data" / "checkpoint-criteo-v2-evaluate.txt")
    # float32 on another CPU (another SIMD width, so another order of a sum in TF's kernels) may
    # differ in the last bit: a few float32 ulps (2**-24 relative each), not an exact match
    np.testing.assert_allclose(np.loadtxt(tmp_path / "evaluate.txt"), recorded, rtol=4 * 2.0**-24, atol=1e-8)

    run_here(["-m", "des.export", "--checkpoint", str(CHECKPOINT), "--output", str(tmp_path / "savedmodel")])
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "serving_client.py"), str(requests),
                           str(tmp_path / "served-"), str(tmp_path / "savedmodel")], env=mpi_env(1),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    served = np.loadtxt(REPO / "tests" / "data" / "checkpoint-criteo-v2-served.txt")
    np.testing.assert_allclose(np.loadtxt(tmp_path / "served-0.txt"), served, rtol=0, atol=1e-6)

    rows = _rows(tmp_path / "criteo_head_160.tsv", 1, 160)  # the name is part of the data's fingerprint
    proc = run_here(["-m", "des.train", "--model", "deepfm", "--data", str(rows), "--cache-dir", str(tmp_path / "cache"),
                     "--embedding-dim", "2", "--hidden", "4", "--batch-size", "64", "--max-steps", "4", "--split",
                     "0.8,0.1,0.1", "--resume", str(CHECKPOINT), "--output", str(tmp_path / "resumed"),
                     "--no-progress"])
    assert "resumed from" in proc.stdout and "at step 2" in proc.stdout
    assert (tmp_path / "resumed" / "checkpoints" / "step-00000004").is_dir()


@pytest.mark.parametrize("name, raw, schema", [("criteo", "criteo_head_40.tsv", "criteo"),
                                               ("avazu", "avazu_head_40.csv", "avazu")])
def test_stores_prepared_before_read_and_prepare_the_same(tmp_path: Path, name: str, raw: str, schema: str) -> None:
    from des.data import ColumnStore, prepare
    from des.data.build import existing_preparation
    from des.data.schema import check_same_schema, load_schema

    old = ColumnStore.open(PREPARED / name)
    check_same_schema(old.schema, load_schema(schema), f"store {name}")  # its recorded schema is the built-in
    split = (0.5, 0.25, 0.25)
    assert existing_preparation(PREPARED / raw, PREPARED / name, split=split, schema=schema) is not None
    new = prepare(PREPARED / raw, tmp_path / name, schema=schema, split=split)
    assert new.manifest == old.manifest and new.fingerprint == old.fingerprint
    for f in range(old.num_fields):
        np.testing.assert_array_equal(new.field(f)[1], old.field(f)[1])
