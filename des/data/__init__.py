"""Data pipeline of des: raw Criteo reader, declared schemas of other tables, column store, batch
reader, synthetic data.

    store = open_dataset("datasets/criteo_sample.txt.gz")     # prepared once, then cached
    for batch in BatchReader(store, "train", fields=[0, 13], batch_size=4096, seed=0, epoch=0):
        batch.fields[13].keys, batch.fields[13].offsets, batch.labels, batch.rows

Separate train/validation/test inputs (several files or globs each) are read as one store by
``open_inputs`` (``des/data/inputs.py``), or prepared together into one store by ``prepare_splits``
(the training statistics from the training files only). Command line: ``python -m des.data
{prepare,synth,inspect} --help``. Every table, Criteo's too, is declared by a schema
(``des/data/schema.py``: ``load_schema``, built in ``criteo`` and ``avazu`` or a TOML file), read
by its format's reader (``tsv.py``: Criteo's TSV; ``tabular.py``: CSV and Parquet) and prepared
with ``prepare(..., schema=...)``; the keys (key scheme 2, and Criteo's key scheme 1, recorded in
``des/data/keys.py`` and ``datasets/README.md``), transforms and the TensorFlow side of both for
served models (``ServingFeatures``) are in ``des/data/features.py``. A pandas DataFrame of a
schema's raw columns becomes a store with ``prepare_frame(df, schema, output)`` (``frames.py``).
"""

import os as _os

from .._numba_cache import guard as _guard

# before any kernel module is imported: the kernels of tsv.py, split.py, synth.py, features.py and
# counting.py inline helpers and constants of keys.py and des/splitmix.py, which numba's per-file
# cache check does not see, so a changed keys.py would otherwise keep the old transform
# (des/_numba_cache.py)
_guard(_os.path.dirname(_os.path.abspath(__file__)), "des_data_sources.sha256")

from .batch import Batch, FieldBatch  # noqa: E402
from .batch_reader import BatchReader  # noqa: E402
from .build import atomic_directory, open_dataset, prepare, prepare_splits  # noqa: E402
from .errors import DataError  # noqa: E402
from .features import (  # noqa: E402
    KEY_SCHEME_2,
    ServedFeatures,
    ServingFeatures,
    Transform,
    encode_rows,
    register_transform,
)
from .frames import frame_columns, prepare_frame  # noqa: E402
from .inputs import ConcatStore, open_inputs  # noqa: E402
from .keys import (  # noqa: E402
    FIELD_NAMES,
    KEY_SCHEME,
    NUM_FIELDS,
    categorical_key,
    field_index,
    field_of_key,
    integer_key,
    integer_keys,
    integer_token,
    make_key,
    missing_key,
    value_of_key,
)
from .schema import Schema, load_schema  # noqa: E402
from .split import SPLIT_NAMES, assign_splits  # noqa: E402
from .store import ColumnStore  # noqa: E402
from .synth import SynthConfig, default_config, synthesize_store, synthesize_tsv  # noqa: E402
from .synth_schema import synthesize_schema  # noqa: E402
from .tabular import resolve_statistics  # noqa: E402

__all__ = [
    "FIELD_NAMES",
    "NUM_FIELDS",
    "KEY_SCHEME",
    "SPLIT_NAMES",
    "DataError",
    "ColumnStore",
    "ConcatStore",
    "open_inputs",
    "open_dataset",
    "prepare",
    "prepare_frame",
    "prepare_splits",
    "frame_columns",
    "atomic_directory",
    "Batch",
    "BatchReader",
    "FieldBatch",
    "make_key",
    "field_of_key",
    "value_of_key",
    "field_index",
    "integer_token",
    "integer_key",
    "integer_keys",
    "categorical_key",
    "missing_key",
    "assign_splits",
    "SynthConfig",
    "default_config",
    "synthesize_store",
    "synthesize_tsv",
    "synthesize_schema",
    "Schema",
    "load_schema",
    "resolve_statistics",
    "KEY_SCHEME_2",
    "Transform",
    "register_transform",
    "encode_rows",
    "ServingFeatures",
    "ServedFeatures",
]
