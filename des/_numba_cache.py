"""Invalidate a package's numba on-disk cache when any of the package's sources changes.

numba's ``cache=True`` keys a function's cache on *its own* source file only. A kernel that calls
or inlines a function of another module (``des/hashtable``: ``gather_rows`` inlines
``init.init_row``, the index and the initial values inline ``des/splitmix.py``; ``des/data``: the
TSV parser inlines the key transform of ``keys.py``, the split, key and synthetic kernels
``des/splitmix.py``; both read arrays by address through ``des/_views.py``) or reads a global of
another module (frozen into the compiled code) keeps
running the old code after that module changed, e.g. after a ``git pull`` into an editable
install. So at import, before any kernel is loaded, :func:`guard` compares a digest of all
``*.py`` files of the package directory and of the modules of ``des/`` every package's kernels
inline (:data:`SHARED_SOURCES`) with a stamp file next to the cache files, and on mismatch removes
the package's ``*.nbi``/``*.nbc`` files and writes the new stamp.

The cache directories checked are the ones numba may use for the package: ``__pycache__`` next
to the sources, ``$NUMBA_CACHE_DIR/<dir>_<hash>`` if set, and the user-wide
``~/.cache/numba/<dir>_<hash>`` (used when the source tree is not writable). Best effort: any
OSError (read-only tree, a concurrent process doing the same) is ignored; numba treats a missing
cache file as a miss and writes its own files atomically.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os

__all__ = ["guard", "source_digest", "cache_dirs", "SHARED_SOURCES"]

#: modules next to the guarded packages (in ``des/``) whose numba functions their kernels inline
SHARED_SOURCES = ("splitmix.py", "_views.py")


def source_digest(package_dir: str) -> str:
    """sha256 over the names and bytes of every ``*.py`` file directly in ``package_dir``, then of
    the :data:`SHARED_SOURCES` in its parent directory."""
    h = hashlib.sha256()
    shared = [os.path.join(os.path.dirname(os.path.abspath(package_dir)), name) for name in SHARED_SOURCES]
    for path in sorted(glob.glob(os.path.join(package_dir, "*.py"))) + [p for p in shared if os.path.isfile(p)]:
        name = os.path.basename(path) if path not in shared else "../" + os.path.basename(path)
        with open(path, "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def cache_dirs(package_dir: str) -> list[str]:
    """The directories where numba may keep the cache files of ``package_dir``'s modules."""
    dirs = [os.path.join(package_dir, "__pycache__")]
    try:  # private numba API (stable since 0.4x); the in-tree directory is the default anyway
        from numba.core import caching, config
        from numba.misc.appdirs import AppDirs

        sub = caching._CacheLocator.get_suitable_cache_subpath(os.path.join(package_dir, "__init__.py"))
        if config.CACHE_DIR:
            dirs.append(os.path.join(config.CACHE_DIR, sub))
        user_wide = os.path.join(AppDirs(appname="numba", appauthor=False).user_cache_dir, sub)
        if os.path.isdir(user_wide):
            dirs.append(user_wide)
    except Exception:
        pass
    return dirs


def guard(package_dir: str, stamp_name: str) -> bool:
    """Remove stale numba cache files of the package in ``package_dir``; True if any dir was reset.

    ``stamp_name`` is the file (in each cache directory) that records the digest of the sources
    the cached kernels were compiled from.
    """
    package_dir = os.path.dirname(os.path.abspath(os.path.join(package_dir, "__init__.py")))
    try:
        digest = source_digest(package_dir)
    except OSError:
        return False
    modules = [os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(package_dir, "*.py"))]
    reset = False
    for d in cache_dirs(package_dir):
        stamp = os.path.join(d, stamp_name)
        try:
            with open(stamp) as f:
                if f.read().strip() == digest:
                    continue
        except OSError:
            pass
        try:
            for m in modules:
                for pattern in (f"{glob.escape(m)}.*.nbi", f"{glob.escape(m)}.*.nbc"):
                    for p in glob.glob(os.path.join(glob.escape(d), pattern)):
                        with contextlib.suppress(FileNotFoundError):  # another process was faster
                            os.unlink(p)
            os.makedirs(d, exist_ok=True)
            tmp = f"{stamp}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(digest + "\n")
            os.replace(tmp, stamp)
            reset = True
        except OSError:
            pass
    return reset
