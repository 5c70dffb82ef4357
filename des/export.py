"""Export a trained checkpoint as a TensorFlow SavedModel that serves raw requests.

    .venv/bin/python -m des.export --checkpoint runs/deepfm-.../checkpoints --output exported/deepfm [--force]

The SavedModel's ``serving_default`` signature takes one batch of requests as named 1-D inputs of
equal length, one per raw column the data's schema reads (the checkpoint records it), and returns
``{"probability": [batch]}`` in the model's dtype (float32 by default):

* Criteo (the default schema): ``I1`` .. ``I13`` int64 (a missing value is ``-2**63``,
  ``MISSING_INT``) and ``C1`` .. ``C26`` strings (8 hex digits in either case, or ``""`` for
  missing). (The one integer a request cannot carry is -2**63 itself, which training clips like
  any value below -2**31.)
* any other schema: each read column in its declared dtype, int64 (missing ``-2**63``), float64
  (missing NaN) or string (missing ``""``); a multi-valued column as its delimited text
  (``"Action|Comedy"``). ``des_export.json`` lists them.

Inside are, as plain TensorFlow ops and variables (loading it needs TensorFlow only, never des):

* the key transform of training: Criteo's (``des/data/keys.py``: ``v if v <= 2 else
  floor(ln(v)^2)`` for integers, done with a table of the exact thresholds of des's own transform
  so it is bit-exact, hex parsing, ``key = ((field + 1) << 40) | u``) or the schema's
  (``des/data/features.py``: string hashing, buckets, time parts, crosses, multi-valued splitting,
  truncation and pooling weights, the dense features' transforms with the training statistics);
* one hash table per field from key to row and, per value block, the matrix of the trained rows
  (rows of ids not yet admitted keep what training gives them: their initial value, or zero; with
  ``--unadmitted shared`` only admitted ids are kept);
* the run's unknown-id behaviour: ``--unadmitted zero`` gives zeros, ``init`` the id's
  deterministic initial value, recomputed with the same splitmix64 streams in uint64 ops
  (``des/hashtable/init.py``), ``shared`` the field's trained out-of-vocabulary row (also for ids
  seen in training but not admitted), as ``des.evaluate`` looks them up;
* the field-sliced weights, the dense features' weights and the top network, applied through each
  substitution's ``reference`` form (the whole-model forward, as ``des.evaluate`` computes it).

A request with a missing or extra column, or a column of another type, is refused by the signature;
a value the key transform cannot read (a Criteo categorical that is not 8 hex digits, a timestamp
not in its format) or columns of unequal length fail with an ``InvalidArgumentError`` naming the
column. The checkpoint may come from any number of ranks and any strategy: only its per-field files
are read, one field at a time, on one process.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from des import runtime  # noqa: F401  (quiets TensorFlow before it is imported)
from des.collectives import run_main
from des.data.features import MISSING_INT  # an integer column's "missing" in a request
from des.data.features import tf_mix64
from des.errors import ArgumentParser, ConfigError, DesError, UsageError
from des.splitmix import GOLDEN_GAMMA

_GOLDEN = int(GOLDEN_GAMMA)
_MAX_ATTEMPTS = 64  # truncated normal: as des.hashtable.init


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="des.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder, checkpoints/ folder or run folder")
    parser.add_argument("--output", required=True, help="SavedModel folder to create")
    parser.add_argument("--force", action="store_true", help="replace an existing --output folder")
    parser.add_argument("--schema", default="", help="the data's schema (default: the checkpoint's; another is "
                        "refused)")
    return parser


# ---------------------------------------------------------------------------------- key transform
def integer_token_thresholds() -> "np.ndarray":
    """``t[i]``: the smallest int64 ``v >= 3`` whose token (des's own ``integer_token``) is at least
    ``i + 2``. For ``v >= 3`` the token is then ``1 + #{i: t[i] <= v}``: an exact copy of training's
    transform (float64 ``ln`` rounding included) without a logarithm in the graph."""
    import numpy as np

    from des.data.keys import integer_token

    top = integer_token(2**63 - 1)
    thresholds = []
    lo = 3
    for token in range(2, top + 1):
        hi = 2**63 - 1
        while lo < hi:  # smallest v in [lo, hi] with integer_token(v) >= token
            mid = (lo + hi) // 2
            if integer_token(mid) >= token:
                hi = mid
            else:
                lo = mid + 1
        thresholds.append(lo)
    out = np.array(thresholds, dtype=np.int64)
    # The transform must be monotone for a threshold table to be exact; check around each step.
    for i, v in enumerate(thresholds):
        if integer_token(v) != i + 2 or integer_token(v - 1) != i + 1:
            raise AssertionError(f"integer transform is not a step function at {v}")
    return out


def _hex_digit_table() -> list[int]:
    table = [-1] * 256
    for text in ("0123456789abcdef", "0123456789ABCDEF"):
        for value, char in enumerate(text):
            table[ord(char)] = value
    return table


class CriteoKeys:
    """The raw Criteo columns of a batch -> int64 keys ``[B, 39]``, in TF ops (``des/data/keys.py``)."""

    def __init__(self) -> None:
        import tensorflow as tf

        from des.data.keys import (FIELD_SHIFT, INT_TOKEN_MAX, INT_TOKEN_MIN, INT_TOKEN_OFFSET, MISSING_VALUE,
                                   NUM_CAT_FIELDS, NUM_INT_FIELDS)

        self.num_int, self.num_cat = NUM_INT_FIELDS, NUM_CAT_FIELDS
        self.shift, self.missing = FIELD_SHIFT, MISSING_VALUE
        self.token_min, self.token_max, self.offset = INT_TOKEN_MIN, INT_TOKEN_MAX, INT_TOKEN_OFFSET
        self.thresholds = tf.constant(integer_token_thresholds())
        self.hex_digits = tf.constant(_hex_digit_table(), tf.int64)

    def integer(self, fields: list[int], values: Any) -> Any:
        """Keys ``[B, n]`` of int64 columns ``[B, n]`` of fields ``fields`` (``MISSING_INT`` = missing)."""
        import tensorflow as tf

        flat = tf.reshape(values, [1, -1])  # searchsorted wants one row of values per sequence
        large = 1 + tf.reshape(tf.searchsorted(self.thresholds[None, :], flat, side="right", out_type=tf.int64),
                               tf.shape(values))
        token = tf.where(values <= 2, values, large)
        u = tf.clip_by_value(token, self.token_min, self.token_max) + self.offset
        u = tf.where(values == MISSING_INT, tf.constant(self.missing, tf.int64), u)
        return tf.bitwise.bitwise_or(self._field_bits(fields), u)

    def categorical(self, fields: list[int], names: list[str], values: Any) -> Any:
        """Keys ``[B, n]`` of hex-string columns ``[B, n]`` (``""`` = missing); a value other than 8
        hex digits fails with an error naming its column."""
        import tensorflow as tf

        length = tf.strings.length(values)
        raw = tf.io.decode_raw(tf.reshape(values, [-1]), tf.uint8, fixed_length=8)  # [B * n, 8], zero-padded
        digits = tf.reshape(tf.gather(self.hex_digits, tf.cast(raw, tf.int32)), tf.concat([tf.shape(values), [8]], 0))
        valid = tf.logical_or(length == 0, tf.logical_and(length == 8, tf.reduce_all(digits >= 0, axis=2)))
        first_bad = tf.where(tf.logical_not(valid))[:1]  # [row, column] of the first bad value, if any
        check = tf.debugging.Assert(tf.reduce_all(valid), [
            "request column", tf.gather(tf.constant(names), first_bad[:, 1]),
            "has a value that is not 8 hex digits or empty (missing):", tf.gather_nd(values, first_bad)])
        with tf.control_dependencies([check]):
            powers = tf.constant([16**i for i in range(7, -1, -1)], tf.int64)
            u = tf.reduce_sum(tf.maximum(digits, 0) * powers, axis=2)
        u = tf.where(length == 0, tf.constant(self.missing, tf.int64), u)
        return tf.bitwise.bitwise_or(self._field_bits(fields), u)

    def _field_bits(self, fields: list[int]) -> Any:
        import tensorflow as tf

        return tf.constant([(f + 1) << self.shift for f in fields], tf.int64)[None, :]


# ---------------------------------------------------------------------------------- initial values
def tf_splitmix64(z: Any) -> Any:
    """The TensorFlow twin of ``des.splitmix.splitmix64`` on a uint64 tensor: ``mix64(z +
    GOLDEN_GAMMA)``, the finalizer being ``des.data.features.tf_mix64`` (bit for bit the numba
    functions: ``tests/test_export.py``)."""
    import tensorflow as tf

    return tf_mix64(z + tf.constant(_GOLDEN, tf.uint64))


def _unit(cs: Any, j: Any) -> Any:
    """Draw ``j`` of stream ``cs`` in (0, 1), float64 (``des.hashtable.init._unit``)."""
    import tensorflow as tf

    u = tf_splitmix64(cs + tf.cast(j, tf.uint64) * tf.constant(_GOLDEN, tf.uint64))
    return (tf.cast(tf.bitwise.right_shift(u, tf.constant(11, tf.uint64)), tf.float64) + 0.5) * 2.0**-53


def _box_muller(cs: Any, attempt: Any) -> tuple[Any, Any]:
    import tensorflow as tf

    radius = tf.sqrt(-2.0 * tf.math.log(_unit(cs, 2 * attempt)))
    cos, sin = _cos_sin_turn(_unit(cs, 2 * attempt + 1))
    return radius * cos, radius * sin


def _cos_sin_turn(v: Any) -> tuple[Any, Any]:
    """``(cos, sin)(2 pi v)`` reduced by the turn as ``des.hashtable._libm.cos_sin_turn`` does:
    ``4 v = q + r`` exactly, then the quadrant ``q`` of ``(cos, sin)(r pi/2)``."""
    import tensorflow as tf

    q = tf.floor(4.0 * v + 0.5)
    x = (4.0 * v - q) * (math.pi / 2)
    c, s = tf.cos(x), tf.sin(x)
    quadrant = tf.bitwise.bitwise_and(tf.cast(q, tf.int64), 3)
    odd = tf.equal(tf.bitwise.bitwise_and(quadrant, 1), 1)
    one = tf.ones_like(v)
    cos_sign = tf.where(tf.logical_or(tf.equal(quadrant, 1), tf.equal(quadrant, 2)), -one, one)
    sin_sign = tf.where(quadrant >= 2, -one, one)
    return cos_sign * tf.where(odd, s, c), sin_sign * tf.where(odd, c, s)


def initial_values(keys: Any, bases: Any, kind: str, scale: float, dim: int) -> Any:
    """float64 ``[n, dim]`` initial values of int64 ``keys`` with per-key stream bases (uint64), the
    same streams as ``des.hashtable.init.init_row``."""
    import numpy as np
    import tensorflow as tf

    n = tf.shape(keys)[0]
    if kind == "zeros":
        return tf.zeros([n, dim], tf.float64)
    kh = tf_splitmix64(tf.bitwise.bitwise_xor(bases, tf.bitcast(keys, tf.uint64)))[:, None]
    golden = tf.constant(_GOLDEN, tf.uint64)
    if kind == "uniform":
        streams = kh + tf.constant(np.arange(dim, dtype=np.uint64))[None, :] * golden
        return scale * (2.0 * _unit(tf_splitmix64(streams), 0) - 1.0)
    pairs = (dim + 1) // 2
    cs = tf_splitmix64(kh + tf.constant(np.arange(pairs, dtype=np.uint64))[None, :] * golden)  # [n, pairs]
    z0, z1 = _box_muller(cs, 0)
    if kind == "truncated_normal":
        # Each output takes the first attempt with |z| <= 2, clipped after 64 attempts.
        def body(a, z0, z1):
            n0, n1 = _box_muller(cs, a)
            return a + 1, tf.where(tf.abs(z0) > 2.0, n0, z0), tf.where(tf.abs(z1) > 2.0, n1, z1)

        def more(a, z0, z1):
            return tf.logical_and(a < _MAX_ATTEMPTS, tf.reduce_any(tf.abs(tf.concat([z0, z1], 1)) > 2.0))

        _, z0, z1 = tf.while_loop(more, body, (tf.constant(1, tf.int64), z0, z1))
        z0, z1 = tf.clip_by_value(z0, -2.0, 2.0), tf.clip_by_value(z1, -2.0, 2.0)
    elif kind != "normal":
        raise ConfigError(f"initializer {kind!r} cannot be exported")
    return scale * tf.reshape(tf.stack([z0, z1], axis=2), [n, 2 * pairs])[:, :dim]


# ---------------------------------------------------------------------------------- checkpoint reading
def _top_names(model: Any) -> list[str]:
    """The replicated weights in ``dense.npz``: the top network's and the dense features' (named as
    :class:`des.strategies.components.DenseParams` names them)."""
    return [*model.top_params(), *(f"{i}:{sub.name}:{p}" for i, sub in enumerate(model.substitutions())
                                   for p in sub.dense_params())]


def _read_checkpoint(folder: Path, manifest: dict[str, Any], model: Any) -> dict[str, Any]:
    """Every field's rows (values as training gathers them), field-sliced weights and the
    replicated weights; with ``--unadmitted shared`` only the admitted keys, and per block the
    ``[fields, dim]`` values of every field's shared row (``shared``: what an unknown or unadmitted
    key is looked up as). ``keys[f]`` are field ``f``'s keys, whose rows are ``values[block]``'s
    rows ``offsets[f]`` on."""
    import numpy as np

    from des.checkpoint import as_checkpoint_error, verified_file

    blocks = [b.name for b in model.blocks()]
    keys, values, shared = [], {b: [] for b in blocks}, {b: [] for b in blocks}
    field_params: dict[str, list[np.ndarray]] = {}
    table: dict[str, Any] = {}
    for field in range(model.num_fields):
        table = _read_field_table(folder, manifest, field, blocks)
        keys.append(table["keys"])
        for b in blocks:
            values[b].append(table["values"][b])
            if table["shared"]:
                shared[b].append(table["shared"][b])
        path = verified_file(folder, manifest, f"field-{field:03d}.dense.npz")
        with as_checkpoint_error(path), np.load(path, allow_pickle=False) as arrays:
            for name in arrays.files:
                if name.endswith("__value") and "__state__" not in name:
                    field_params.setdefault(name[: -len("__value")], []).append(arrays[name])
    path = verified_file(folder, manifest, "dense.npz")
    with as_checkpoint_error(path), np.load(path, allow_pickle=False) as arrays:
        top = {name: arrays[f"{name}__value"] for name in _top_names(model)}
    return {
        "keys": keys,
        "offsets": np.concatenate([[0], np.cumsum([k.size for k in keys])]).astype(np.int64),
        "values": {b: np.concatenate(v) if v else np.zeros((0, table["specs"][b].dim)) for b, v in values.items()},
        "field_params": {k: np.stack(v) for k, v in field_params.items()},
        "top": top, "specs": table["specs"], **table["options"],
        "shared": {b: np.stack(v) for b, v in shared.items() if v},
    }


def _read_field_table(folder: Path, manifest: dict[str, Any], field: int, blocks: list[str]) -> dict[str, Any]:
    """One field's table: the keys to serve, their values per block (as training gathers them),
    the shared row's values (``--unadmitted shared``), the blocks' specs and the table's options."""
    import numpy as np

    from des.checkpoint import field_table
    from des.hashtable.table import SHARED_KEY

    table = field_table(folder, manifest, field)  # a field split by key: its shares as one table
    if [b.name for b in table.blocks] != blocks:
        raise ConfigError(f"checkpoint {folder}: field {field}'s table has blocks {[b.name for b in table.blocks]}, "
                          f"expected {blocks}")
    field_keys = table.keys()
    rows = np.arange(field_keys.size, dtype=np.int64)
    shared = {}
    if table.unadmitted == "shared":
        # An evaluation lookup of the shared key itself: its row (made as training would make it,
        # with its initial value, if the table has none yet). Unadmitted keys are left out: served
        # as unknown, they get this row, as lookup maps them to it.
        shared_key = np.array([SHARED_KEY], dtype=np.int64)
        shared_row = table.lookup(shared_key, insert=False)
        shared = {b: table.gather(b, shared_key, shared_row)[0] for b in blocks}
        keep = (field_keys != SHARED_KEY) & table.metadata(rows)["admitted"]
        field_keys, rows = field_keys[keep], rows[keep]
    # gather applies admission: a not-yet-admitted row gives its initial value or zero
    return {"keys": field_keys, "values": {b: table.gather(b, field_keys, rows) for b in blocks}, "shared": shared,
            "specs": {b.name: b for b in table.blocks},
            "options": {"seed": table.seed, "min_count": table.min_count, "unadmitted": table.unadmitted,
                        "dtype": table.dtype}}


