"""A serving client that knows nothing of des: plain TensorFlow on a raw Criteo TSV.

    python tests/serving_client.py ROWS.tsv OUT_PREFIX SAVEDMODEL...

Loads each SavedModel with ``tf.saved_model.load``, turns the TSV's 39 feature columns into the
``serving_default`` request (I1..I13 int64, missing = -2**63; C1..C26 strings, "" = missing) and
writes one probability per row to ``OUT_PREFIX<i>.txt``. Fails if des was imported.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np
import tensorflow as tf

MISSING_INT = -(2**63)


def request(path: str) -> dict:
    rows = [line.rstrip("\n").split("\t") for line in open(path)]
    columns = {}
    for i in range(13):
        columns[f"I{i + 1}"] = tf.constant([int(r[1 + i]) if r[1 + i] else MISSING_INT for r in rows], tf.int64)
    for i in range(26):
        columns[f"C{i + 1}"] = tf.constant([r[14 + i] for r in rows], tf.string)
    return columns


def main() -> None:
    tsv, prefix, *models = sys.argv[1:]
    columns = request(tsv)
    for i, folder in enumerate(models):
        serve = tf.saved_model.load(folder).signatures["serving_default"]
        np.savetxt(f"{prefix}{i}.txt", serve(**columns)["probability"].numpy(), fmt="%.9g")
    assert not any(name == "des" or name.startswith("des.") for name in sys.modules), "des was imported"


if __name__ == "__main__":
    main()
