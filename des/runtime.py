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
