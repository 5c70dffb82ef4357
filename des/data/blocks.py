"""A raw file's bytes in blocks of whole lines, read ahead and hashed, for readers that parse the
pieces of a block side by side (``tabular.py``'s CSV/TSV reader; ``tsv.py``, Criteo's, cuts its
buffer with :func:`line_pieces` too).

:class:`LineBlocks` reads a file (plain or gzip) in blocks of about ``block_bytes``, each cut after
its last newline (the rest goes to the next block), hashes the bytes as stored
(:func:`file_digest`) and counts them on a progress bar. :func:`line_pieces` cuts whole lines into
pieces, one per thread. A piece's lines are its newlines (a last line may lack one), so the line
number of every row of a piece is known before it is parsed: that is what lets pieces be parsed
apart and still name each bad row's line. A block where a line break could be something else (a quote character, where the
format has one: a quoted value may span lines; a ``\\r`` that does not end a line) is not cut:
:meth:`LineBlocks.rest` gives it and everything after it as one stream for a serial reader.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import threading
import zlib
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from .errors import DataError
from .parallel import threads

UTF8_BOM = b"\xef\xbb\xbf"
_NEWLINE = 10
_MIN_PIECE_BYTES = 1 << 18


#: A file of more bytes than this is identified by the sha256 of its blocks of this many bytes
#: (:func:`combine_digests`), which the ranks of a job take side by side, each its own run of a
#: file's blocks (``des/data/ranks.py``); a smaller one by its sha256, as every file was before. A
#: sha256 runs on one core (0.7-1.3 GB/s): for 20M CSV rows (1.5 GB) on 8 ranks of a 16-core Xeon
#: the one rank that hashed the whole file set the job's time (docs/benchmarks.md, "Data path").
DIGEST_BLOCK = 1 << 26
#: How a file's digest in blocks starts (the hex sha256 over its blocks' digests follows)
BLOCKS_PREFIX = "sha256-blocks-64MiB:"


def in_blocks(size: int) -> bool:
    """Whether a file of ``size`` bytes is identified by its blocks' digests."""
    return size > DIGEST_BLOCK


