"""Run a GIL-releasing kernel over parts of a range on several threads.

The table kernels are serial ``nogil`` numba functions; work that splits into independent parts
(the fields of a shard, the new rows of a table) runs its parts on a shared thread pool and the
calling thread. Each item belongs to exactly one part and parts write disjoint memory, so results
do not depend on the number of threads. This replaces numba's ``parallel=True``: each parallel
kernel cost ~10 s of compilation per signature in every process with a cold cache (parfor passes,
gufunc), against ~1 s for a serial one, and the thread count is the same: numba's, of the calling
thread (``NUMBA_NUM_THREADS``, ``numba.set_num_threads``, set per rank by ``des.runtime``).

A background thread (the pipelined step's next-batch lookup, ``--pipeline on``) calls
:func:`background_thread`: it and the pool threads its kernels use run at Linux's ``SCHED_IDLE``
priority, so they take only cores nobody else wants. At normal priority the lookup thread took a
core from TF's two intra-op threads for its whole run, and a TF op split over two threads waits
for its slower half: TF's step lost more time than the overlap hid (DeepFM, one rank, B=4096:
fused step 121-139 ms vs 116-120 at idle priority). Idle, it fills the gaps in TF's step (ops on
one thread, Python between calls) and, once the step waits for it, runs on the cores the waiting
step leaves free. Scheduling never changes results: each item's work is the same on any thread.

The background thread's Python parts (packing the ids, the batch reader) hold the GIL, and a
thread that holds it gives it up only once the interpreter's switch interval (5 ms) has passed
after another thread asked, or later: at idle priority it may wait for a core to get there. The
foreground then waits for the GIL between its TF calls. So once a background thread exists the
process's switch interval is :data:`BACKGROUND_SWITCH_INTERVAL` (DeepFM, one rank, B=4096, 4
alternating runs each: TF's part of the step 63.8 -> 61.5 ms, the step 69.6 -> 67.8 ms).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numba
import numpy as np

_pool: ThreadPoolExecutor | None = None
_idle_pool: ThreadPoolExecutor | None = None  # the kernel parts of background threads
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


def _executor() -> ThreadPoolExecutor:
    global _pool, _idle_pool
    workers = max(1, (os.cpu_count() or 1) - 1)
    with _lock:
        if getattr(_local, "background", False):
            if _idle_pool is None:
                _idle_pool = ThreadPoolExecutor(workers, thread_name_prefix="des-table-idle", initializer=idle_priority)
            return _idle_pool
        if _pool is None:
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="des-table")
        return _pool


def split(weights: np.ndarray | int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ranges covering ``[0, n)``, at most ``parts``, of about equal total weight;
    ``weights``: one per item, or ``n`` (items of equal weight)."""
    n = weights if isinstance(weights, int) else int(weights.shape[0])
    parts = max(1, min(parts, n))
    if parts == 1:
        return [(0, n)]
    if isinstance(weights, int):
        edges = [n * p // parts for p in range(parts + 1)]
    else:
        cum = np.cumsum(np.asarray(weights, dtype=np.float64) + 1.0)  # +1: an empty item costs a little too
        bounds = np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts, side="right")
        edges = sorted({0, n, *(int(b) for b in bounds)})
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def run(kernel: Callable[[int, int], object], weights: np.ndarray | int, min_weight: float = 0.0) -> None:
    """``kernel(lo, hi)`` over ranges covering ``[0, n)`` (see :func:`split`): on this thread alone
    when one thread is allowed or the total weight is below ``min_weight`` (threads would cost
    more than they save), else one range per thread, the first on this thread. All ranges have
    finished when it returns; then the first error of a range is raised."""
    n_threads = threads()
    total = weights if isinstance(weights, int) else float(np.sum(weights))
    ranges = split(weights, n_threads if n_threads > 1 and total >= min_weight else 1)
    if len(ranges) == 1:
        kernel(*ranges[0])
        return
    futures: list[Future] = [_executor().submit(kernel, lo, hi) for lo, hi in ranges[1:]]
    error: BaseException | None = None
    try:
        kernel(*ranges[0])
    except BaseException as e:  # noqa: BLE001 - re-raised once every range is done
        error = e
    for f in futures:
        e = f.exception()
        error = error or e
    if error is not None:
        raise error
