"""Process set-up shared by the entry points: quiet TensorFlow, and threads sized to the ranks.

TF's thread pools can only be sized before its first op (the log-level variables are set by
``des/__init__.py``, before TF loads). With several ranks per machine, each rank gets
``cores // ranks_on_this_node`` intra-op threads, inter-op 1 (measured: more threads than cores
per rank slow every rank down when ranks share cores).
"""

from __future__ import annotations

import os


def local_ranks() -> int:
    """Number of ranks of this job on this machine."""
    from mpi4py import MPI

    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()


def configure_threads(threads: int = 0) -> int:
    """Size TF's thread pools (``threads`` = 0: cores // local ranks); returns the intra-op count."""
    ranks = local_ranks()
    cores = os.cpu_count() or 1
    intra = threads or max(1, cores // ranks)
    if ranks >= cores:
        # Oversubscribed: numba and BLAS must not start their own pools on top of TF's.
        os.environ.setdefault("NUMBA_NUM_THREADS", "1")
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # TF already ran an op in this process (e.g. inside tests); keep its pools
    return intra


def describe_hosts(comm) -> str:
    """``  hosts: 2 (node1: ranks 0-3, node2: ranks 4-7)``: where the ranks run, from
    ``MPI.Get_processor_name()`` gathered over ``comm`` (collective; fixed-width bytes, no pickle)."""
    import numpy as np
    from mpi4py import MPI

    name = MPI.Get_processor_name().encode()[:255]
    names = comm.allgather(np.frombuffer(name.ljust(256, b"\0"), dtype=np.uint8), "setup")
    hosts: dict[str, list[int]] = {}
    for rank, raw in enumerate(names):
        hosts.setdefault(raw.tobytes().rstrip(b"\0").decode(errors="replace"), []).append(rank)
    parts = [f"{host}: {len(ranks)} rank(s) {_ranges(ranks)}" for host, ranks in hosts.items()]
    return f"  hosts: {len(hosts)} ({', '.join(parts)})"


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)
