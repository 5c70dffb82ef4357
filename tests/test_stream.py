"""Continuous training on a stream of ordered files (``des.train --stream``): one pass in file
order with progressive validation ("test, then train"), resume mid-stream onto another rank
count, ``--follow`` picking up a file added while the job runs, and a bad stream as one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, criteo_head, mpi_env, run_job

ROWS = [250, 200, 300, 250]  # the files' rows: 4, 4, 5 and 4 batches of 64 (the last ones partial)
FLAGS = ["--model", "wdl", "--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "64", "--dtype", "float64",
         "--unadmitted", "init", "--no-drop-last", "--no-progress", "--table-capacity", "256",
         "--eval-batch-size", "512", "--ttl-files", "2"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """``stream/day-0K.tsv``: the first rows of the sample cut in order, and what is never read: a
    file being written (``.tmp``), a hidden one and one the glob does not match."""
    root = tmp_path_factory.mktemp("stream")
    lines = criteo_head(root / "all.tsv", sum(ROWS) + 300).read_text().splitlines(keepends=True)
    (root / "stream").mkdir()
    start = 0
    for k, rows in enumerate(ROWS):
        (root / "stream" / f"day-0{k}.tsv").write_text("".join(lines[start:start + rows]))
        start += rows
    (root / "later.tsv").write_text("".join(lines[start:]))  # the file --follow sees arrive
    (root / "stream" / "day-09.tsv.tmp").write_text("garbage")
    (root / "stream" / ".day-08.tsv").write_text("garbage")
    (root / "stream" / "notes.txt").write_text("not data")
    return root


def train(work: Path, ranks: int, output: str, *flags: str, check: bool = True):
    args = ["-m", "des.train", "--stream", str(work / "stream"), "--stream-glob", "day-*.tsv",
            "--cache-dir", str(work / "cache"), "--output", str(work / output), *FLAGS, *flags]
    return run_job(ranks, args, check=check, timeout=180)


def records(work: Path, output: str, kind: str = "progressive_auc") -> list[dict]:
    return [r for r in map(json.loads, (work / output / "metrics.jsonl").read_text().splitlines()) if kind in r]


def summary(work: Path, output: str) -> dict:
    return json.loads((work / output / "summary.json").read_text())


def batches(rows: list[int]) -> list[int]:
    return [-(-r // 64) for r in rows]


def assert_same_state(a: Path, b: Path) -> None:
    from des.check import state_arrays

    left, right = state_arrays(a), state_arrays(b)
    assert sorted(left) == sorted(right)
    for key, value in left.items():
        np.testing.assert_allclose(right[key], value, rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.fixture(scope="module")
def straight(work: Path) -> Path:
    """The whole stream on one rank, a checkpoint every 2 steps (all kept)."""
    train(work, 1, "straight", "--checkpoint-every", "2", "--keep-checkpoints", "0", "--export-every-files", "2",
          "--export-dir", str(work / "exports"))
    return work / "straight"


def test_a_stream_trains_every_row_once_in_file_order(work: Path, straight: Path) -> None:
    from des.tensorboard import read_scalars

    s = summary(work, "straight")
    assert s["steps"] == sum(batches(ROWS)) and s["train_samples"] == sum(ROWS)  # every row, once
    # One progressive record per file, made before its first step: the steps of the files before it.
    got = records(work, "straight")
    assert [(r["file"], r["index"], r["rows"]) for r in got] == \
        [(f"day-0{k}.tsv", k, rows) for k, rows in enumerate(ROWS)]
    assert [r["step"] for r in got] == list(np.cumsum([0, *batches(ROWS)[:-1]]))
    assert all(0 < r["progressive_auc"] < 1 and r["progressive_logloss"] > 0 for r in got)
    assert s["progressive"] == got
    later = got[1:]
    assert s["progressive_auc_mean"] == pytest.approx(
        sum(r["progressive_auc"] * r["rows"] for r in later) / sum(r["rows"] for r in later))
    assert [step for step, _ in read_scalars(straight)["progressive/auc"]] == [r["step"] for r in got]
    # --ttl-files 2: after each file, the tables hold the ids of the last two files, no others
    from des.data.build import open_dataset
    from des.data.stream import TRAIN_ALL

    stores = [open_dataset(work / "stream" / f"day-0{k}.tsv", cache_dir=work / "cache", split=TRAIN_ALL)
              for k in range(len(ROWS))]
    evictions = records(work, "straight", "evicted_rows")
    assert [r["file"] for r in evictions] == [f"day-0{k}.tsv" for k in range(1, len(ROWS))]
    for k, record in enumerate(evictions, start=1):
        kept = [np.unique(np.concatenate([s.field(f)[1] for s in stores[k - 1:k + 1]])).size
                for f in range(stores[0].num_fields)]
        assert list(record["rows"].values()) == kept
    # --export-every-files 2: a SavedModel version after the second and the fourth (last) file
    ends = list(np.cumsum(batches(ROWS)))
    assert [e["step"] for e in s["exports"]] == [ends[1], ends[3]]
    assert sorted(p.name for p in (work / "exports").iterdir()) == sorted(str(ends[k]) for k in (1, 3))
    manifest = json.loads((straight / "checkpoints" / "step-00000006" / "manifest.json").read_text())
    assert manifest["stream"]["name"] == "day-01.tsv" and manifest["stream"]["next_batch"] == 2
    assert [f["name"] for f in manifest["stream"]["done"]] == ["day-00.tsv"]
    # Windows of 128 rows (2 batches) in file order: a record before each, over the rows it trains.
    train(work, 1, "windows", "--progressive-every-rows", "128", "--stream-shuffle", "off")
    windows = records(work, "windows")
    expected = [(k, b, min(128, rows - 64 * b)) for k, rows in enumerate(ROWS) for b in range(0, batches([rows])[0], 2)]
    assert [(r["index"], r["batch"], r["rows"]) for r in windows] == expected
    assert summary(work, "windows")["train_samples"] == sum(ROWS)


@pytest.mark.mpi
def test_resume_mid_stream_equals_the_straight_run(work: Path, straight: Path) -> None:
    """Stopped inside the second file (--max-steps 6, a checkpoint there) and resumed on 2 ranks;
    resumed between files (the checkpoint after the first file) on 1 rank: both end at the
    straight run's model, with its progressive records."""
    train(work, 1, "stopped", "--max-steps", "6", "--checkpoint-every", "2")
    assert summary(work, "stopped")["steps"] == 6
    train(work, 2, "resumed-2", "--checkpoint-every", "2", "--resume", str(work / "stopped" / "checkpoints"))
    train(work, 1, "between-files", "--resume", str(straight / "checkpoints" / "step-00000004"))
    for name, steps in (("resumed-2", 6), ("between-files", 4)):
        assert_same_state(straight / "checkpoints", work / name / "checkpoints")
        s = summary(work, name)
        assert s["steps"] == sum(batches(ROWS)) and s["steps_this_run"] == sum(batches(ROWS)) - steps
        assert len(s["progressive"]) == len(ROWS)  # the ones before the resume came with the checkpoint
        for mine, theirs in zip(s["progressive"], summary(work, "straight")["progressive"]):
            assert mine["progressive_auc"] == pytest.approx(theirs["progressive_auc"], rel=1e-9)
    assert [r["file"] for r in records(work, "between-files")] == ["day-01.tsv", "day-02.tsv", "day-03.tsv"]


