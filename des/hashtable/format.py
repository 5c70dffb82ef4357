"""The on-disk format of one embedding table (one field), version 1. No pickle anywhere.

A table file is an *uncompressed* ``.npz`` archive (a zip of ``.npy`` arrays, as written by
``numpy.savez`` and read with ``numpy.load(..., allow_pickle=False)``) holding:

``header``                 uint8 array: UTF-8 JSON, see below
``keys``                   int64   [n]   live keys, in row order
``count``                  int32   [n]   occurrences seen at ``lookup(insert=True)`` (saturating);
                                         absent when ``counters`` is false
``last_seen``              int32   [n]   step of the last ``lookup(insert=True)``; likewise
``block.<i>.values``       float   [n, dim_i]   values of block ``i`` (blocks in header order);
                                                absent where they are computed from the slots
                                                (``BlockSpec.computed``: FTRL with ``store_w`` 0
                                                on a zeros-initialized block holds z and n only)
``block.<i>.slot.<name>``  float   [n, dim_i]   optimizer slots (``m``, ``v``, ``accumulator``,
                                                ``z``, ``n``), same dtype as the values; a
                                                row-wise slot ``[n, 1]``
``block.<i>.steps``        int32   [n]   Adam's per-row step count (only for Adam blocks)
``pending.keys``           int64   [p]   keys counted below ``min_count``, which have no row (by key);
                                         absent when there are none
``pending.counts``         int32   [p]   their counts, each in [1, min_count)

(A row is admitted, i.e. trained, iff ``count >= min_count``; every row of a file without counters.)

The header is a JSON object::

    {"format": "des.hashtable", "version": 1, "field": int, "seed": int, "dtype": "float32",
     "table_dtype": "float32"|"float64"|"bfloat16",
     "min_count": int, "unadmitted": "init"|"zero"|"shared", "counters": bool, "max_load": float, "n_rows": n,
     "n_pending": p, "evicted_count": int, "admitted_total": int, "last_update_step": int|null,
     "blocks": [{"name": str, "dim": int, "optimizer": {...}, "init": {...}}, ...],
     "arrays": {name: {"dtype": numpy dtype str, "shape": [...]}, ...},
     "sha256": hex digest of the payload}

``admitted_total`` (admissions ever made) was added without a version change: readers ignore
header entries they do not know, and a file without it loads with the number of admitted rows.
``table_dtype`` (how values and slots are stored: bfloat16 as ``uint16`` bits) likewise: a file
without it stores them in ``dtype``. ``counters`` too: a file without it holds ``count`` and
``last_seen``. ``n_pending`` and the ``pending.*`` arrays too: a file without them has no pending
keys, and a row of it counted below ``min_count`` loads as a pending key (``persistence.py``).
FTRL's ``store_w`` too: an FTRL block of a file without it stores its values (``optimizer_from_dict``'s
``saved``), as every file did before.

The payload digest is SHA-256 over the arrays in sorted name order, each contributing
``name NUL dtype.str NUL json(shape) NUL`` followed by its C-order bytes. Files are written to a
temporary name in the same directory, fsynced and renamed over the target (``os.replace``), so a
reader sees either the old or the new file, never a partial one. Any unreadable, truncated,
corrupt or inconsistent file raises :class:`TableFormatError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from typing import Any, Mapping

import numpy as np

FORMAT_NAME = "des.hashtable"
FORMAT_VERSION = 1
_HASH_CHUNK_BYTES = 64 << 20


class TableFormatError(ValueError):
    """A table file is unreadable, truncated, corrupt, of another format version or inconsistent."""


def payload_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of the payload arrays (see the module docstring), hashed in bounded chunks."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}\0{a.dtype.str}\0{json.dumps(list(a.shape))}\0".encode())
        if a.size == 0:
            continue
        flat_rows = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(-1, 1)
        step = max(1, _HASH_CHUNK_BYTES // max(1, flat_rows.shape[1] * a.itemsize))
        for i in range(0, flat_rows.shape[0], step):
            h.update(np.ascontiguousarray(flat_rows[i:i + step]).data)
    return h.hexdigest()


def write_table_file(path: str | os.PathLike, header: dict[str, Any],
                     arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``header`` + ``arrays`` to ``path`` atomically (temp file, fsync, os.replace)."""
    path = os.fspath(path)
    header = dict(header)
    header["format"] = FORMAT_NAME
    header["version"] = FORMAT_VERSION
    header["arrays"] = {k: {"dtype": v.dtype.str, "shape": list(v.shape)} for k, v in arrays.items()}
    header["sha256"] = payload_digest(arrays)
    blob = np.frombuffer(json.dumps(header, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:  # a file object: np.savez must not append ".npz" to the name
            np.savez(f, header=blob, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename durable; best effort (not every filesystem allows opening a directory)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def read_table_file(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and verify a table file. Returns ``(header, arrays)``.

    Raises ``FileNotFoundError`` if the file does not exist and :class:`TableFormatError` for
    anything else that is wrong with it (message: ``"<path>: <what>"``, one line).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such table file")

    def fail(what: str) -> TableFormatError:
        return TableFormatError(f"{path}: {what}".replace("\n", " "))

    try:
        with np.load(path, allow_pickle=False) as npz:
            names = set(npz.files)
            if "header" not in names:
                raise fail("not a des.hashtable file (no header entry)")
            header = json.loads(npz["header"].tobytes().decode("utf-8"))
            if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
                raise fail("not a des.hashtable file (wrong format name)")
            if header.get("version") != FORMAT_VERSION:
                raise fail(f"unsupported format version {header.get('version')!r} "
                           f"(this code reads version {FORMAT_VERSION})")
            declared = header.get("arrays")
            if not isinstance(declared, dict) or set(declared) != names - {"header"}:
                raise fail("array list does not match the header")
            arrays = {}
            for name in sorted(declared):
                a = npz[name]
                spec = declared[name]
                if a.dtype.str != spec.get("dtype") or list(a.shape) != spec.get("shape"):
                    raise fail(f"array {name!r} is {a.dtype.str}{list(a.shape)}, header says "
                               f"{spec.get('dtype')}{spec.get('shape')}")
                arrays[name] = a
    except TableFormatError:
        raise
    except zipfile.BadZipFile as e:
        msg = str(e)
        kind = "checksum error" if "CRC" in msg else "corrupt or truncated archive"
        raise fail(f"{kind} ({msg})") from e
    except (ValueError, KeyError, EOFError, OSError, UnicodeDecodeError, json.JSONDecodeError,
            AttributeError, TypeError) as e:
        raise fail(f"corrupt or truncated file ({type(e).__name__}: {e})") from e
    digest = payload_digest(arrays)
    if digest != header.get("sha256"):
        raise fail(f"checksum error: payload sha256 {digest[:16]}... does not match the header")
    return header, arrays
