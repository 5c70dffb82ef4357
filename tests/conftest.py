"""Shared test helpers: quiet TensorFlow, scratch files in RAM, a runner for multi-rank programs
under the venv's own ``mpiexec`` with a timeout (a test never hangs; a failing rank aborts the
whole job), and one for one-rank entry points run in the test process (a rank's start-up, mostly
TensorFlow's import, costs seconds; one rank needs no launcher)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # oneDNN: des's own choice (des/_tensorflow_env.py)

import importlib
import importlib.util
import io
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest


def _scratch_in_ram(path: str = "/dev/shm", min_free: int = 2**30) -> None:
    """Temporary files (pytest's tmp_path, des.check's work folders, the jobs' children inherit
    TMPDIR) go to a tmpfs when there is a roomy one and TMPDIR is not set: every checkpoint file is
    fsync'ed, slow on a disk and free in RAM, which adds up over a test session."""
    if os.environ.get("TMPDIR") or not os.path.isdir(path) or not os.access(path, os.W_OK):
        return
    stat = os.statvfs(path)
    if stat.f_bavail * stat.f_frsize >= min_free:
        os.environ["TMPDIR"] = path
        tempfile.tempdir = None  # tempfile.gettempdir() reads TMPDIR again


_scratch_in_ram()

REPO = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"


#: TensorFlow's import loads Keras eagerly, and with it scikit-learn and SciPy: over a second of
#: every process's start-up, and des uses no Keras. Where the legacy Keras package is not installed,
#: asking for it leaves Keras unloaded (TensorFlow skips the eager import of a missing package; a
#: use of ``tf.keras`` would fail loudly). The tests' child processes get it (:func:`mpi_env`, and
#: des.check's jobs through :func:`driver_env`); tests/test_train.py's progress-bar job runs without
#: it, as a user's would.
NO_KERAS = {} if importlib.util.find_spec("tf_keras") else {"TF_USE_LEGACY_KERAS": "1"}


def mpi_env(ranks: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        OPENBLAS_NUM_THREADS="1",
        NUMBA_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        **NO_KERAS,
    )
    return env


def driver_env(ranks: int) -> dict[str, str]:
    """:func:`mpi_env` for THIS process, where a driver (``des.check``) launches the jobs: without
    ``NUMBA_NUM_THREADS``, which numba re-reads before every compilation and refuses to see change
    once its pool runs (a cold cache compiles in this process later). The launches set it."""
    return {k: v for k, v in mpi_env(ranks).items() if k != "NUMBA_NUM_THREADS"}


