"""Run a GIL-releasing kernel over parts of a range on several threads.

The table kernels are serial ``nogil`` numba functions; work that splits into independent parts
(the fields of a shard, the new rows of a table) runs its parts on a shared thread pool and the
calling thread. Each item belongs to exactly one part and parts write disjoint memory, so results
do not depend on the number of threads. This replaces numba's ``parallel=True``: each parallel
kernel cost ~10 s of compilation per signature in every process with a cold cache (parfor passes,
gufunc), against ~1 s for a serial one, and the thread count is the same: numba's, of the calling
thread (``NUMBA_NUM_THREADS``, ``numba.set_num_threads``, set per rank by ``des.runtime``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numba
import numpy as np

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def threads() -> int:
    """Threads the calling thread may use (numba's setting for it)."""
    return max(1, int(numba.get_num_threads()))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, (os.cpu_count() or 1) - 1), thread_name_prefix="des-table")
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
