"""Shared test helpers: quiet TensorFlow, and a runner for multi-rank programs under the venv's
own ``mpiexec`` with a timeout (a test never hangs; a failing rank aborts the whole job)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def mpi_env(ranks: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_ENABLE_ONEDNN_OPTS="0",
        OPENBLAS_NUM_THREADS="1",
        NUMBA_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def run_mpi(
    ranks: int, args: list[str], *, timeout: float = 240, check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks python args...``; fails the test on timeout (after killing the job)."""
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, *args]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd or REPO, env=mpi_env(ranks), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n{exc.stdout}\n{exc.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def criteo_head(path: Path, rows: int) -> Path:
    """The first ``rows`` rows of the shipped Criteo sample, as a plain TSV at ``path``."""
    import gzip

    with gzip.open(REPO / "datasets" / "criteo_sample.txt.gz", "rt") as src, open(path, "w") as dst:
        for _, line in zip(range(rows), src):
            dst.write(line)
    return path


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def mpich_shm() -> set[str]:
    """MPICH's shared-memory files in /dev/shm: every job's on the machine, so tests compare the
    names a job itself reports having used (other jobs may come and go meanwhile)."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("mpich_*")} if shm.is_dir() else set()

