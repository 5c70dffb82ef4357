"""Row-block collectives of ranks that share one machine, as loads and stores in shared memory.

MPICH moves a large intra-node message through its shared-memory cells in many chunks, each
needing a progress call from both sides, so a reduce-scatter plus an all-gather of DeepFM's
``[4096, 410]`` float32 buffer costs several memcpy's worth of time, more as N grows. When every rank of the communicator is on one machine, the DES step's two big
collectives instead use one shared array per purpose:

* ``reduce_scatter_rows_sum``: every rank stores its ``[B, P]`` partials in its own slot; after one
  barrier, rank r sums its row block over the N slots, in rank order (deterministic), in one pass
  (:func:`_sum_slots`: each element ``((s_0 + s_1) + s_2) + ...``, the bits of adding the slots one
  after the other, reading each slot once and writing the block once);
* ``allgather_rows``: every rank stores its row block in place; after one barrier, each copies out
  the whole ``[B, P]`` (or, for a result used only until the step's next collective of its kind,
  as the buffer gradient ``G`` is, reads it in place).

Storing into a slot and summing a block run over ranges of rows on the rank's threads
(``des.hashtable._threads``: the calling thread and the pool's); each row is copied or summed by
one thread in the same order, so the bits do not depend on the number of threads.

Each purpose has two alternating buffers, so one barrier per call suffices: a rank can only write a
buffer again two calls later, after a barrier every rank reached after reading it.

The memory has no name: the node's first rank makes it (``memfd_create``) and the others open its
descriptor through ``/proc``, so it goes with the last process that maps it, and nothing is left
behind whatever happens to the job, a rank killed while the others wait for it in the allocation
included. Where ``/proc`` is closed to them, a file in ``/dev/shm`` made by the first rank and
unlinked as soon as every rank has mapped it (a job killed in between leaves it).
The bytes accounted per call are the same as for the MPI path: the logical volume of the collective.
"""

from __future__ import annotations

import mmap
import os
import uuid

import numpy as np
from mpi4py import MPI
from numba import njit

from des.hashtable import _threads
from des.zero_copy import aligned_copy, aligned_empty

_SHM_DIR = "/dev/shm"
#: bytes below which a copy or a sum stays on the calling thread (handing out ranges costs more)
_MIN_PARALLEL_BYTES = 1 << 20


