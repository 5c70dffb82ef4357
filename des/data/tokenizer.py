"""A piece of plain delimited lines split into its columns by numba, its categorical text keyed
in the same pass.

pyarrow's CSV reader parses a piece into Arrow string arrays, whose values
:func:`features.string_keys` then hashes: every byte of a categorical column is copied once and
read twice. Most CTR files are plain: ASCII, no quoting, every line as wide as the header. For
such a piece (:func:`plain_lines`) the separators are found by numpy over the whole piece at
once, one numba pass over the lines gives each keyed column's key scheme 2 keys straight from the
piece's bytes (a value of at most 8 bytes read as one word), and another copies only the other
columns' values (the label, numbers, the inputs of derived fields) into Arrow string arrays
(docs/benchmarks.md: a 4 MB piece of an Avazu-like CSV).

What comes back is what pyarrow gives with the same options (a column of text, an empty value
missing when ``""`` is a null value), but for the keyed columns: int64, the keys
:func:`features.string_keys` gives of their text, marked by :data:`KEYED` in their field's
metadata (:func:`keyed_columns` finds them). Anything else (a byte that is not ASCII, a quote
character, a carriage return that does not end a line, a line of another width) returns None,
and pyarrow parses the piece as before: its rows, errors and messages are pyarrow's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numba
import numpy as np

from .features import string_key, word_key

#: the metadata of a keyed column's field
KEYED = {b"des": b"string keys"}
_NEWLINE, _RETURN = 10, 13
_PADDING = 24  # bytes after a piece's end: a value's two aligned words are always inside


@numba.njit(cache=True, nogil=True)
def _keys(data, words, separators, ends, width, fields, keys):
    """Line by line, the key scheme 2 key of each of ``fields``' values into its row of ``keys``:
    a value starts after a separator and ends at ``ends`` (the separators, a CRLF line's last
    value before its carriage return); ``words`` is ``data`` as aligned 8-byte words. One loop over
    the keyed columns alone. An earlier loop found a CRLF line's end per value through a helper
    that read the piece only under a branch; numba then counted references to the piece on every
    value, atomic operations that made the loop 4.5x slower on a Xeon (docs/design.md, "no
    reference counting in a row loop")."""
    for row in range(separators.shape[0] // width):
        base = row * width
        for j in range(fields.shape[0]):
            f = fields[j]
            start = separators[base + f - 1] + 1 if base + f > 0 else 0
            end = ends[base + f]
            n = end - start
            keys[j, row] = word_key(words, start, n) if 0 < n <= 8 else string_key(data, start, end)


@numba.njit(cache=True, nogil=True)
def _text_bytes(separators, ends, width, fields):
    """The bytes of each of ``fields`` (columns copied as text) over every line."""
    out = np.zeros(fields.shape[0], dtype=np.int64)
    for row in range(separators.shape[0] // width):
        base = row * width
        for t in range(fields.shape[0]):
            f = fields[t]
            out[t] += ends[base + f] - (separators[base + f - 1] + 1 if base + f > 0 else 0)
    return out


@numba.njit(cache=True, nogil=True)
def _text(data, separators, ends, width, fields, offsets, text, bases, empty):
    """Line by line, each of ``fields``' values copied after its column's ``bases`` in ``text``,
    with their ``offsets`` (from the column's base) and whether each is ``empty``."""
    at = bases.copy()
    for row in range(separators.shape[0] // width):
        base = row * width
        for t in range(fields.shape[0]):
            f = fields[t]
            start = separators[base + f - 1] + 1 if base + f > 0 else 0
            end = ends[base + f]
            p = at[t]
            for j in range(start, end):
                text[p] = data[j]
                p += 1
            at[t] = p
            offsets[t, row + 1] = p - bases[t]
            empty[t, row] = end == start


def plain_lines(piece: Any, names: Sequence[str], read: Sequence[str], keyed: Collection[str], delimiter: str,
                quote: str | None, empty_is_null: bool) -> Any:
    """The columns ``read`` (in that order) of a piece of whole lines of ASCII, as a
    ``pyarrow.RecordBatch``: those in ``keyed`` as their keys (int64, :data:`KEYED`), the others
    as text (an empty value null where ``empty_is_null``); lines end in LF or CRLF. None where
    the piece is not plain: it holds the ``quote`` character or a carriage return that does not
    end a line, or a line is not ``len(names)`` wide."""
    import pyarrow as pa

    size = len(piece)
    padded = np.zeros((size + 1 + _PADDING + 7) // 8 * 8, dtype=np.uint8)  # aligned: numpy's allocation
    padded[:size] = np.frombuffer(piece, dtype=np.uint8)
    if quote is not None and (padded[:size] == ord(quote)).any():
        return None
    if size and padded[size - 1] != _NEWLINE:
        padded[size] = _NEWLINE  # the last line's end
        size += 1
    data = padded[:size]
    newline = data == _NEWLINE
    returns = data == _RETURN
    crlf = bool(returns.any())
    if crlf and (returns[-1] or (returns[:-1] & ~newline[1:]).any()):  # a carriage return not before LF
        return None
    separators = np.flatnonzero(newline | (data == ord(delimiter)))
    width, rows = len(names), int(np.count_nonzero(newline))
    line_ends = separators[width - 1::width]
    if separators.shape[0] != rows * width or not newline[line_ends].all():
        return None
    ends = separators
    if crlf:  # a CRLF line's last value ends before its carriage return
        ends = separators.copy()
        ends[width - 1::width] -= returns[np.maximum(line_ends - 1, 0)] & (line_ends > 0)
    keys_read = [name for name in read if name in keyed]
    texts = [name for name in read if name not in keyed]
    keys = np.empty((len(keys_read), rows), dtype=np.int64)
    _keys(padded, padded.view(np.uint64), separators, ends, width, _columns(names, keys_read), keys)
    text_fields = _columns(names, texts)
    sizes = _text_bytes(separators, ends, width, text_fields)
    bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    offsets = np.zeros((len(texts), rows + 1), dtype=np.int32)
    text = np.empty(max(int(sizes.sum()), 1), dtype=np.uint8)
    empty = np.empty((len(texts), rows), dtype=np.bool_)
    _text(data, separators, ends, width, text_fields, offsets, text, bases, empty)
    columns, fields = [], []
    for name in read:
        if name in keyed:
            columns.append(pa.array(keys[keys_read.index(name)]))
            fields.append(pa.field(name, pa.int64(), metadata=KEYED))
            continue
        t = texts.index(name)
        missing = empty[t] if empty_is_null else np.zeros(0, dtype=np.bool_)
        nulls = int(np.count_nonzero(missing))
        validity = pa.py_buffer(np.packbits(~missing, bitorder="little")) if nulls else None
        values = pa.py_buffer(text[bases[t]:bases[t] + sizes[t]])
        columns.append(pa.Array.from_buffers(pa.string(), rows, [validity, pa.py_buffer(offsets[t]), values], nulls))
        fields.append(pa.field(name, pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def _columns(names: Sequence[str], wanted: Sequence[str]) -> np.ndarray:
    """The positions in a line of the columns ``wanted``."""
    return np.array([names.index(name) for name in wanted], dtype=np.int64)


def keyed_columns(batch: Any) -> frozenset[str]:
    """The columns of a batch :func:`plain_lines` gave as keys."""
    return frozenset(f.name for f in batch.schema if f.metadata == KEYED)
