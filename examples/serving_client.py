"""A serving client that knows nothing of des: plain TensorFlow on raw rows (copy it).

    python examples/serving_client.py [--examples] ROWS OUT_PREFIX SAVEDMODEL...

Loads each SavedModel with ``tf.saved_model.load`` and writes one probability per row of ROWS to
``OUT_PREFIX<i>.txt`` (through ``serving_default``, one named input per column); with
``--examples`` also to ``OUT_PREFIX<i>.examples.txt`` through the ``examples`` signature, each row
sent as one serialized ``tf.Example`` (int64 as an ``int64_list``, string as a ``bytes_list``,
float64 as a ``bytes_list`` of its text; a missing value left out), the form whose call binds one
input instead of one per column. ROWS is a raw Criteo TSV (its 39 feature columns become the request: I1..I13
int64, missing = -2**63; C1..C26 strings, "" = missing) or a CSV with a header, whose columns are
sent as the signature declares them (int64: missing = -2**63, float64: missing = NaN, string: as
written, "" = missing): each column is built in its signature's dtype, so a request of mixed dtypes
is valid, and a value that is not of its column's dtype is refused naming the column and row
(TensorFlow's own refusal names an input by its position only). Fails if des was imported (the
tests run it as the proof that serving needs no des).
"""

import csv
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np
import tensorflow as tf

MISSING_INT = -(2**63)


def criteo_request(path: str) -> dict:
    rows = [line.rstrip("\n").split("\t") for line in open(path)]
    columns = {}
    for i in range(13):
        columns[f"I{i + 1}"] = tf.constant([int(r[1 + i]) if r[1 + i] else MISSING_INT for r in rows], tf.int64)
    for i in range(26):
        columns[f"C{i + 1}"] = tf.constant([r[14 + i] for r in rows], tf.string)
    return columns


def typed(name: str, values: list, dtype: tf.DType) -> tf.Tensor:
    """One column of the request in the signature's dtype; a value that does not convert is refused
    with the column's name and the row (1: the first after the header)."""
    convert, missing = {tf.int64: (int, MISSING_INT), tf.float64: (float, np.nan)}.get(dtype, (str, ""))
    out = []
    for row, value in enumerate(values, start=1):
        try:
            out.append(convert(value) if value not in ("", None) else missing)
        except ValueError:
            raise SystemExit(f"column {name}, row {row}: {value!r} is not {dtype.name}") from None
    return tf.constant(out, dtype)


def csv_request(path: str, signature: dict) -> dict:
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    missing = [name for name in signature if rows and name not in rows[0]]
    if missing:
        raise SystemExit(f"{path}: no column {', '.join(missing)} (the model takes {', '.join(signature)})")
    return {name: typed(name, [row[name] for row in rows], spec.dtype) for name, spec in signature.items()}


def serialized_examples(columns: dict) -> tf.Tensor:
    """The rows of a named request as serialized ``tf.Example`` s, a missing value left out."""
    features = [{} for _ in range(len(next(iter(columns.values()))))]
    for name, column in columns.items():
        for row, value in zip(features, column.numpy().tolist()):
            if column.dtype == tf.int64 and value != MISSING_INT:
                row[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
            elif column.dtype == tf.float64 and not np.isnan(value):  # repr: the float64's shortest exact text
                row[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[repr(value).encode()]))
            elif column.dtype == tf.string and value:
                row[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.constant([tf.train.Example(features=tf.train.Features(feature=row)).SerializeToString()
                        for row in features])


def main() -> None:
    examples = "--examples" in sys.argv[1:]
    rows, prefix, *models = [a for a in sys.argv[1:] if a != "--examples"]
    for i, folder in enumerate(models):
        signatures = tf.saved_model.load(folder).signatures
        serve = signatures["serving_default"]
        signature = serve.structured_input_signature[1]
        columns = csv_request(rows, signature) if rows.endswith(".csv") else criteo_request(rows)
        np.savetxt(f"{prefix}{i}.txt", serve(**columns)["probability"].numpy(), fmt="%.9g")
        if examples:
            p = signatures["examples"](examples=serialized_examples(columns))["probability"]
            np.savetxt(f"{prefix}{i}.examples.txt", p.numpy(), fmt="%.9g")
    assert not any(name == "des" or name.startswith("des.") for name in sys.modules), "des was imported"


if __name__ == "__main__":
    main()
