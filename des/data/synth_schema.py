"""Synthetic data for any declared schema, with a known oracle (``des.data synth --schema``).

Each read column gets values of its kind, drawn in fixed blocks of ``BLOCK_ROWS`` rows from
``np.random.default_rng([seed, 0, block])`` (any chunking gives the same rows, a smaller dataset is
a prefix of a larger one): categorical columns Zipf-distributed ids (vocabularies of 10 to 10^5
by column, 2 % missing; string columns as the id's decimal text, hex ones as its 8 hex digits), multi-valued columns 0..k ids
(k = ``max_length`` + 1, else 4; weights in [0.5, 1.5) when weighted), sequences 0..``max_length`` + 2
ids (so some are cut to their most recent), a column sharing a table drawing the ids of the column
that owns it (and keyed as that field in the oracle), numeric columns N(0, 1)
(``log1p`` and ``log_squared`` columns: Zipf counts; 2 % missing), time inputs hours over two weeks
from 2014-10-21 (unix seconds or the declared format), ignored columns the row number. The rows
are then keyed exactly as preparing keys them (``features.encode_rows``; statistics from the
training rows, as ``prepare`` computes them), and the label comes from the same seeded
factorization machine over the keys as ``synth.py`` (plus a linear term of the dense values),
its bias calibrated to ``positive_rate``. A label with a rule is written as a value on the
right side of it.

The output is a raw file in the schema's format (CSV with its delimiter and header, ``.gz`` for
gzip, Parquet, or Criteo's TSV) that ``des.data prepare --schema`` reads back into the same keys, or directly
a column store with the true probabilities and the oracle's test AUC.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from des.metrics import logloss as log_loss, roc_auc

from .batch import FieldBatch
from .build import atomic_directory
from .errors import DataError
from .features import encode_rows
from ..splitmix import mix64, seed_to_uint64
from .schema import ColumnSpec, Schema, load_schema, manifest_sections
from .split import DEFAULT_SPLIT, assign_splits, check_fractions
from .store import ColumnStore, StoreWriter
from .synth import _ORACLE_SALT, _SQRT3, _accumulate_fm, calibrated_bias, zipf_ranks

BLOCK_ROWS = 1 << 15
GENERATOR_NAME = "des.data.synth_schema"
_VOCABULARIES = (10, 1_000, 100_000, 100, 10_000)
_MISSING_RATE = 0.02
_START_SECONDS = 1413849600  # 2014-10-21 00:00 UTC
_LINEAR_STD, _LATENT_STD, _LATENT_DIM = 0.15, 0.14, 4


def _time_formats(schema: Schema) -> dict[str, str]:
    """Input column -> the time format a derived field reads it with."""
    return {derived.inputs[0]: derived.options["time_format"] for derived in schema.derived
            if "time_format" in derived.options}


def _strings(values: np.ndarray, missing: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.array(values, mask=missing).cast(pa.string())


def _column(column: ColumnSpec, index: int, rng: np.random.Generator, rows: int, first_row: int,
            time_format: str | None) -> Any:
    """One block of a read column's raw values (an Arrow array of its value dtype)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    vocab = _VOCABULARIES[index % len(_VOCABULARIES)]
    missing = rng.random(rows) < _MISSING_RATE
    if column.kind == "ignored":
        return pa.array(np.arange(first_row, first_row + rows)).cast(pa.string())
    if column.is_list:
        top = 4 if not column.max_length else column.max_length + (2 if column.kind == "sequence" else 1)
        lengths = rng.integers(0, top + 1, rows)
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        ids = pa.array(zipf_ranks(rng.random(int(offsets[-1])), vocab, 1.1)).cast(pa.string())
        if column.weight_separator is not None:
            weights = pa.array(np.round(rng.uniform(0.5, 1.5, len(ids)), 3)).cast(pa.string())
            ids = pc.binary_join_element_wise(ids, weights, column.weight_separator)
        return pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), ids), column.separator)
    if column.kind == "numeric":
        if column.transform == "log1p" or column.buckets == "log_squared":
            values = zipf_ranks(rng.random(rows), 100_000, 1.2).astype(np.float64)
        else:
            values = rng.standard_normal(rows)
        return pa.array(values.astype(np.int64) if column.dtype == "int" else values, mask=missing)
    if column.kind == "input" and time_format is not None:
        seconds = _START_SECONDS + 3600 * rng.integers(0, 24 * 14, rows)
        if time_format == "unix":
            return pa.array(seconds, mask=missing)
        stamps = pa.array(seconds.astype("datetime64[s]"))
        return pc.if_else(pa.array(missing), pa.scalar(None, pa.string()), pc.strftime(stamps, format=time_format))
    ranks = zipf_ranks(rng.random(rows), vocab, 1.1)
    if column.dtype == "hex":  # the id's 8 hex digits
        return pc.if_else(pa.array(missing), pa.scalar(None, pa.string()), pa.array(np.char.mod("%08x", ranks)))
    if column.value_dtype == "int":
        return pa.array(ranks, mask=missing)
    if column.value_dtype == "float":
        return pa.array(rng.standard_normal(rows), mask=missing)
    return _strings(ranks, missing)


