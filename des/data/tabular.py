"""Reading and preparing raw tables of a declared schema (CSV/TSV, plain or gzip, and Parquet;
Criteo's TSV through its own reader, ``tsv.py``).

Files are read in bounded chunks: a CSV in blocks of whole lines cut into pieces, a plain piece
(ASCII, unquoted, every line as wide as the header) split by numba with its categorical text keyed
in the same pass (``tokenizer.py``), any other piece parsed by pyarrow (every column read as text,
a piece of ASCII lines as bytes viewed as text, and converted here, so each bad value is found with
its line), from a block that cannot be cut on ``pyarrow.csv.open_csv``; a Parquet file by runs of
row groups. A chunk is validated (label and its rule, numbers, integers, weights, the inputs of
derived fields), its bad rows fail the preparation with one line ``file:line: column NAME: what``
(policy ``fail``) or are skipped and counted (``skip``), and its good rows are keyed
(``features.encode_rows``, numba kernels over the Arrow buffers) and appended to the store. Line
numbers count the header (a quoted value that spans lines shifts the numbers of the lines after it).

The training statistics of a schema (quantile boundaries, mean and std of standardized columns)
come from a first pass over the training rows only: the split of row ``i`` is a function of
``(seed, i)`` (``split.py``), so the first pass knows it without writing anything. Quantiles are
taken from a seeded sample of at most ``QUANTILE_SAMPLE`` values per column (exact when the
training values fit it).
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import os
import re
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .blocks import LineBlocks, Share, file_digest
from .errors import DataError
from .features import (TRANSFORMS, EncodedRows, StringKeys, derived_inputs, encode_rows, float_values, hex_keys,
                       multi_valued_field, string_keys)
from .parallel import in_order, submit, threads
from .schema import ColumnSpec, Schema, manifest_sections
from .split import SPLIT_NAMES, assign_splits
from .store import StoreWriter
from .tokenizer import KEYED, keyed_columns, plain_lines
from .tsv import FIRST_BAD_LINES_KEPT, Chunk, CriteoTsvReader, SourceReport

QUANTILE_SAMPLE = 1 << 20
_MOMENT_BLOCK = 1 << 16
_MIN_BLOCK_BYTES = 1 << 14
_MAX_BLOCK_BYTES = 1 << 26
_BYTES_PER_ROW_GUESS = 128
#: bytes of a block of lines cut into pieces per thread parsing them: a small block's parsed
#: columns are still in the cache when its rows are validated and keyed (docs/benchmarks.md)
_BLOCK_BYTES_PER_THREAD = 1 << 22
_HEADER_BYTES = 1 << 16  # the header line must fit
#: a byte that is not UTF-8, as ``errors="surrogateescape"`` decodes it
_ESCAPED = re.compile("[\udc80-\udcff]")
_SMALL_DICTIONARY_BYTES = 1 << 16  # a Parquet column read as a dictionary below this (``_small_dictionary``)


def _short(value: Any) -> str:
    text = str(value)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def uncastable(array: Any, type_: Any) -> np.ndarray:
    """Bool mask of the values of an Arrow array that do not convert to ``type_`` (bisection over
    casts: one cast when all do)."""
    mask = np.zeros(len(array), dtype=bool)

    def visit(lo: int, hi: int) -> None:
        try:
            array.slice(lo, hi - lo).cast(type_)
        except Exception:  # noqa: BLE001 - Arrow's conversion errors
            if hi - lo == 1:
                mask[lo] = True
                return
            mid = (lo + hi) // 2
            visit(lo, mid)
            visit(mid, hi)

    if len(array):
        visit(0, len(array))
    return mask


class _Problems:
    """The bad rows of one chunk: a mask and the first message of each bad row."""

    def __init__(self, rows: int) -> None:
        self.mask = np.zeros(rows, dtype=bool)
        self.first: tuple[int, str] | None = None

    def add(self, bad: np.ndarray, describe: Any) -> None:
        new = bad & ~self.mask
        if not new.any():
            return
        row = int(np.flatnonzero(new)[0])
        if self.first is None or row < self.first[0]:
            self.first = (row, describe(row))
        self.mask |= bad


@dataclass
class _Checked:
    """A batch of ``rows`` rows validated: its ``problems`` and its good rows (None: none)."""

    rows: int
    problems: _Problems
    good: Chunk | None


@dataclass(frozen=True)
class InMemoryTable:
    """Rows already in memory (a ``pyarrow.Table`` with the schema's columns, each of its value
    dtype or text), read as a Parquet file's are; ``name`` names it in messages and the manifest
    (``des.data.frames``: a pandas DataFrame)."""

    name: str
    table: Any

    def sha256(self) -> str:
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.table.schema) as writer:
            writer.write_table(self.table)
        return hashlib.sha256(memoryview(sink.getvalue())).hexdigest()


class TableReader:
    """Reads a schema's raw files into validated :class:`Chunk` s of at most ``chunk_rows`` rows.

    ``reports`` holds one :class:`des.data.tsv.SourceReport` per file read (sha256, lines, rows,
    skipped). With ``bad_rows="fail"`` the first bad row raises a DataError naming file, line and
    column; with ``"skip"`` bad rows are counted and left out.
    """

    def __init__(self, schema: Schema, bad_rows: str = "fail", chunk_rows: int = 1 << 18,
                 progress: Any = None, encode: bool = False) -> None:
        import pyarrow as pa

        self.pa = pa
        self.schema = schema
        self.skip = bad_rows == "skip"
        self.chunk_rows = int(chunk_rows)
        self.progress = progress
        self.encode = encode  # key the rows where they are read (each chunk's ``encoded``)
        self._coded = _coded_columns(schema)
        # the columns a plain piece gives as keys (tokenizer.py): categorical text, not hex
        self._keyed = frozenset(name for name in self._coded if schema.column(name).dtype == "string")
        self._plain = set(schema.format.null_values) <= {""}  # what plain_lines reads as missing
        self.reports: list[SourceReport] = []

    # ------------------------------------------------------------------ files
    def read(self, paths: Sequence[str | os.PathLike | InMemoryTable | Share]) -> Iterator[Chunk]:
        """The chunks of each input in order: a file, a table, or a :class:`Share` of a file."""
        for path in paths:
            if isinstance(path, Share) and not path.whole:
                yield from self._read_share(path)
            elif isinstance(path, (Share, InMemoryTable)):
                yield from self._read_file(path.path if isinstance(path, Share) else path)
            else:
                yield from self._read_file(os.fspath(path))

    def _read_share(self, share: Share) -> Iterator[Chunk]:
        """The rows of part of a file (its report: that part's lines, rows and bad rows)."""
        report = SourceReport(display_name=share.path)
        self.reports.append(report)
        if self.schema.format.type == "parquet":
            yield from self._read_parquet(share.path, report, share)
        else:
            yield from self._read_csv(share.path, report, share)

    def _read_file(self, path: str | InMemoryTable) -> Iterator[Chunk]:
        report = SourceReport(display_name=path.name if isinstance(path, InMemoryTable) else path)
        self.reports.append(report)
        if isinstance(path, InMemoryTable):
            yield from self._read_in_memory(path, report)
            path = path.name
        elif not os.path.exists(path):
            raise DataError(f"{path}: no such file")
        elif os.path.isdir(path):
            raise DataError(f"{path}: is a directory, not a data file")
        elif self.schema.format.type == "parquet":
            yield from self._read_parquet(path, report)
        else:
            yield from self._read_csv(path, report)
        if report.lines == 0:
            raise DataError(f"{path}: file is empty (no rows)")
        if report.rows == 0:
            raise DataError(f"{path}: no valid rows ({report.skipped} bad rows skipped, first "
                            f"{path}:{report.first_error})")

    def _check_names(self, path: str, names: Sequence[str], where: str) -> None:
        declared = self.schema.file_columns
        duplicated = sorted({n for n in names if list(names).count(n) > 1})
        if duplicated:
            raise DataError(f"{path}: {where} names column {duplicated[0]!r} more than once")
        missing = [n for n in declared if n not in names]
        if missing:
            raise DataError(f"{path}: {where} has no column {missing[0]!r}, which schema {self.schema.name} declares")
        extra = [n for n in names if n not in declared]
        if extra:
            raise DataError(f"{path}: {where} has column {extra[0]!r}, which schema {self.schema.name} does not "
                            "declare (declare it with kind = \"ignored\" to drop it)")

    def _csv_options(self, names: Sequence[str] | None, block_size: int, bad: list,
                     lines: _LineNumbers | None, first_line: int = 1, text: Any = None) -> tuple[Any, Any, Any]:
        """pyarrow's options: ``names`` the columns (None: the header's), ``first_line`` the line of
        the first byte read; rows of a wrong width go to ``bad`` (and ``lines``, when given);
        ``text``: the type the columns are read as (default ``string``)."""
        import pyarrow.csv as csv

        fmt = self.schema.format
        read_columns = [self.schema.label.column, *(c.name for c in self.schema.read_columns)]

        def on_invalid(row: Any) -> str:  # a row of a wrong width: reported by _chunk, in line order
            number = row.number + first_line - 1
            bad.append((number, row.actual_columns, row.expected_columns))
            if lines is not None:
                lines.skip(number)
            return "skip"

        read = csv.ReadOptions(block_size=block_size, use_threads=False,
                               column_names=list(names) if names is not None else None)
        parse = csv.ParseOptions(delimiter=fmt.delimiter, quote_char=fmt.quote if fmt.quote else False,
                                 ignore_empty_lines=False, invalid_row_handler=on_invalid)
        convert = csv.ConvertOptions(column_types={n: text or self.pa.string() for n in read_columns},
                                     include_columns=read_columns, null_values=list(fmt.null_values),
                                     strings_can_be_null=True, quoted_strings_can_be_null=True)
        return read, parse, convert

    def _header(self, path: str) -> list[str]:
        """The column names of a CSV file (its header, or the declared names), after checking that
        its first bytes are text."""
        import pyarrow.csv as csv

        handle = open(path, "rb")
        try:
            stream = gzip.GzipFile(fileobj=handle, mode="rb") if handle.read(2) == b"\x1f\x8b" else handle
            handle.seek(0)
            head = stream.read(_HEADER_BYTES)
            if not head:
                raise DataError(f"{path}: file is empty (no rows)")
            if b"\0" in head or not _is_utf8(head):
                raise DataError(f"{path}: line 1 is not text (binary data?)")
            if not self.schema.format.header:
                return list(self.schema.format.names)
            fmt = self.schema.format
            reader = csv.open_csv(self.pa.BufferReader(head), read_options=csv.ReadOptions(
                block_size=_HEADER_BYTES + 1, use_threads=False), parse_options=csv.ParseOptions(
                delimiter=fmt.delimiter, quote_char=fmt.quote if fmt.quote else False,
                invalid_row_handler=lambda row: "skip"), convert_options=csv.ConvertOptions(include_columns=[]))
            return list(reader.schema.names)
        except (self.pa.ArrowInvalid, OSError, EOFError, zlib.error) as error:
            damaged = isinstance(error, (EOFError, gzip.BadGzipFile, zlib.error)) or "compress" in str(error).lower()
            what = "truncated or corrupt gzip data" if damaged else "cannot read the header"
            raise DataError(f"{path}: {what} ({_arrow_message(error)})") from None
        finally:
            handle.close()

    def _read_csv(self, path: str, report: SourceReport, share: Share | None = None) -> Iterator[Chunk]:
        """The rows of a CSV/TSV file (or of its ``share``: whole lines after the first, which the
        header starts): blocks of whole lines cut into pieces parsed side by side (``blocks.py``),
        from the first block that cannot be cut on, one serial reader. A block is at most 4 MiB a
        thread: 8 MiB blocks on 2 threads prepared an Avazu-like CSV 1.11x faster than 32 MiB ones
        (the same store; on 8 or more threads the chunk's bound, as before)."""
        names = self._header(path)
        self._check_names(path, names, "the header" if self.schema.format.header else "format.names")
        block = min(max(self.chunk_rows * _BYTES_PER_ROW_GUESS, _MIN_BLOCK_BYTES), _MAX_BLOCK_BYTES)
        bad_lines: list[tuple[int, int, int]] = []
        later = share is not None and share.start > 0
        lines = _LineNumbers(share.first_line - 1 if later else 1 if self.schema.format.header else 0)
        cut = min(block, threads() * _BLOCK_BYTES_PER_THREAD)  # the serial reader's blocks stay ``block``
        blocks = LineBlocks(path, cut, self.schema.format.quote, self.progress, share)
        try:
            if not self.schema.format.header or later or blocks.skip_header():
                rest = yield from self._read_pieces(path, report, blocks, names, lines, bad_lines)
            else:  # a header pyarrow must find the end of: everything read by it
                rest = (blocks.rest([]), 1)
            if rest is not None:
                stream, first_line = rest
                serial_names = names if blocks.next_line > 1 or not self.schema.format.header else None
                yield from self._read_serial(path, report, stream, serial_names, first_line, block, lines, bad_lines)
            yield from self._chunk(path, report, None, lines, bad_lines)
            if share is None:
                report.sha256 = blocks.digest()
        except self.pa.ArrowInvalid as error:
            raise DataError(f"{path}: {_arrow_message(error)}") from None
        finally:
            blocks.close()

    def _read_pieces(self, path: str, report: SourceReport, blocks: LineBlocks, names: Sequence[str],
                     lines: _LineNumbers, bad_lines: list) -> Iterator[Chunk]:
        """The chunks of the blocks that can be cut, each block's pieces parsed in the pool while
        the previous block's rows are validated and keyed; returns ``(stream of the rest, its first
        line)`` at the first block that cannot be cut, or None at the end of the file."""
        reading = submit(blocks.next, threads())
        parsed: list[Any] = []
        while True:
            block = reading.result()
            if block is None or block.pieces is None:
                break
            pieces = [submit(self._parse_piece, path, piece, names, first) for first, piece in block.pieces]
            reading = submit(blocks.next, threads())
            yield from self._piece_chunks(path, report, parsed, lines, bad_lines)
            parsed = pieces
        yield from self._piece_chunks(path, report, parsed, lines, bad_lines)
        return None if block is None else (blocks.rest([block]), block.first_line)

    def _parse_piece(self, path: str, piece: bytes, names: Sequence[str],
                     first_line: int) -> tuple[list[_Checked], list]:
        """A piece of whole lines (the first at ``first_line``) parsed and checked (:meth:`_check`),
        and its rows of a wrong width ``(line, columns found, expected)``."""
        import pyarrow.csv as csv

        bad: list[tuple[int, int, int]] = []
        ascii_only = _ascii_only(piece)
        if ascii_only and self._plain:
            fmt = self.schema.format
            batch = plain_lines(piece, names, [self.schema.label.column, *(c.name for c in self.schema.read_columns)],
                                self._keyed, fmt.delimiter, fmt.quote, "" in fmt.null_values)
            if batch is not None:
                return self._checked(batch), bad
        read, parse, convert = self._csv_options(names, len(piece) + 1, bad, None, first_line,
                                                 self.pa.binary() if ascii_only else None)
        try:
            table = csv.read_csv(self.pa.py_buffer(piece), read_options=read, parse_options=parse,
                                 convert_options=convert)
        except self.pa.ArrowInvalid:
            if not ascii_only:
                self._not_utf8(path, piece, names, first_line)
            raise
        return self._checked(_as_text(table) if ascii_only else table), bad

    def _not_utf8(self, path: str, piece: bytes, names: Sequence[str], first_line: int) -> None:
        """Where a column read holds a value that is not UTF-8, a DataError naming its first such line
        and column (pyarrow's own message counts the rows of the piece, not the lines of the file;
        the bytes of a column not read are never checked)."""
        text = bytes(piece).decode("utf-8", errors="surrogateescape")  # a byte that is not UTF-8: one \udcXX
        read = {self.schema.label.column, *(c.name for c in self.schema.read_columns)}
        line, counted = first_line, 0
        for bad in _ESCAPED.finditer(text):
            line += text.count("\n", counted, bad.start())
            counted = bad.start()
            column = text.count(self.schema.format.delimiter, text.rfind("\n", 0, bad.start()) + 1, bad.start())
            if column < len(names) and names[column] in read:
                raise DataError(f"{path}:{line}: column {names[column]}: byte {ord(bad.group()) - 0xDC00:#04x} "
                                "is not UTF-8 text")

    def _piece_chunks(self, path: str, report: SourceReport, pieces: list, lines: _LineNumbers,
                      bad_lines: list) -> Iterator[Chunk]:
        for future in pieces:
            checked, bad = future.result()
            for number, *_ in bad:
                lines.skip(number)
            bad_lines.extend(bad)
            for batch in checked:
                yield from self._chunk(path, report, batch, lines, bad_lines)

    def _read_serial(self, path: str, report: SourceReport, stream: Any, names: Sequence[str] | None,
                     first_line: int, block: int, lines: _LineNumbers, bad_lines: list) -> Iterator[Chunk]:
        """The chunks of one serial pyarrow reader over ``stream`` (whose first line is
        ``first_line``; ``names`` None: it starts with the header)."""
        import pyarrow.csv as csv

        read, parse, convert = self._csv_options(names, block, bad_lines, lines, first_line)
        try:
            reader = csv.open_csv(self.pa.PythonFile(stream, mode="r"), read_options=read, parse_options=parse,
                                  convert_options=convert)
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                for checked in self._checked(batch):
                    yield from self._chunk(path, report, checked, lines, bad_lines)
        except OSError as error:  # pyarrow's decompression errors
            if "compress" not in str(error).lower():
                raise
            where = f"after line {report.lines + 1}" if report.lines else "before its first rows could be read"
            raise DataError(f"{path}: truncated or corrupt gzip data {where} ({_arrow_message(error)})") from None

    def _read_parquet(self, path: str, report: SourceReport, share: Share | None = None) -> Iterator[Chunk]:
        """The rows of a Parquet file (of its ``share``'s row groups): runs of row groups read side
        by side."""
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except (self.pa.ArrowInvalid, OSError) as error:
            raise DataError(f"{path}: not a Parquet file ({_arrow_message(error)})") from None
        self._check_names(path, parquet.schema_arrow.names, "the Parquet schema")
        self._check_parquet_types(path, parquet.schema_arrow)
        columns = [self.schema.label.column, *(c.name for c in self.schema.read_columns)]
        size, total = os.path.getsize(path), max(parquet.metadata.num_rows, 1)
        groups = range(parquet.metadata.num_row_groups) if share is None else range(share.start, share.end)
        lines = _LineNumbers(0 if share is None else share.first_line - 1)
        # Parquet is read by row groups: its bytes are hashed apart (a share's file elsewhere)
        hashing = submit(file_digest, path) if share is None else None
        runs = _row_group_runs(parquet.metadata, self.chunk_rows, groups)

        coded = [name for name in columns if name in self._coded and _small_dictionary(parquet.metadata, name)]
        keyed = [name for name in coded if name in self._keyed]

        def read(run: list[int]) -> tuple[list[_Checked], int]:  # a file object of its own per thread
            one = pq.ParquetFile(path, metadata=parquet.metadata, read_dictionary=coded)
            table = _keyed_dictionaries(one.read_row_groups(run, columns=columns, use_threads=len(runs) == 1), keyed)
            table = table.combine_chunks()
            return self._checked(table), table.num_rows

        for checked, rows in in_order(read, runs):
            for batch in checked:
                yield from self._chunk(path, report, batch, lines, [], row_word="row ")
            if self.progress is not None:
                self.progress.update(size * rows / total / 1e6)
        if hashing is not None:
            report.sha256 = hashing.result()

    def _check_parquet_types(self, path: str, arrow_schema: Any) -> None:
        """A Parquet column must hold what the schema declares: text for a string column (a hex id,
        a multi-valued list), integers for an int one, numbers for a float one (integers cast to
        float64, each value checked to be exact) and for the label; anything else (a float64 column
        declared int, digit strings declared a number) is one line naming the column and the file."""
        pa = self.pa
        declared = {self.schema.label.column: "label", **{c.name: c.value_dtype for c in self.schema.read_columns}}
        for name, dtype in declared.items():
            type_ = arrow_schema.field(name).type
            if pa.types.is_dictionary(type_):
                type_ = type_.value_type
            text = pa.types.is_string(type_) or pa.types.is_large_string(type_)
            integer = pa.types.is_integer(type_)
            number = integer or pa.types.is_floating(type_)
            ok = {"string": text, "int": integer, "float": number, "label": number or pa.types.is_boolean(type_)}[dtype]
            if not ok:
                want = {"string": "text", "int": "integers", "float": "numbers", "label": "numbers (the label)"}[dtype]
                raise DataError(f"{path}: column {name} is {type_} in the Parquet file, but schema "
                                f"{self.schema.name} declares {want} (write it as such, or declare the column so)")

    def _read_in_memory(self, source: InMemoryTable, report: SourceReport) -> Iterator[Chunk]:
        self._check_names(source.name, source.table.schema.names, "the table")
        columns = [self.schema.label.column, *(c.name for c in self.schema.read_columns)]
        lines = _LineNumbers(0)
        for batch in source.table.select(columns).to_batches(max_chunksize=self.chunk_rows):
            if batch.num_rows:
                yield from self._chunk(source.name, report, self._check(batch), lines, [], row_word="row ")
        report.sha256 = source.sha256()

    # ------------------------------------------------------------------ validation
    def _checked(self, rows: Any) -> list[_Checked]:
        """Every slice of at most ``chunk_rows`` rows of a table's batches (or of one batch), checked."""
        batches = [rows] if isinstance(rows, self.pa.RecordBatch) else rows.to_batches()
        return [self._check(batch.slice(start, self.chunk_rows)) for batch in batches
                for start in range(0, batch.num_rows, self.chunk_rows)]

    def _check(self, batch: Any) -> _Checked:
        """Validate one batch, keep its good rows and key them (``encode``): the work a batch needs
        of itself, done in the thread that parsed or read it (the pool's, side by side); what needs
        the batches in file order (line numbers, the first error, the counts) is :meth:`_chunk`'s.
        Where the main thread validated and keyed what the pool parsed, it bounded the whole: 2M
        Avazu-like rows on 16 threads took 1.26 s, 1.01 s so (docs/benchmarks.md)."""
        problems = _Problems(batch.num_rows)
        keyed = keyed_columns(batch)
        labels, typed = self._validate({name: StringKeys(np.asarray(batch.column(name))) if name in keyed
                                        else batch.column(name) for name in batch.schema.names}, problems)
        keep = ~problems.mask
        if not keep.any():
            return _Checked(batch.num_rows, problems, None)
        if not keep.all():
            labels = labels[keep]
            mask = self.pa.array(keep)
            typed = {name: array.filter(mask) for name, array in typed.items()}
        good = Chunk(labels, typed)
        if self.encode:
            good.encoded = encode_rows(self.schema, typed, labels.shape[0])
        return _Checked(batch.num_rows, problems, good)

    def _chunk(self, path: str, report: SourceReport, checked: _Checked | None, lines: _LineNumbers,
               bad_lines: list[tuple[int, int, int]], row_word: str = "") -> Iterator[Chunk]:
        """One checked batch's rows in file order: its bad rows' lines (with those of a wrong width
        before it) failed or counted, its good rows given (None: only the rows of a wrong width left
        at the end of the file)."""
        first_row = lines.returned  # rows pyarrow returned before this batch
        rows = 0 if checked is None else checked.rows
        last_line = lines.line(first_row + rows - 1) if checked is not None else None
        width_errors = [b for b in bad_lines[lines.widths_seen:] if last_line is None or b[0] <= last_line]
        problems = _Problems(0) if checked is None else checked.problems
        message = None
        if problems.first is not None:
            message = (lines.line(first_row + problems.first[0]), problems.first[1])
        if width_errors:
            number, actual, expected = width_errors[0]
            if message is None or number < message[0]:
                message = (number, f"expected {expected} columns, found {actual}")
        bad_count = int(problems.mask.sum()) + len(width_errors)
        if bad_count and not self.skip:
            raise DataError(f"{path}:{row_word}{message[0]}: {message[1]}")
        if bad_count:
            if not report.first_error:
                report.first_error = f"{row_word}{message[0]}: {message[1]}"
            bad_numbers = sorted([b[0] for b in width_errors] + [lines.line(first_row + int(r)) for r in
                                                                  np.flatnonzero(problems.mask)[:FIRST_BAD_LINES_KEPT]])
            room = FIRST_BAD_LINES_KEPT - len(report.first_skipped)
            report.first_skipped.extend(bad_numbers[:max(room, 0)])
            report.skipped += bad_count
        lines.widths_seen += len(width_errors)
        lines.returned += rows
        report.lines += rows + len(width_errors)
        if checked is None or checked.good is None:
            return
        report.rows += checked.good.num_rows
        yield checked.good

    def _validate(self, columns: dict[str, Any], problems: _Problems) -> tuple[np.ndarray, dict[str, Any]]:
        pa = self.pa
        schema = self.schema
        label_name = schema.label.column
        raw_label = columns[label_name]
        if pa.types.is_dictionary(raw_label.type):
            raw_label = raw_label.dictionary_decode()
        label_values, unparsable = _convert(raw_label, pa.float64())
        problems.add(unparsable, lambda r: f"column {label_name}: {_short(raw_label[r].as_py())} is not a number")
        missing = np.isnan(label_values) & ~unparsable
        problems.add(missing, lambda r: f"column {label_name}: the label is missing")
        rule = schema.label.parsed_rule()
        if rule is None:
            outside = ~np.isin(label_values, (0.0, 1.0)) & ~np.isnan(label_values)
            problems.add(outside, lambda r: f"column {label_name}: {_short(raw_label[r].as_py())} is not 0 or 1 "
                                            "(give the label a rule to turn other values into 0/1)")
            labels = (label_values == 1.0).astype(np.uint8)
        else:
            labels = _apply_rule(rule, label_values).astype(np.uint8)
        typed: dict[str, Any] = {}
        for column in schema.read_columns:
            array = columns[column.name]
            if isinstance(array, StringKeys):  # keyed where it was read: nothing to check
                typed[column.name] = array
                continue
            if pa.types.is_dictionary(array.type) and not (column.name in self._coded and (
                    pa.types.is_string(array.type.value_type) or pa.types.is_large_string(array.type.value_type))):
                array = array.dictionary_decode()
            typed[column.name] = self._typed(column, array, problems)
        for derived in schema.derived:
            if not all(name in typed for name in derived.inputs):
                continue  # an input is another derived field: checked where that one is
            transform = TRANSFORMS.get(derived.transform)()
            inputs = derived_inputs(schema, derived, typed, {})
            invalid = transform.invalid(inputs, derived.options)
            if invalid is not None:
                source = inputs[0].name
                problems.add(np.asarray(invalid, bool),
                             lambda r, d=derived, s=source: f"column {s}: {_short(typed[s][r].as_py())} cannot be "
                                                            f"read by {d.transform} ({_options_text(d.options)})")
        return labels, typed

    def _typed(self, column: ColumnSpec, array: Any, problems: _Problems) -> Any:
        pa = self.pa
        dtype = column.value_dtype
        if dtype == "string":
            if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
                    or pa.types.is_dictionary(array.type)):  # text, or its dictionary (_coded)
                array = array.cast(pa.string())
            if column.is_list and (column.weight_separator is not None or column.key_dtype == "int"):
                self._check_elements(column, array, problems)
            if column.dtype == "hex":
                problems.add(hex_keys(array) < 0,
                             lambda r: f"column {column.name}: {_short(array[r].as_py())} is not 8 hex digits")
            return array
        target = pa.float64() if dtype == "float" else pa.int64()
        what = "is not a number" if dtype == "float" else "is not an integer"
        if dtype == "float" and pa.types.is_integer(array.type):  # a typed file's integers: cast when exact
            what = "is an integer a float64 cannot hold exactly"
        values, bad = _convert(array, target, as_array=True)
        problems.add(bad, lambda r: f"column {column.name}: {_short(array[r].as_py())} {what}")
        return values

    def _check_elements(self, column: ColumnSpec, array: Any, problems: _Problems) -> None:
        try:
            multi_valued_field(array, column)
            return
        except ValueError:
            pass
        bad = np.zeros(len(array), dtype=bool)
        for r in range(len(array)):  # only after a chunk had an unreadable weight: find its rows
            try:
                multi_valued_field(array.slice(r, 1), column)
            except ValueError:
                bad[r] = True
        what = "an element that is not an integer" if column.key_dtype == "int" else "a weight that is not a number"
        problems.add(bad, lambda r: f"column {column.name}: {_short(array[r].as_py())} has {what}")


