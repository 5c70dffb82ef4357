"""User-facing errors.

Every error a user can cause (a bad flag, a missing file, a malformed row, a corrupt checkpoint, more
ranks than fields) is raised as a :class:`DesError` whose message is one line naming what and where.
Entry points print such errors as ``des: error: <message>`` with no traceback; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse


class DesError(Exception):
    """An error caused by the user's input or configuration; its message is one line."""


class ConfigError(DesError):
    """A wrong flag, config value or combination of them."""


class PlacementError(ConfigError):
    """Fields cannot be placed on the ranks (e.g. more ranks than fields)."""


class UsageError(ConfigError):
    """A bad command line or config file: every rank parses the same input and fails the same
    way, so only rank 0 reports it (one line instead of one per rank, or a usage text per rank)."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` for entry points that run on many ranks: a bad flag raises
    :class:`UsageError` (one line, "see --help") instead of printing the usage text on every rank."""

    def error(self, message: str):  # noqa: ANN201 - argparse's signature
        raise UsageError(f"{message} (see --help)")
