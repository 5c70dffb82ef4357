"""Rows of a pandas DataFrame as a column store, read exactly as the same rows in a raw file are.

    store = prepare_frame(df, "avazu", "prepared/avazu")            # train on it: --data prepared/avazu

A frame holds the schema's raw columns by name (``frame_columns``: the label, then each read
column, in its value dtype): Criteo's ``label``, ``I1`` .. ``I13`` (integers) and ``C1`` .. ``C26``
(8 hex digits); a declared schema's columns as its file has them (``int`` and ``float`` columns as
numbers or text, ``string`` and multi-valued columns as text: ``"Action|Comedy"``). A missing value
is ``None``, ``NaN`` or ``pd.NA`` (and, for a CSV schema, any of its ``null_values`` in a text
column: ``""`` by default, as an empty field of the file). Other columns of the frame are left out;
the label and ``kind = "ignored"`` columns may be absent (the label then reads 0: predictions only).

Criteo's rows are written as its TSV and read by its own parser (``tsv.py``); a schema's go to
the reader of its files as an in-memory Arrow table (``tabular.InMemoryTable``), validated the same
way. A bad value is one DataError naming the frame's row (1-based, in frame order) and column.
pandas is imported only here, and only when a frame is given.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .build import SchemaLike, atomic_directory, prepare
from .errors import DataError
from .inputs import WHOLE_FILE
from .schema import Schema, load_schema
from .split import DEFAULT_SPLIT, check_fractions
from .store import ColumnStore
from .tsv import BAD_ROW_POLICIES, COLUMN_NAMES

FRAME = "DataFrame"


def frame_columns(schema: SchemaLike = None) -> dict[str, str]:
    """The columns a frame of ``schema`` holds and their value dtypes (``int``, ``float`` or
    ``string``), the label first (itself a number)."""
    schema = load_schema(schema)
    return {schema.label.column: "float", **{c.name: c.value_dtype for c in schema.read_columns}}


def prepare_frame(frame: Any, schema: SchemaLike, output: str | os.PathLike, *,
                  split: Sequence[float] | None = DEFAULT_SPLIT, seed: int = 0, bad_rows: str = "fail",
                  overwrite: bool = False) -> ColumnStore:
    """A column store at ``output`` of the rows of ``frame`` (a pandas DataFrame) of ``schema``
    (None: criteo), split by ``split`` and ``seed`` as :func:`des.data.prepare` splits a file's rows
    (training statistics from the training rows); the store is complete or absent. ``bad_rows``:
    ``fail`` (a DataError naming row and column) or ``skip``."""
    schema = load_schema(schema)
    fractions = check_fractions(split)
    if bad_rows not in BAD_ROW_POLICIES:
        raise DataError(f"bad_rows must be one of {', '.join(BAD_ROW_POLICIES)}, not {bad_rows!r}")
    _check_frame(frame)
    if schema.format.type == "criteo":  # its rows are read by Criteo's reader, as its files are
        with tempfile.TemporaryDirectory(prefix="des-frame-") as folder:
            path = write_criteo_tsv(frame, Path(folder) / f"{FRAME}.tsv")
            with _named_rows(path):
                return prepare(path, output, schema=schema, split=fractions, seed=seed, bad_rows=bad_rows,
                               overwrite=overwrite, progress=False)
    from .tabular import resolve_statistics, write_store

    source = _in_memory(frame, schema)
    with atomic_directory(output, "replace" if overwrite else "error") as directory:
        resolved = resolve_statistics(schema, [source], fractions, int(seed), bad_rows, progress=False)
        write_store(resolved, [source], directory, fractions, int(seed), bad_rows, 1 << 18, progress=False)
    return ColumnStore.open(output)


def frame_store(frame: Any, schema: Schema, output: str | os.PathLike) -> ColumnStore:
    """The rows of ``frame`` as a store at ``output`` (a new folder) prepared whole, in frame order
    (every row in the test split), with a resolved ``schema`` (a checkpoint's: the training data's
    statistics): what ``des.evaluate --data FILE`` prepares from the same rows in a file."""
    _check_frame(frame)
    if schema.format.type == "criteo":
        path = write_criteo_tsv(frame, Path(output).with_name(f"{FRAME}.tsv"))
        try:
            with _named_rows(path):
                return prepare(path, output, schema=schema, split=WHOLE_FILE, seed=0, progress=False)
        finally:
            path.unlink(missing_ok=True)
    from .tabular import write_store

    assert schema.resolved
    with atomic_directory(output) as directory:
        write_store(schema, [_in_memory(frame, schema)], directory, WHOLE_FILE, 0, "fail", 1 << 18,
                          progress=False)
    return ColumnStore.open(output)


def _check_frame(frame: Any) -> None:
    if not hasattr(frame, "columns") or not hasattr(frame, "__len__"):
        raise DataError(f"expected a pandas DataFrame, not {type(frame).__name__}")
    if len(frame) == 0:
        raise DataError(f"the {FRAME} has no rows")


def _missing(frame: Any, name: str, schema_name: str) -> DataError:
    return DataError(f"the {FRAME} has no column {name!r}, which schema {schema_name} declares "
                     f"(its columns: {', '.join(map(str, frame.columns[:8]))}{', ...' if len(frame.columns) > 8 else ''})")


# ---------------------------------------------------------------------------------------------- Criteo
def write_criteo_tsv(frame: Any, path: Path) -> Path:
    """``frame``'s rows as Criteo TSV lines at ``path`` (missing values as empty fields; no label
    column: 0)."""
    import csv

    import pandas as pd

    columns = {}
    for name in COLUMN_NAMES:
        if name not in frame.columns:
            if name != "label":
                raise _missing(frame, name, "criteo")
            columns[name] = pd.Series(np.zeros(len(frame), np.int64), index=frame.index)
            continue
        series = frame[name]
        if pd.api.types.is_float_dtype(series.dtype) or pd.api.types.is_integer_dtype(series.dtype):
            values = series.to_numpy(dtype=np.float64, na_value=np.nan)
            fractional = ~np.isnan(values) & (values != np.floor(values))
            if fractional.any():
                row = int(np.flatnonzero(fractional)[0])
                raise DataError(f"{FRAME}:row {row + 1}: column {name}: {values[row]!r} is not an integer")
            series = series.astype("Int64")  # 3.0 -> 3
        else:
            text = series.astype("string")
            bad = np.flatnonzero(text.str.contains("[\t\r\n]", regex=True).fillna(False).to_numpy(bool))
            if bad.size:  # it would break the line apart
                raise DataError(f"{FRAME}:row {bad[0] + 1}: column {name}: {str(text.iloc[bad[0]])[:37]!r} holds a "
                                "tab or a line break")
        columns[name] = series
    pd.DataFrame(columns).to_csv(path, sep="\t", header=False, index=False, na_rep="", quoting=csv.QUOTE_NONE,
                                 lineterminator="\n")
    return path


class _named_rows:
    """DataErrors of the TSV written for a frame name the frame's rows, not the file's lines."""

    def __init__(self, path: Path) -> None:
        self.pattern = re.compile(re.escape(str(path)) + r":(\d+):")

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> bool:
        if isinstance(error, DataError) and self.pattern.search(str(error)):
            raise DataError(self.pattern.sub(lambda m: f"{FRAME}:row {m.group(1)}:", str(error))) from None
        return False


# ---------------------------------------------------------------------------------------------- schemas
def _in_memory(frame: Any, schema: Schema):
    """``frame``'s schema columns as an :class:`~des.data.tabular.InMemoryTable`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .tabular import InMemoryTable

    nulls = pa.array(list(schema.format.null_values), pa.string()) if schema.format.type == "csv" else None
    arrays, names = [], []
    for name in schema.file_columns:
        if name in frame.columns:
            array = _arrow(frame[name])
            if nulls is not None and len(nulls) and (pa.types.is_string(array.type) or
                                                     pa.types.is_large_string(array.type)):
                array = pc.if_else(pc.is_in(array, value_set=nulls), pa.scalar(None, array.type), array)
        elif name == schema.label.column:
            array = pa.array(np.zeros(len(frame)))
        elif schema.column(name).kind == "ignored":
            array = pa.nulls(len(frame), pa.string())
        else:
            raise _missing(frame, name, schema.name)
        arrays.append(array)
        names.append(name)
    return InMemoryTable(FRAME, pa.Table.from_arrays(arrays, names=names))


def _arrow(series: Any):
    """A pandas column as one Arrow array (missing values null); a column of mixed Python types
    as text."""
    import pyarrow as pa

    try:
        array = pa.array(series, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        array = pa.array([None if _is_missing(v) else str(v) for v in series], pa.string())
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _is_missing(value: Any) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False