class SchemaGenerator:
    """Draws blocks of raw rows of a schema and their oracle probabilities."""

    def __init__(self, schema: Schema, seed: int, split: Sequence[float], positive_rate: float, rows: int) -> None:
        if not 0.0 < positive_rate < 1.0:
            raise DataError(f"positive_rate must be in (0, 1), not {positive_rate}")
        self.seed = int(seed)
        self.split = check_fractions(split)
        self.positive_rate = positive_rate
        self.time_formats = _time_formats(schema)
        self.schema = self._resolved(schema, rows)
        self._salt = np.uint64(mix64(seed_to_uint64(self.seed) ^ _ORACLE_SALT))
        rng = np.random.default_rng([self.seed % (1 << 63), 2])
        self._dense_weights = _LINEAR_STD * _SQRT3 * rng.uniform(-1.0, 1.0, len(self.schema.dense_columns))
        self.bias = self._calibrate()

    def raw_block(self, index: int, rows: int = BLOCK_ROWS) -> dict[str, Any]:
        """The read columns of block ``index`` (its first ``rows`` rows), Arrow arrays by name."""
        rng = np.random.default_rng([self.seed % (1 << 63), 0, index])
        first = index * BLOCK_ROWS
        index = {c.name: i for i, c in enumerate(self.schema.columns)}
        columns = {c.name: _column(c, index[self.schema.table_owner(c.name)], rng, BLOCK_ROWS, first,
                                   self.time_formats.get(c.name))
                   for c in self.schema.columns}
        return {name: array.slice(0, rows) for name, array in columns.items()}

    def _resolved(self, schema: Schema, rows: int) -> Schema:
        """The schema with the statistics of the training rows of the ``rows`` generated rows, as
        ``prepare`` computes them from the raw file (a first pass over the blocks)."""
        if schema.resolved:
            return schema
        from .tabular import _Statistics

        self.schema = schema
        stats = [_Statistics(c, self.seed, i) for i, c in enumerate(c for c in schema.columns if c.needs_statistics)]
        for block in range(math.ceil(rows / BLOCK_ROWS)):
            size = min(BLOCK_ROWS, rows - block * BLOCK_ROWS)
            raw = self.raw_block(block, size)
            train = assign_splits(self.seed, self.split, block * BLOCK_ROWS, size) == 0
            for accumulator in stats:
                values = np.asarray(raw[accumulator.column.name].to_numpy(zero_copy_only=False), np.float64)
                accumulator.add(values[train])
        return schema.with_statistics({a.column.name: a.result() for a in stats})

    def _logits(self, raw: dict[str, Any], rows: int) -> tuple[list, np.ndarray | None, np.ndarray]:
        encoded = encode_rows(self.schema, raw, rows)
        linear = np.zeros(rows)
        latent_sum = np.zeros((rows, _LATENT_DIM))
        square_sum = np.zeros(rows)
        one_hot = np.arange(rows + 1, dtype=np.int64)
        no_weights = np.zeros(0, dtype=np.float32)
        names = self.schema.field_names
        for name, column in zip(names, encoded.columns):
            block = column if isinstance(column, FieldBatch) else FieldBatch(one_hot, column, None)
            # the number of the field whose table it uses in the keys: a field's keys only need to be
            # unique within its table
            keys = block.keys ^ np.int64(names.index(self.schema.table_owner(name)) << 56)
            weights = no_weights if block.weights is None else block.weights
            _accumulate_fm(block.offsets, keys, weights, block.weights is not None, self._salt, _LINEAR_STD,
                           _LATENT_STD, linear, latent_sum, square_sum)
        logits = linear + 0.5 * ((latent_sum ** 2).sum(axis=1) - square_sum)
        if encoded.dense is not None:
            logits += encoded.dense.astype(np.float64) @ self._dense_weights
        return encoded.columns, encoded.dense, logits

    def _calibrate(self) -> float:
        rng_block = 1 << 40  # a block index no dataset reaches: the calibration rows
        return calibrated_bias(self._logits(self.raw_block(rng_block), BLOCK_ROWS)[2], self.positive_rate)

    def blocks(self, rows: int) -> Iterator[tuple[dict[str, Any], list, np.ndarray | None, np.ndarray, np.ndarray]]:
        """``(raw columns, keyed columns, dense, probabilities, labels)`` of each block."""
        for index in range(math.ceil(rows / BLOCK_ROWS)):
            size = min(BLOCK_ROWS, rows - index * BLOCK_ROWS)
            raw = self.raw_block(index, size)
            columns, dense, logits = self._logits(raw, size)
            probabilities = (1.0 / (1.0 + np.exp(-(logits + self.bias)))).astype(np.float32)
            draw = np.random.default_rng([self.seed % (1 << 63), 1, index]).random(size)
            yield raw, columns, dense, probabilities, (draw < probabilities).astype(np.uint8)

    def label_values(self, labels: np.ndarray) -> Any:
        """The label column's raw values: 0/1, or values on either side of the rule."""
        import pyarrow as pa

        rule = self.schema.label.parsed_rule()
        if rule is None:
            return pa.array(labels.astype(np.int64))
        op, operands = rule
        x = operands[0]
        positive, negative = {">=": (x, x - 1), ">": (x + 1, x), "<=": (x, x + 1), "<": (x - 1, x), "==": (x, x + 1),
                              "!=": (x + 1, x), "in": (x, max(operands) + 1)}[op]
        values = np.where(labels == 1, positive, negative)
        return pa.array(values.astype(np.int64) if np.all(values == np.round(values)) else values)


