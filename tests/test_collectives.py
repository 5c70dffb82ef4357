"""The Communicator: one body on a 1-process communicator and on the world under mpiexec; an
error on one rank ends the whole job with its message instead of hanging."""

from __future__ import annotations

import glob
import re
import time

from mpi4py import MPI

from des.collectives import Communicator
from tests.conftest import run_mpi
from tests.mpi_programs.collectives_body import check_collectives


def test_collectives_on_one_process() -> None:
    check_collectives(Communicator(MPI.COMM_SELF))


def test_collectives_on_three_ranks() -> None:
    # two numba threads a rank: the shared-memory row blocks are copied and summed on both
    proc = run_mpi(3, ["-m", "tests.mpi_programs.collectives_body"], timeout=60, env={"NUMBA_NUM_THREADS": "2"})
    # Ranks share stdout, so lines may interleave: look for each rank's report anywhere.
    assert sorted(re.findall(r"rank \d of 3: ok", proc.stdout)) == [f"rank {r} of 3: ok" for r in range(3)]
    assert proc.stdout.count("large rows on 1 and 2 threads") == 3, proc.stdout


def test_error_on_one_rank_aborts_the_job() -> None:
    start = time.monotonic()
    proc = run_mpi(3, ["-m", "tests.mpi_programs.fail_on_rank", "table file x.npz is corrupt"],
                   timeout=60, check=False)
    assert proc.returncode != 0
    assert "[rank 1] fail_on_rank: error: table file x.npz is corrupt" in proc.stderr
    assert "Traceback" not in proc.stderr  # a user error is one line, not a traceback wall
    assert time.monotonic() - start < 30


def test_a_rank_failing_while_the_others_make_node_memory_leaves_nothing_in_dev_shm() -> None:
    """The others wait for rank 1 inside the making of their shared memory (rank 0 has made it) when
    rank 1 fails and the job is killed: the memory has no name, so nothing is left in /dev/shm."""
    before = set(glob.glob("/dev/shm/des-*"))
    proc = run_mpi(2, ["-m", "tests.mpi_programs.fail_on_rank", "x.npz is corrupt", "--in-node-memory"],
                   timeout=60, check=False)
    assert proc.returncode != 0 and "[rank 1] fail_on_rank: error: x.npz is corrupt" in proc.stderr, proc.stderr
    assert set(glob.glob("/dev/shm/des-*")) <= before


def test_a_waiting_rank_yields_its_core_then_sleeps(monkeypatch) -> None:
    """``Communicator.wait``: a request not done at once is polled with the core given to a peer between polls
    (``sched_yield``: ranks that share cores keep the collective's protocol rounds moving), and
    only a long wait (past ``yield_seconds``) sleeps between polls."""
    import os

    from des.collectives import communicator as module

    clock = [0.0]
    calls: list[str] = []
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(module.time, "sleep", lambda s: (calls.append("sleep"), clock.__setitem__(0, clock[0] + s)))
    monkeypatch.setattr(os, "sched_yield", lambda: (calls.append("yield"), clock.__setitem__(0, clock[0] + 1e-3)))

    class Request:  # done at its n-th Test(); each Test() takes 0.1 ms of the clock
        def __init__(self, n: int) -> None:
            self.n = n

        def Test(self) -> bool:
            clock[0] += 1e-4
            self.n -= 1
            return self.n <= 0

    comm = Communicator(MPI.COMM_SELF, yield_seconds=2e-2, poll_sleep_seconds=2e-4)
    comm.wait(Request(1))
    assert calls == []
    comm.wait(Request(4))  # a few yields
    assert calls == ["yield"] * 3
    clock[0], calls[:] = 0.0, []
    comm.wait(Request(200))  # a long wait: ~18 yields until 20 ms, then sleeps
    first_sleep = calls.index("sleep")
    assert set(calls[:first_sleep]) == {"yield"} and 15 < first_sleep < 21
    assert set(calls[first_sleep:]) == {"sleep"}


def test_ranks_that_share_cores_yield_briefly_before_sleeping(monkeypatch) -> None:
    """Where every rank on the machine has a core, a wait yields for 20 ms before it sleeps; where
    ranks share cores only 0.5 ms (two waiting ranks on one core must leave it idle for the
    scheduler to move a working rank there); an explicit value wins."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for local, expected in (("1", 2e-2), ("2", 2e-2), ("4", 5e-4)):
        monkeypatch.setenv("MPI_LOCALNRANKS", local)
        assert Communicator(MPI.COMM_SELF).yield_seconds == expected
    assert Communicator(MPI.COMM_SELF, yield_seconds=1e-3).yield_seconds == 1e-3
