"""Process set-up shared by the entry points: quiet TensorFlow, threads sized to the ranks, and a
heap that keeps what a step frees.

TF's thread pools can only be sized before its first op (the log-level variables are set by
``des/__init__.py``, before TF loads). With several ranks per machine, each rank gets
``cores // ranks_on_this_node`` intra-op threads (and as many numba threads), inter-op 1
(measured: more threads than cores per rank slow every rank down when ranks share cores);
``--threads`` overrides it.

``--pin-cores on`` binds each rank's threads to cores of its own (:func:`cores_to_pin`). Unbound,
the scheduler moves a rank's TF, numba and pipeline threads onto its neighbours' cores, and a
synchronous step waits for the rank that lost its core; bound, a rank cannot leave a core that
something else on the machine takes. On a shared 16-core host, 8 ranks x 2 threads with 512 rows a
rank ran 1.13x as fast bound in one run and 0.98x in another, where two bound ranks shared their
cores with something else (docs/benchmarks.md, "Each rank on cores of its own"). So it is off by
default.

A step allocates and frees the same few-MB arrays every time (pooled inputs, gradients, what the
collectives receive). glibc returns such memory to the kernel (arrays above its mmap threshold,
and the heap's free top above its trim threshold), and the next step's first write to each page
faults it back in, zero-filled: ~1,700 faults per step and rank at DeepFM B=4096 on 2 ranks, a
visible part of the step. :func:`keep_freed_memory` keeps it in the process instead.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from des.errors import ConfigError

#: glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): arrays up to it come
#: from the heap and go back to it
MMAP_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_USER_MALLOC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def local_ranks() -> int:
    """Number of ranks of this job on this machine."""
    return node_position()[1]


def node_position() -> tuple[int, int]:
    """``(index, count)``: this rank's place among the job's ranks on this machine, and their number."""
    from mpi4py import MPI

    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


@dataclass(frozen=True)
class Threads:
    """The thread pools of one rank: TF intra-op and inter-op, numba's parallel kernels."""

    intra_op: int
    inter_op: int
    numba: int
    cores: int
    local_ranks: int
    chosen: str  # "auto" (cores // local ranks) or "--threads"
    heap: str = ""  # what keep_freed_memory() did
    pinning: str = ""  # what pin_cores() did
    #: the cores the job's ranks on this machine may use (their affinity before any binding: a
    #: container's or batch system's cores, not the machine's); 0 where the platform cannot say
    usable: int = 0

    def describe(self) -> str:
        from des._tensorflow_env import onednn_setting

        return (f"  threads per rank: TF intra-op {self.intra_op}, inter-op {self.inter_op}, numba {self.numba} "
                f"({self.chosen}: {self.cores} cores, {self.local_ranks} rank(s) on this machine); TF oneDNN "
                f"{onednn_setting()} (TF_ENABLE_ONEDNN_OPTS); heap: {self.heap}; cores: {self.pinning}")


def keep_freed_memory() -> str:
    """Keep freed memory in this process (glibc): arrays up to :data:`MMAP_THRESHOLD` come from the
    heap, and its free top is never trimmed, so a step's arrays reuse the pages the previous step's
    freed instead of faulting fresh ones in (module docstring). Peak memory is unchanged; what was
    freed is not given back until the process ends. The user's ``MALLOC_*_`` variables or glibc
    malloc tunables win. Returns what it did, for the start-up report."""
    if any(name in os.environ for name in _USER_MALLOC_SETTINGS) or "glibc.malloc." in os.environ.get(
            "GLIBC_TUNABLES", ""):
        return "malloc as the environment sets it"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "the C library's default"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) != 1:
        return "the C library's default"
    return f"freed memory kept (mmap threshold {MMAP_THRESHOLD >> 20} MiB, no trim)"


