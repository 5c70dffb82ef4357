"""Criteo's reader: raw Criteo TSV files (plain or gzip) as columns, streamed and validated.

Each line is ``label \\t I1..I13 \\t C1..C26`` (40 columns, empty = missing): the ``[format] type =
"criteo"`` of a schema (``schema.py``; the built-in ``criteo``). A numba kernel parses and
validates a block of bytes in one pass into the columns of its rows, which the schema's
transforms then key (``features.encode_rows``): the labels (uint8), ``I1..I13`` as float64 (NaN:
missing; the float64 rounding of the integer, as ``keys.integer_token`` takes it; beyond 2^63,
which no transform tells apart, its float64 approximation) and ``C1..C26`` as int64 values (-1:
missing). It stops at the first bad row (policy ``"fail"``) or counts and skips bad rows
(policy ``"skip"``). A row is valid when it has exactly 40 columns, the label is ``0`` or ``1``,
every integer column is empty or ``[+-]?[0-9]+`` (any size), and every categorical column is
empty or exactly 8 hex digits (either case). A trailing ``\\r`` is ignored; blank lines are bad rows.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numba
import numpy as np

from .blocks import UTF8_BOM, HashingReader, RangeReader, Share, line_pieces, piece_count
from .errors import DataError
from .features import HEX_DIGITS
from .keys import FIELD_NAMES, NUM_FIELDS, NUM_INT_FIELDS
from .parallel import each, submit

NUM_COLUMNS = NUM_FIELDS + 1
COLUMN_NAMES: tuple[str, ...] = ("label", *FIELD_NAMES)
BAD_ROW_POLICIES = ("fail", "skip")
MAX_LINE_BYTES = 1 << 20
FIRST_BAD_LINES_KEPT = 10

_OK, _COLUMNS, _LABEL, _NOT_INT, _NOT_HEX = 0, 1, 2, 3, 4
_INCOMPLETE = -1
_NEWLINE, _TAB, _CR = 10, 9, 13
_EXACT_DIGITS = 18  # up to 18 decimal digits fit an int64 exactly
_INT64_MAX_DIV10, _INT64_MAX_MOD10 = divmod(2**63 - 1, 10)
_HEX_VALUE = HEX_DIGITS  # byte -> hex digit value, -1 if not a hex digit


@numba.njit(cache=True, nogil=True)
def _large_value(buf, start, end, negative):
    """The float64 of a value of more than 18 significant digits ``buf[start:end]`` (no sign, no
    leading zero): exact rounding while it fits an int64, else from its first 18 digits and the
    digit count (infinite beyond float64's range)."""
    m = 0
    for j in range(start, start + _EXACT_DIGITS):
        m = m * 10 + (np.int64(buf[j]) - 48)
    digits = end - start
    if digits == _EXACT_DIGITS + 1:
        last = np.int64(buf[end - 1]) - 48
        if m < _INT64_MAX_DIV10 or (m == _INT64_MAX_DIV10 and last <= _INT64_MAX_MOD10):
            value = float(m * 10 + last)
            return -value if negative else value
    value = float(m) * 10.0 ** (digits - _EXACT_DIGITS)
    return -value if negative else value


@numba.njit(cache=True, inline="always")
def _to_delimiter(buf, i, n):
    """The position of the first tab or newline from ``i`` (``n``: none)."""
    while i < n and buf[i] != _TAB and buf[i] != _NEWLINE:
        i += 1
    return i


@numba.njit(cache=True, nogil=True)
def _parse_line(buf, pos, final, labels, ints, hexes, row, problem):
    """Parse the line at ``pos`` into slot ``row``; returns (status, position after the line).

    Each column's digits are read in the pass that finds its end (decimal after an optional sign
    in an integer column, hex in a categorical one), then checked and stored: one pass over the
    bytes, 1.9x finding the end first and then reading the value. One function: numba's inlined
    helpers (a tuple or a status returned) cost it nearly half its speed. On a bad line,
    ``problem`` gets [column, value start, value end] (column count for _COLUMNS).
    """
    n = buf.shape[0]
    column = 0
    status = _OK
    i = pos
    while True:
        start = i
        value = np.int64(0)
        negative = False
        if status == _OK and 0 < column <= NUM_INT_FIELDS:
            if i < n and (buf[i] == 45 or buf[i] == 43):  # '-' or '+'
                negative = buf[i] == 45
                i += 1
            while i < n:
                d = np.int64(buf[i]) - 48
                if d < 0 or d > 9:
                    break
                value = value * 10 + d  # wraps beyond 18 digits; such values take _large_value
                i += 1
        elif status == _OK and NUM_INT_FIELDS < column < NUM_COLUMNS:
            while i < n:
                d = _HEX_VALUE[buf[i]]
                if d < 0:
                    break
                value = value * 16 + d
                i += 1
        digits_end = i
        if i < n and buf[i] != _TAB and buf[i] != _NEWLINE:
            i = _to_delimiter(buf, i, n)
        if i >= n and not final:
            return _INCOMPLETE, pos
        line_end = i >= n or buf[i] == _NEWLINE
        end = i - 1 if line_end and i > start and buf[i - 1] == _CR else i
        if status == _OK and column < NUM_COLUMNS:
            if column == 0:
                if end - start == 1 and (buf[start] == 48 or buf[start] == 49):
                    labels[row] = buf[start] - 48
                else:
                    status = _LABEL
            elif column <= NUM_INT_FIELDS:
                if start == end:
                    ints[column - 1, row] = np.nan
                else:
                    first = start + 1 if buf[start] == 45 or buf[start] == 43 else start
                    if first == end or digits_end < end:
                        status = _NOT_INT
                    else:
                        while first < end and buf[first] == 48:  # leading zeros are not significant ("007" is 7)
                            first += 1
                        if end - first <= _EXACT_DIGITS:
                            ints[column - 1, row] = float(-value if negative else value)
                        else:
                            ints[column - 1, row] = _large_value(buf, first, end, negative)
            else:
                if start == end:
                    hexes[column - 1 - NUM_INT_FIELDS, row] = -1
                elif end - start != 8 or digits_end < end:
                    status = _NOT_HEX
                else:
                    hexes[column - 1 - NUM_INT_FIELDS, row] = value
            if status != _OK:
                problem[0], problem[1], problem[2] = column, start, end
        column += 1
        if line_end:
            break
        i += 1
    if column != NUM_COLUMNS:
        status = _COLUMNS
        problem[0], problem[1], problem[2] = column, pos, i
    return status, min(i + 1, n)


@numba.njit(cache=True, nogil=True)
def _parse_block(buf, pos, final, row, labels, ints, hexes, skip, bad_lines, problem):
    """Parse lines from ``pos`` into slots ``row..`` until the slots or the complete lines run out.

    Returns (position, next free slot, lines consumed, bad lines, status of the first bad line,
    its line offset in this call). With ``skip`` false it stops at the first bad line (``position``
    is then that line's start).
    """
    n = buf.shape[0]
    max_rows = labels.shape[0]
    lines = 0
    n_bad = 0
    first_status = _OK
    first_line = -1
    scratch = np.zeros(3, dtype=np.int64)
    while row < max_rows and pos < n:
        status, next_pos = _parse_line(buf, pos, final, labels, ints, hexes, row, scratch)
        if status == _INCOMPLETE:
            break
        if status == _OK:
            row += 1
        else:
            if n_bad == 0:
                first_status, first_line = status, lines
                problem[:] = scratch
            if n_bad < bad_lines.shape[0]:
                bad_lines[n_bad] = lines
            n_bad += 1
            if not skip:
                return pos, row, lines, n_bad, first_status, first_line
        lines += 1
        pos = next_pos
    return pos, row, lines, n_bad, first_status, first_line


def _looks_binary(raw: bytes) -> bool:
    if b"\x00" in raw:
        return True
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


SCHEMA_HINT = " (the default schema is criteo; pass --schema NAME|FILE for other data)"


def _describe_problem(status: int, problem: np.ndarray, buf: bytes) -> str:
    """The column-specific part of a bad-row message."""
    column, start, end = (int(x) for x in problem)
    if status == _COLUMNS:
        line = buf[start:end]
        if _looks_binary(line):
            return "line is not text (binary data?)"
        # one column that is not empty: no tab at all, most likely another format read as Criteo's
        hint = SCHEMA_HINT if column == 1 and line.strip() else ""
        return f"expected {NUM_COLUMNS} tab-separated columns, found {column}{hint}"
    raw = buf[start:end]
    text = raw.decode("utf-8", errors="backslashreplace")
    shown = repr(text if len(text) <= 40 else text[:37] + "...")
    if _looks_binary(raw):
        return f"column {COLUMN_NAMES[column]}: {shown} is not text (binary data?)"
    expectation = {_LABEL: "is not 0 or 1", _NOT_INT: "is not an integer", _NOT_HEX: "is not 8 hex digits"}[status]
    return f"column {COLUMN_NAMES[column]}: {shown} {expectation}"


@dataclass
class Chunk:
    """Validated rows: labels (uint8) and the read columns by name (Arrow arrays of their value
    dtypes, categorical text already keyed as ``features.StringKeys``, or the numpy arrays of
    Criteo's reader)."""

    labels: np.ndarray
    columns: dict[str, Any]
    scratch: bool = False  # the columns are a reader's buffers: what reads them once may overwrite them
    encoded: Any = None  # the rows' store columns (``features.EncodedRows``), where the reader keyed them

    @property
    def num_rows(self) -> int:
        return self.labels.shape[0]


@dataclass
class SourceReport:
    """What reading one file found."""

    display_name: str
    sha256: str = ""
    rows: int = 0
    lines: int = 0
    skipped: int = 0
    first_skipped: list[int] = field(default_factory=list)
    first_error: str = ""  # "<line>: <problem>" of the first bad row, without the file name
    line_base: int = 0  # lines of the file before the part read (a Share's first line - 1)


class CriteoTsvReader:
    """Reads raw Criteo files into :class:`Chunk` s of at most ``chunk_rows`` validated rows
    (the module docstring says of which columns)."""

    def __init__(self, bad_rows: str = "fail", chunk_rows: int = 1 << 18, read_bytes: int = 1 << 21,
                 progress: Any = None) -> None:
        if bad_rows not in BAD_ROW_POLICIES:
            raise DataError(f"bad_rows must be one of {', '.join(BAD_ROW_POLICIES)}, not {bad_rows!r}")
        if chunk_rows < 1:
            raise DataError(f"chunk_rows must be positive, not {chunk_rows}")
        self.skip = bad_rows == "skip"
        self.chunk_rows = int(chunk_rows)
        self.read_bytes = int(read_bytes)
        self.progress = progress  # a tqdm bar over the bytes of the files as stored, or None
        self.reports: list[SourceReport] = []
        self._labels = np.empty(self.chunk_rows, dtype=np.uint8)
        # column-major; rows padded so the 39 write streams do not alias in the cache
        self._ints = np.empty((NUM_INT_FIELDS, self.chunk_rows + 24), dtype=np.float64)[:, : self.chunk_rows]
        self._hexes = np.empty((NUM_FIELDS - NUM_INT_FIELDS, self.chunk_rows + 24), dtype=np.int64)[:, : self.chunk_rows]
        self._filled = 0

    def read(self, paths: list[str | Path | Share]) -> Iterator[Chunk]:
        """Yield chunks of rows of all files (or :class:`Share` s of files) in order (the last one
        may be short).

        A chunk is a view of the reader's buffers: use it before asking for the next one.
        """
        for path in paths:
            if isinstance(path, Share):
                yield from self._read_file(path.path, None if path.whole else path)
            else:
                yield from self._read_file(path)
        if self._filled:
            yield self._take_block()

    def _take_block(self) -> Chunk:
        n = self._filled
        columns = {name: self._ints[f, :n] for f, name in enumerate(FIELD_NAMES[:NUM_INT_FIELDS])}
        columns.update((name, self._hexes[f, :n]) for f, name in enumerate(FIELD_NAMES[NUM_INT_FIELDS:]))
        self._filled = 0
        return Chunk(self._labels[:n], columns, scratch=True)

    def _read_file(self, path: str | Path, share: Share | None = None) -> Iterator[Chunk]:
        """The rows of a file (of a ``share`` of its lines: the share's report, no sha256, the
        whole file's checks left to whoever joins the shares)."""
        name = str(path)
        report = SourceReport(display_name=name, line_base=0 if share is None else share.first_line - 1)
        self.reports.append(report)
        file_path = Path(path)
        if not file_path.exists():
            raise DataError(f"{name}: no such file")
        if file_path.is_dir():
            raise DataError(f"{name}: is a directory, not a data file")
        with open(file_path, "rb") as handle:
            is_gzip = share is None and handle.read(2) == b"\x1f\x8b"
            handle.seek(0)
            size = None if share is not None else os.fstat(handle.fileno()).st_size  # a share: hashed elsewhere
            hashing = HashingReader(handle if share is None else RangeReader(handle, share.start, share.end),
                                    self.progress, size)  # type: ignore[arg-type]
            stream = gzip.GzipFile(fileobj=hashing, mode="rb") if is_gzip else hashing  # type: ignore[arg-type]
            yield from self._parse_stream(stream, report, is_gzip, share is None or share.start == 0)
            if share is not None:
                return
            report.sha256 = hashing.finish()
        if report.lines == 0:
            raise DataError(f"{name}: file is empty (no rows)")
        if report.rows == 0:
            first = f"{name}:{report.first_error}"
            raise DataError(f"{name}: no valid rows ({report.skipped} bad rows skipped, first {first})")

    def _read_chunk(self, reading: Future[bytes], report: SourceReport, is_gzip: bool, offset: int) -> bytes:
        """The bytes a read of the next ``read_bytes`` (decompressed) gave; ``offset``: bytes read
        before."""
        try:
            return reading.result()
        except (EOFError, gzip.BadGzipFile, zlib.error) as error:
            what = "truncated or corrupt gzip data" if is_gzip else "read error"
            if report.lines:
                where = f"after line {report.lines}"
            else:  # the damage is in the first read: no line could be checked
                where = f"before line 1 could be read (within the first {offset + self.read_bytes:,} bytes of data)"
            raise DataError(f"{report.display_name}: {what} {where} ({error})") from None

    def _parse_stream(self, stream: IO[bytes], report: SourceReport, is_gzip: bool, at_start: bool = True
                      ) -> Iterator[Chunk]:
        pending = b""
        at_eof = False
        offset = 0
        reading = submit(stream.read, self.read_bytes)  # the next bytes are read (and hashed) ahead
        while not at_eof:
            data = self._read_chunk(reading, report, is_gzip, offset)
            if offset == 0 and at_start and data.startswith(UTF8_BOM):
                data = data[len(UTF8_BOM):]  # some editors save one; it is not part of the label
            offset += len(data)
            at_eof = not data
            if not at_eof:
                reading = submit(stream.read, self.read_bytes)
            buf = pending + data if pending else data
            array = np.frombuffer(buf, dtype=np.uint8)
            pos = 0
            while True:  # until no line is left (a chunk given whenever it is full)
                if self._filled == self.chunk_rows:
                    yield self._take_block()
                after = self._parse_lines(array, buf, pos, at_eof, report)
                if after == pos:
                    break
                pos = after
            pending = buf[pos:]
            if len(pending) > MAX_LINE_BYTES:
                where = f"{report.display_name}:{report.line_base + report.lines + 1}"
                raise DataError(f"{where}: line is longer than {MAX_LINE_BYTES} bytes (binary data?)")

    def _parse_lines(self, array: np.ndarray, buf: bytes, pos: int, final: bool, report: SourceReport) -> int:
        """Parse the whole lines from ``pos`` (the last one too when ``final``) that fit the chunk,
        in pieces of lines side by side, each into its slots (the rows of a piece after one with
        bad rows are moved down to follow its good ones); returns the position after them."""
        room, size = self.chunk_rows - self._filled, len(buf)
        end = size if final else buf.rfind(b"\n", pos) + 1  # at the end of the file, its last line too
        if end <= pos:
            return pos
        cuts, counts = line_pieces(buf, pos, end, piece_count(end - pos))
        if sum(counts) > room:  # only the first ``room`` lines fit
            end = pos + int(np.flatnonzero(array[pos:end] == _NEWLINE)[room - 1]) + 1
            cuts, counts = line_pieces(buf, pos, end, piece_count(end - pos))
        slots = (self._filled + np.cumsum([0, *counts[:-1]])).tolist()
        pieces = list(zip(cuts, cuts[1:], slots))

        def parse(piece: tuple[int, int, int]) -> tuple[Any, ...]:
            bad_lines, problem = np.zeros(FIRST_BAD_LINES_KEPT, dtype=np.int64), np.zeros(3, dtype=np.int64)
            return (*_parse_block(array[piece[0]:piece[1]], 0, True, piece[2], self._labels, self._ints, self._hexes,
                                  self.skip, bad_lines, problem), bad_lines, problem)

        target = self._filled
        for (start, end, slot), result in zip(pieces, each(parse, pieces)):
            _, row, lines, n_bad, status, bad_offset, bad_lines, problem = result
            if n_bad:
                self._record_bad_rows(report, buf[start:end], n_bad, status, bad_offset, bad_lines, problem)
            if target != slot:  # rows of an earlier piece were bad: this piece's rows follow its good ones
                for rows in (self._labels, self._ints, self._hexes):
                    rows[..., target:target + row - slot] = rows[..., slot:row].copy()
            target += row - slot
            report.rows += row - slot
            report.lines += lines
        self._filled = target
        return pieces[-1][1]

    def _record_bad_rows(self, report, buf, n_bad, status, bad_offset, bad_lines, problem) -> None:
        where = f"{report.line_base + report.lines + bad_offset + 1}: {_describe_problem(status, problem, buf)}"
        if not self.skip:
            raise DataError(f"{report.display_name}:{where}")
        if not report.first_error:
            report.first_error = where
        room = FIRST_BAD_LINES_KEPT - len(report.first_skipped)
        report.first_skipped.extend(int(report.line_base + report.lines + x + 1) for x in bad_lines[: min(room, n_bad)])
        report.skipped += n_bad
