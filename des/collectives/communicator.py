"""A thin, typed wrapper over mpi4py's buffer collectives with byte and time accounting.

Every collective takes a ``site``: the purpose of the call ("forward_partials", "embeddings",
"dense_gradients", ...). The communicator keeps, per site, the number of calls, the bytes this rank
sent and received, and the seconds spent (waiting included), so a run can report bytes per step per
purpose and put them next to the analytic formulas.

How bytes are counted, per rank, for a payload of ``S`` bytes and ``N`` ranks (the cost of the
standard bandwidth-optimal algorithms; what MPICH really does for small messages may differ, but
these are the numbers the DES paper's formulas use):

* ``allreduce_sum_`` (ring: reduce-scatter then all-gather): sends and receives ``2 (N-1)/N · S``.
* ``reduce_scatter_rows_sum`` / ``allgather_rows`` (ring, row blocks of ``r·rows // N``): sends and
  receives ``S`` minus this rank's block, ``(N-1)/N · S`` for an even split.
* ``allgather``/``allgatherv`` (ring): receives every other rank's block, ``total - own``, and sends
  as much (each rank forwards ``N-1`` blocks around the ring).
* ``alltoallv``: exactly the bytes addressed to / coming from the other ranks (self excluded).
* ``bcast_``: the root sends ``(N-1) · S``, every other rank receives ``S``.
* ``barrier``: no payload.

With one rank nothing is sent, no MPI call is made, and the counters show zero bytes.

Waiting: a rank that reaches a collective early (its peers are still evaluating or writing) would
spin at a full CPU share inside a blocking MPI call and slow the working ranks when ranks share
cores. So every collective is issued non-blocking and completed by :meth:`Communicator.wait`, which
polls ``Test()``, yielding the core between polls (``sched_yield``: a peer on the same core runs,
else the poll comes right back, as a spin would) for ``yield_seconds``, then sleeping 0.2 ms
between polls. MPICH moves a non-blocking collective on only inside ``Test()``, so a sleeping rank
holds up every protocol round of a collective. Where every rank of the machine has a core of its
own (the launcher's local rank count, ``MPI_LOCALNRANKS`` / ``OMPI_COMM_WORLD_LOCAL_SIZE``, at most
the cores; without either a rank counts as alone), a rank yields for 20 ms (the waits inside a
step; long waits, evaluation and checkpoints, sleep). Where ranks share cores, 0.5 ms: two ranks
waiting on one core must leave it idle (sleep) for the scheduler to move a working rank there:
long yields there help short, even steps but hold up data with long, uneven lookups
(``docs/benchmarks.md`` has the runs that chose the two values).

Ranks on one machine: the row-block collectives of the DES step (``reduce_scatter_rows_sum``,
``allgather_rows``) run as loads and stores in shared memory with one barrier each
(:mod:`des.collectives.node_memory`); the bytes accounted are those above either way.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from des.collectives.node_memory import NodeBuffers
from des.row_blocks import row_bounds
from des.zero_copy import aligned_empty


#: entry times kept per site, the last calls' (:meth:`Communicator.waiting_ms`)
ENTRIES_KEPT = 64


@dataclass
class CallStats:
    """Accumulated cost of the collectives issued at one call site."""

    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "calls": self.calls,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "seconds": self.seconds,
        }


class Communicator:
    """Buffer collectives over an MPI communicator, with per-site accounting.

    ``Communicator()`` uses ``MPI.COMM_WORLD`` (a single process started without ``mpiexec`` is a
    world of one); ``Communicator(MPI.COMM_SELF)`` gives a 1-process communicator inside an MPI job.
    """

    def __init__(
        self,
        comm: MPI.Comm | None = None,
        *,
        yield_seconds: float | None = None,
        poll_sleep_seconds: float = 2e-4,
        node_memory: bool = True,
    ) -> None:
        self.comm: MPI.Comm = MPI.COMM_WORLD if comm is None else comm
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        if yield_seconds is None:  # see the module docstring
            from des._tensorflow_env import launcher_local_ranks

            yield_seconds = 2e-2 if launcher_local_ranks() <= (os.cpu_count() or 1) else 5e-4
        self.yield_seconds = yield_seconds
        self.poll_sleep_seconds = poll_sleep_seconds
        self.stats: dict[str, CallStats] = defaultdict(CallStats)
        #: per site, when this rank entered its last calls (``time.perf_counter``: one clock per machine)
        self.entries: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=ENTRIES_KEPT))
        # the row-block collectives in shared memory when all ranks share one machine (decided at
        # their first call, which every rank makes): des/collectives/node_memory.py
        self._node_memory: NodeBuffers | bool | None = None if node_memory and self.size > 1 else False

    def split(self, color: int) -> "Communicator":
        """The communicator of the ranks that pass the same ``color`` (collective: every rank calls
        it), ordered by rank, accounting into this one's sites (the summary reads one set)."""
        sub = Communicator(self.comm.Split(int(color), self.rank), yield_seconds=self.yield_seconds,
                           poll_sleep_seconds=self.poll_sleep_seconds)
        sub.stats, sub.entries = self.stats, self.entries
        return sub

    def _node(self) -> NodeBuffers | None:
        if self._node_memory is None:
            self._node_memory = NodeBuffers(self.comm, self._quiet_barrier) if NodeBuffers.available(self.comm) else False
        return self._node_memory or None

    def _quiet_barrier(self) -> None:
        self.wait(self.comm.Ibarrier())

    # ----------------------------------------------------------------------------- accounting
    def _account(self, site: str, sent: float, received: float, seconds: float) -> None:
        entry = self.stats[site]
        entry.calls += 1
        entry.bytes_sent += int(round(sent))
        entry.bytes_received += int(round(received))
        entry.seconds += seconds
        self.entries[site].append(time.perf_counter() - seconds)

    def stats_dict(self) -> dict[str, dict[str, float]]:
        return {site: s.as_dict() for site, s in sorted(self.stats.items())}

    def waiting_ms(self, sites: list[str]) -> dict[str, list[float]]:
        """Collective: per site, every rank's median milliseconds from entering one of the site's
        last calls (at most :data:`ENTRIES_KEPT`) to the last rank's entering it: the part of a
        collective's time spent waiting for the slowest peer, not moving data (the median: a
        warm-up step's wait does not weigh). Only where every rank runs on one machine (one clock)
        and made as many calls at the site (lock-step: the i-th calls match); {} with one rank.
        A split communicator's sites (:meth:`split`: groups calling side by side) are compared over
        this communicator's ranks, so there the figure is the groups' skew too."""
        if self.size == 1:
            return {}
        width = ENTRIES_KEPT + 1
        row = np.full(1 + len(sites) * width, np.nan)
        row[0] = zlib.crc32(MPI.Get_processor_name().encode())
        for i, site in enumerate(sites):
            kept = list(self.entries.get(site, ()))
            row[1 + i * width] = self.stats[site].calls if site in self.stats else 0
            row[2 + i * width : 2 + i * width + len(kept)] = kept
        table = self.allgather(row, "waiting")
        if np.unique(table[:, 0]).size > 1:
            return {}
        waits = {}
        for i, site in enumerate(sites):
            calls, entered = table[:, 1 + i * width], table[:, 2 + i * width : 1 + (i + 1) * width]
            if calls[0] and (calls == calls[0]).all():
                entered = entered[:, : int(min(calls[0], ENTRIES_KEPT))]
                waits[site] = [round(float(v) * 1e3, 3) for v in np.median(entered.max(axis=0) - entered, axis=1)]
        return waits

    def wait(self, request: MPI.Request) -> None:
        """Complete ``request`` without hogging a core while peers are busy (see module doc)."""
        polite = time.perf_counter() + self.yield_seconds
        while time.perf_counter() < polite:
            if request.Test():
                return
            os.sched_yield()
        while not request.Test():
            time.sleep(self.poll_sleep_seconds)

    # ----------------------------------------------------------------------------- collectives
    def allreduce_sum_(self, buffer: np.ndarray, site: str) -> np.ndarray:
        """Sum ``buffer`` over all ranks, in place; returns it."""
        _require_contiguous(buffer, site)
        start = time.perf_counter()
        if self.size > 1:
            self.wait(self.comm.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.SUM))
        moved = 2.0 * (self.size - 1) / self.size * buffer.nbytes
        self._account(site, moved, moved, time.perf_counter() - start)
        return buffer

    def start_allreduce_sum_(self, buffer: np.ndarray, site: str) -> "Pending":
        """:meth:`allreduce_sum_` started now and completed by ``.wait()``: work done in between
        (other collectives, local compute) overlaps it. Accounted when it completes."""
        _require_contiguous(buffer, site)
        moved = 2.0 * (self.size - 1) / self.size * buffer.nbytes
        request = self.comm.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.SUM) if self.size > 1 else None
        return Pending(self, request, site, moved, buffer)

    def row_bounds(self, rows: int) -> list[int]:
        """Rank r's row block of ``rows`` rows is ``[bounds[r], bounds[r+1])``: ``r·rows // N``, so the
        remainder is spread evenly (the same split as a sharded batch reader's)."""
        return row_bounds(rows, self.size)

    def reduce_scatter_rows_sum(self, buffer: np.ndarray, site: str) -> np.ndarray:
        """This rank's row block (:meth:`row_bounds`) of the sum over ranks of ``buffer [rows, ...]``.
        Ring cost: every rank sends and receives the blocks but its own, ``(N-1)/N · S`` when even."""
        _require_contiguous(buffer, site)
        bounds = self.row_bounds(buffer.shape[0])
        row_items = int(np.prod(buffer.shape[1:], dtype=np.int64))
        # aligned: TF takes it without a copy (des/zero_copy.py)
        out = aligned_empty((bounds[self.rank + 1] - bounds[self.rank],) + buffer.shape[1:], buffer.dtype)
        start = time.perf_counter()
        if self.size > 1 and self._node() is not None:
            out = self._node().reduce_scatter_rows_sum(buffer, bounds)
        elif self.size > 1:
            counts = np.diff(bounds).astype(np.int64) * row_items
            self.wait(self.comm.Ireduce_scatter(buffer, out, counts, op=MPI.SUM))
        else:
            out[...] = buffer
        moved = buffer.nbytes - out.nbytes
        self._account(site, moved, moved, time.perf_counter() - start)
        return out

    def allgather_rows(self, block: np.ndarray, rows: int, site: str, *, transient: bool = False) -> np.ndarray:
        """``[rows, ...]`` from every rank's row block (:meth:`row_bounds`); the inverse of
        :meth:`reduce_scatter_rows_sum`'s split. Ring cost: ``S - own block`` sent and received.
        ``transient``: the caller reads the result only, and is done with it before its second next
        call at ``site``, so ranks of one machine may read it in the shared memory it was gathered in."""
        block = np.ascontiguousarray(block)
        bounds = self.row_bounds(rows)
        if block.shape[0] != bounds[self.rank + 1] - bounds[self.rank]:
            raise ValueError(f"allgather_rows at {site}: {block.shape[0]} rows, expected this rank's block of {rows}")
        out = aligned_empty((rows,) + block.shape[1:], block.dtype)  # as reduce_scatter_rows_sum's
        start = time.perf_counter()
        if self.size > 1 and self._node() is not None:
            out = self._node().allgather_rows(block, bounds, rows, transient=transient,
                                              purpose=f"allgather:{site}" if transient else "allgather")
        elif self.size > 1:
            row_items = int(np.prod(block.shape[1:], dtype=np.int64))
            counts = np.diff(bounds).astype(np.int64) * row_items
            displs = np.asarray(bounds[:-1], dtype=np.int64) * row_items
            self.wait(self.comm.Iallgatherv(block, [out.reshape(-1), (counts, displs)]))
        else:
            out[...] = block
        moved = out.nbytes - block.nbytes
        self._account(site, moved, moved, time.perf_counter() - start)
        return out

    def allgather(self, block: np.ndarray, site: str) -> np.ndarray:
        """Every rank's equally shaped ``block``, stacked: shape ``[size, *block.shape]``."""
        block = np.ascontiguousarray(block)
        out = np.empty((self.size,) + block.shape, dtype=block.dtype)
        start = time.perf_counter()
        if self.size > 1:
            self.wait(self.comm.Iallgather(block, out))
        else:
            out[0] = block
        moved = (self.size - 1) * block.nbytes
        self._account(site, moved, moved, time.perf_counter() - start)
        return out

    def allgatherv(self, block: np.ndarray, site: str) -> tuple[np.ndarray, np.ndarray]:
        """Concatenation of every rank's 1-D ``block`` (lengths may differ) and the lengths."""
        block = np.ascontiguousarray(block).reshape(-1)
        counts = self.allgather(np.array([block.size], dtype=np.int64), site + ":counts")[:, 0]
        out = np.empty(int(counts.sum()), dtype=block.dtype)
        start = time.perf_counter()
        if self.size > 1:
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self.wait(self.comm.Iallgatherv(block, [out, (counts, displs)]))
        else:
            out[:] = block
        moved = out.nbytes - block.nbytes
        self._account(site, moved, moved, time.perf_counter() - start)
        return out, counts

    def alltoallv(
        self, send: np.ndarray, send_counts: np.ndarray, site: str, recv_counts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Send ``send[displ_j : displ_j + send_counts[j]]`` to rank ``j``; returns what arrived,
        concatenated in rank order, and the per-rank receive counts (in elements of dim 0).

        ``send`` may be 2-D (rows of a table); counts are in rows. ``recv_counts``: when the
        receiver already knows them, nothing else travels (else an Alltoall of the counts first,
        accounted at ``site:counts``).
        """
        send = np.ascontiguousarray(send)
        send_counts = np.asarray(send_counts, dtype=np.int64)
        if send_counts.shape != (self.size,) or send_counts.sum() != send.shape[0]:
            raise ValueError(f"alltoallv at {site}: send_counts do not match the buffer")
        row_items = int(np.prod(send.shape[1:], dtype=np.int64))
        if recv_counts is None:
            recv_counts = self._exchange_counts(send_counts, site)
        recv_counts = np.asarray(recv_counts, dtype=np.int64)
        out = np.empty((int(recv_counts.sum()),) + send.shape[1:], dtype=send.dtype)
        start = time.perf_counter()
        if self.size > 1:
            s_items = send_counts * row_items
            r_items = recv_counts * row_items
            s_displ = np.concatenate([[0], np.cumsum(s_items)[:-1]])
            r_displ = np.concatenate([[0], np.cumsum(r_items)[:-1]])
            self.wait(
                self.comm.Ialltoallv(
                    [send.reshape(-1), (s_items, s_displ)], [out.reshape(-1), (r_items, r_displ)]
                )
            )
        else:
            out[...] = send
        row_bytes = row_items * send.dtype.itemsize
        me = self.rank
        sent = (send_counts.sum() - send_counts[me]) * row_bytes
        received = (recv_counts.sum() - recv_counts[me]) * row_bytes
        self._account(site, sent, received, time.perf_counter() - start)
        return out, recv_counts

    def _exchange_counts(self, send_counts: np.ndarray, site: str) -> np.ndarray:
        recv_counts = np.empty(self.size, dtype=np.int64)
        start = time.perf_counter()
        if self.size > 1:
            self.wait(self.comm.Ialltoall(send_counts, recv_counts))
        else:
            recv_counts[:] = send_counts
        moved = (self.size - 1) * 8
        self._account(site + ":counts", moved, moved, time.perf_counter() - start)
        return recv_counts

    def bcast_(self, buffer: np.ndarray, site: str, root: int = 0) -> np.ndarray:
        """Overwrite ``buffer`` on every rank with the root's, in place; returns it."""
        _require_contiguous(buffer, site)
        start = time.perf_counter()
        if self.size > 1:
            self.wait(self.comm.Ibcast(buffer, root=root))
        if self.rank == root:
            sent, received = (self.size - 1) * buffer.nbytes, 0
        else:
            sent, received = 0, buffer.nbytes
        self._account(site, sent, received, time.perf_counter() - start)
        return buffer

    def bcast_json(self, obj: Any, site: str, root: int = 0) -> Any:
        """Broadcast a JSON-able object (configs, manifests); never pickles."""
        if self.size == 1:
            return obj
        payload = json.dumps(obj).encode() if self.rank == root else b""
        length = self.bcast_(np.array([len(payload)], dtype=np.int64), site, root)[0]
        data = np.frombuffer(payload, dtype=np.uint8).copy() if self.rank == root else None
        if data is None:
            data = np.empty(int(length), dtype=np.uint8)
        self.bcast_(data, site, root)
        return json.loads(data.tobytes().decode())

    def allreduce_scalar(self, value: float, site: str, op: str = "sum") -> float:
        """Reduce one number over the ranks (``op`` in sum/max/min); for counters and checks."""
        values = self.allgather(np.array([value], dtype=np.float64), site)[:, 0]
        return float({"sum": np.sum, "max": np.max, "min": np.min}[op](values))

    # ----------------------------------------------------------------------------- point to point
    def send(self, array: np.ndarray, dest: int, tag: int, site: str) -> None:
        """Send a contiguous array to ``dest`` (the receiver learns its length by probing)."""
        array = np.ascontiguousarray(array)
        start = time.perf_counter()
        self.wait(self.comm.Isend(array, dest=dest, tag=tag))
        self._account(site, array.nbytes, 0, time.perf_counter() - start)

    def poll(self, source: int = -1, tag: int = -1) -> tuple[int, int] | None:
        """``(source, tag)`` of a pending message (any source/tag by default), or None."""
        status = MPI.Status()
        source = MPI.ANY_SOURCE if source < 0 else source
        tag = MPI.ANY_TAG if tag < 0 else tag
        if self.comm.Iprobe(source=source, tag=tag, status=status):
            return status.Get_source(), status.Get_tag()
        return None

    def recv(self, source: int, tag: int, dtype: np.dtype | type, site: str) -> np.ndarray:
        """Receive the next message from ``source`` with ``tag`` into a new 1-D array; waits without
        spinning (probe, then sleep between probes)."""
        dtype = np.dtype(dtype)
        start = time.perf_counter()
        status = MPI.Status()
        while not self.comm.Iprobe(source=source, tag=tag, status=status):
            time.sleep(self.poll_sleep_seconds)
        out = np.empty(status.Get_count(MPI.BYTE) // dtype.itemsize, dtype=dtype)
        self.comm.Recv(out, source=source, tag=tag)
        self._account(site, 0, out.nbytes, time.perf_counter() - start)
        return out

    def barrier(self, site: str = "barrier") -> None:
        start = time.perf_counter()
        if self.size > 1:
            self.wait(self.comm.Ibarrier())
        self._account(site, 0, 0, time.perf_counter() - start)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (used when this rank hit an error)."""
        if self.size > 1 or MPI.COMM_WORLD.Get_size() > 1:
            MPI.COMM_WORLD.Abort(code)
        raise SystemExit(code)


class Pending:
    """A collective in flight (:meth:`Communicator.start_allreduce_sum_`)."""

    def __init__(self, comm: Communicator, request: MPI.Request | None, site: str, moved: float,
                 buffer: np.ndarray) -> None:
        self.comm, self.request, self.site, self.moved, self.buffer = comm, request, site, moved, buffer
        self.started = time.perf_counter()

    def wait(self) -> np.ndarray:
        """Complete it; returns the buffer. Accounted seconds: from the start (overlapped time included)."""
        if self.request is not None:
            self.comm.wait(self.request)
            self.request = None
        self.comm._account(self.site, self.moved, self.moved, time.perf_counter() - self.started)
        return self.buffer


def _require_contiguous(buffer: np.ndarray, site: str) -> None:
    if not isinstance(buffer, np.ndarray) or not buffer.flags.c_contiguous:
        raise ValueError(f"collective at {site} needs a C-contiguous numpy array")
