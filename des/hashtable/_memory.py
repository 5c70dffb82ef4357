"""Row arrays that grow without moving, and fresh memory that is committed in bulk.

A plain array grows as a fresh buffer 1.15x larger and a copy of the live rows. The first touch of
fresh pages costs far more than the copy (page faults run an order of magnitude slower than
re-writing touched memory, on VMs most of all), and each row would be copied ~7 times over the
table's growth: most of the insert time would go there.

So a large row array is a view of a private anonymous mapping that reserves ``RESERVE`` times the
rows asked for: reserved address space costs no memory (``MAP_NORESERVE``; pages are committed
when touched), so growing inside the reservation moves nothing, and only outgrowing it copies (on
average ``1 / (RESERVE - 1)`` copies per row). New rows are committed with one
``madvise(MADV_POPULATE_WRITE)`` per growth step (Linux >= 5.14), which fills the page tables in
bulk (several times faster than faulting page by page), and ``MADV_HUGEPAGE`` asks for
transparent huge pages (random row access misses the TLB less). Where any of this is unavailable
(another OS, an address-space limit) the arrays are plain numpy arrays of exactly the rows asked
for and every growth copies: slower, same results.

Committing is the kernel zeroing fresh pages: on a VM about a third of inserting a new key. :func:`commit_ahead` starts the next growth step's commit on a background
thread right after a growth, so it runs while the table fills the rows it has (on a free core,
or interleaved with the inserting thread); the next growth waits for it and finds the pages in
place. The resident memory then runs up to one growth step ahead of the row capacity.

A mapping is unmapped when its last numpy view dies (the mmap object is the views' base), so a
stale view can never point into freed memory.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

RESERVE = 8  # rows reserved per row asked for, when a reservation is (re)made
_MIN_MAPPED_BYTES = 1 << 21  # smaller arrays come from numpy's allocator (one 2 MiB huge page)
_LINUX = sys.platform.startswith("linux")
_MAP_NORESERVE = 0x4000  # Linux value; not exported by Python's mmap module before 3.13
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_PAGE = mmap.PAGESIZE
_COMMIT_CHUNK = 64 << 20  # bytes per background madvise call
_committer: ThreadPoolExecutor | None = None
_committer_lock = threading.Lock()
# madvise through ctypes: it releases the GIL (mmap.madvise does not), and committing a growth step
# can take a second, e.g. in a lookup on a background thread
_LIBC = ctypes.CDLL(None, use_errno=True) if _LINUX else None
if _LIBC is not None:
    _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _mapping(nbytes: int, reserve: bool) -> mmap.mmap | None:
    """A private anonymous read-write mapping of ``nbytes`` (zero-filled, uncommitted), or None."""
    if not _LINUX or nbytes < _MIN_MAPPED_BYTES:
        return None
    flags = mmap.MAP_PRIVATE | (_MAP_NORESERVE if reserve else 0)
    try:
        m = mmap.mmap(-1, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError, OverflowError):
        return None
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):
        pass
    return m


def _populate(a: np.ndarray, m: mmap.mmap, start: int, stop: int) -> None:
    """Commit bytes ``[start, stop)`` of mapping ``m``, which starts at ``a``'s first byte, in one
    call (best effort: an old kernel refuses it, and the pages fault in when first written)."""
    start -= start % _PAGE
    stop = min(len(m), -(-stop // _PAGE) * _PAGE)
    if stop > start and _LIBC is not None:
        _LIBC.madvise(a.ctypes.data + start, stop - start, _MADV_POPULATE_WRITE)


def _owner(a: np.ndarray) -> mmap.mmap | None:
    """The mapping under an array made by :func:`row_array` (numpy's base chain ends in a memoryview of it)."""
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def row_array(rows: int, tail: tuple[int, ...], dtype: np.dtype | type, *, reserve: bool) -> np.ndarray:
    """A zero-filled ``[R, *tail]`` array, ``R >= rows``, of which rows ``[0, rows)`` are committed.

    ``reserve``: make ``R = RESERVE * rows`` when the array is mapped (address space only), so that
    :func:`grow_in_place` can extend it; otherwise ``R = rows``.
    """
    dtype = np.dtype(dtype)
    row_bytes = dtype.itemsize * int(np.prod(tail, dtype=np.int64))
    reserved = max(1, rows) * (RESERVE if reserve else 1)
    m = _mapping(reserved * row_bytes, reserve)
    if m is None:
        return np.zeros((rows, *tail), dtype=dtype)
    a = np.frombuffer(m, dtype=dtype, count=reserved * row_bytes // dtype.itemsize).reshape(reserved, *tail)
    _populate(a, m, 0, rows * row_bytes)
    return a


def grow_in_place(a: np.ndarray, committed: int, rows: int) -> bool:
    """Make rows ``[committed, rows)`` of ``a`` (an array from :func:`row_array`, whole) usable
    without moving it; False if ``a`` has fewer than ``rows`` rows (then the caller allocates and
    copies). Commits them when ``a`` is mapped."""
    if rows > a.shape[0]:
        return False
    m = _owner(a)
    if m is not None and rows > committed:
        row_bytes = a.strides[0]
        _populate(a, m, committed * row_bytes, rows * row_bytes)
    return True


def commit_ahead(arrays: list[np.ndarray], committed: int, rows: int) -> Future | None:
    """Commit rows ``[committed, rows)`` of each of ``arrays`` (whole arrays from :func:`row_array`)
    on a background thread; None when there is nothing to do (no mapped array has those rows).
    The caller waits for the future before it grows into, or replaces, these arrays. The closure
    holds the arrays, so their mappings outlive the commit whatever the table does meanwhile."""
    global _committer
    jobs = [(a, m) for a in arrays if rows <= a.shape[0] and rows > committed and (m := _owner(a)) is not None]
    if not jobs:
        return None

    def commit() -> None:
        # in chunks: a commit holds the process's memory-map lock (shared), which a new mapping
        # (the table growing its index meanwhile) waits for
        for a, m in jobs:
            for start in range(committed * a.strides[0], rows * a.strides[0], _COMMIT_CHUNK):
                _populate(a, m, start, min(start + _COMMIT_CHUNK, rows * a.strides[0]))

    with _committer_lock:
        if _committer is None:  # one thread: commits run in order, never on the tables' pool
            _committer = ThreadPoolExecutor(1, thread_name_prefix="des-commit")
    return _committer.submit(commit)