# ---------------------------------------------------------------------------------- the module
class FieldIds:
    """One field's ids in a request, as TF tensors: ``keys`` (int64, flat), ``row_ids`` (the sample
    of each key; None: one key per sample, in order) and ``weights`` (float, flat; None: all 1)."""

    def __init__(self, keys: Any, row_ids: Any = None, weights: Any = None) -> None:
        self.keys, self.row_ids, self.weights = keys, row_ids, weights

    @classmethod
    def of(cls, keys: Any, weights: Any = None) -> "FieldIds":
        """From a ``[B]`` tensor of one-hot keys or a ``RaggedTensor`` ``[B, None]`` (and its weights)."""
        import tensorflow as tf

        if isinstance(keys, tf.RaggedTensor):
            return cls(keys.flat_values, keys.value_rowids(), None if weights is None else weights.flat_values)
        return cls(keys)


def request_fields(schema: Any, request: dict[str, Any]) -> tuple[list[FieldIds], Any]:
    """A request's ids per field (the store's field order) and its dense features ``[B, D]`` (or
    None): Criteo's key transform (key scheme 1) or a schema's (``des.data.features``)."""
    import tensorflow as tf

    from des.data.keys import FIELD_NAMES, NUM_INT_FIELDS

    if schema.is_criteo:
        columns = [request[name] for name in FIELD_NAMES]
        size = tf.shape(columns[0])[0]
        checks = [tf.debugging.assert_equal(tf.shape(c)[0], size,
                                            message=f"column {name} has another number of rows than I1")
                  for name, c in zip(FIELD_NAMES, columns)]
        with tf.control_dependencies(checks):
            integers = tf.stack(columns[:NUM_INT_FIELDS], axis=1)
            strings = tf.stack(columns[NUM_INT_FIELDS:], axis=1)
        # One op sequence for all integer columns and one for all hex columns (fewer ops per request).
        keys_op, fields = CriteoKeys(), list(range(len(FIELD_NAMES)))
        keys = tf.concat([keys_op.integer(fields[:NUM_INT_FIELDS], integers),
                          keys_op.categorical(fields[NUM_INT_FIELDS:], list(FIELD_NAMES[NUM_INT_FIELDS:]), strings)],
                         axis=1)
        return [FieldIds(keys[:, f]) for f in fields], None
    from des.data.features import ServingFeatures

    columns = list(request.values())
    size = tf.shape(columns[0])[0]
    checks = [tf.debugging.assert_equal(tf.shape(c)[0], size, message=f"column {name} has another number of rows "
                                        f"than {next(iter(request))}") for name, c in request.items()]
    with tf.control_dependencies(checks):
        served = ServingFeatures(schema)({name: tf.identity(c) for name, c in request.items()})
    fields = [FieldIds.of(served.keys[name], served.weights.get(name)) for name in schema.field_names]
    return fields, served.dense if schema.dense_names else None


