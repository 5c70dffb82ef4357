"""Rank 1 raises while the others wait in a collective: the whole job must end quickly. With
``--in-node-memory`` the others wait in a row-block collective whose shared memory they are making
(rank 1 raises a moment later)."""

import sys
import time

import numpy as np

from des.collectives import Communicator, run_main
from des.collectives.failure import mapped_shm_segments
from des.errors import DesError


def main() -> int:
    comm = Communicator()
    # For the /dev/shm tests: the segment this job uses (its name is unlinked by now).
    print(f"rank {comm.rank} segments: {' '.join(mapped_shm_segments(include_unlinked=True))}", flush=True)
    in_node_memory = "--in-node-memory" in sys.argv[2:]
    if in_node_memory:  # the node's memory set up, one purpose's buffers made
        block = comm.reduce_scatter_rows_sum(np.ones((4, 2)), "first")
    if comm.rank == 1:
        if in_node_memory:
            time.sleep(0.5)
        raise DesError(sys.argv[1] if len(sys.argv) > 1 else "bad input on rank 1")
    if in_node_memory:  # another purpose's buffers: made by rank 0, then the wait for rank 1
        comm.allgather_rows(block, 4, "never_completes")
    comm.allreduce_sum_(np.zeros(4), "never_completes")
    return 0


if __name__ == "__main__":
    run_main(main, "fail_on_rank")
