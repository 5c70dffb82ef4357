"""The one exception type of the data pipeline."""

from __future__ import annotations

from des.errors import DesError


class DataError(DesError):
    """A problem with input data, a prepared store or a data option.

    The message is one line meant for the user (it names the file and, where there is one, the
    line and column); the CLI prints it as ``des.data: error: <message>``.
    """