def request_signature(schema: Any) -> dict[str, Any]:
    """``serving_default``'s inputs: a name -> ``tf.TensorSpec([None], dtype)`` per raw column."""
    import tensorflow as tf

    from des.data.keys import FIELD_NAMES, NUM_INT_FIELDS

    if schema.is_criteo:
        return {name: tf.TensorSpec([None], tf.int64 if f < NUM_INT_FIELDS else tf.string, name=name)
                for f, name in enumerate(FIELD_NAMES)}
    from des.data.features import ServingFeatures

    return ServingFeatures(schema).signature()


class ServedModel:
    """The trained model as TF variables and hash tables (held by :attr:`module`, the
    ``tf.Module`` that is saved), and its forward on a request's ids."""

    def __init__(self, model: Any, state: dict[str, Any]) -> None:
        import tensorflow as tf

        from des.hashtable import Initializer

        self.model, self.substitutions = model, model.substitutions()
        self.dtype = tf.as_dtype(state["dtype"])
        self.unadmitted, self.specs = state["unadmitted"], state["specs"]
        # one table per field (a field's keys are unique within it): key -> row of the values
        self.tables = []
        for f, field_keys in enumerate(state["keys"]):
            table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
            table.insert(tf.constant(field_keys, tf.int64),
                         tf.range(field_keys.size, dtype=tf.int64) + int(state["offsets"][f]))
            self.tables.append(table)
        self.values = {b: tf.Variable(v, trainable=False, name=f"values_{b}") for b, v in state["values"].items()}
        self.field_params = {k: tf.Variable(v, trainable=False, name=k.replace(":", "_"))
                             for k, v in state["field_params"].items()}
        self.top = {k: tf.Variable(v, trainable=False, name=k.replace(":", "_")) for k, v in state["top"].items()}
        # --unadmitted shared: per block, [fields, dim] values of every field's shared row
        self.shared = {b: tf.Variable(v, trainable=False, name=f"shared_{b}") for b, v in state["shared"].items()}
        # uint64 stream bases per (block, field), as des.hashtable.init.Initializer.stream_base
        self.bases = {b: [Initializer.stream_base(state["seed"], f, b) for f in range(model.num_fields)]
                      for b in self.specs}
        #: what is saved: every table and variable above
        self.module = tf.Module(name="des_export")
        self.module.tables, self.module.values, self.module.shared = self.tables, self.values, self.shared
        self.module.field_params, self.module.top = self.field_params, self.top

    def unknown_values(self, f: int, keys: Any, block: str) -> Any:
        """What field ``f``'s unknown (or unadmitted) ``keys`` are looked up as: ``[n, dim]``."""
        import tensorflow as tf

        dim, count = self.specs[block].dim, tf.shape(keys)[0]
        if self.unadmitted == "shared":
            return tf.repeat(self.shared[block][f][None, :], count, axis=0)
        init = self.specs[block].init
        if self.unadmitted == "zero" or init.kind == "zeros":
            return tf.zeros([count, dim], self.dtype)
        bases = tf.fill(tf.shape(keys), tf.constant(self.bases[block][f], tf.uint64))
        return tf.cast(initial_values(keys, bases, init.kind, init.scale, dim), self.dtype)

    def pooled(self, f: int, ids: FieldIds, rows: Any, size: Any, block: str) -> Any:
        """``[B, dim]``: field ``f``'s values of ``block``, pooled per sample (as the tables' gather
        pools them: each id's value times its weight, summed), for its ids and their rows (-1:
        unknown)."""
        import tensorflow as tf

        out = tf.gather(self.values[block], tf.maximum(rows, 0))
        unknown = tf.where(rows < 0)
        out = tf.tensor_scatter_nd_update(out, unknown, self.unknown_values(f, tf.gather_nd(ids.keys, unknown), block))
        if ids.row_ids is None:  # one id per sample: its value
            return out
        if ids.weights is not None:
            out *= tf.cast(ids.weights, self.dtype)[:, None]
        return tf.math.unsorted_segment_sum(out, ids.row_ids, size)

    def probability(self, fields: list[FieldIds], dense: Any, size: Any) -> Any:
        """The whole model's forward (each substitution's ``reference``, then the top network)."""
        import tensorflow as tf

        rows = [self.tables[f].lookup(ids.keys) for f, ids in enumerate(fields)]
        pooled = {b: tf.stack([self.pooled(f, ids, r, size, b) for f, (ids, r) in enumerate(zip(fields, rows))],
                              axis=1) for b in self.specs}
        dense = None if dense is None else tf.cast(dense, self.dtype)
        outputs = []
        for i, sub in enumerate(self.substitutions):
            params = _named(self.field_params, f"{i}:{sub.name}:")
            if sub.reads_dense:
                outputs.append(sub.reference(pooled[sub.block], params, dense, _named(self.top, f"{i}:{sub.name}:")))
            else:
                outputs.append(sub.reference(pooled[sub.block], params))
        return tf.sigmoid(self.model.top(self.top, outputs))


