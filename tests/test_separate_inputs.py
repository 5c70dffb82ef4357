"""Separate inputs: ``--train-data``, ``--validation-data``, ``--test-data`` (files, prepared
directories, globs), next to ``--data`` + ``--split``.

Files and globs are read in order (globs in natural order) as one stream, the same batches as one
file with the same rows; each raw file is prepared on its own and again when it changes; a run on
separate inputs trains on 2 ranks what it trains on 1 (float64) and resumes across rank counts from
a mid-epoch checkpoint; a resume with other training files is refused; and every bad input is one
line before training. One launch (2 ranks); everything else runs in this process.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from des.collectives import run_main
from des.data import BatchReader, ColumnStore, ConcatStore, DataError, open_inputs, prepare
from des.data.inputs import Part, natural_key
from des.data.synth import default_config, synthesize_store
from des.errors import UsageError
from tests.conftest import criteo_head, run_mpi

# rows of the first 1000 lines of the shipped sample: three training "days", validation, test
FILES = {"day_1.tsv": (0, 200), "day_2.tsv.gz": (200, 400), "day_10.tsv": (400, 600), "val.tsv": (600, 800),
         "test.tsv": (800, 1000)}
SMALL = ["--model", "deepfm", "--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "64", "--dtype", "float64",
         "--eval-batch-size", "1024", "--no-progress", "--table-capacity", "256"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    lines = criteo_head(root / "head.tsv", 1000).read_text().splitlines(keepends=True)
    for name, (lo, hi) in FILES.items():
        data = "".join(lines[lo:hi]).encode()
        (root / name).write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    return root


def inputs(work: Path, validation: bool = True, test: bool = True) -> list[str]:
    flags = ["--train-data", str(work / "day_*"), "--cache-dir", str(work / "cache")]
    flags += ["--validation-data", str(work / "val.tsv")] if validation else []
    return flags + (["--test-data", str(work / "test.tsv")] if test else [])


def train_here(*argv: str) -> None:
    """``python -m des.train`` on one rank, in this process."""
    from des.train import main

    assert main(list(argv)) == 0


def one_line_error(capsys, argv: list[str]) -> str:
    """Run ``des.train argv`` as its entry point does; the one line it prints (and exit code 2)."""
    from des.train import main

    with pytest.raises(SystemExit) as exit_info:
        run_main(lambda: main(argv), "des.train")
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("des.train: error: ")
    return lines[0].removeprefix("des.train: error: ")


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------- reading
def test_files_and_globs_are_one_stream_in_order(work: Path) -> None:
    store = open_inputs({"train": f"{work}/day_*", "validation": str(work / "val.tsv"),
                         "test": str(work / "test.tsv")}, cache_dir=work / "cache")
    assert [Path(p.input).name for p in store.parts] == ["day_1.tsv", "day_2.tsv.gz", "day_10.tsv", "val.tsv",
                                                          "test.tsv"]
    assert sorted(["day_10", "day_2", "x"], key=natural_key) == ["day_2", "day_10", "x"]
    assert [len(store.split_rows(s)) for s in ("train", "validation", "test", "all")] == [600, 200, 200, 1000]
    # The same batches (rows, labels, ids; any row shard) as one file holding the three days' rows.
    one = prepare([work / "day_1.tsv", work / "day_2.tsv.gz", work / "day_10.tsv"], work / "one", split=(1, 0, 0))
    for epoch in (0, 1):
        ours = BatchReader(store, "train", batch_size=64, seed=3, epoch=epoch)
        theirs = BatchReader(one, "train", batch_size=64, seed=3, epoch=epoch)
        for a, b in zip(ours, theirs):
            assert np.array_equal(a.rows, b.rows) and np.array_equal(a.labels, b.labels)
            for f in (0, 20, 38):
                assert np.array_equal(a.fields[f].keys, b.fields[f].keys)
        half = BatchReader(store, "train", fields=[20], batch_size=64, seed=3, epoch=epoch, shard=(1, 2)).batch(2)
        assert np.array_equal(half.fields[20].keys, theirs.batch(2).fields[20].keys[32:])
    # validation and test rows are those files' rows, in file order
    val = ColumnStore.open(store.parts[3].store.path)
    assert np.array_equal(store.take_labels(store.split_rows("validation")), np.asarray(val.labels))
    assert "train day_1.tsv .. day_10.tsv (3 files)" in store.display_name
    # a directory prepared with des.data prepare gives all its rows (its own split is not used)
    prepared = prepare([work / "val.tsv"], work / "val-prepared")
    assert prepared.manifest["split"]["rows"]["validation"] < 200
    store = open_inputs({"train": str(work / "day_1.tsv"), "validation": str(prepared.path)},
                        cache_dir=work / "cache")
    assert len(store.split_rows("validation")) == 200 and len(store.split_rows("test")) == 0


def test_a_file_in_two_splits_is_a_warning(work: Path, capsys) -> None:
    store = open_inputs({"train": f"{work}/day_*", "test": str(work / "day_2.tsv.gz")}, cache_dir=work / "cache")
    assert len(store.split_rows("test")) == 200
    assert capsys.readouterr().err == (f"warning: {work}/day_2.tsv.gz is in --train-data and in --test-data: its rows "
                                       "are in both splits\n")


def test_missing_empty_or_other_layout_inputs_fail_before_any_file_is_prepared(work: Path, tmp_path: Path) -> None:
    (tmp_path / "empty.tsv").write_text("")
    synthesize_store(tmp_path / "multi-hot", 50, default_config(seed=0, multi_hot_fields=("C3",), vocab_scale=0.01))
    for test, error in [("empty.tsv", "file is empty"), ("nope.tsv", "no such file"), ("multi-hot", "layout")]:
        with pytest.raises(DataError, match=error):
            open_inputs({"train": str(work / "day_1.tsv"), "test": str(tmp_path / test)}, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_multi_hot_weighted_parts_are_gathered_in_row_order(tmp_path: Path) -> None:
    config = default_config(seed=1, multi_hot_fields=("C1", "C2"), weighted=True, vocab_scale=0.01)
    a = synthesize_store(tmp_path / "a", 50, config)
    b = synthesize_store(tmp_path / "b", 70, default_config(seed=2, multi_hot_fields=("C1", "C2"), weighted=True,
                                                            vocab_scale=0.01))
    store = ConcatStore([Part("train", "a", a), Part("test", "b", b)])
    rows = np.array([60, 3, 119, 50, 49, 0, 77, 3])
    c1 = store.field_index("C1")
    got = store.gather(c1, rows)
    for i, row in enumerate(rows):
        part, local = (a, row) if row < 50 else (b, row - 50)
        want = part.gather(c1, np.array([local]))
        lo, hi = got.offsets[i], got.offsets[i + 1]
        assert np.array_equal(got.keys[lo:hi], want.keys) and np.array_equal(got.weights[lo:hi], want.weights)
    assert list(store.take_labels(rows)) == [int(b.labels[10]), int(a.labels[3]), int(b.labels[69]),
                                             int(b.labels[0]), int(a.labels[49]), int(a.labels[0]),
                                             int(b.labels[27]), int(a.labels[3])]


def test_a_changed_file_is_prepared_again(work: Path, tmp_path: Path) -> None:
    day = tmp_path / "day_0.tsv"
    day.write_bytes((work / "day_1.tsv").read_bytes())
    first = open_inputs({"train": str(day)}, cache_dir=tmp_path / "cache")
    again = open_inputs({"train": str(day)}, cache_dir=tmp_path / "cache")
    assert again.parts[0].store.path == first.parts[0].store.path  # unchanged: the cached store
    day.write_text("".join(day.read_text().splitlines(keepends=True)[:150]))
    changed = open_inputs({"train": str(day)}, cache_dir=tmp_path / "cache")
    assert changed.num_rows == 150 and changed.fingerprint != first.fingerprint
    assert len(list((tmp_path / "cache").iterdir())) == 2


# ------------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def straight(work: Path) -> Path:
    """18 steps on one rank (2 epochs of 9 batches), checkpoints every 6 steps."""
    train_here(*inputs(work), *SMALL, "--epochs", "2", "--checkpoint-every", "6", "--output", str(work / "straight"))
    return work / "straight"


@pytest.mark.mpi
def test_two_ranks_resume_a_one_rank_run_and_end_where_it_ends(work: Path, straight: Path) -> None:
    """Steps 7..18 (from a mid-epoch checkpoint, over the epoch boundary) on 2 ranks, the validations
    and the test split: the same numbers as the straight 1-rank run, in float64."""
    resume = straight / "checkpoints" / "step-00000006"
    run_mpi(2, ["-m", "des.train", *inputs(work), *SMALL, "--epochs", "2", "--checkpoint-every", "6",
                "--output", str(work / "resumed"), "--resume", str(resume)])
    a, b = summary(straight), summary(work / "resumed")
    assert (a["ranks"], b["ranks"], b["steps"], b["steps_this_run"]) == (1, 2, 18, 12)
    for key in ("validation_auc", "validation_logloss", "test_auc", "test_logloss"):
        assert math.isclose(a[key], b[key], rel_tol=1e-9), key
    assert a["test_rows"] == b["test_rows"] == 200
    straight_records = {r["step"]: r for r in records(straight)}
    for r in records(work / "resumed"):
        assert math.isclose(r["logloss"], straight_records[r["step"]]["logloss"], rel_tol=1e-9)
    with np.load(straight / "checkpoints" / "step-00000018" / "dense.npz") as x, \
            np.load(work / "resumed" / "checkpoints" / "step-00000018" / "dense.npz") as y:
        for name in x.files:
            np.testing.assert_allclose(y[name], x[name], rtol=1e-9, atol=1e-12, err_msg=name)
    config = json.loads((straight / "config.json").read_text())
    assert [Path(p["input"]).name for p in config["data"]["train"]] == ["day_1.tsv", "day_2.tsv.gz", "day_10.tsv"]
    assert config["config"]["train_data"] == str(work / "day_*") and config["config"]["data"] == ""


def test_a_resume_needs_the_same_training_files_but_not_the_same_test(work: Path, straight: Path, capsys) -> None:
    checkpoint = str(straight / "checkpoints" / "step-00000006")
    message = one_line_error(capsys, ["--train-data", str(work / "day_1.tsv"), str(work / "day_2.tsv.gz"),
                                      *inputs(work)[2:], *SMALL, "--epochs", "2", "--resume", checkpoint,
                                      "--output", str(work / "other-days")])
    assert message.startswith(f"checkpoint {checkpoint} was written with another batch order")
    assert "'train': ['day_1.tsv', 'day_2.tsv.gz', 'day_10.tsv']" in message
    assert "'train': ['day_1.tsv', 'day_2.tsv.gz'], 'validation'" in message
    assert not (work / "other-days").exists()
    # the test split only enters the final report: a finished run tested on other rows
    train_here(*inputs(work, test=False), "--test-data", str(work / "day_1.tsv"), *SMALL, "--epochs", "2",
               "--resume", str(straight / "checkpoints" / "step-00000018"), "--output", str(work / "retested"))
    assert summary(work / "retested")["test_rows"] == 200


def test_without_validation_data_early_stopping_is_off(work: Path) -> None:
    output = work / "no-validation"
    train_here(*inputs(work, validation=False, test=False), "--model", "lr", "--batch-size", "200", "--epochs", "1",
               "--no-progress", "--output", str(output))
    assert json.loads((output / "config.json").read_text())["config"]["early_stop"] == 0
    s = summary(output)
    assert s["validation_auc"] is None and s["test_auc"] is None and s["steps"] == 3


# ------------------------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def bad(work: Path) -> Path:
    root = work / "bad"
    root.mkdir()
    lines = (work / "val.tsv").read_text().splitlines()
    (root / "val41.tsv").write_text("".join(line + "\t00000000\n" for line in lines))  # 41 columns
    (root / "empty.tsv").write_text("")
    multi_hot = default_config(seed=0, multi_hot_fields=("C3",), vocab_scale=0.01)
    synthesize_store(root / "multi-hot", 100, multi_hot)
    return root


NOT_TOGETHER = (" do not go together (--data/--split split one input; --train-data, --validation-data and "
                "--test-data name each split's own)")


@pytest.mark.parametrize(("flags", "message"), [
    (["--data", "x.tsv"], "--train-data and --data" + NOT_TOGETHER),
    (["--split", "1,0,0"], "--train-data and --split" + NOT_TOGETHER),
    (["--validation-data", "{bad}/val41.tsv"], "--validation-data: {bad}/val41.tsv:1: expected 40 tab-separated "
                                               "columns, found 41"),
    (["--validation-data", "{bad}/multi-hot"], "--validation-data: {bad}/multi-hot: another column layout than the "
                                               "training data {work}/day_1.tsv: field C3 is categorical multi-hot, "
                                               "in the training data categorical one-hot"),
    (["--test-data", "{bad}/empty.tsv"], "--test-data: {bad}/empty.tsv: file is empty (no rows)"),
    (["--test-data", "{bad}/day_*.tsv"], "--test-data: {bad}/day_*.tsv: no file matches"),
    (["--test-data", "{bad}/nope.tsv"], "--test-data: {bad}/nope.tsv: no such file or dataset directory"),
    (["--early-stop", "2"], "--early-stop 2 needs validation rows, and the data has none (give --validation-data)"),
    (["--dense-schedule", "plateau:factor=0.5"], "--dense-schedule plateau needs validation rows, and the data has "
                                                 "none (give --validation-data)"),
    # a schedule or an optimizer with a negative rate
    (["--sparse-schedule", "linear:end=-0.1"], "--sparse-schedule 'linear:end=-0.1': end must be a finite number "
                                               ">= 0 (a rate is never negative), got -0.1"),
    (["--dense-schedule", "warmup:steps=-5"], "--dense-schedule 'warmup:steps=-5': steps must be a finite number "
                                              ">= 0 (a rate is never negative), got -5"),
    (["--embedding-optimizer", "adam:lr=-0.001"], "--embedding-optimizer 'adam:lr=-0.001': lr must be finite and "
                                                  "> 0, got -0.001"),
], ids=["data", "split", "columns", "layout", "empty", "glob", "missing", "early-stop", "plateau",
        "negative-schedule", "negative-warmup", "negative-optimizer"])
def test_bad_input_is_one_line_before_training(work: Path, bad: Path, capsys, flags: list[str], message: str) -> None:
    output = work / "bad-run"
    argv = ["--train-data", str(work / "day_1.tsv"), "--cache-dir", str(work / "cache"), "--output", str(output),
            *SMALL, *(f.format(bad=bad, work=work) for f in flags)]
    assert one_line_error(capsys, argv) == message.format(bad=bad, work=work)
    assert not output.exists()


def test_validation_or_test_data_need_train_data(capsys) -> None:
    assert one_line_error(capsys, ["--test-data", "t.tsv"]) == ("--test-data needs --train-data (with --data, "
                                                                 "--split makes the validation and test rows)")


def test_toml_keys_mirror_the_flags(tmp_path: Path) -> None:
    from des.config import load_config

    toml = tmp_path / "run.toml"
    toml.write_text('train_data = ["a/day_*.gz", "b.gz"]\nvalidation-data = "v.gz"\n')
    config = load_config(["--config", str(toml), "--test-data", "t1.gz", "t2.gz"])
    assert (config.train_data, config.validation_data, config.test_data) == ("a/day_*.gz,b.gz", "v.gz", "t1.gz,t2.gz")
    toml.write_text('train_data = "a.gz"\nsplit = "1,0,0"\n')
    with pytest.raises(UsageError, match="--train-data and --split"):
        load_config(["--config", str(toml)])
