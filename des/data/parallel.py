"""The threads of ``des.data prepare``: its kernels (numba with ``nogil``, pyarrow, numpy copies
and file writes) release the GIL, so the fields of a chunk are keyed and counted side by side.

The result never depends on the number of threads: each task writes its own field (its own
columns, its own counter, its own files) and :func:`each` returns the results in the order of its
items. ``DES_DATA_THREADS`` sets how many threads work (default: the cores this process may use;
1 runs every task in the calling thread, the reference the tests compare against).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from .errors import DataError

T = TypeVar("T")
R = TypeVar("R")

THREADS_VARIABLE = "DES_DATA_THREADS"
_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}
_POOL_NAME = "des-data"  # its threads are des-data_0, des-data_1, ...
_processes = [1]  # processes of one job preparing on this machine (share_cores)


def share_cores(processes: int) -> None:
    """This process is one of ``processes`` preparing side by side on this machine (ranks of a
    job): by default each uses its share of the usable cores."""
    _processes[0] = max(1, int(processes))


def threads() -> int:
    """How many threads prepare's kernels use (``$DES_DATA_THREADS``, else the usable cores, or
    this process's share of them: :func:`share_cores`)."""
    text = os.environ.get(THREADS_VARIABLE, "").strip()
    if not text:
        machine = os.cpu_count() or 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
        return max(1, cores // _processes[0] if cores >= machine else cores)  # a bound process: its own cores
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise DataError(f"{THREADS_VARIABLE}={text!r}: expected a positive integer")
    return value


def pool() -> ThreadPoolExecutor:
    """The process's pool of :func:`threads` workers (created once per size, reused)."""
    size = threads()
    with _lock:
        if size not in _pools:
            _pools[size] = ThreadPoolExecutor(size, thread_name_prefix=_POOL_NAME)
        return _pools[size]


def in_pool() -> bool:
    """True in one of the pool's threads: work given there runs there (a task that waited on tasks
    queued behind it could wait for ever)."""
    return threading.current_thread().name.startswith(_POOL_NAME + "_")


def each(function: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[function(item) for item in items]``, the calls spread over the calling thread and
    helpers in the pool (all in the calling thread when there is one thread, or when it is one of
    the pool's); the first exception raised is raised here, after every call has ended.

    The caller takes items too, and a helper that has not started when the items run out is
    called off: work the pool took before (the next pieces parsed, a reader's next bytes) never
    holds up the caller's, which would wait behind it in the pool's queue (2M CSV rows on 2
    threads of the 16-core Xeon: 1.13x; the same on 16 threads and on a 2-core machine)."""
    items = list(items)
    if threads() == 1 or len(items) < 2 or in_pool():
        return [function(item) for item in items]
    outcomes: list[Any] = [None] * len(items)
    taken = itertools.count()  # one item each (``next`` is atomic)

    def work() -> None:
        while (index := next(taken)) < len(items):
            try:
                outcomes[index] = (function(items[index]), None)
            except Exception as error:  # noqa: BLE001 - raised by the caller, after every call has ended
                outcomes[index] = (None, error)

    helpers = [pool().submit(work) for _ in range(min(threads(), len(items)) - 1)]
    work()
    for helper in helpers:
        if not helper.cancel():
            helper.result()
    for _, error in outcomes:
        if error is not None:
            raise error
    return [value for value, _ in outcomes]


def submit(function: Callable[..., R], *args: Any) -> Future[R]:
    """``function(*args)`` in the pool (a Future); run at once in the calling thread when there is
    one thread."""
    if threads() > 1:
        return pool().submit(function, *args)
    future: Future[R] = Future()
    try:
        future.set_result(function(*args))
    except Exception as error:  # noqa: BLE001 - raised by the Future's result(), as the pool's would be
        future.set_exception(error)
    return future


def in_order(function: Callable[[T], R], items: Iterable[T], ahead: int | None = None) -> Iterator[R]:
    """``function(item)`` of each item, in order, the calls run in the pool at most ``ahead``
    (default :func:`threads`) ahead of the one the caller is given."""
    pending: deque[Future[R]] = deque()
    ahead = threads() if ahead is None else ahead
    for item in items:
        pending.append(submit(function, item))
        if len(pending) > ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _all_ended(futures: list[Future[Any]]) -> list[Future[Any]]:
    for future in futures:
        future.exception()  # waits; the exception (if any) is raised by result() afterwards
    return futures


class Background:
    """One thread that runs tasks in the order they are given (a store's sequential writes),
    beside the work that produces the next ones. ``submit`` returns a Future; ``wait`` ends when
    every task given so far has, raising the first failure."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="des-data-write") if threads() > 1 else None
        self._pending: list[Future[Any]] = []

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._executor is None:
            future: Future[Any] = Future()
            future.set_result(function(*args))
            return future
        future = self._executor.submit(function, *args)
        self._pending.append(future)
        return future

    def wait(self) -> None:
        pending, self._pending = self._pending, []
        for future in _all_ended(pending):
            future.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