def _named(weights: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The weights named ``prefix`` + name, by name."""
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def build_module(model: Any, state: dict[str, Any], schema: Any) -> Any:
    """A ``tf.Module`` whose ``serve`` is the ``serving_default`` signature (see the module doc)."""
    import tensorflow as tf

    served = ServedModel(model, state)
    module, signature = served.module, request_signature(schema)

    @tf.function(input_signature=[signature], autograph=False)
    def serve(request):
        fields, dense = request_fields(schema, request)
        return {"probability": served.probability(fields, dense, tf.shape(next(iter(request.values())))[0])}

    # A signature function takes keyword arguments: wrap so each column is its own named input.
    @tf.function(input_signature=list(signature.values()), autograph=False)
    def serving_default(*columns):
        return serve(dict(zip(signature, columns)))

    module.serve = serve
    module.serving_default = serving_default
    return module


def describe_inputs(schema: Any) -> str:
    """The request's columns, for ``des_export.json`` and the user."""
    if schema.is_criteo:
        return "I1..I13 int64 (missing: -2**63), C1..C26 string (8 hex digits, '' = missing)"
    from des.data.features import ServingFeatures

    kinds = {"int64": "int64 (missing: -2**63)", "float64": "float64 (missing: NaN)", "string": "string ('' = missing)"}
    multi = schema.multi_valued_names
    return ", ".join(f"{name} {kinds[dtype]}" + (" (a delimited list)" if name in multi else "")
                     for name, dtype in ServingFeatures(schema).request_columns().items())


def export(checkpoint: str | Path, output: str | Path, *, force: bool = False, schema: str = "") -> dict[str, Any]:
    """Write the SavedModel of ``checkpoint`` to ``output`` (atomically); returns what was written.
    ``schema``: a ``--schema`` given by the user, which must be the checkpoint's."""
    start = time.perf_counter()
    output = Path(output).resolve()
    if output.exists() and not force:
        raise ConfigError(f"output folder {output} exists (use --force to replace it)")
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    info = write_savedmodel(checkpoint, tmp, schema)
    _put_in_place(tmp, output, output.with_name(f".{output.name}.old-{os.getpid()}"))
    info["seconds"] = time.perf_counter() - start
    info["bytes"] = sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    return info


def write_savedmodel(checkpoint: str | Path, folder: Path, schema: str = "") -> dict[str, Any]:
    """Write the SavedModel of ``checkpoint`` and its ``des_export.json`` into ``folder`` (replaced
    if present; the caller renames it into place), verified and synced; returns the json's content.
    A bad checkpoint fails before anything is written."""
    import tensorflow as tf

    from des.checkpoint import read_manifest
    from des.config import TrainConfig
    from des.data.schema import trained_schema
    from des.plugins import load_plugins
    from des.building import build_model

    folder, (checkpoint, manifest) = Path(folder), read_manifest(checkpoint)
    config = TrainConfig(**manifest["config"])
    load_plugins(config.plugins)  # a user model (or a schema's transform) is rebuilt from its plugin
    data_schema = trained_schema(manifest.get("schema"), schema, f"checkpoint {checkpoint}")
    if len(data_schema.field_names) != manifest["num_fields"]:
        raise ConfigError(f"checkpoint {checkpoint} has {manifest['num_fields']} fields; its schema "
                          f"{data_schema.name!r} has {len(data_schema.field_names)}")
    model = build_model(config, manifest["num_fields"], manifest["model"].get("num_dense", 0))
    state = _read_checkpoint(checkpoint, manifest, model)
    module = build_module(model, state, data_schema)

    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serving_default})
    info = {"checkpoint": str(checkpoint), "step": manifest["step"], "ranks": manifest["ranks"],
            "model": manifest["model"], "dtype": manifest["dtype"], "rows": int(state["offsets"][-1]),
            "unadmitted": state["unadmitted"], "min_count": state["min_count"], "missing_int": MISSING_INT,
            "schema": data_schema.to_dict(), "inputs": describe_inputs(data_schema),
            "outputs": {"probability": manifest["dtype"]}}
    (folder / "des_export.json").write_text(json.dumps(info, indent=1))
    _verify_savedmodel(folder, set(request_signature(data_schema)))
    _sync_tree(folder)
    return info


