"""Streaming reader and validator of raw Criteo TSV files (plain or gzip).

Each line is ``label \\t I1..I13 \\t C1..C26`` (40 columns, empty = missing). A numba kernel parses
and validates a block of bytes and turns every value into its key (``keys.py``) in one pass; it
stops at the first bad row (policy ``"fail"``) or counts and skips bad rows (policy ``"skip"``).
A row is valid when it has exactly 40 columns, the label is ``0`` or ``1``, every integer column
is empty or ``[+-]?[0-9]+`` (any size), and every categorical column is empty or exactly 8 hex
digits (either case). A trailing ``\\r`` is ignored; blank lines are bad rows.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numba
import numpy as np

from .errors import DataError
from .keys import (
    FIELD_NAMES,
    MISSING_VALUE,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    int_value_code,
    key_of,
    token_of_int,
)

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
_LN10 = math.log(10.0)


def _hex_table() -> np.ndarray:
    table = np.full(256, -1, dtype=np.int64)
    for text in ("0123456789abcdef", "0123456789ABCDEF"):
        for value, char in enumerate(text):
            table[ord(char)] = value
    return table


_HEX_VALUE = _hex_table()  # byte -> hex digit value, -1 if not a hex digit


@numba.njit(cache=True)
def _token_table(size: int) -> np.ndarray:
    table = np.empty(size, dtype=np.int64)
    for v in range(size):
        table[v] = token_of_int(v)
    return table


_SMALL_TOKEN_LIMIT = 1 << 14
_SMALL_TOKENS = _token_table(_SMALL_TOKEN_LIMIT)  # token_of_int(v) for 0 <= v < limit (skips a log)


@numba.njit(cache=True, inline="always")
def _parse_integer_column(buf, start, end, field, keys, row):
    if start == end:
        keys[field, row] = key_of(field, MISSING_VALUE)
        return _OK
    negative = False
    i = start
    if buf[i] == 45 or buf[i] == 43:  # '-' or '+'
        negative = buf[i] == 45
        i += 1
    if i == end:
        return _NOT_INT
    while i < end and buf[i] == 48:  # leading zeros are not significant digits ("007" is 7)
        i += 1
    digits_start = i
    value = 0
    while i < end:
        d = np.int64(buf[i]) - 48
        if d < 0 or d > 9:
            return _NOT_INT
        value = value * 10 + d  # wraps beyond 18 digits; such values take _large_token
        i += 1
    if end - digits_start <= _EXACT_DIGITS:
        if negative:
            token = token_of_int(-value)
        elif value < _SMALL_TOKEN_LIMIT:
            token = _SMALL_TOKENS[value]
        else:
            token = token_of_int(value)
    else:
        token = _large_token(buf, digits_start, end, negative)
    keys[field, row] = key_of(field, int_value_code(token))
    return _OK


@numba.njit(cache=True)
def _large_token(buf, start, end, negative):
    """Token of a value of more than 18 significant digits ``buf[start:end]`` (no sign, no
    leading zero): exact while it fits an int64, else ``floor(ln(v)^2)`` with ``ln(v)`` from the
    first 18 digits and the digit count, so any length works (the same as ``keys.integer_token``
    up to rounding in the last bits of ``ln(v)``)."""
    if negative:
        return -(1 << 62)  # below -2^31 whether or not it fits an int64: clipped by int_value_code
    m = 0
    for j in range(start, start + _EXACT_DIGITS):
        m = m * 10 + (np.int64(buf[j]) - 48)
    digits = end - start
    if digits == _EXACT_DIGITS + 1:
        last = np.int64(buf[end - 1]) - 48
        if m < _INT64_MAX_DIV10 or (m == _INT64_MAX_DIV10 and last <= _INT64_MAX_MOD10):
            return token_of_int(m * 10 + last)
    log = math.log(float(m)) + (digits - _EXACT_DIGITS) * _LN10
    return np.int64(math.floor(log * log))


@numba.njit(cache=True, inline="always")
def _parse_hex_column(buf, start, end, field, keys, row):
    if start == end:
        keys[field, row] = key_of(field, MISSING_VALUE)
        return _OK
    if end - start != 8:
        return _NOT_HEX
    value = 0
    for i in range(start, end):
        d = _HEX_VALUE[buf[i]]
        if d < 0:
            return _NOT_HEX
        value = value * 16 + d
    keys[field, row] = key_of(field, value)
    return _OK


@numba.njit(cache=True, inline="always")
def _parse_column(buf, start, end, column, labels, keys, row):
    if column == 0:
        if end - start == 1 and (buf[start] == 48 or buf[start] == 49):
            labels[row] = buf[start] - 48
            return _OK
        return _LABEL
    field = column - 1
    if field < NUM_INT_FIELDS:
        return _parse_integer_column(buf, start, end, field, keys, row)
    return _parse_hex_column(buf, start, end, field, keys, row)


@numba.njit(cache=True, inline="always")
def _parse_line(buf, pos, final, labels, keys, row, problem):
    """Parse the line at ``pos`` into slot ``row``; returns (status, position after the line).

    On a bad line, ``problem`` gets [column, value start, value end] (column count for _COLUMNS).
    """
    n = buf.shape[0]
    column = 0
    start = pos
    status = _OK
    i = pos
    while True:
        if i >= n:
            if not final:
                return _INCOMPLETE, pos
            c = _NEWLINE
        else:
            c = buf[i]
        if c == _TAB or c == _NEWLINE:
            end = i
            if c == _NEWLINE and end > start and buf[end - 1] == _CR:
                end -= 1
            if status == _OK and column < NUM_COLUMNS:
                status = _parse_column(buf, start, end, column, labels, keys, row)
                if status != _OK:
                    problem[0], problem[1], problem[2] = column, start, end
            column += 1
            if c == _NEWLINE:
                break
            start = i + 1
        i += 1
    if column != NUM_COLUMNS:
        status = _COLUMNS
        problem[0], problem[1], problem[2] = column, pos, i
    return status, min(i + 1, n)


@numba.njit(cache=True)
def _parse_block(buf, pos, final, row, labels, keys, skip, bad_lines, problem):
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
        status, next_pos = _parse_line(buf, pos, final, labels, keys, row, scratch)
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


_UTF8_BOM = b"\xef\xbb\xbf"


class _HashingReader:
    """A read-only file wrapper that feeds every byte it returns into a sha256."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.sha256.update(data)
        return data

    def readable(self) -> bool:
        return True

    def finish(self) -> str:
        """Hash the rest of the file (bytes after a gzip stream end) and return the hex digest."""
        while self.read(1 << 20):
            pass
        return self.sha256.hexdigest()


