"""Fail loudly, never hang: an error on any rank ends the whole MPI job with its message.

Without this, a rank that raises leaves its peers blocked in the next collective forever. Entry
points run through :func:`run_main`; user scripts can call :func:`install_abort_hook` instead.
A :class:`des.errors.DesError` is printed as one line (``[rank R] prog: error: message``) by the
first rank that fails (the others stay quiet); anything else is a bug and keeps its traceback.

Shared memory: MPICH (ch4, the ``mpich`` wheel) keeps the ranks of a node in one POSIX segment,
``/dev/shm/mpich_shm_<world id>_<node id>``, mapped by every rank during ``MPI_Init`` and unlinked
only by ``MPI_Finalize``. A job that ends through ``MPI_Abort`` or a killed rank (the launcher
SIGKILLs the others, no handler runs) would leave it behind. :func:`run_main` therefore unlinks the
segment's *name* as soon as every rank of the node has mapped it (the standard "unlink after
attach" idiom: the mappings stay valid, the memory is freed when the last rank exits, however it
exits), and the abort path unlinks whatever this rank still has mapped under a name.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from mpi4py import MPI

from des.errors import DesError, UsageError

_ABORT_GRACE_SECONDS = 1.0
_USAGE_ERROR_WAIT_SECONDS = 30.0
_ABORT_WATCHDOG_SECONDS = 10.0
_SHM_DIR = "/dev/shm/"
_SHM_PREFIXES = ("mpich_", "des-")  # mpich_shm_* (the node slab), mpich_vci_* (extra VCIs, if any) and
# des-* (des/collectives/node_memory.py, only where /proc is closed to it: unlinked once mapped)
_first_failure_fd: int | None = None  # a tiny file shared by the ranks of a node (see _claim_report)
_processes: list[tuple[str, int]] = []  # (host, pid) of every rank, gathered by prepare_job


def describe_processes() -> str:
    """``rank: host pid`` of every rank (empty on one rank): when a rank is killed, the launcher
    names only its pid, and every other rank is killed at once without a word."""
    if not _processes:
        return ""
    return "  processes: " + ", ".join(f"rank {r} pid {pid} on {host}" for r, (host, pid) in enumerate(_processes))


def mapped_shm_segments(include_unlinked: bool = False) -> list[str]:
    """The MPICH shared-memory segments this process has mapped whose names still exist (or all of
    them, with ``include_unlinked``)."""
    found = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if path.startswith(_SHM_DIR) and path[len(_SHM_DIR):].startswith(_SHM_PREFIXES):
                    if not path.endswith(" (deleted)"):
                        found.add(path)
                    elif include_unlinked:
                        found.add(path.removesuffix(" (deleted)"))
    except OSError:  # not Linux: nothing we can see or clean
        pass
    return sorted(found)


def _unlink_quietly(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass  # already gone (another rank of the node was first)


def prepare_job() -> None:
    """Collective over the world, once at start-up (:func:`run_main` calls it). Unlinks the names
    of the node's MPICH segments once every rank of the node has them mapped, and opens the
    node's first-failure file; afterwards no way out of the job, including SIGKILL, leaves
    anything in ``/dev/shm``."""
    global _first_failure_fd, _processes
    world = MPI.COMM_WORLD
    if world.Get_size() == 1:
        return
    _processes = world.allgather((socket.gethostname(), os.getpid()))
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        mapped = node.allgather(mapped_shm_segments())
        # After the allgather every rank of the node has mapped these: nobody opens them by name.
        common = set(mapped[0]).intersection(*map(set, mapped[1:]))
        name = None
        if node.Get_rank() == 0:
            _unlink_quietly(sorted(common))
            try:
                fd, name = tempfile.mkstemp(prefix="des-job-", dir=_SHM_DIR if os.path.isdir(_SHM_DIR) else None)
                os.close(fd)
            except OSError:
                pass  # no shared file: every failing rank reports (as before)
        name = node.bcast(name)
        if name is not None:
            _first_failure_fd = os.open(name, os.O_RDWR)
            node.Barrier()
            if node.Get_rank() == 0:
                _unlink_quietly([name])  # the open descriptors keep it alive for the job's lifetime
    finally:
        node.Free()


def _claim_report() -> bool:
    """Is this the first rank (of its node) to report a failure? Later failures are usually
    echoes of the first (peers of a dead rank, the same bad file on every rank): one line per job."""
    if _first_failure_fd is None:
        return True
    try:
        fcntl.flock(_first_failure_fd, fcntl.LOCK_EX)
        try:
            if os.pread(_first_failure_fd, 1, 0):
                return False
            os.pwrite(_first_failure_fd, str(MPI.COMM_WORLD.Get_rank()).encode() + b"\n", 0)
            return True
        finally:
            fcntl.flock(_first_failure_fd, fcntl.LOCK_UN)
    except OSError:
        return True


def _world_size() -> int:
    return MPI.COMM_WORLD.Get_size()


def _prefix() -> str:
    return f"[rank {MPI.COMM_WORLD.Get_rank()}] " if _world_size() > 1 else ""


def report_and_abort(exc: BaseException, prog: str) -> NoReturn:
    """Print ``exc`` (one line for user errors) and end the job on every rank."""
    if isinstance(exc, UsageError) and _world_size() > 1:
        _leave_together(f"{_prefix()}{prog}: error: {exc}")
    if _world_size() > 1 and not _claim_report():
        # Another rank already reported: this one only leaves (see ``_abort``).
        code = 2 if isinstance(exc, DesError) else 1
        _abort(code)
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else 2
        if exc.code is not None and not isinstance(exc.code, int):
            print(f"{_prefix()}{exc.code}", file=sys.stderr)
    elif isinstance(exc, KeyboardInterrupt):
        print(f"{_prefix()}{prog}: interrupted", file=sys.stderr)
        code = 130
    elif isinstance(exc, DesError):
        print(f"{_prefix()}{prog}: error: {exc}", file=sys.stderr)
        code = 2
    else:
        traceback.print_exception(exc, file=sys.stderr)
        print(f"{_prefix()}{prog}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    sys.stderr.flush()
    sys.stdout.flush()
    if _world_size() > 1 and code != 0:
        _abort(code)
    raise SystemExit(code)


def _abort(code: int) -> NoReturn:
    """End the whole job: no shared-memory name left behind, no launcher banner after our line."""
    _unlink_quietly(mapped_shm_segments())  # already done at start-up under run_main
    sys.stderr.flush()
    sys.stdout.flush()
    # MPI_Abort makes the launcher kill every process at once, and what it has not yet
    # forwarded from this rank's stderr pipe is lost (seen: 1 run in 20 printed nothing).
    # A short pause lets the message reach the user first.
    time.sleep(_ABORT_GRACE_SECONDS)
    # MPICH prints a multi-line "Abort(2) on node ..." banner of its own: the line above said it.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    # Watchdog: should MPI_Abort itself hang (a launcher already gone), this rank still ends.
    timer = threading.Timer(_ABORT_WATCHDOG_SECONDS, os._exit, (code,))
    timer.daemon = True
    timer.start()
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)  # not reached


def _leave_together(message: str) -> NoReturn:
    """A :class:`UsageError` comes from parsing the same command line on every rank, before any
    communication: all ranks fail here together. Rank 0 alone prints it (one line, not one per
    rank) and every rank leaves through ``MPI_Finalize`` (no abort banner from the launcher). A
    watchdog ends a rank whose peers never arrive, so even a rank-dependent input cannot hang."""

    def watchdog() -> None:
        print(f"{message} (ranks disagreed; leaving alone)", file=sys.stderr, flush=True)
        os._exit(2)

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(message, file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    timer = threading.Timer(_USAGE_ERROR_WAIT_SECONDS, watchdog)
    timer.daemon = True
    timer.start()
    MPI.Finalize()
    timer.cancel()
    raise SystemExit(2)


def run_main(main: Callable[[], int | None], prog: str) -> NoReturn:
    """Run an entry point; on an exception on any rank, report it and abort the whole job."""
    try:
        prepare_job()
        code = main() or 0
    except SystemExit as exc:  # argparse and explicit exits: fine on one rank, fatal in a job
        if exc.code in (0, None):
            raise
        report_and_abort(exc, prog)
    except BaseException as exc:  # noqa: BLE001 - every failure must end all ranks
        report_and_abort(exc, prog)
    sys.stdout.flush()
    raise SystemExit(code)


def install_abort_hook(prog: str = "des") -> None:
    """Make any uncaught exception abort the whole job (for user scripts and tests)."""

    def hook(exc_type, exc, tb):  # noqa: ANN001 - sys.excepthook signature
        report_and_abort(exc.with_traceback(tb), prog)

    sys.excepthook = hook