def _verify_savedmodel(folder: Path, inputs: set[str]) -> None:
    """What a model server reads first, read back: the graph parses and its ``serving_default``
    takes ``inputs`` and returns ``probability``; the variables' index is there."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((folder / "saved_model.pb").read_bytes())
    signature = saved.meta_graphs[0].signature_def["serving_default"]
    if set(signature.inputs) != inputs or set(signature.outputs) != {"probability"} or \
            not (folder / "variables" / "variables.index").is_file():
        raise DesError(f"the SavedModel written to {folder} is incomplete: not putting it in place")


def _sync_tree(folder: Path) -> None:
    """fsync every file and folder below ``folder``: a rename must never publish a folder whose
    contents a crash of the machine could still lose."""
    for path in [*folder.rglob("*"), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _put_in_place(tmp: Path, final: Path, old: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is moved to ``old`` first and deleted
    last, so a crash leaves the old folder or the new one under ``final``, never half of one."""
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------- versions
# des.train --export-every: numbered SavedModels in TF Serving's layout (it serves the highest
# numeric subfolder and ignores others, so hidden names hide what is not complete).
_LEFTOVER_PREFIXES = (".tmp-", ".old-", ".del-")


def check_export_dir(path: str) -> Path:
    """``--export-dir`` resolved; a one-line :class:`ConfigError` if it is a file or cannot be
    written (nothing is created: the first export creates it)."""
    root = Path(path).resolve()
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"--export-dir {root}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--export-dir {root} is not writable: {existing} is not a writable directory")
    return root


