"""The files of a stream (``des.train --stream``), in name order.

A stream is a directory whose files arrive over time (hourly or daily CTR logs), or a list of
files; names sort in time order (``day-00.csv``, ``2026-11-28T10.tsv.gz``). A file is read only once
it is complete, so a producer writes it under a temporary name and renames it into the directory
(a rename is atomic within a file system): names starting with ``.`` or ending with ``.tmp`` are
never listed, and neither are sub-directories.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from .errors import DataError

TRAIN_ALL: tuple[float, float, float] = (1.0, 0.0, 0.0)  # a stream file's rows are all training rows


def incomplete(name: str) -> bool:
    """A name a producer is still writing under (or a hidden file)."""
    return name.startswith(".") or name.endswith(".tmp")


def list_stream(spec: str, pattern: str = "*", *, follow: bool = False) -> list[dict[str, str]]:
    """``[{"name", "path"}]`` of the stream's complete files in name order: a directory's regular
    files matching ``pattern``, or the comma-separated files of ``spec``. Empty when a directory
    has none yet; a one-line DataError for a missing path, a list with ``follow`` (only a
    directory gets new files) or two files of one name (a checkpoint names files by name)."""
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if len(items) == 1 and os.path.isdir(os.path.expanduser(items[0])):
        folder = Path(os.path.expanduser(items[0]))
        try:
            entries = [entry for entry in os.scandir(folder) if entry.is_file()]
        except OSError as exc:
            raise DataError(f"--stream {folder}: cannot be listed ({exc.strerror})") from None
        files = [{"name": e.name, "path": e.path} for e in entries
                 if not incomplete(e.name) and fnmatch.fnmatchcase(e.name, pattern)]
    else:
        if follow:
            raise DataError(f"--follow needs --stream to be a directory, not {spec!r}")
        files = []
        for item in items:
            path = Path(os.path.expanduser(item))
            if not path.is_file():
                raise DataError(f"--stream: {item}: no such file")
            files.append({"name": path.name, "path": str(path)})
    files.sort(key=lambda f: (f["name"], f["path"]))
    names = [f["name"] for f in files]
    twice = next((name for name, after in zip(names, names[1:]) if name == after), None)
    if twice is not None:
        raise DataError(f"--stream: two files are named {twice} (a stream's files are known by name)")
    return files


def first_listing(spec: str, pattern: str, follow: bool) -> list[dict[str, str]]:
    """:func:`list_stream`, which must find a file: a job starts on the stream's first file."""
    if not spec or not os.path.exists(os.path.expanduser(spec.split(",")[0].strip())):
        raise DataError(f"--stream {spec}: no such file or directory")
    files = list_stream(spec, pattern, follow=follow)
    if not files:
        raise DataError(f"--stream {spec}: no file matches {pattern!r} (names starting with '.' or ending "
                        "'.tmp' are skipped: a file still being written)")
    return files
