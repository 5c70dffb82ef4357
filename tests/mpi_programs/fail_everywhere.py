"""Every rank raises the same user error (the same bad input on every rank, say); each first says
which MPICH shared-memory segments it has mapped, so a test can check none is left in /dev/shm."""

import sys

from des.collectives import Communicator, run_main
from des.errors import DesError


def segments() -> list[str]:
    """Every /dev/shm/mpich_* mapping of this process, unlinked (" (deleted)") or not."""
    with open("/proc/self/maps") as maps:
        paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "/dev/shm/mpich_" in line}
    return sorted(p.removesuffix(" (deleted)") for p in paths)


def main() -> int:
    comm = Communicator()
    print(f"rank {comm.rank} segments: {' '.join(segments())}", flush=True)
    comm.barrier()
    raise DesError(sys.argv[1] if len(sys.argv) > 1 else "the same bad input on every rank")


if __name__ == "__main__":
    run_main(main, "fail_everywhere")
