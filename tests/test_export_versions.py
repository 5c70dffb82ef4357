"""``des.train --export-every K --export-dir DIR``: numbered SavedModels in TF Serving's layout,
written during training from the checkpoint of their step. A one-rank job in this process exports
every K steps and at its end, prunes to ``--keep-exports`` and leaves no temporary folder; the
newest version, served by a process without des, predicts what ``des.evaluate`` of that step's
checkpoint predicts; an export that dies before its rename leaves the previous version whole and
alone visible. Then the versions' bookkeeping with a stand-in SavedModel (pruning, leftovers
cleared, a resumed job's versions), and a bad ``--export-dir``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, criteo_head, mpi_env, run_here
from tests.test_export import SMALL, _edited_rows
from tests.test_train import expect_error


def train_args(root: Path, output: str, *flags: str) -> list[str]:
    return ["-m", "des.train", "--data", str(root / "small.tsv"), "--cache-dir", str(root / "cache"),
            "--output", str(root / output), "--model", "lr", *SMALL, "--export-dir", str(root / "exports"), *flags]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export-versions")
    criteo_head(root / "small.tsv", 2000)
    return root


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def contents(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def stand_in_savedmodel(checkpoint, folder: Path, schema: str = "", export_dtype: str = "float32") -> dict:
    """In place of :func:`des.export.write_savedmodel`: a folder that says what it was made of."""
    folder.mkdir()
    (folder / "checkpoint").write_text(str(checkpoint))
    (folder / "rows").write_text(export_dtype)
    return {"step": int(folder.name[len(".tmp-"):])}


def test_versions_served_and_a_crash_before_the_rename(root: Path, monkeypatch) -> None:
    from des import export

    # Every 2 steps and at the end: versions 2 and 3; --keep-exports 1 then removes version 2.
    exports = root / "exports"
    proc = run_here(train_args(root, "run", "--export-every", "2", "--max-steps", "3", "--keep-exports", "1"))
    assert listing(exports) == ["3"]  # and no temporary folder left
    records = json.loads((root / "run" / "summary.json").read_text())["exports"]
    assert records == [{"version": v, "step": v, "path": str(exports / str(v))} for v in (2, 3)]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("exported")]
    assert [line.split(": ")[0] for line in lines] == [f"exported version {v} to {exports / str(v)}" for v in (2, 3)]
    assert lines[1].endswith(", removed 2")

    # Version 3 served by a process without des = des.evaluate of the checkpoint of step 3 (the
    # server starts first: its TensorFlow loads while des.evaluate runs here).
    rows = _edited_rows(root / "small.tsv", root / "requests.tsv")
    server = subprocess.Popen([sys.executable, str(REPO / "examples" / "serving_client.py"), str(rows),
                               str(root / "served-"), str(exports / "3")], cwd=root, env=mpi_env(1),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_here(["-m", "des.evaluate", "--checkpoint", str(root / "run" / "checkpoints" / "step-00000003"),
              "--data", str(rows), "--cache-dir", str(root / "cache"), "--predictions", str(root / "evaluate.txt")])
    _, errors = server.communicate(timeout=240)
    assert server.returncode == 0, errors
    np.testing.assert_allclose(np.loadtxt(root / "served-0.txt"), np.loadtxt(root / "evaluate.txt"), rtol=0,
                               atol=1e-6)

    # The next export dies between its write and its rename: version 3 stays, whole and alone visible.
    before, real_replace = contents(exports / "3"), os.replace

    def crash_before_publishing(src, dst):
        if Path(src).name == ".tmp-4":
            raise OSError("simulated crash")
        return real_replace(src, dst)

    monkeypatch.setattr(export, "write_savedmodel", stand_in_savedmodel)
    monkeypatch.setattr(os, "replace", crash_before_publishing)
    with pytest.raises(OSError, match="simulated crash"):
        export.export_version("4", exports, 4)
    assert listing(exports) == [".tmp-4", "3"] and contents(exports / "3") == before


def test_pruning_leftovers_and_versions_above(tmp_path: Path, monkeypatch) -> None:
    """The bookkeeping of :func:`des.export.export_version`, with a stand-in for the SavedModel."""
    from des import export

    monkeypatch.setattr(export, "write_savedmodel", stand_in_savedmodel)
    for version in range(1, 7):
        record = export.export_version(str(version), tmp_path, version, keep=3)
    assert listing(tmp_path) == ["4", "5", "6"] and record["removed"] == [3]
    for leftover in (".tmp-9", ".del-2", ".old-6", ".user-file"):
        (tmp_path / leftover).mkdir()
    export.export_version("7", tmp_path, 7, export_dtype="int8")  # keep 0: all
    assert listing(tmp_path) == [".user-file", "4", "5", "6", "7"]  # only what an export leaves is cleared
    assert (tmp_path / "7" / "rows").read_text() == "int8" and (tmp_path / "6" / "rows").read_text() == "float32"
    # A job resumed from an earlier step: its version replaces the one there, and is the highest.
    record = export.export_version("5", tmp_path, 5, keep=2)
    assert listing(tmp_path) == [".user-file", "4", "5"] and record["removed"] == [6, 7]
    assert export.exported_versions(tmp_path) == [4, 5]


def test_a_bad_export_dir_is_one_line(root: Path) -> None:
    (root / "a-file").write_text("x")
    proc = run_here(train_args(root, "bad-dir", "--export-every", "2", "--export-dir", str(root / "a-file")),
                    check=False)
    expect_error(proc, f"--export-dir {root / 'a-file'}: {root / 'a-file'} is a file, not a folder")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (root / "bad-dir").exists()
    (root / "old-run").mkdir()
    (root / "old-run" / "config.json").write_text("{}")
    proc = run_here(train_args(root, "old-run", "--export-every", "2", "--overwrite", "--export-dir",
                               str(root / "old-run" / "v")), check=False)
    expect_error(proc, "is inside the run folder that --overwrite replaces")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = run_here(["-m", "des.train", "--export-every", "2"], check=False)
    expect_error(proc, "and --export-dir DIR go together")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
