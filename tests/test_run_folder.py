"""Run folders that never clobber each other, and aborts that leave nothing behind.

The folder lock and the atomic overwrite are checked in-process (``des.run_folder``); then end to
end: a reused folder without flags, with ``--resume`` and with ``--overwrite``, two jobs started
together on one folder, and ``/dev/shm`` after failing jobs. One-class evaluation splits on two
ranks are checked by the progress-bar job of tests/test_train.py (one launch for both).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from des.errors import ConfigError
from des.run_folder import LOCK_NAME, RunFolder, RunFolderError
from tests.conftest import REPO, criteo_head, mpi_env, mpich_shm, run_here, run_mpi
from tests.test_train import SMALL, expect_error


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run-folder")
    criteo_head(root / "small.tsv", 2000)
    return root


def train_args(work: Path, output: str, *flags: str) -> list[str]:
    return ["-m", "des.train", "--data", str(work / "small.tsv"), "--cache-dir", str(work / "cache"),
            "--output", str(work / output), *SMALL, "--model", "lr", *flags]


# --- in-process: the lock and the overwrite ---------------------------------------------------


def test_pruning_keeps_the_newest_checkpoints_and_what_latest_names(tmp_path: Path) -> None:
    from des.run import prune_checkpoints

    for step in (4, 8, 12, 16, 100):
        (tmp_path / f"step-{step:08d}").mkdir()
        (tmp_path / f"step-{step:08d}" / "manifest.json").write_text("{}")
    (tmp_path / "best" / "step-00000004").mkdir(parents=True)
    (tmp_path / ".step-00000120.tmp").mkdir()  # a checkpoint being written: not a step folder
    (tmp_path / "latest").write_text("step-00000008\n")  # (after a resume from step 8, say)
    deleted = prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in deleted) == ["step-00000004", "step-00000012"]  # by step, not by name
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-00000120.tmp", "best", "latest", "step-00000008",
                                                          "step-00000016", "step-00000100"]
    assert (tmp_path / "best" / "step-00000004").is_dir()


def test_a_second_job_is_refused_naming_the_holder_and_stale_locks_are_taken(tmp_path: Path) -> None:
    first = RunFolder.plan(str(tmp_path / "run"), model="lr")
    first.create()
    lock = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
    assert set(lock) == {"host", "pid", "started"}
    # flock conflicts between two opens even in one process: the second "job" is refused.
    with pytest.raises(RunFolderError, match=rf"in use by another job \(host .*, pid {lock['pid']}, started"):
        RunFolder.plan(str(tmp_path / "run"), model="lr")
    with pytest.raises(RunFolderError, match="in use by another job"):
        RunFolder(tmp_path / "run", tmp_path / "run").create()
    (tmp_path / "run" / "config.json").write_text("{}")
    first.finish()  # success: lock released and its file removed
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    # A job killed while holding it leaves the file but no lock (the OS drops it): not in use,
    # but the folder now holds a run.
    stale = RunFolder.plan(str(tmp_path / "other"), model="lr")
    stale.create()
    stale.release()
    again = RunFolder.plan(str(tmp_path / "other"), model="lr")
    again.create()
    again.finish()


def test_overwrite_replaces_only_after_success_and_only_run_folders(tmp_path: Path) -> None:
    old = tmp_path / "run"
    old.mkdir()
    (old / "config.json").write_text('{"old": 1}')
    (old / "metrics.jsonl").write_text("old\n")
    with pytest.raises(RunFolderError, match="already holds a run .config.json, metrics.jsonl.; pass --resume"):
        RunFolder.plan(str(old), model="lr")
    folder = RunFolder.plan(str(old), model="lr", overwrite=True)
    assert folder.overwrite and folder.work != folder.path
    folder.create()
    (folder.work / "config.json").write_text('{"new": 1}')
    assert folder.public(folder.work / "checkpoints" / "step-1") == old / "checkpoints" / "step-1"
    # Until the job finishes, the old run is untouched (a job killed now leaves it as it was).
    assert json.loads((old / "config.json").read_text()) == {"old": 1}
    folder.finish()
    assert json.loads((old / "config.json").read_text()) == {"new": 1}
    assert sorted(p.name for p in old.iterdir()) == ["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging or old copy left
    # --overwrite never deletes a folder des did not make.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    with pytest.raises(RunFolderError, match="not a des run folder"):
        RunFolder.plan(str(mine), model="lr", overwrite=True)
    # --resume continues a run only from a checkpoint inside it.
    with pytest.raises(ConfigError, match="--resume DIR continues only a checkpoint inside it"):
        RunFolder.plan(str(old), model="lr", resume=str(tmp_path / "elsewhere"))
    assert RunFolder.plan(str(old), model="lr", resume=str(old)).resuming


def test_resume_without_output_continues_the_run_folder_holding_the_checkpoint(tmp_path: Path) -> None:
    from des.run_folder import run_folder_of

    run = tmp_path / "live"
    (run / "checkpoints" / "best" / "step-00000004").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    for checkpoint in (run, run / "checkpoints", run / "checkpoints" / "best" / "step-00000004"):
        assert run_folder_of(checkpoint) == run
        folder = RunFolder.plan("", model="lr", resume=str(checkpoint))
        assert folder.path == run and folder.resuming
    (tmp_path / "copied").mkdir()  # a checkpoint outside any run folder: a new runs/<model>-<time>
    assert run_folder_of(tmp_path / "copied") is None and run_folder_of(run / "elsewhere") is None


def test_a_utf8_bom_is_skipped(tmp_path: Path) -> None:
    from des.data import prepare

    plain = criteo_head(tmp_path / "plain.tsv", 50)
    bom = tmp_path / "bom.tsv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    a = prepare(plain, tmp_path / "a", split=(1.0, 0.0, 0.0), seed=0)
    b = prepare(bom, tmp_path / "b", split=(1.0, 0.0, 0.0), seed=0)
    assert a.num_rows == b.num_rows == 50


def test_auc_of_one_class_is_none_with_one_warning(capsys) -> None:
    from des.metrics import auc_or_none

    assert auc_or_none(np.array([0, 1]), np.array([0.2, 0.7])) == 1.0
    assert auc_or_none(np.ones(5), np.linspace(0, 1, 5), "the test split of x") is None
    assert auc_or_none(np.ones(5), np.linspace(0, 1, 5), "the test split of x") is None
    assert auc_or_none(np.zeros(0), np.zeros(0), "empty", warn=False) is None
    err = capsys.readouterr().err
    assert err.count("warning: AUC is undefined on the test split of x (5 rows, only positive labels)") == 1
    assert "empty" not in err


# --- end to end -------------------------------------------------------------------------------


def test_a_run_keeps_its_newest_checkpoints(work: Path) -> None:
    """--keep-checkpoints N (default 5, as TensorFlow's max_to_keep): periodic checkpoints beyond the
    newest N are deleted as the run goes; 0 keeps them all."""
    run_here(train_args(work, "keep2", "--max-steps", "10", "--checkpoint-every", "2", "--keep-checkpoints", "2"))
    assert sorted(p.name for p in (work / "keep2" / "checkpoints").glob("step-*")) == ["step-00000008",
                                                                                      "step-00000010"]
    run_here(train_args(work, "keep-all", "--max-steps", "10", "--checkpoint-every", "2", "--keep-checkpoints", "0"))
    assert len(list((work / "keep-all" / "checkpoints").glob("step-*"))) == 5


def test_reused_folder_needs_resume_or_overwrite(work: Path) -> None:
    # One rank, in this process (run_here: the entry point as launched, without a start-up).
    run_here(train_args(work, "x", "--max-steps", "3", "--dtype", "float64"))
    proc = run_here(train_args(work, "x", "--max-steps", "3", "--model", "fm"), check=False)
    expect_error(proc, "already holds a run", "--overwrite")
    assert proc.stderr.count("error:") == 1
    assert json.loads((work / "x" / "config.json").read_text())["config"]["model"] == "lr"
    # --resume continues it: same folder, metrics appended, steps 3 -> 5.
    run_here(train_args(work, "x", "--max-steps", "5", "--dtype", "float64", "--resume", str(work / "x")))
    summary = json.loads((work / "x" / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["steps_this_run"] == 2
    assert (work / "x" / "checkpoints" / "latest").read_text().strip() == "step-00000005"
    # float64 predictions keep every digit.
    preds = work / "preds.txt"
    run_here(["-m", "des.evaluate", "--checkpoint", str(work / "x"), "--data", str(work / "small.tsv"),
              "--cache-dir", str(work / "cache"), "--predictions", str(preds)])
    first = preds.read_text().split()[0]
    assert len(first.lstrip("0.").replace(".", "").split("e")[0]) >= 15, first
    # --overwrite replaces it: nothing of the float64 lr run is left.
    run_here(train_args(work, "x", "--max-steps", "2", "--model", "fm", "--overwrite"))
    config = json.loads((work / "x" / "config.json").read_text())["config"]
    assert config["model"] == "fm" and config["dtype"] == "float32"
    assert sorted(p.name for p in (work / "x" / "checkpoints").iterdir()) == ["latest", "step-00000002"]
    steps = [json.loads(line)["step"] for line in (work / "x" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2]
    summary = json.loads((work / "x" / "summary.json").read_text())
    assert summary["model"] == "fm" and summary["run_folder"] == str(work / "x")
    assert summary["checkpoint"] == str(work / "x" / "checkpoints" / "step-00000002")
    assert not [p for p in work.iterdir() if p.name.startswith(".x.")]


def test_two_jobs_on_one_folder(work: Path) -> None:
    """Started together: one trains, the other is refused in one line (never a traceback, never
    both writing)."""
    cmd = [sys.executable, *train_args(work, "both", "--max-steps", "3")]
    jobs = [subprocess.Popen(cmd, cwd=REPO, env=mpi_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(job.wait(timeout=240), *job.communicate()) for job in jobs]
    codes = sorted(code for code, _, _ in results)
    assert codes[0] == 0 and codes[1] != 0, results
    refused = next(err for code, _, err in results if code != 0)
    assert "Traceback" not in refused and refused.count("error:") == 1, refused
    assert re.search(r"in use by another job \(host .*, pid \d+|already holds a run|filled by another job", refused)
    steps = [json.loads(line)["step"] for line in (work / "both" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3]


@pytest.mark.mpi
@pytest.mark.parametrize("program, ranks", [("fail_everywhere", 3), ("fail_on_rank", 2)])
def test_a_failing_job_prints_once_and_leaves_no_shared_memory(program: str, ranks: int) -> None:
    """Every rank failing alike, or one rank failing while the others wait in a collective: one
    line from one rank (no copy per rank, no launcher banner), and the job's segment is gone."""
    before = mpich_shm()
    proc = run_mpi(ranks, ["-m", f"tests.mpi_programs.{program}", "x.npz is corrupt"], check=False, timeout=60)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and re.fullmatch(rf"\[rank \d\] {program}: error: x.npz is corrupt", errors[0]), proc.stderr
    segments = set(re.findall(r"/dev/shm/(mpich_\S+)", proc.stdout))
    assert segments, proc.stdout  # MPICH did use a segment (named in /dev/shm while the job ran)...
    after = mpich_shm()
    assert not segments & after, (sorted(before), sorted(after))  # ...and nothing of it is left
