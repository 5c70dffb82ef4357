"""On several hosts: the Communicator's collectives over the whole job (which spans hosts: MPI
only) and over each host's ranks (node memory), and which node-memory segments each rank mapped
(one line each, ended by `` end``: the launcher may join the ranks' lines)."""

from __future__ import annotations

import sys

from mpi4py import MPI

from des.collectives import Communicator, install_abort_hook
from des.collectives.failure import mapped_shm_segments
from des.collectives.node_memory import NodeBuffers
from tests.mpi_programs.collectives_body import check_collectives

if __name__ == "__main__":
    install_abort_hook("node_memory_hosts")
    job = Communicator()
    check_collectives(job)
    across = [s for s in mapped_shm_segments(include_unlinked=True) if "/des-" in s]
    host = Communicator(MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED))
    check_collectives(host)
    within = [s for s in mapped_shm_segments(include_unlinked=True) if "/des-" in s and s not in across]
    print(f"rank {job.rank} on {MPI.Get_processor_name()}: job node memory {NodeBuffers.available(job.comm)} "
          f"segments {','.join(across) or '-'}; host ranks {host.size} node memory "
          f"{NodeBuffers.available(host.comm)} segments {','.join(sorted(within)) or '-'} end", flush=True)
    sys.stdout.flush()