class NodeBuffers:
    """Shared double buffers of the ranks of ``comm`` (all on one machine), grown on demand.
    Every method is collective: all ranks call it with the same global shapes (lock-step)."""

    def __init__(self, comm: MPI.Comm, barrier) -> None:
        self.comm, self.size, self.rank = comm, comm.Get_size(), comm.Get_rank()
        self._barrier = barrier  # the Communicator's non-spinning barrier
        self._arrays: dict[str, np.ndarray] = {}  # purpose -> uint8 [2, slots, capacity bytes]
        self._maps: dict[str, mmap.mmap] = {}
        self._calls: dict[str, int] = {}

    @staticmethod
    def available(comm: MPI.Comm) -> bool:
        """Whether every rank of ``comm`` shares this machine's memory (and /dev/shm exists)."""
        if comm.Get_size() < 2 or not os.path.isdir(_SHM_DIR):
            return False
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            return node.Get_size() == comm.Get_size()
        finally:
            node.Free()

    # ----------------------------------------------------------------------------- collectives
    def reduce_scatter_rows_sum(self, buffer: np.ndarray, bounds: list[int]) -> np.ndarray:
        """Rank r's row block ``bounds[r]:bounds[r+1]`` of the sum over ranks of ``buffer``."""
        slots = self._slots("reduce_scatter", buffer, self.size)
        mine = slots[self.rank]
        _on_threads(lambda a, b: np.copyto(mine[a:b], buffer[a:b]), buffer.shape[0], buffer.nbytes)
        self._barrier()
        lo, hi = bounds[self.rank], bounds[self.rank + 1]
        out = aligned_empty((hi - lo,) + buffer.shape[1:], buffer.dtype)  # TF takes it without a copy
        items = int(np.prod(buffer.shape[1:], dtype=np.int64))
        every, block = slots.reshape(self.size, -1, items), out.reshape(hi - lo, items)
        _on_threads(lambda a, b: _sum_slots(every, lo + a, lo + b, block[a:b]), hi - lo, buffer.nbytes)
        return out

    def allgather_rows(self, block: np.ndarray, bounds: list[int], rows: int, *, transient: bool = False,
                       purpose: str = "allgather") -> np.ndarray:
        """``[rows, ...]`` from every rank's row block ``bounds[r]:bounds[r+1]``. ``transient``: the
        caller is done with the result before its second next call of this ``purpose`` (the double
        buffer: no rank writes that memory again before then) and does not write it, so the shared
        array itself is returned (writeable only so that TF can take it without a copy) instead of a
        private copy."""
        whole = self._slots(purpose, np.empty((rows,) + block.shape[1:], block.dtype), 1)[0]
        whole[bounds[self.rank] : bounds[self.rank + 1]] = block
        self._barrier()
        return whole if transient else aligned_copy(whole)

    # ----------------------------------------------------------------------------- memory
    def _slots(self, purpose: str, like: np.ndarray, count: int) -> np.ndarray:
        """This call's buffer of ``purpose`` as ``[count, *like.shape]`` of ``like.dtype``."""
        need = count * like.nbytes
        array = self._arrays.get(purpose)
        if array is None or array.shape[1] < need:
            size = max(need, 2 * (0 if array is None else array.shape[1]))
            array = self._allocate(purpose, -(-size // 4096) * 4096)  # both halves page-aligned (TF takes them)
        call = self._calls.get(purpose, 0)
        self._calls[purpose] = call + 1
        return array[call % 2, :need].view(like.dtype).reshape((count,) + like.shape)

    def _allocate(self, purpose: str, nbytes: int) -> np.ndarray:
        """A new shared ``[2, nbytes]`` array (collective; the old one is dropped by each rank)."""
        size = 2 * nbytes
        fd, path = self._nameless(size)
        if fd < 0:
            fd, path = self._named(size)
        try:
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._barrier()  # every rank has it mapped: the name can go
        if path and self.rank == 0:
            os.unlink(path)
        self._maps[purpose] = mapping
        self._arrays[purpose] = np.frombuffer(mapping, dtype=np.uint8).reshape(2, nbytes)
        self._calls[purpose] = 0
        return self._arrays[purpose]

    def _nameless(self, size: int) -> tuple[int, str]:
        """Memory with no name anywhere (collective): rank 0 makes it (``memfd_create``), the others
        open rank 0's descriptor through ``/proc``; it goes with the last process that maps it, so a
        job killed at any moment leaves nothing behind. ``(-1, "")`` on every rank where one rank
        cannot (no ``memfd_create``, ``/proc`` closed to it)."""
        where = np.zeros(2, dtype=np.int64)
        fd = -1
        if self.rank == 0 and hasattr(os, "memfd_create"):
            try:
                fd = os.memfd_create("des-node-buffer", os.MFD_CLOEXEC)
                os.ftruncate(fd, size)
                where[:] = os.getpid(), fd
            except OSError:
                fd = -1
        self.comm.Bcast(where, root=0)
        if self.rank != 0 and where[0]:
            try:
                fd = os.open(f"/proc/{int(where[0])}/fd/{int(where[1])}", os.O_RDWR)
            except OSError:
                fd = -1
        opened = np.array([int(fd >= 0)], dtype=np.int32)
        self.comm.Allreduce(MPI.IN_PLACE, opened, op=MPI.MIN)  # also: every rank opened before rank 0 closes
        if opened[0]:
            return fd, ""
        if fd >= 0:
            os.close(fd)
        return -1, ""

    def _named(self, size: int) -> tuple[int, str]:
        """A file in /dev/shm (collective), rank 0's to unlink once every rank has mapped it."""
        name = np.zeros(64, dtype=np.uint8)
        if self.rank == 0:
            encoded = f"des-{uuid.uuid4().hex}".encode()
            name[: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        self.comm.Bcast(name, root=0)
        path = os.path.join(_SHM_DIR, name.tobytes().rstrip(b"\0").decode())
        if self.rank == 0:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)
        self._barrier()
        if self.rank != 0:
            fd = os.open(path, os.O_RDWR)
        return fd, path


def _on_threads(kernel, rows: int, nbytes: int) -> None:
    """``kernel(a, b)`` over ranges of ``[0, rows)`` on the rank's threads, or on this one alone
    where the ``nbytes`` it moves are few (:data:`_MIN_PARALLEL_BYTES`)."""
    if nbytes < _MIN_PARALLEL_BYTES:
        kernel(0, rows)
    else:
        _threads.run(kernel, rows)


@njit(cache=True, nogil=True)
def _sum_slots(slots, lo, hi, out):  # pragma: no cover - numba
    """``out[i] = slots[0, lo + i] + slots[1, lo + i] + ...`` left to right, element by element: the
    same bits as copying slot 0 and adding the others in rank order, in one pass over the memory."""
    n, width = slots.shape[0], slots.shape[2]
    for i in range(hi - lo):  # a row of the block stays in cache while the slots' rows are added to it
        for c in range(width):
            out[i, c] = slots[0, lo + i, c]
        for r in range(1, n):
            for c in range(width):
                out[i, c] += slots[r, lo + i, c]