def configure_threads(threads: int = 0, pin: str = "off") -> Threads:
    """Size TF's and numba's thread pools: ``threads`` per rank, or (0) ``cores // local ranks``
    (at least 1), and bind them to cores as ``pin`` says (:func:`pin_cores`). Oversubscribed (more
    ranks than cores): BLAS gets 1 thread, so no library starts a pool on top of TF's. Also
    :func:`keep_freed_memory` (every entry point calls this first)."""
    heap = keep_freed_memory()
    index, ranks = node_position()
    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    intra = threads or max(1, cores // ranks)
    pinning = pin_cores(pin, intra, index, ranks)
    if ranks >= cores:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if "numba" not in sys.modules:
        # numba reads it at import and re-reads it before every compilation: set after the import,
        # a different value makes the next compilation (a cold cache) fail once its pool runs
        os.environ.setdefault("NUMBA_NUM_THREADS", str(intra))
    import numba
    import tensorflow as tf

    numba_threads = max(1, min(intra, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(numba_threads)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # TF already ran an op in this process (e.g. inside tests); keep its pools
    # what TF really has (0: its own default, one thread per core)
    return Threads(tf.config.threading.get_intra_op_parallelism_threads() or cores,
                   tf.config.threading.get_inter_op_parallelism_threads() or cores, numba_threads, cores, ranks,
                   "--threads" if threads else "auto", heap, pinning, usable)


def cores_to_pin(mode: str, threads: int, index: int, ranks: int, allowed: Sequence[int],
                 shared: bool) -> tuple[list[int] | None, str]:
    """The cores the ``index``-th of ``ranks`` ranks on a machine binds its threads to, and why
    (None: it stays as it is). ``allowed``: the cores the process may use now; ``shared``: every
    rank of the machine may use the same ones (nobody bound the ranks one by one; a container's or
    batch system's cores for the whole job still count as shared). ``on``: the ``index``-th run of
    ``threads`` of the allowed cores, one rank too; ranks their launcher bound one by one
    (``mpiexec --bind-to``, ``taskset`` per rank) keep that binding; ranks that do not fit are
    refused. ``off``: never."""
    if mode == "off":
        return None, "not bound (--pin-cores off)"
    if not shared:
        return None, f"bound by the launcher to {_ranges(sorted(allowed))}"
    need = ranks * threads
    if need > len(allowed):
        raise ConfigError(f"--pin-cores on: {ranks} rank(s) x {threads} thread(s) need {need} cores of their own; "
                          f"this machine lets them use {len(allowed)}")
    mine = sorted(allowed)[index * threads:(index + 1) * threads]
    return mine, f"bound to {_ranges(mine)} ({ranks} rank(s) x {threads} thread(s), --pin-cores on)"


def pin_cores(mode: str, threads: int, index: int, ranks: int) -> str:
    """Bind every thread of this process, and those it starts later, to :func:`cores_to_pin`'s
    cores; returns what it did, for the start-up report. With ``on``, collective over the
    machine's ranks (they compare the cores each may use)."""
    if mode == "off":
        return cores_to_pin(mode, threads, index, ranks, [], True)[1]
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError("--pin-cores on: this platform cannot bind threads to cores")
    allowed = os.sched_getaffinity(0)
    mine, what = cores_to_pin(mode, threads, index, ranks, allowed, same_cores_on_the_machine(allowed))
    if mine is not None:
        os.sched_setaffinity(0, mine)  # this thread, and every thread it starts from now on
        for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
            try:  # threads started before (TF's, numba's pools) follow
                os.sched_setaffinity(int(task), mine)
            except OSError:
                pass  # ended meanwhile
    return what


def same_cores_on_the_machine(allowed: set[int]) -> bool:
    """Whether every rank of this machine may use the same cores (collective over them)."""
    import numpy as np
    from mpi4py import MPI

    mask = np.zeros(max([*allowed, 0]) // 64 + 1, dtype=np.uint64)
    for core in allowed:
        mask[core // 64] |= np.uint64(1 << (core % 64))
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        width = np.array([mask.size], dtype=np.int64)
        node.Allreduce(MPI.IN_PLACE, width, op=MPI.MAX)
        row = np.zeros(int(width[0]), dtype=np.uint64)
        row[: mask.size] = mask
        rows = np.empty((node.Get_size(), row.size), dtype=np.uint64)
        node.Allgather(row, rows)
    finally:
        node.Free()
    return bool((rows == rows[0]).all())


def host_ranks(comm) -> dict[str, tuple[list[int], int]]:
    """Per host, its ranks and its physical memory in bytes: ``MPI.Get_processor_name()`` and
    ``sysconf`` gathered over ``comm`` (collective; fixed-width bytes, no pickle)."""
    import numpy as np
    from mpi4py import MPI

    name = MPI.Get_processor_name().encode()[:255]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    row = np.concatenate([np.frombuffer(name.ljust(256, b"\0"), dtype=np.uint8),
                          np.frombuffer(np.int64(memory).tobytes(), dtype=np.uint8)])
    hosts: dict[str, tuple[list[int], int]] = {}
    for rank, raw in enumerate(comm.allgather(row, "setup")):
        host = raw[:256].tobytes().rstrip(b"\0").decode(errors="replace")
        hosts.setdefault(host, ([], int(raw[256:].view(np.int64)[0])))[0].append(rank)
    return hosts


def describe_hosts(hosts: dict[str, tuple[list[int], int]]) -> str:
    """``  hosts: 2 (node1: ranks 0-3, node2: ranks 4-7)``: where the ranks run (:func:`host_ranks`)."""
    parts = [f"{host}: {len(ranks)} rank(s) {_ranges(ranks)}" for host, (ranks, _) in hosts.items()]
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