def test_follow_picks_up_a_new_file(work: Path) -> None:
    """--follow: a file renamed into the directory while the job runs is tested and trained on;
    the job ends --follow-timeout seconds after the last file."""
    folder = work / "followed"
    shutil.copytree(work / "stream", folder)
    output = work / "follow-run"
    cmd = [sys.executable, "-m", "des.train", "--stream", str(folder), "--stream-glob", "day-*.tsv",
           "--cache-dir", str(work / "cache"), "--output", str(output), *FLAGS, "--follow", "--follow-timeout", "3",
           "--follow-interval", "0.5"]
    job = subprocess.Popen(cmd, cwd=REPO, env=mpi_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        metrics = output / "metrics.jsonl"
        # the last listed file is being tested or trained: the job will list the directory again
        while not (metrics.exists() and "day-03.tsv" in metrics.read_text()):
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the stream did not reach its last file"
            time.sleep(0.05)
        shutil.copy(work / "later.tsv", folder / "day-04.tsv.tmp")  # the producer's contract
        os.replace(folder / "day-04.tsv.tmp", folder / "day-04.tsv")
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, err
    s = json.loads((output / "summary.json").read_text())
    assert [r["file"] for r in s["progressive"]] == [f"day-0{k}.tsv" for k in range(5)]
    assert s["train_samples"] == sum(ROWS) + 300 and s["steps"] == sum(batches([*ROWS, 300]))


def test_a_bad_stream_is_one_line(work: Path, straight: Path) -> None:
    def expect_error(proc, fragment: str) -> None:
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and fragment in lines[0], proc.stderr

    (work / "empty").mkdir(exist_ok=True)
    (work / "empty" / "day-00.tsv.tmp").write_text("being written")
    proc = run_job(1, ["-m", "des.train", "--stream", str(work / "empty"), "--no-progress"], check=False)
    expect_error(proc, "no file matches '*'")
    expect_error(train(work, 1, "bad", "--epochs", "3", check=False), "--epochs 3 does not apply to --stream")
    expect_error(train(work, 1, "bad", "--early-stop", "2", check=False), "--early-stop 2 does not apply")
    expect_error(run_job(1, ["-m", "des.train", "--follow"], check=False), "--follow needs --stream")
    # A file of the stream changes (same size, other bytes) before a resume inside it.
    changed = work / "changed"
    shutil.copytree(work / "stream", changed)
    text = (changed / "day-01.tsv").read_text()
    (changed / "day-01.tsv").write_text(("1" if text[0] == "0" else "0") + text[1:])
    proc = run_job(1, ["-m", "des.train", "--stream", str(changed), "--stream-glob", "day-*.tsv",
                       "--cache-dir", str(work / "cache"), "--output", str(work / "bad-resume"), *FLAGS,
                       "--resume", str(straight / "checkpoints" / "step-00000006")], check=False)
    expect_error(proc, "the stream's file day-01.tsv changed since it was trained on")
    assert not (work / "bad-resume").exists()
