"""Rank 1 raises while the others wait in a collective: the whole job must end quickly."""

import sys

import numpy as np

from des.collectives import Communicator, run_main
from des.collectives.failure import mapped_shm_segments
from des.errors import DesError


def main() -> int:
    comm = Communicator()
    # For the /dev/shm tests: the segment this job uses (its name is unlinked by now).
    print(f"rank {comm.rank} segments: {' '.join(mapped_shm_segments(include_unlinked=True))}", flush=True)
    if comm.rank == 1:
        raise DesError(sys.argv[1] if len(sys.argv) > 1 else "bad input on rank 1")
    comm.allreduce_sum_(np.zeros(4), "never_completes")
    return 0


if __name__ == "__main__":
    run_main(main, "fail_on_rank")
