"""One short run launched as across machines (``mpiexec -f HOSTFILE``, the hostfile naming
``localhost``): the start-up report names the hosts and ranks per host, and rank 0 leaves
TensorBoard scalars next to ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MPIEXEC, REPO, criteo_head, mpi_env

FLAGS = ["--model", "lr", "--embedding-dim", "4", "--batch-size", "256", "--eval-batch-size", "1024",
         "--no-progress", "--table-capacity", "256", "--max-steps", "4", "--eval-every", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hostfile")
    criteo_head(root / "small.tsv", 2000)
    (root / "hosts").write_text("localhost:2\n")  # MPICH's hydra starts local ranks without ssh
    cmd = [str(MPIEXEC), "-f", str(root / "hosts"), "-n", "2", sys.executable, "-m", "des.train",
           "--data", str(root / "small.tsv"), "--cache-dir", str(root / "cache"), "--output", str(root / "run"), *FLAGS]
    proc = subprocess.run(cmd, cwd=REPO, env=mpi_env(2), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"stdout": proc.stdout, "folder": root / "run"}


def test_hostfile_launch_reports_hosts_and_ranks(run: dict) -> None:
    from mpi4py import MPI

    host = MPI.Get_processor_name() or socket.gethostname()
    assert f"  hosts: 1 ({host}: 2 rank(s) 0-1)" in run["stdout"]
    cores = os.cpu_count()
    assert (f"  threads per rank: TF intra-op 1, inter-op 1, numba 1 (--threads: {cores} cores, 2 rank(s) on this "
            "machine)") in run["stdout"]
    assert "heap: freed memory kept (mmap threshold 32 MiB, no trim)" in run["stdout"]  # des.train kept freed memory
    assert "  pipeline off (auto: 1 thread(s) per rank)" in run["stdout"]  # one thread: no core for the overlap
    assert "  admission: --min-count 2 --unadmitted shared; l2 on looked-up rows 0.01" in run["stdout"]  # LR's auto
    assert json.loads((run["folder"] / "summary.json").read_text())["ranks"] == 2


def test_tensorboard_scalars_of_a_short_run(run: dict) -> None:
    from des.tensorboard import read_scalars

    scalars = read_scalars(run["folder"])
    metrics = [json.loads(line) for line in (run["folder"] / "metrics.jsonl").read_text().splitlines()]
    assert [step for step, _ in scalars["train/loss"]] == [m["step"] for m in metrics] == [2, 4]
    assert scalars["train/loss"][-1][1] == pytest.approx(metrics[-1]["train_loss"], rel=1e-6)
    assert scalars["validation/auc"][-1][1] == pytest.approx(metrics[-1]["auc"], rel=1e-6)
    for tag in ("validation/logloss", "train/samples_per_second", "test/auc", "test/logloss",
                "learning_rate/dense", "learning_rate/sparse_linear", "bytes_per_step/forward_partials"):
        assert tag in scalars, sorted(scalars)
    assert scalars["learning_rate/dense"][0][1] == pytest.approx(0.001)
    assert scalars["learning_rate/sparse_linear"][0][1] == pytest.approx(0.1)  # LR's AdaGrad lr (auto)
    summary = json.loads((run["folder"] / "summary.json").read_text())
    assert scalars["test/auc"] == [(4, pytest.approx(summary["test_auc"], rel=1e-6))]