@dataclass
class RowBlock:
    """Parsed rows: labels uint8 [n] and keys int64 [NUM_FIELDS, n] (each field's row contiguous)."""

    labels: np.ndarray
    keys: np.ndarray

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


class CriteoTsvReader:
    """Reads raw Criteo files into blocks of at most ``chunk_rows`` validated, keyed rows."""

    def __init__(self, bad_rows: str = "fail", chunk_rows: int = 1 << 18, read_bytes: int = 1 << 21) -> None:
        if bad_rows not in BAD_ROW_POLICIES:
            raise DataError(f"bad_rows must be one of {', '.join(BAD_ROW_POLICIES)}, not {bad_rows!r}")
        if chunk_rows < 1:
            raise DataError(f"chunk_rows must be positive, not {chunk_rows}")
        self.skip = bad_rows == "skip"
        self.chunk_rows = int(chunk_rows)
        self.read_bytes = int(read_bytes)
        self.reports: list[SourceReport] = []
        self._labels = np.empty(self.chunk_rows, dtype=np.uint8)
        # field-major; rows padded so the 39 write streams do not alias in the cache
        self._keys = np.empty((NUM_FIELDS, self.chunk_rows + 24), dtype=np.int64)[:, : self.chunk_rows]
        self._filled = 0

    def read(self, paths: list[str | Path]) -> Iterator[RowBlock]:
        """Yield blocks of rows of all files in order (the last block may be short).

        A block is a view of the reader's buffers: use it before asking for the next one.
        """
        for path in paths:
            yield from self._read_file(path)
        if self._filled:
            yield self._take_block()

    def _take_block(self) -> RowBlock:
        block = RowBlock(self._labels[: self._filled], self._keys[:, : self._filled])
        self._filled = 0
        return block

    def _read_file(self, path: str | Path) -> Iterator[RowBlock]:
        name = str(path)
        report = SourceReport(display_name=name)
        self.reports.append(report)
        file_path = Path(path)
        if not file_path.exists():
            raise DataError(f"{name}: no such file")
        if file_path.is_dir():
            raise DataError(f"{name}: is a directory, not a data file")
        with open(file_path, "rb") as handle:
            is_gzip = handle.read(2) == b"\x1f\x8b"
            handle.seek(0)
            hashing = _HashingReader(handle)
            stream = gzip.GzipFile(fileobj=hashing, mode="rb") if is_gzip else hashing  # type: ignore[arg-type]
            yield from self._parse_stream(stream, report, is_gzip)
            report.sha256 = hashing.finish()
        if report.lines == 0:
            raise DataError(f"{name}: file is empty (no rows)")
        if report.rows == 0:
            first = f"{name}:{report.first_error}"
            raise DataError(f"{name}: no valid rows ({report.skipped} bad rows skipped, first {first})")

    def _read_chunk(self, stream: IO[bytes], report: SourceReport, is_gzip: bool, offset: int) -> bytes:
        """The next ``read_bytes`` bytes (decompressed); ``offset``: bytes read before."""
        try:
            return stream.read(self.read_bytes)
        except (EOFError, gzip.BadGzipFile, zlib.error) as error:
            what = "truncated or corrupt gzip data" if is_gzip else "read error"
            if report.lines:
                where = f"after line {report.lines}"
            else:  # the damage is in the first read: no line could be checked
                where = f"before line 1 could be read (within the first {offset + self.read_bytes:,} bytes of data)"
            raise DataError(f"{report.display_name}: {what} {where} ({error})") from None

    def _parse_stream(self, stream: IO[bytes], report: SourceReport, is_gzip: bool) -> Iterator[RowBlock]:
        pending = b""
        at_eof = False
        bad_lines = np.zeros(FIRST_BAD_LINES_KEPT, dtype=np.int64)
        problem = np.zeros(3, dtype=np.int64)
        offset = 0
        while not at_eof:
            data = self._read_chunk(stream, report, is_gzip, offset)
            if offset == 0 and data.startswith(_UTF8_BOM):
                data = data[len(_UTF8_BOM):]  # some editors save one; it is not part of the label
            offset += len(data)
            at_eof = not data
            buf = pending + data if pending else data
            array = np.frombuffer(buf, dtype=np.uint8)
            pos = 0
            while True:
                pos, filled, lines, n_bad, status, bad_offset = _parse_block(
                    array, pos, at_eof, self._filled, self._labels, self._keys, self.skip, bad_lines, problem
                )
                if n_bad:
                    self._record_bad_rows(report, buf, n_bad, status, bad_offset, bad_lines, problem)
                report.rows += filled - self._filled
                report.lines += lines
                self._filled = filled
                if self._filled == self.chunk_rows:
                    yield self._take_block()
                    continue
                break
            pending = buf[pos:]
            if len(pending) > MAX_LINE_BYTES:
                where = f"{report.display_name}:{report.lines + 1}"
                raise DataError(f"{where}: line is longer than {MAX_LINE_BYTES} bytes (binary data?)")

    def _record_bad_rows(self, report, buf, n_bad, status, bad_offset, bad_lines, problem) -> None:
        where = f"{report.lines + bad_offset + 1}: {_describe_problem(status, problem, buf)}"
        if not self.skip:
            raise DataError(f"{report.display_name}:{where}")
        if not report.first_error:
            report.first_error = where
        room = FIRST_BAD_LINES_KEPT - len(report.first_skipped)
        report.first_skipped.extend(int(report.lines + x + 1) for x in bad_lines[: min(room, n_bad)])
        report.skipped += n_bad
