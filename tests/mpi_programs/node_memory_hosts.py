"""On several hosts: the Communicator's collectives over the whole job (which spans hosts: MPI
only) and over each host's ranks (node memory), and which node-memory segments each rank mapped,
as ``device:inode`` (the same memory wherever it is mapped; one line each, ended by `` end``: the
launcher may join the ranks' lines)."""

from __future__ import annotations

import sys

from mpi4py import MPI

from des.collectives import Communicator, install_abort_hook
from des.collectives.node_memory import NodeBuffers
from tests.mpi_programs.collectives_body import check_collectives


def node_buffers() -> list[str]:
    """``device:inode`` of every node-memory segment this process maps (nameless, or a des-* file)."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and ("/memfd:des-node-buffer" in parts[5] or "/dev/shm/des-" in parts[5]):
                found.add(f"{parts[3]}:{parts[4]}")
    return sorted(found)


if __name__ == "__main__":
    install_abort_hook("node_memory_hosts")
    job = Communicator()
    check_collectives(job)
    across = node_buffers()
    host = Communicator(MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED))
    check_collectives(host)
    within = [s for s in node_buffers() if s not in across]
    print(f"rank {job.rank} on {MPI.Get_processor_name()}: job node memory {NodeBuffers.available(job.comm)} "
          f"segments {','.join(across) or '-'}; host ranks {host.size} node memory "
          f"{NodeBuffers.available(host.comm)} segments {','.join(sorted(within)) or '-'} end", flush=True)
    sys.stdout.flush()