def run_mpi(
    ranks: int, args: list[str], *, timeout: float = 240, check: bool = True, cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks python args...`` (``env``: variables set over :func:`mpi_env`'s); fails
    the test on timeout (after killing the job)."""
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, *args]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd or REPO, env={**mpi_env(ranks), **(env or {})}, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n{exc.stdout}\n{exc.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_mpi_many(ranks: int, runs: dict[str, list[str]], folder: Path, *, timeout: float = 240) -> dict[str, str]:
    """Several ``-m MODULE ARGS...`` runs (by name) one after another in ONE ``mpiexec -n ranks``
    job (tests/mpi_programs/entry_points.py: the ranks start once); a failing run fails the test.
    Returns each run's standard output, its ranks' in rank order. For runs that set up alike and
    succeed; a run expected to fail keeps a job of its own."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    listing = folder / "runs.json"
    listing.write_text(json.dumps([{"name": name, "args": args} for name, args in runs.items()]))
    run_mpi(ranks, ["-m", "tests.mpi_programs.entry_points", str(listing)], timeout=timeout)
    return {name: "".join((folder / f"{name}.rank-{r}.out").read_text() for r in range(ranks)) for name in runs}


def run_here(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS...`` on one rank, in this process: the module's ``main`` under the
    same :func:`des.collectives.run_main` as a launch (one-line errors, exit codes), its stdout and
    stderr captured. For one-rank runs only (``mpiexec -n 1`` adds nothing but a start-up)."""
    from des.collectives import run_main

    assert args[0] == "-m", args
    module = importlib.import_module(args[1])
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            run_main(lambda: module.main(list(args[2:])), args[1])
        except SystemExit as exc:
            code = exc.code
    proc = subprocess.CompletedProcess(["(in-process)", *args], code or 0, out.getvalue(), err.getvalue())
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_job(ranks: int, args: list[str], *, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
    """One rank: :func:`run_here`; more: :func:`run_mpi`."""
    return run_here(args, check=check) if ranks == 1 else run_mpi(ranks, args, check=check, timeout=timeout)


def assert_states_equal(expected: dict, got: dict, rtol: float = 1e-9) -> None:
    """Two checkpoints' numbers (``des.check.state_arrays``): the same arrays, integers equal and
    floats to ``rtol``."""
    import numpy as np

    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        if value.dtype.kind in "iu":
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            np.testing.assert_allclose(got[key], value, rtol=rtol, atol=1e-12, err_msg=key)


def criteo_head(path: Path, rows: int) -> Path:
    """The first ``rows`` rows of the shipped Criteo sample, as a plain TSV at ``path``."""
    import gzip

    with gzip.open(REPO / "datasets" / "criteo_sample.txt.gz", "rt") as src, open(path, "w") as dst:
        for _, line in zip(range(rows), src):
            dst.write(line)
    return path


def schema_requests(root: Path, schema: Path, rows: int, seed: int, kept: int, edited: list[list[str]]) -> None:
    """``root/train.csv``: ``rows`` synthetic rows of ``schema``; ``root/requests.csv``: its header,
    its first ``kept`` rows and the ``edited`` ones (rows a service may get)."""
    import csv

    from des.data.synth_schema import synthesize_schema

    synthesize_schema(root / "train.csv", rows, str(schema), seed=seed, file_format="raw")
    with open(root / "train.csv", newline="", encoding="utf-8") as handle:
        lines = list(csv.reader(handle))
    with open(root / "requests.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(lines[:kept + 1] + edited)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def mpich_shm() -> set[str]:
    """MPICH's shared-memory files in /dev/shm: every job's on the machine, so tests compare the
    names a job itself reports having used (other jobs may come and go meanwhile)."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("mpich_*")} if shm.is_dir() else set()


#: a session of at least this many tests (the whole suite, not a file or a -k selection) on a
#: cold numba cache first compiles the table kernels on every core (tests/warm_numba.py)
WARM_NUMBA_MIN_TESTS = 300


def numba_cache_is_cold() -> bool:
    """No cached fused update kernel of des.hashtable where numba keeps it (importing the package
    first drops a stale cache)."""
    from des.hashtable import fused

    try:  # numba's own file name for the kernel's index (private, stable since numba 0.4x)
        return not os.path.exists(fused._update_pieces._cache._cache_file._index_path)
    except AttributeError:
        return False


def pytest_collection_finish(session) -> None:
    """A whole-suite run on a cold cache: tests/warm_numba.py in one process per core (at most 2: its
    runs are few), waited for; one line if it failed (then the tests compile what they need)."""
    if session.config.option.collectonly or len(session.items) < WARM_NUMBA_MIN_TESTS or not numba_cache_is_cold():
        return
    import time

    from tests.warm_numba import prepare_store

    parts = max(1, min(2, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="des-warm-numba-") as scratch:
        store = prepare_store(Path(scratch))
        procs = [subprocess.Popen([sys.executable, "-m", "tests.warm_numba", str(store), str(i), str(parts)], cwd=REPO,
                                  env=mpi_env(parts), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(parts)]
        deadline = time.monotonic() + 600
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            if proc.returncode:
                last = (out.strip().splitlines() or ["no output"])[-1]
                session.config.pluginmanager.get_plugin("terminalreporter").write_line(
                    f"tests/warm_numba.py exited {proc.returncode}: {last}")
