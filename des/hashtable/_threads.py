"""Run a GIL-releasing kernel over parts of a range on several threads.

The table kernels are serial ``nogil`` numba functions; work that splits into independent parts
(the fields of a shard, the new rows of a table) runs its parts on a shared thread pool and the
calling thread. Each item belongs to exactly one part and parts write disjoint memory, so results
do not depend on the number of threads. This replaces numba's ``parallel=True``: a parallel
kernel compiles about ten times slower than a serial one (parfor passes, gufunc), per signature in
every process with a cold cache, and the thread count is the same: numba's, of the calling thread
(``NUMBA_NUM_THREADS``, ``numba.set_num_threads``, set per rank by ``des.runtime``).

A background thread (the pipelined step's next-batch lookup, ``--pipeline on``) calls
:func:`background_thread`: it and the pool threads its kernels use run at Linux's ``SCHED_IDLE``
priority, so they take only cores nobody else wants. At normal priority the lookup thread took a
core from TF's two intra-op threads for its whole run, and a TF op split over two threads waits
for its slower half: TF's step lost more time than the overlap hid. Idle, it fills the gaps in
TF's step (ops on one thread, Python between calls) and, once the step waits for it, runs on the
cores the waiting step leaves free. Scheduling never changes results: each item's work is the same on any thread.

The background thread's Python parts (packing the ids, the batch reader) hold the GIL, and a
thread that holds it gives it up only once the interpreter's switch interval (5 ms) has passed
after another thread asked, or later: at idle priority it may wait for a core to get there. The
foreground then waits for the GIL between its TF calls. So once a background thread exists the
process's switch interval is :data:`BACKGROUND_SWITCH_INTERVAL`, short next to a step's TF calls
(``docs/benchmarks.md`` has what each of these choices measured).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

import numba
import numpy as np
from numba import njit

_lock = threading.Lock()
_local = threading.local()
#: the interpreter's switch interval once a background thread exists (module docstring)
BACKGROUND_SWITCH_INTERVAL = 2e-4


def idle_priority() -> bool:
    """Lower the calling thread to ``SCHED_IDLE`` (it runs when a core would otherwise be idle);
    False where the OS has no such policy (the thread keeps its priority)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # pid 0: this thread (Linux)
    except (AttributeError, OSError):
        return False
    return True


def background_thread() -> None:
    """Make the calling thread a background thread: idle priority, and the ranges :func:`run`
    hands to other threads go to a pool of idle-priority threads (a pool thread at normal
    priority would compete with the foreground as before); the GIL changes hands within
    :data:`BACKGROUND_SWITCH_INTERVAL` (module docstring)."""
    idle_priority()
    _local.background = True
    if sys.getswitchinterval() > BACKGROUND_SWITCH_INTERVAL:
        sys.setswitchinterval(BACKGROUND_SWITCH_INTERVAL)


def threads() -> int:
    """Threads the calling thread may use (numba's setting for it)."""
    return max(1, int(numba.get_num_threads()))


class _Worker:
    """A pool thread and its one task slot, handed over through two locks used as binary
    semaphores: a futex each way. ``ThreadPoolExecutor.submit`` (a future, a work item, a queue,
    a semaphore) and a split of the work by numpy calls cost the step's caller a noticeable part
    of a step's Python once TensorFlow has left the caches cold."""

    def __init__(self, name: str, idle: bool) -> None:
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._task: tuple[Callable[[int, int], object], int, int] | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._loop, args=(idle,), name=name, daemon=True).start()

    def _loop(self, idle: bool) -> None:
        if idle:
            idle_priority()
        while True:
            self._go.acquire()
            kernel, lo, hi = self._task  # type: ignore[misc]
            try:
                kernel(lo, hi)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                self._error = e
            self._task = None
            self._done.release()

    def start(self, kernel: Callable[[int, int], object], lo: int, hi: int) -> None:
        self._task, self._error = (kernel, lo, hi), None
        self._go.release()

    def join(self) -> BaseException | None:
        self._done.acquire()
        return self._error