def synthesize_schema(output: str | os.PathLike, rows: int, schema: Schema | str, *, seed: int = 0,
                      split: Sequence[float] = DEFAULT_SPLIT, positive_rate: float = 0.25, file_format: str = "store",
                      overwrite: bool = False) -> dict[str, Any]:
    """Write ``rows`` synthetic rows of ``schema``: a column store (``file_format="store"``) or a
    raw file in the schema's format (``"raw"``). Returns ``{"rows", "positive_rate", "oracle_auc"}``
    (the AUC of the true probabilities on the test split; None for a raw file or one class)."""
    if rows < 1:
        raise DataError(f"rows must be positive, not {rows}")
    generator = SchemaGenerator(load_schema(schema), seed, split, positive_rate, rows)
    if file_format == "raw":
        return _write_raw(generator, Path(output), rows, overwrite)
    if file_format != "store":
        raise DataError(f"file_format must be store or raw, not {file_format!r}")
    schema = generator.schema
    test_labels, test_probabilities = [], []
    with atomic_directory(output, "replace" if overwrite else "error") as directory:
        with StoreWriter(directory, schema.field_specs(), generator.split, generator.seed,
                         {"probabilities": np.float32}, dense_names=schema.dense_names) as writer:
            for _, columns, dense, probabilities, labels in generator.blocks(rows):
                codes = writer.append(labels, columns, {"probabilities": probabilities}, dense=dense)
                test_labels.append(labels[codes == 2])
                test_probabilities.append(probabilities[codes == 2])
            labels, probabilities = np.concatenate(test_labels), np.concatenate(test_probabilities)
            auc = roc_auc(labels, probabilities) if 0 < int(labels.sum()) < labels.shape[0] else None
            manifest = writer.finish(
                sources=[], **manifest_sections(schema),
                synthetic={"generator": GENERATOR_NAME, "block_rows": BLOCK_ROWS, "rows": rows,
                           "config": {"seed": generator.seed, "positive_rate": positive_rate},
                           "calibrated_bias": generator.bias,
                           "oracle": {"split": "test", "rows": int(labels.shape[0]), "auc": auc,
                                      "logloss": log_loss(labels, probabilities) if labels.shape[0] else None}})
    ColumnStore.open(output)
    return {"rows": rows, "positive_rate": manifest["positive_rate"], "oracle_auc": auc}


def _write_raw(generator: SchemaGenerator, target: Path, rows: int, overwrite: bool) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.csv as csv
    import pyarrow.parquet as pq

    schema = generator.schema
    if target.exists() and not overwrite:
        raise DataError(f"{target}: output already exists (remove it or pass --force)")
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.tmp-{os.getpid()}"
    names = schema.format.names if schema.format.type == "csv" and not schema.format.header else schema.file_columns
    delimiter, header = (schema.format.delimiter, schema.format.header) if schema.format.type == "csv" else ("\t", False)
    separators = {c.separator for c in schema.columns if c.is_list} | {
        c.weight_separator for c in schema.columns if c.is_list}
    quoting = "needed" if delimiter in separators else "none"  # as Avazu's files: no quotes
    positives = 0
    writer: Any = None
    try:
        sink = pa.output_stream(str(temporary), compression="gzip" if target.name.endswith(".gz") else None)
        with sink:
            for raw, _, _, _, labels in generator.blocks(rows):
                positives += int(labels.sum())
                arrays = {**raw, schema.label.column: generator.label_values(labels)}
                table = pa.table({name: arrays[name] for name in names})
                if schema.format.type == "parquet":
                    writer = writer or pq.ParquetWriter(sink, table.schema)
                    writer.write_table(table)
                    continue
                options = csv.WriteOptions(include_header=header and writer is None, delimiter=delimiter,
                                           quoting_style=quoting, quoting_header="none")
                csv.write_csv(table, sink, options)
                writer = True
            if writer is not None and writer is not True:
                writer.close()
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return {"rows": rows, "positive_rate": positives / rows, "oracle_auc": None}