class _LineNumbers:
    """Line numbers of the rows pyarrow returns, which leaves out the rows of a wrong width."""

    def __init__(self, header_lines: int) -> None:
        self.header_lines = header_lines
        self.skipped: list[int] = []  # lines of the rows left out so far (ascending)
        self.returned = 0  # rows returned and validated so far
        self.widths_seen = 0  # rows of a wrong width accounted for so far

    def skip(self, number: int | None) -> None:
        if number is not None:
            self.skipped.append(int(number))

    def line(self, row: int) -> int:
        """The line of the ``row``-th (0-based) row returned."""
        base = self.header_lines + 1 + row
        count = bisect.bisect_right(self.skipped, base)
        while bisect.bisect_right(self.skipped, base + count) != count:
            count = bisect.bisect_right(self.skipped, base + count)
        return base + count


def _keyed_dictionaries(table: Any, names: Sequence[str]) -> Any:
    """``table`` with its dictionary columns ``names`` as their keys (int64, marked
    :data:`~des.data.tokenizer.KEYED`, as the tokenizer gives a CSV's text): each row group's
    dictionary keyed once and its indices mapped (``features.string_keys``), before the row groups
    are combined. Combined first, Arrow unified the row groups' dictionaries, hashing every value
    of each again: reading and keying 2M Avazu-like rows of Parquet (147 row groups) on one thread
    took 1.9 s so, 1.4 s this way (docs/benchmarks.md, "Data path")."""
    import pyarrow as pa

    for name in names:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, pa.field(name, pa.int64(), metadata=KEYED), pa.array(string_keys(table.column(i))))
    return table