class _Pool:
    """``cores - 1`` workers for the ranges of :func:`run` past the caller's first; one caller at
    a time (``busy``): a second thread calling meanwhile runs its ranges itself."""

    def __init__(self, prefix: str, idle: bool) -> None:
        self.busy = threading.Lock()
        self.workers = [_Worker(f"{prefix}_{k}", idle) for k in range(max(1, (os.cpu_count() or 1) - 1))]


_pools: dict[bool, _Pool] = {}  # False: the foreground's, True: the kernel parts of background threads


def _pool() -> _Pool:
    background = getattr(_local, "background", False)
    pool = _pools.get(background)
    if pool is None:
        with _lock:
            pool = _pools.get(background)
            if pool is None:
                pool = _pools[background] = _Pool("des-table-idle" if background else "des-table", background)
    return pool


@njit(cache=True, nogil=True)
def _edges(weights, parts):  # pragma: no cover - numba
    """The total weight, and the ends of ``parts`` contiguous ranges of about equal ``weight + 1``
    each (an empty item costs a little too): ``split``'s bounds in one call."""
    n = weights.shape[0]
    cum = np.empty(n, dtype=np.float64)
    running, total = 0.0, 0.0
    for i in range(n):
        total += weights[i]
        running += weights[i] + 1.0
        cum[i] = running
    edges = np.empty(parts + 1, dtype=np.int64)
    edges[0] = 0
    for p in range(1, parts):  # as np.searchsorted(cum, cum[-1] * p / parts, side="right")
        target = cum[n - 1] * p / parts
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if cum[mid] <= target:
                lo = mid + 1
            else:
                hi = mid
        edges[p] = lo
    edges[parts] = n
    return total, edges


def _ranges(edges: np.ndarray) -> list[tuple[int, int]]:
    cuts = sorted({int(e) for e in edges})
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def split(weights: np.ndarray | int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ranges covering ``[0, n)``, at most ``parts``, of about equal total weight;
    ``weights``: one per item, or ``n`` (items of equal weight)."""
    n = weights if isinstance(weights, int) else int(weights.shape[0])
    parts = max(1, min(parts, n))
    if parts == 1:
        return [(0, n)]
    if isinstance(weights, int):
        return _ranges(np.array([n * p // parts for p in range(parts + 1)]))
    return _ranges(_edges(np.asarray(weights, dtype=np.float64), parts)[1])


def run(kernel: Callable[[int, int], object], weights: np.ndarray | int, min_weight: float = 0.0) -> None:
    """``kernel(lo, hi)`` over ranges covering ``[0, n)`` (see :func:`split`): on this thread alone
    when one thread is allowed or the total weight is below ``min_weight`` (threads would cost
    more than they save), else one range per thread, the first on this thread (ranges beyond the
    pool's threads too, after it). All ranges have finished when it returns; then the first error
    of a range is raised."""
    n_threads = threads()
    if isinstance(weights, int):
        total, n = float(weights), weights
    else:
        weights = np.asarray(weights, dtype=np.float64)
        n = int(weights.shape[0])
        total = None
    parts = max(1, min(n_threads, n))
    if parts > 1 and total is None:
        total, edges = _edges(weights, parts)
    if parts == 1 or total < min_weight:
        kernel(0, n)
        return
    ranges = split(n, parts) if isinstance(weights, int) else _ranges(edges)
    pool = _pool()
    if len(ranges) == 1 or not pool.busy.acquire(blocking=False):
        for lo, hi in ranges:  # another thread has the pool: the same ranges, one after another
            kernel(lo, hi)
        return
    try:
        started = pool.workers[: len(ranges) - 1]
        for worker, (lo, hi) in zip(started, ranges[1:]):
            worker.start(kernel, lo, hi)
        error: BaseException | None = None
        try:
            kernel(*ranges[0])
            for lo, hi in ranges[1 + len(started):]:
                kernel(lo, hi)
        except BaseException as e:  # noqa: BLE001 - re-raised once every range is done
            error = e
        for worker in started:
            error = error or worker.join()
    finally:
        pool.busy.release()
    if error is not None:
        raise error
