"""Every rank raises the same user error (the same bad input on every rank, say); each first says
which MPICH shared-memory segments it has mapped, so a test can check none is left in /dev/shm."""

import sys

from des.collectives import Communicator, run_main
from des.collectives.failure import mapped_shm_segments
from des.errors import DesError


def main() -> int:
    comm = Communicator()
    print(f"rank {comm.rank} segments: {' '.join(mapped_shm_segments(include_unlinked=True))}", flush=True)
    comm.barrier()
    raise DesError(sys.argv[1] if len(sys.argv) > 1 else "the same bad input on every rank")


if __name__ == "__main__":
    run_main(main, "fail_everywhere")
