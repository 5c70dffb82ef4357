"""One test body for the Communicator, run on a 1-process communicator (in pytest) and on the
world communicator (under ``mpiexec -n N``), in the style of mpi4py's own tests."""

from __future__ import annotations

import sys
import time
import zlib

import numpy as np
from mpi4py import MPI


def check_collectives(comm) -> None:  # comm: des.collectives.Communicator
    n, me = comm.size, comm.rank

    buf = np.arange(6, dtype=np.float64) + me
    comm.allreduce_sum_(buf, "sum")
    np.testing.assert_array_equal(buf, n * np.arange(6) + n * (n - 1) / 2)
    stats = comm.stats["sum"]
    assert stats.calls == 1
    assert stats.bytes_sent == stats.bytes_received == round(2 * (n - 1) / n * 48)

    gathered = comm.allgather(np.array([me, 10 * me], dtype=np.int64), "gather")
    np.testing.assert_array_equal(gathered, [[r, 10 * r] for r in range(n)])
    assert comm.stats["gather"].bytes_received == (n - 1) * 16

    values, counts = comm.allgatherv(np.full(me + 1, me, dtype=np.int32), "gatherv")
    np.testing.assert_array_equal(counts, np.arange(1, n + 1))
    np.testing.assert_array_equal(values, np.repeat(np.arange(n), np.arange(1, n + 1)))

    # Rank r sends (j + 1) rows of width 2 to rank j, each row holding (r, j).
    send_counts = np.arange(1, n + 1)
    send = np.concatenate([np.tile([[me, j]], (j + 1, 1)) for j in range(n)]).astype(np.float32)
    received, recv_counts = comm.alltoallv(send, send_counts, "a2a")
    np.testing.assert_array_equal(recv_counts, np.full(n, me + 1))
    np.testing.assert_array_equal(received, np.repeat([[r, me] for r in range(n)], me + 1, axis=0))
    expect_sent = (send_counts.sum() - send_counts[me]) * 2 * 4
    assert comm.stats["a2a"].bytes_sent == expect_sent
    assert comm.stats["a2a"].bytes_received == (n - 1) * (me + 1) * 2 * 4

    # Row blocks (the DES step): any rows, any N; shared memory on one machine and MPI agree, over
    # calls that alternate buffers and grow them.
    mpi_path = type(comm)(comm.comm, node_memory=False)
    for rows in (7, 5, 64, 3, 64, 200):
        bounds = comm.row_bounds(rows)
        lo, hi = bounds[me], bounds[me + 1]
        mine = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * (me + 1) + 0.1 * me
        whole = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * n * (n + 1) / 2 + 0.1 * n * (n - 1) / 2
        for c in (comm, mpi_path):
            block = c.reduce_scatter_rows_sum(mine, "rows")
            np.testing.assert_allclose(block, whole[lo:hi], rtol=1e-14)
            np.testing.assert_array_equal(c.allgather_rows(block, rows, "gather_rows"), block_all(c, block, rows))
            # read in place (shared memory on one machine): valid until the second next call at its site
            first = c.allgather_rows(block, rows, "transient", transient=True)
            second = c.allgather_rows(block * 2, rows, "transient", transient=True)
            np.testing.assert_array_equal(first, block_all(c, block, rows))
            np.testing.assert_array_equal(second, 2 * block_all(c, block, rows))
    assert comm.stats["rows"].bytes_sent == mpi_path.stats["rows"].bytes_sent
    assert comm.stats["gather_rows"].bytes_received == mpi_path.stats["gather_rows"].bytes_received
    check_large_rows_on_threads(comm)

    root_value = comm.bcast_(np.array([me + 5.0]), "bcast", root=n - 1)
    assert root_value[0] == n - 1 + 5.0
    assert comm.bcast_json({"rank": me, "text": "é"}, "json") == {"rank": 0, "text": "é"}
    assert comm.allreduce_scalar(me, "max", op="max") == n - 1
    comm.barrier()

    # waiting: the last rank enters each call at "late" 0.1 s after the others, who wait for it
    for _ in range(3):
        if n > 1 and me == n - 1:
            time.sleep(0.1)
        comm.allreduce_sum_(np.zeros(1), "late")
    waits = comm.waiting_ms(["late", "never_called"])
    hosts = comm.allgather(np.array([zlib.crc32(MPI.Get_processor_name().encode())], dtype=np.int64), "hosts")
    if n == 1 or np.unique(hosts).size > 1:  # no peers, or clocks of several machines
        assert waits == {}
    else:
        assert set(waits) == {"late"} and len(waits["late"]) == n, waits
        assert waits["late"][n - 1] < 20 and min(waits["late"][:-1]) > 50, waits


def check_large_rows_on_threads(comm) -> None:
    """A buffer over a megabyte is stored and its block summed on the rank's threads (in shared
    memory on one machine): the same bits on one thread or two, the sum of the ranks' buffers."""
    import numba

    n, me = comm.size, comm.rank
    rows, width = 3001, 50  # 1.2 MB of float64: past the calling thread's share
    every = [np.random.default_rng(r).standard_normal((rows, width)) for r in range(n)]
    expected = every[0].copy()
    for other in every[1:]:
        expected += other
    lo, hi = comm.row_bounds(rows)[me : me + 2]
    before, tried = numba.get_num_threads(), sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)})
    blocks = []
    try:
        for threads in tried:
            numba.set_num_threads(threads)
            blocks.append(comm.reduce_scatter_rows_sum(every[me], "large_rows"))
            np.testing.assert_allclose(blocks[-1], expected[lo:hi], rtol=1e-12, atol=1e-12)
    finally:
        numba.set_num_threads(before)
    assert all(block.tobytes() == blocks[0].tobytes() for block in blocks), "the bits depend on the threads"
    print(f"large rows on {' and '.join(map(str, tried))} threads")


def block_all(comm, block: np.ndarray, rows: int) -> np.ndarray:
    """Every rank's row block stacked, through the generic all-gather (the reference)."""
    sizes = comm.allgather(np.array([block.shape[0]], dtype=np.int64), "check_sizes")[:, 0]
    values, _ = comm.allgatherv(block.reshape(-1), "check_blocks")
    assert sizes.sum() == rows
    return values.reshape(rows, *block.shape[1:])


if __name__ == "__main__":
    from des.collectives import Communicator, install_abort_hook

    install_abort_hook("collectives_body")
    communicator = Communicator()
    check_collectives(communicator)
    print(f"rank {communicator.rank} of {communicator.size}: ok")
    sys.stdout.flush()
