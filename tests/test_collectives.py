"""The Communicator: one body on a 1-process communicator and on the world under mpiexec; an
error on one rank ends the whole job with its message instead of hanging."""

from __future__ import annotations

import re
import time

from mpi4py import MPI

from des.collectives import Communicator
from tests.conftest import run_mpi
from tests.mpi_programs.collectives_body import check_collectives


def test_collectives_on_one_process() -> None:
    check_collectives(Communicator(MPI.COMM_SELF))


def test_collectives_on_three_ranks() -> None:
    proc = run_mpi(3, ["-m", "tests.mpi_programs.collectives_body"], timeout=60)
    # Ranks share stdout, so lines may interleave: look for each rank's report anywhere.
    assert sorted(re.findall(r"rank \d of 3: ok", proc.stdout)) == [f"rank {r} of 3: ok" for r in range(3)]


def test_error_on_one_rank_aborts_the_job() -> None:
    start = time.monotonic()
    proc = run_mpi(3, ["-m", "tests.mpi_programs.fail_on_rank", "table file x.npz is corrupt"],
                   timeout=60, check=False)
    assert proc.returncode != 0
    assert "[rank 1] fail_on_rank: error: table file x.npz is corrupt" in proc.stderr
    assert "Traceback" not in proc.stderr  # a user error is one line, not a traceback wall
    assert time.monotonic() - start < 30
