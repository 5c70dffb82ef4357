"""Fail loudly, never hang: an error on any rank ends the whole MPI job with its message.

Without this, a rank that raises leaves its peers blocked in the next collective forever. Entry
points run through :func:`run_main`; user scripts can call :func:`install_abort_hook` instead.
A :class:`des.errors.DesError` is printed as one line (``prog: error: message``); anything else is
a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from mpi4py import MPI

from des.errors import DesError, UsageError

_ABORT_GRACE_SECONDS = 1.0
_USAGE_ERROR_WAIT_SECONDS = 30.0


def _world_size() -> int:
    return MPI.COMM_WORLD.Get_size()


def _prefix() -> str:
    return f"[rank {MPI.COMM_WORLD.Get_rank()}] " if _world_size() > 1 else ""


def report_and_abort(exc: BaseException, prog: str) -> NoReturn:
    """Print ``exc`` (one line for user errors) and end the job on every rank."""
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else 2
        if exc.code is not None and not isinstance(exc.code, int):
            print(f"{_prefix()}{exc.code}", file=sys.stderr)
    elif isinstance(exc, KeyboardInterrupt):
        print(f"{_prefix()}{prog}: interrupted", file=sys.stderr)
        code = 130
    elif isinstance(exc, UsageError) and _world_size() > 1:
        _leave_together(f"{_prefix()}{prog}: error: {exc}")
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
        # MPI_Abort makes the launcher kill every process at once, and what it has not yet
        # forwarded from this rank's stderr pipe is lost (seen: 1 run in 20 printed nothing).
        # A short pause lets the message reach the user first.
        time.sleep(_ABORT_GRACE_SECONDS)
        MPI.COMM_WORLD.Abort(code)
    raise SystemExit(code)


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