def _coded_columns(schema: Schema) -> frozenset[str]:
    """The columns whose dictionary arrays of text (a Parquet file's, a pandas categorical's) stay
    so: categorical text read for its keys alone (hashed once per distinct value,
    :func:`des.data.features.by_indices`), not an element list nor a derived field's input."""
    inputs = {name for derived in schema.derived for name in derived.inputs}
    return frozenset(c.name for c in schema.read_columns if c.kind == "categorical" and c.value_dtype == "string"
                     and not c.is_list and c.name not in inputs)


def _small_dictionary(metadata: Any, name: str) -> bool:
    """Whether column ``name`` of a Parquet file's first row group is dictionary-encoded with a
    dictionary page of at most 64 KiB: one its writer did not give up for plain values (they do at
    about 1 MiB of values), which pyarrow reads as a dictionary 2x faster than as text (a column
    whose pages went plain it reads so 4x slower: each value hashed into a dictionary)."""
    if metadata.num_row_groups == 0:
        return False
    group = metadata.row_group(0)
    for index in range(group.num_columns):
        column = group.column(index)
        if column.path_in_schema == name:
            size = column.data_page_offset - (column.dictionary_page_offset or 0)
            return bool(column.has_dictionary_page) and 0 < size <= _SMALL_DICTIONARY_BYTES
    return False


