"""``python -m des.data``: prepare is idempotent (same inputs and options: a no-op; others: a clear
error suggesting --force), and ``inspect --top-k``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from des.data import ColumnStore, DataError, prepare
from des.data.__main__ import main
from des.data.summary import format_summary, top_share
from des.data.testing import random_criteo_lines, write_lines

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_file(tmp_path):
    return write_lines(tmp_path / "small.tsv", random_criteo_lines(300, seed=5))


def _snapshot(directory: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(directory.iterdir())}


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("des.data: error: "), err
    return err


def test_prepare_twice_with_same_inputs_is_a_no_op(tmp_path, small_file, capsys):
    out = tmp_path / "store"
    args = ["prepare", "--input", str(small_file), "--output", str(out), "--seed", "4", "--split", "0.8,0.1,0.1"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("prepared 300 rows")
    before = _snapshot(out)
    assert main(args + ["--chunk-rows", "7"]) == 0  # chunking does not change the store
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out == (f"already prepared: 300 rows from the same inputs and options in {out} "
                            "(nothing to do; --force rebuilds it)\n")
    assert _snapshot(out) == before  # untouched, not rewritten
    # the same file under another name is the same input (compared by sha256, like open_dataset)
    copy = write_lines(tmp_path / "renamed.tsv", random_criteo_lines(300, seed=5))
    assert main(["prepare", "--input", str(copy), "--output", str(out), "--seed", "4", "--split", "0.8,0.1,0.1"]) == 0
    assert "already prepared: 300 rows" in capsys.readouterr().out
    # the Python API behaves the same way
    assert prepare(small_file, out, seed=4, split=(0.8, 0.1, 0.1)).num_rows == 300
    assert _snapshot(out) == before


@pytest.mark.parametrize(
    "change, expected",
    [
        (["--seed", "5"], "seed 4, now 5"),
        (["--seed", "4", "--split", "0.9,0.05,0.05"], "split 0.8,0.1,0.1, now 0.9,0.05,0.05"),
        (["--seed", "4", "--bad-rows", "skip"], "bad-rows fail, now skip"),
        (["--seed", "4", "OTHER"], "input sha256 "),
    ],
)
def test_prepare_again_with_other_inputs_or_options_is_a_clear_error(tmp_path, small_file, capsys, change, expected):
    out = tmp_path / "store"
    options = ["--seed", "4", "--split", "0.8,0.1,0.1"]
    assert main(["prepare", "--input", str(small_file), "--output", str(out), *options]) == 0
    capsys.readouterr()
    before = _snapshot(out)
    inputs = [str(small_file)]
    if "OTHER" in change:
        change = [c for c in change if c != "OTHER"] + ["--split", "0.8,0.1,0.1"]
        inputs = [str(write_lines(tmp_path / "other.tsv", random_criteo_lines(300, seed=6)))]
    elif "--split" not in change:
        change = change + ["--split", "0.8,0.1,0.1"]
    assert main(["prepare", "--input", *inputs, "--output", str(out), *change]) == 2
    err = _error_line(capsys)
    assert err.startswith(f"des.data: error: {out}: output already exists, prepared from other inputs or options (")
    assert expected in err and err.rstrip().endswith("pass --force to replace it")
    assert _snapshot(out) == before
    assert main(["prepare", "--input", *inputs, "--output", str(out), *change, "--force"]) == 0
    assert capsys.readouterr().out.startswith("prepared ")


def test_prepare_into_a_foreign_or_broken_directory(tmp_path, small_file, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main(["prepare", "--input", str(small_file), "--output", str(foreign)]) == 2
    assert "output already exists and is not a prepared dataset" in _error_line(capsys)
    broken = tmp_path / "broken"
    prepare(small_file, broken)
    (broken / "labels.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"output already exists but is not a valid store \(.*labels.bin: 0 bytes"):
        prepare(small_file, broken)
    with pytest.raises(DataError, match=r"absent.tsv: no such file$"):
        prepare(tmp_path / "absent.tsv", broken)
    assert prepare(small_file, broken, overwrite=True).num_rows == 300


def test_prepare_no_op_from_the_command_line(tmp_path, small_file):
    out = tmp_path / "store"
    command = [sys.executable, "-m", "des.data", "prepare", "--input", str(small_file), "--output", str(out)]
    first = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert second.stdout.startswith("already prepared: 300 rows") and "error" not in second.stderr


def _shares(report: str, k: int) -> dict[str, float]:
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("#"))
    assert lines[header].endswith(f"top-{k} share")
    return {line.split()[1]: float(line.split()[-1].rstrip("%")) for line in lines[header + 2:]}


def test_inspect_top_k(tmp_path, small_file, capsys):
    store = prepare(small_file, tmp_path / "store")
    for k in (1, 3, 10, 100000):
        assert main(["inspect", str(store.path), "--top-k", str(k)]) == 0
        shares = _shares(capsys.readouterr().out, k)
        assert list(shares) == list(store.field_names)
        for field in store.field_names:
            _, counts = np.unique(np.asarray(store.field(field)[1]), return_counts=True)
            expected = np.sort(counts)[::-1][:k].sum() / store.num_rows
            assert shares[field] == pytest.approx(100 * expected, abs=0.006)
            assert top_share(store, field, k) == pytest.approx(expected, abs=1e-6)
    assert main(["inspect", str(store.path)]) == 0  # default: top-10, from the manifest
    assert _shares(capsys.readouterr().out, 10) == _shares(format_summary(ColumnStore.open(store.path), 10), 10)
    assert main(["inspect", str(store.path), "--top-k", "1"]) == 0
    assert "top-1 share" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(store.path), "--top-k", "0"])
    assert info.value.code == 2 and re.search(r"--top-k: 0 is not positive", _error_line(capsys))


def test_inspect_of_a_file_prepared_whole_shows_no_split(tmp_path, small_file, capsys):
    """A file of --train-data (or des.evaluate --data) is prepared whole, every row in the test split:
    inspect says the flag decides what its rows are for, not "test 100%"."""
    from des.data import open_dataset
    from des.data.inputs import WHOLE_FILE

    store = open_dataset(small_file, cache_dir=tmp_path / "cache", split=WHOLE_FILE)
    assert main(["inspect", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "split        none: the file prepared whole, its rows in input order" in out
    assert "test 300 (100.00%)" not in out
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    assert "(docs/data.md)" in capsys.readouterr().out.replace("\n", " ")
