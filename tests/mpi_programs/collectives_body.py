"""One test body for the Communicator, run on a 1-process communicator (in pytest) and on the
world communicator (under ``mpiexec -n N``), in the style of mpi4py's own tests."""

from __future__ import annotations

import sys

import numpy as np


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

    root_value = comm.bcast_(np.array([me + 5.0]), "bcast", root=n - 1)
    assert root_value[0] == n - 1 + 5.0
    assert comm.bcast_json({"rank": me, "text": "é"}, "json") == {"rank": 0, "text": "é"}
    assert comm.allreduce_scalar(me, "max", op="max") == n - 1
    comm.barrier()


if __name__ == "__main__":
    from des.collectives import Communicator, install_abort_hook

    install_abort_hook("collectives_body")
    communicator = Communicator()
    check_collectives(communicator)
    print(f"rank {communicator.rank} of {communicator.size}: ok")
    sys.stdout.flush()