def exported_versions(root: Path) -> list[int]:
    """The versions in ``root`` (its numeric subfolders), in increasing order."""
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isascii() and p.name.isdigit() and p.is_dir())


def export_version(checkpoint: str | Path, root: Path, version: int, keep: int = 0) -> dict[str, Any]:
    """Write ``checkpoint`` as ``root/<version>/`` (built in ``root/.tmp-<version>``, verified,
    then renamed into place; what a crashed export left is removed first). The new version is then
    the highest: versions above it (of a job that got further before this one resumed from an
    earlier checkpoint, or the steps after the best one an early stop went back to) are removed,
    and with ``keep`` all but the newest ``keep``. Returns ``{"version", "step", "path"}`` and
    ``bytes``, ``seconds``, ``removed``."""
    start = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.iterdir():
        if leftover.name.startswith(_LEFTOVER_PREFIXES):
            shutil.rmtree(leftover, ignore_errors=True)
    final = root / str(version)
    info = write_savedmodel(checkpoint, root / f".tmp-{version}")
    _put_in_place(root / f".tmp-{version}", final, root / f".old-{version}")
    versions = exported_versions(root)
    removed = [v for v in versions if v > version]
    if keep:  # the newest ``keep`` are this one and the ``keep - 1`` below it
        below = [v for v in versions if v < version]
        removed += below[: max(len(below) - (keep - 1), 0)]
    for v in removed:  # hidden by a rename first: a deletion cut short is never served
        os.replace(root / str(v), root / f".del-{v}")
        shutil.rmtree(root / f".del-{v}", ignore_errors=True)
    return {"version": version, "step": info["step"], "path": str(final), "removed": removed,
            "bytes": sum(p.stat().st_size for p in final.rglob("*") if p.is_file()),
            "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.output.strip():
        raise UsageError("--output must name a folder")
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() > 1:  # every rank would write the same folder
        raise UsageError("des.export runs on one process: start it without mpiexec")
    runtime.configure_threads()
    info = export(args.checkpoint, args.output, force=args.force, schema=args.schema)
    print(f"exported {info['model']['model']} (step {info['step']}, written by {info['ranks']} rank(s), "
          f"{info['rows']} rows) to {args.output}: {info['bytes'] / 2**20:.1f} MiB in {info['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    run_main(main, "des.export")