def _row_group_runs(metadata: Any, rows: int, groups: Sequence[int]) -> list[list[int]]:
    """A Parquet file's ``groups`` (consecutive row groups) in runs of consecutive ones of about
    ``rows`` rows (a larger row group alone), each read by one thread."""
    runs: list[list[int]] = []
    count = rows
    for group in groups:
        size = metadata.row_group(group).num_rows
        if count + size > rows:
            runs.append([])
            count = 0
        runs[-1].append(group)
        count += size
    return runs


def _arrow_message(error: Exception) -> str:
    """The first line of an Arrow error, at most 160 characters."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _is_utf8(data: bytes) -> bool:
    """True if ``data`` is UTF-8 text, a character cut at its end allowed."""
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError as error:
        return error.start >= len(data) - 3 and error.reason == "unexpected end of data"


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in options.items()) or "no options"


def _ascii_only(piece: Any) -> bool:
    """Whether a piece's bytes are all ASCII. ASCII is UTF-8, so such a piece is parsed as bytes and
    viewed as text (:func:`_as_text`), without pyarrow's UTF-8 check of every value: an 8 MB piece
    of the Avazu-like CSV in 43 against 50 ms, the check itself 0.2 ms."""
    return len(piece) > 0 and int(np.frombuffer(piece, dtype=np.uint8).max()) < 0x80


def _as_text(table: Any) -> Any:
    """A table whose columns were read as bytes (of ASCII text only), its columns viewed as text:
    the same buffers, so the same table as one read as text."""
    import pyarrow as pa

    columns = [pa.chunked_array([chunk.view(pa.string()) for chunk in column.chunks], pa.string())
               if pa.types.is_binary(column.type) else column for column in table.columns]
    return pa.table(columns, names=table.column_names)


def _convert(array: Any, type_: Any, as_array: bool = False) -> tuple[Any, np.ndarray]:
    """``(values, unconvertible mask)``: float64 numpy values (NaN where missing or unconvertible),
    or with ``as_array`` an Arrow array of ``type_`` (null there)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        converted = array.cast(type_)
        bad = np.zeros(len(array), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        bad = uncastable(array, type_)
        converted = pc.if_else(pa.array(bad), pa.scalar(None, array.type), array).cast(type_)
    if as_array:
        return converted, bad
    return np.asarray(converted.to_numpy(zero_copy_only=False), dtype=np.float64), bad


def _apply_rule(rule: tuple[str, tuple[float, ...]], values: np.ndarray) -> np.ndarray:
    op, operands = rule
    with np.errstate(invalid="ignore"):
        if op == "in":
            return np.isin(values, operands)
        x = operands[0]
        return {">=": values >= x, ">": values > x, "<=": values <= x, "<": values < x, "==": values == x,
                "!=": values != x}[op]


# ---------------------------------------------------------------------------------- statistics
class _Statistics:
    """Accumulates a column's training statistics: a bounded seeded sample (quantiles) or the
    count, mean and sum of squared deviations of the transformed values (standardize)."""

    def __init__(self, column: ColumnSpec, seed: int, index: int) -> None:
        self.column = column
        self.rng = np.random.default_rng([int(seed) % (1 << 63), 7, index])
        self.sample = np.empty(0, dtype=np.float64)
        self.seen = 0
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.pending = np.empty(0, dtype=np.float64)

    def _merge(self, x: np.ndarray) -> None:
        """Merge a block's count, mean and squared deviations (Chan et al.): the values are taken in
        blocks of ``_MOMENT_BLOCK`` whatever the chunks, so the result does not depend on them."""
        n, mean = x.shape[0], float(x.mean())
        m2 = float(((x - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    def add(self, values: np.ndarray) -> None:
        from .features import dense_transform

        if self.column.as_ == "dense":
            pending = np.concatenate([self.pending, dense_transform(values, self.column)])
            full = pending.shape[0] - pending.shape[0] % _MOMENT_BLOCK
            for start in range(0, full, _MOMENT_BLOCK):
                self._merge(pending[start:start + _MOMENT_BLOCK])
            self.pending = pending[full:]
            return
        x = values[~np.isnan(values)]
        room = QUANTILE_SAMPLE - self.sample.shape[0]
        if room > 0:
            self.sample = np.concatenate([self.sample, x[:room]])
            self.seen += min(room, x.shape[0])
            x = x[room:]
        if x.shape[0]:  # reservoir sampling: the i-th value replaces a random slot with probability k/i
            positions = self.seen + 1 + np.arange(x.shape[0])
            slots = (self.rng.random(x.shape[0]) * positions).astype(np.int64)
            taken = slots < QUANTILE_SAMPLE
            self.sample[slots[taken]] = x[taken]
            self.seen += x.shape[0]

    def result(self) -> dict[str, Any]:
        if self.column.as_ == "dense":
            if self.pending.shape[0]:
                self._merge(self.pending)
                self.pending = self.pending[:0]
            std = (self.m2 / self.count) ** 0.5 if self.count else 0.0
            return {"mean": self.mean, "std": std if std > 0 else 1.0}
        if self.sample.shape[0] == 0:
            return {"boundaries": []}
        levels = np.arange(1, self.column.count) / self.column.count
        return {"boundaries": np.unique(np.quantile(self.sample, levels)).tolist()}


def resolve_statistics(schema: Schema, paths: Sequence[str | os.PathLike], split: Sequence[float], seed: int,
                       bad_rows: str = "fail", chunk_rows: int = 1 << 18, progress: bool | None = None) -> Schema:
    """The schema with its training statistics computed from the training rows of ``paths``
    (row ``i`` of the valid rows is a training row per ``assign_splits(seed, split, i)``); the
    schema itself when it has none to compute."""
    if schema.resolved:
        return schema
    return schema.with_statistics(training_statistics(schema, paths, split, seed, bad_rows, chunk_rows, progress))


def training_statistics(schema: Schema, paths: Sequence[str | os.PathLike], split: Sequence[float], seed: int,
                        bad_rows: str = "fail", chunk_rows: int = 1 << 18,
                        progress: bool | None = None) -> dict[str, dict[str, Any]]:
    """The statistics :func:`resolve_statistics` fills in, by column (JSON-ready)."""
    columns = [c for c in schema.columns if c.needs_statistics]
    stats = [_Statistics(c, seed, i) for i, c in enumerate(columns)]
    row = 0
    with progress_bar(paths, "statistics", progress) as bar:
        reader = open_reader(schema, bad_rows, chunk_rows, bar)
        for chunk in reader.read(paths):
            train = assign_splits(seed, split, row, chunk.num_rows) == 0
            row += chunk.num_rows
            for accumulator in stats:
                accumulator.add(float_values(chunk.columns[accumulator.column.name])[train])
            if bar is not None:
                bar.set_postfix_str(f"{row:,} rows", refresh=False)
    return {a.column.name: a.result() for a in stats}


def open_reader(schema: Schema, bad_rows: str, chunk_rows: int, progress: Any = None,
                encode: bool = False) -> TableReader | CriteoTsvReader:
    """The reader of ``schema``'s files (how their bytes become columns): Criteo's own for
    ``[format] type = "criteo"``, else :class:`TableReader` (``encode``: keying the rows where it
    reads them; see :func:`encoded`)."""
    if schema.format.type == "criteo":
        return CriteoTsvReader(bad_rows, chunk_rows, progress=progress)
    return TableReader(schema, bad_rows, chunk_rows, progress, encode=encode)


def encoded(schema: Schema, chunk: Chunk) -> EncodedRows:
    """The store's columns of a chunk's rows: the reader's, where it keyed them, else keyed here."""
    if chunk.encoded is not None:
        return chunk.encoded
    return encode_rows(schema, chunk.columns, chunk.num_rows, in_place=chunk.scratch)


def write_store(schema: Schema, paths: Sequence[str | os.PathLike], directory: Path, split: Sequence[float],
                seed: int, bad_rows: str, chunk_rows: int, progress: bool | None = None,
                roles: Sequence[str] | None = None) -> dict[str, Any]:
    """Write the rows of ``paths`` as a column store in ``directory`` (a resolved ``schema``),
    split by ``split`` and ``seed``, or with ``roles`` (one split name per path) each path's rows
    in its split; returns the manifest."""
    assert schema.resolved
    with progress_bar(paths, "preparing", progress) as bar, \
            StoreWriter(directory, schema.field_specs(), split, seed, dense_names=schema.dense_names) as writer:
        reader = open_reader(schema, bad_rows, chunk_rows, bar, encode=True)
        groups = [(None, list(paths))] if roles is None else [(SPLIT_NAMES.index(r), [p]) for r, p in zip(roles, paths)]
        for code, group in groups:
            for chunk in reader.read(group):
                rows = encoded(schema, chunk)
                writer.append(chunk.labels, rows.columns, dense=rows.dense, split_code=code)
                if bar is not None:
                    bar.set_postfix_str(f"{writer.num_rows:,} rows", refresh=False)
        if roles is not None:
            writer.split_by_input = split_by_input(roles, reader.reports)
        return writer.finish(**source_sections(reader.reports, bad_rows), **manifest_sections(schema))


def split_by_input(roles: Sequence[str], reports: Sequence[SourceReport]) -> list[list[str]]:
    """The manifest's ``split.inputs``: each input's role and name."""
    return [[role, Path(r.display_name).name] for role, r in zip(roles, reports)]


def source_sections(reports: Sequence[SourceReport], bad_rows: str) -> dict[str, Any]:
    """The manifest's ``sources`` and ``bad_rows`` of the files read (one report each, in order)."""
    first_skipped = [f"{Path(r.display_name).name}:{line}" for r in reports
                     for line in r.first_skipped][:FIRST_BAD_LINES_KEPT]
    first_error = next((f"{Path(r.display_name).name}:{r.first_error}" for r in reports if r.first_error), None)
    return {"sources": [{"name": Path(r.display_name).name, "sha256": r.sha256, "lines": r.lines, "rows": r.rows,
                         "skipped": r.skipped} for r in reports],
            "bad_rows": {"policy": bad_rows, "skipped": sum(r.skipped for r in reports),
                         "first_skipped": first_skipped, "first_error": first_error}}


class progress_bar:
    """A tqdm bar over the input bytes on stderr (rows, MB/s, ETA) when ``enabled`` (None: when
    stderr is a terminal); a context manager giving the bar or None."""

    def __init__(self, paths: Sequence[str | os.PathLike], what: str, enabled: bool | None) -> None:
        self.bar = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            from tqdm import tqdm

            total = sum(os.path.getsize(p) for p in paths if not isinstance(p, InMemoryTable) and os.path.isfile(p))
            self.bar = tqdm(total=total / 1e6, desc=what, unit="MB", dynamic_ncols=True, file=sys.stderr, leave=False,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} MB "
                                       "[{elapsed}<{remaining}, {rate_fmt}{postfix}]")

    def __enter__(self) -> Any:
        return self.bar

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self.bar.close()
