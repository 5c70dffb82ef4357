"""Collectives: the :class:`Communicator` and the abort-on-error entry point runner."""

from des.collectives.communicator import CallStats, Communicator
from des.collectives.failure import describe_processes, install_abort_hook, report_and_abort, run_main

__all__ = ["CallStats", "Communicator", "describe_processes", "install_abort_hook", "report_and_abort", "run_main"]
