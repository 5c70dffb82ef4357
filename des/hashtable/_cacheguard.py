"""Invalidate this package's numba on-disk cache when any of its sources changes.

numba's ``cache=True`` keys a function's cache on *its own* source file only; a kernel that
inlines a helper from another module (``gather_rows`` inlines ``init.init_row``, every kernel
inlines ``splitmix64``) would keep running the old helper after that module changed. So at
import, a digest of all ``des/hashtable/*.py`` files is compared with a stamp next to the cache
files, and on mismatch this package's ``*.nbi``/``*.nbc`` files are removed. Best effort: any
OSError (read-only tree, a concurrent rank doing the same) is ignored; numba treats a missing
cache file as a miss and writes its own files atomically.
"""

from __future__ import annotations

import glob
import hashlib
import os

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_STAMP = "des_hashtable_sources.sha256"


def _cache_dirs() -> list[str]:
    dirs = [os.path.join(_PKG_DIR, "__pycache__")]
    try:
        from numba.core import caching, config

        if config.CACHE_DIR:
            sub = caching._CacheLocator.get_suitable_cache_subpath(os.path.join(_PKG_DIR, "table.py"))
            dirs.append(os.path.join(config.CACHE_DIR, sub))
    except Exception:  # private numba API; the in-tree directory is the default anyway
        pass
    return dirs


def check() -> None:
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(_PKG_DIR, "*.py"))):
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    digest = h.hexdigest()
    modules = [os.path.splitext(os.path.basename(p))[0]
               for p in glob.glob(os.path.join(_PKG_DIR, "*.py"))]
    for d in _cache_dirs():
        stamp = os.path.join(d, _STAMP)
        try:
            with open(stamp) as f:
                if f.read().strip() == digest:
                    continue
        except OSError:
            pass
        try:
            for m in modules:
                for pattern in (f"{m}.*.nbi", f"{m}.*.nbc"):
                    for p in glob.glob(os.path.join(d, pattern)):
                        os.unlink(p)
            os.makedirs(d, exist_ok=True)
            tmp = f"{stamp}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(digest + "\n")
            os.replace(tmp, stamp)
        except OSError:
            pass
