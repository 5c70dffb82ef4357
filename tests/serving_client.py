"""A serving client that knows nothing of des: plain TensorFlow on raw rows.

    python tests/serving_client.py ROWS OUT_PREFIX SAVEDMODEL...

Loads each SavedModel with ``tf.saved_model.load`` and writes one probability per row of ROWS to
``OUT_PREFIX<i>.txt``. ROWS is a raw Criteo TSV (its 39 feature columns become the request: I1..I13
int64, missing = -2**63; C1..C26 strings, "" = missing) or a CSV with a header, whose columns are
sent as the signature declares them (int64: missing = -2**63, float64: missing = NaN, string: as
written, "" = missing). Fails if des was imported.
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


def csv_request(path: str, signature: dict) -> dict:
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    columns = {}
    for name, spec in signature.items():
        values = [row[name] for row in rows]
        if spec.dtype == tf.int64:
            columns[name] = tf.constant([int(v) if v else MISSING_INT for v in values], tf.int64)
        elif spec.dtype == tf.float64:
            columns[name] = tf.constant([float(v) if v else np.nan for v in values], tf.float64)
        else:
            columns[name] = tf.constant(values, tf.string)
    return columns


def main() -> None:
    rows, prefix, *models = sys.argv[1:]
    for i, folder in enumerate(models):
        serve = tf.saved_model.load(folder).signatures["serving_default"]
        signature = serve.structured_input_signature[1]
        columns = csv_request(rows, signature) if rows.endswith(".csv") else criteo_request(rows)
        np.savetxt(f"{prefix}{i}.txt", serve(**columns)["probability"].numpy(), fmt="%.9g")
    assert not any(name == "des" or name.startswith("des.") for name in sys.modules), "des was imported"


if __name__ == "__main__":
    main()