def block_count(size: int) -> int:
    return -(-size // DIGEST_BLOCK)


def blocks_bytes(size: int, first: int, last: int) -> int:
    """The bytes of a file of ``size`` bytes in its blocks ``first`` to ``last``."""
    return max(min(size, last * DIGEST_BLOCK) - first * DIGEST_BLOCK, 0)


def combine_digests(blocks: list[str]) -> str:
    """A file's digest from its blocks' sha256 (hex, in order): :data:`BLOCKS_PREFIX` and the
    sha256 of their 32-byte digests laid end to end."""
    return BLOCKS_PREFIX + hashlib.sha256(b"".join(bytes.fromhex(block) for block in blocks)).hexdigest()


def digest_tag(digest: str) -> str:
    """The digest's hex (its first 16 characters name cache entries), whatever its kind."""
    return digest.rpartition(":")[2]


def block_digests(path: str | os.PathLike, first: int, last: int, stop: threading.Event | None = None) -> list[str]:
    """The sha256 (hex) of the file's blocks ``first`` to ``last`` (of :data:`DIGEST_BLOCK`
    bytes, the last one shorter); ``stop`` set: given up (``[]``)."""
    digests = []
    with open(path, "rb", buffering=0) as handle:
        for block in range(first, last):
            digest = _sha256_of(handle, block * DIGEST_BLOCK, DIGEST_BLOCK, stop)
            if digest is None:
                return []
            digests.append(digest.hexdigest())
    return digests


def file_digest(path: str | os.PathLike, stop: threading.Event | None = None, like: str | None = None) -> str:
    """The file's identity as a store's manifest records it: its blocks' digest where
    :func:`in_blocks`, else its sha256 (hex). ``like``: a digest recorded before, to compare with:
    the same kind is taken (a store prepared before digests in blocks recorded the sha256 of a
    large file too). ``stop`` set: given up at the next 4 MiB (returns "")."""
    size = os.path.getsize(path)
    blockwise = in_blocks(size) if like is None else like.startswith(BLOCKS_PREFIX)
    if not blockwise:
        with open(path, "rb", buffering=0) as handle:
            digest = _sha256_of(handle, 0, None, stop)
        return "" if digest is None else digest.hexdigest()
    blocks = block_digests(path, 0, block_count(size), stop)
    return combine_digests(blocks) if blocks or size == 0 else ""


def file_sha256(path: str | os.PathLike, stop: threading.Event | None = None) -> str:
    """sha256 (hex) of a file's bytes as stored (``stop``: as :func:`file_digest`)."""
    return file_digest(path, stop, like="")


def _sha256_of(handle: Any, start: int, length: int | None, stop: threading.Event | None) -> Any:
    """The sha256 of ``length`` bytes (None: to the end) of an open file from ``start``, read into
    one reused buffer (beside other work in the process, no new memory per read); None where
    ``stop`` was set at a 4 MiB read."""
    digest = hashlib.sha256()
    buffer = bytearray(1 << 22)
    view = memoryview(buffer)
    handle.seek(start)
    left = length
    while left is None or left > 0:
        read = handle.readinto(view if left is None or left >= len(buffer) else view[:left])
        if not read:
            break
        if stop is not None and stop.is_set():
            return None
        digest.update(view[:read])
        left = None if left is None else left - read
    return digest


class FileDigest:
    """:func:`file_digest` of a file of ``size`` bytes, from its bytes given in order (``update``)."""

    def __init__(self, size: int) -> None:
        self._blocks: list[str] | None = [] if in_blocks(size) else None
        self._digest = hashlib.sha256()
        self._left = DIGEST_BLOCK

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while self._blocks is not None and len(view) >= self._left:
            self._digest.update(view[:self._left])
            view = view[self._left:]
            self._blocks.append(self._digest.hexdigest())
            self._digest, self._left = hashlib.sha256(), DIGEST_BLOCK
        self._digest.update(view)
        self._left -= len(view)

    def hexdigest(self) -> str:
        if self._blocks is None:
            return self._digest.hexdigest()
        return combine_digests(self._blocks + ([self._digest.hexdigest()] if self._left < DIGEST_BLOCK else []))


class HashingReader:
    """A read-only file wrapper that feeds every byte it returns into a :class:`FileDigest` of the
    file (``size`` its bytes; None: not hashed, a share of a file whose digest is taken elsewhere)."""

    def __init__(self, handle: IO[bytes], progress: Any = None, size: int | None = None) -> None:
        self._handle = handle
        self.digest = None if size is None else FileDigest(size)
        self.progress = progress

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        if self.digest is not None:
            self.digest.update(data)
        if self.progress is not None:
            self.progress.update(len(data) / 1e6)
        return data

    def readable(self) -> bool:
        return True

    def finish(self) -> str:
        """Hash the rest of the file (bytes after a gzip stream end) and return its digest."""
        while self.read(1 << 20):
            pass
        return "" if self.digest is None else self.digest.hexdigest()


@dataclass(frozen=True)
class Share:
    """The part of one input that one process reads (``des/data/ranks.py``): the bytes ``start``
    to ``end`` of a plain text file (whole lines, the first of them line ``first_line``), or the
    row groups ``start`` to ``end`` of a Parquet file (the first of them row ``first_line``);
    ``end`` None: the whole file, read as one process reads it (its sha256 taken, an empty file or
    one without a valid row refused). A part's file is checked and hashed whole elsewhere."""

    path: str
    start: int = 0
    end: int | None = None
    first_line: int = 1
    #: the share's lines (a Parquet share's rows) where counted before reading, else None
    lines: int | None = None

    @property
    def whole(self) -> bool:
        return self.end is None


class RangeReader:
    """A read-only stream of the bytes ``start`` to ``end`` of an open file."""

    def __init__(self, handle: IO[bytes], start: int, end: int) -> None:
        self._handle = handle
        self._handle.seek(start)
        self._left = end - start

    def read(self, size: int = -1) -> bytes:
        size = self._left if size is None or size < 0 else min(size, self._left)
        data = self._handle.read(size)
        self._left -= len(data)
        return data

    def readable(self) -> bool:
        return True


@dataclass
class Block:
    """Whole lines of a file: ``data`` starts at line ``first_line`` (1-based); ``pieces`` its
    parts of whole lines ``(first line, bytes)``, one per thread, when it may be cut (its line
    breaks are newlines only), else None. Both are views of one buffer (nothing copied)."""

    data: memoryview
    first_line: int
    pieces: list[tuple[int, memoryview]] | None


def piece_count(size: int) -> int:
    """How many pieces Criteo's reader cuts ``size`` bytes of whole lines into for :func:`threads`
    threads: two a thread while a piece keeps 256 KiB or more, else one a thread. The pool that
    parses them also reads the next bytes ahead; with more pieces than threads, the threads that do
    not read take the pieces of the one that does (2M rows on 2 threads: 1.08x, faster in 10 of 11
    alternating runs). The CSV reader keeps one a thread: its pieces become its chunks, and smaller
    chunks made it slower (0.89x)."""
    count = threads()
    return count if count == 1 else max(count, min(2 * count, size // _MIN_PIECE_BYTES))


def line_pieces(buf: bytes | bytearray, start: int, end: int, count: int) -> tuple[list[int], list[int]]:
    """``buf[start:end]`` (whole lines) cut into at most ``count`` pieces of whole lines of about
    equal size: the cuts (``start``, ..., ``end``) and the lines of each piece (the last line may
    lack its newline: the end of the file)."""
    cuts = [start]
    for k in range(1, count):
        cut = buf.find(b"\n", max(cuts[-1], start + (end - start) * k // count), end) + 1
        if cut <= cuts[-1] or cut >= end:
            break
        cuts.append(cut)
    cuts.append(end)
    data = np.frombuffer(buf, dtype=np.uint8)  # counted by a vector compare: 3x ``bytes.count``
    lines = [int(np.count_nonzero(data[a:b] == _NEWLINE)) for a, b in zip(cuts, cuts[1:])]
    del data  # a bytearray may grow again once no view of it is left
    if end > start and buf[end - 1] != _NEWLINE:
        lines[-1] += 1
    return cuts, lines


def _only_newlines(buf: bytearray, end: int) -> bool:
    """True if every line break of ``buf[:end]`` is a newline (a ``\\r`` only before one)."""
    return buf.find(b"\r", 0, end) < 0 or buf.count(b"\r", 0, end) == buf.count(b"\r\n", 0, end)


class LineBlocks:
    """The blocks of whole lines of one file (see the module docstring); ``quote``: the format's
    quote character (None: none). ``digest()`` after the last block: the file's :func:`file_digest`
    (a share's bytes are not hashed). Read errors of a gzip file are DataErrors naming the file and
    the line reached."""

    def __init__(self, path: str, block_bytes: int, quote: str | None, progress: Any = None,
                 share: Share | None = None) -> None:
        self.path = path
        self.block_bytes = int(block_bytes)
        self.quote = quote.encode() if quote else None
        self._handle = open(path, "rb")
        self.is_gzip = share is None and self._handle.read(2) == b"\x1f\x8b"
        self._handle.seek(0)
        whole = share is None or share.whole
        part = self._handle if whole else RangeReader(self._handle, share.start, share.end)  # type: ignore[union-attr]
        size = os.fstat(self._handle.fileno()).st_size if whole else None
        self._hashing = HashingReader(part, progress, size)  # type: ignore[arg-type]
        self._stream: IO[bytes] = (gzip.GzipFile(fileobj=self._hashing, mode="rb") if self.is_gzip  # type: ignore[arg-type]
                                   else self._hashing)  # type: ignore[assignment]
        self._pending = b""
        self._started = share is not None and share.start > 0  # a UTF-8 BOM only at the file's start
        self.next_line = 1 if share is None else share.first_line
        self.at_end = False

    def close(self) -> None:
        self._handle.close()

    def digest(self) -> str:
        """The file's :func:`file_digest` (a share's: "")."""
        return self._hashing.finish()

    def _read(self) -> bytes:
        try:
            data = self._stream.read(self.block_bytes)
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as error:
            where = f"after line {self.next_line - 1}" if self.next_line > 1 else "before its first rows could be read"
            raise DataError(f"{self.path}: truncated or corrupt gzip data {where} ({error})") from None
        if not self._started:
            self._started = True
            if data.startswith(UTF8_BOM):  # as pyarrow's reader, which skips it
                data = data[len(UTF8_BOM):]
        return data

    def skip_header(self) -> bool:
        """Drop the first line (a header) if it ends with a newline within the first block and
        holds no other line break (False, and nothing dropped, otherwise)."""
        self._pending = self.read_more()
        end = self._pending.find(b"\n")
        if end < 0 or b"\r" in self._pending[:end].rstrip(b"\r"):
            return False
        self._pending = self._pending[end + 1:]
        self.next_line += 1
        return True

    def next(self, pieces: int = 1) -> Block | None:
        """The next block (None at the end of the file), cut into ``pieces`` when it may be."""
        buf = bytearray(self._pending)
        while True:
            buf += self.read_more()
            cut = len(buf) if self.at_end else buf.rfind(b"\n") + 1
            if cut > 0 or self.at_end:
                break
        self._pending = bytes(buf[cut:])  # a line's start, for the next block
        if cut == 0:
            return None
        first, view = self.next_line, memoryview(buf)[:cut]
        if (self.quote is not None and buf.find(self.quote, 0, cut) >= 0) or not _only_newlines(buf, cut):
            self.next_line += sum(line_pieces(buf, 0, cut, 1)[1])  # not cut: the rest is a serial reader's
            return Block(view, first, None)
        cuts, lines = line_pieces(buf, 0, cut, pieces)
        parts = []
        for a, b, count in zip(cuts, cuts[1:], lines):
            parts.append((self.next_line, view[a:b]))
            self.next_line += count
        return Block(view, first, parts)

    def rest(self, blocks: list[Block]) -> _Rest:
        """A read-only stream of ``blocks`` (not parsed yet, in order) and every byte after them."""
        return _Rest([bytes(block.data) for block in blocks] + [self._pending], self)

    def read_more(self) -> bytes:
        """The next bytes of the file after what was read (b"" at its end)."""
        data = b"" if self.at_end else self._read()
        self.at_end = not data
        return data


class _Rest:
    """A file-like stream (``read``) of some bytes, then the rest of a :class:`LineBlocks`' file."""

    def __init__(self, parts: list[bytes], blocks: LineBlocks) -> None:
        self._parts = [part for part in parts if part]
        self._blocks = blocks
        self._buffer = b""
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        while not self._buffer and (self._parts or not self._blocks.at_end):
            self._buffer = self._parts.pop(0) if self._parts else self._blocks.read_more()
        if size is None or size < 0:
            size = len(self._buffer)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True
