"""The served model: the SavedModel's TF graph of a trained model, taking a batch of requests' raw
columns and returning ``{"probability": [batch]}`` (``docs/design.md``, section 11).

Inside are, as plain TensorFlow ops and variables (loading it needs TensorFlow only, never des):

* the key transform of training, the schema's (``des/data/features.py``, each TF op next to its
  numpy twin: string hashing, hex ids, buckets (Criteo's ``log_squared`` too), key scheme 1's
  field tags, time parts, crosses, multi-valued splitting, truncation and pooling weights, the
  dense features' transforms with the training statistics);
* one hash table from key to row (int32 rows unless there are 2^31 of them: half the saved
  table's bytes) for all fields, each field's keys XORed with its salt (0 when the fields' keys
  are distinct already, as key scheme 1's carry their field), a row counting only inside its
  field's range of rows (so a key of another field that lands on the same salted key is unknown:
  exact), and the matrix of the trained rows, every value block's columns side by side so that
  one gather reads them all (``state.py``: rows of ids not yet admitted keep what training gives
  them, their initial value or zero; with ``--unadmitted shared`` only admitted ids are kept);
* the run's unknown-id behaviour: ``--unadmitted shared`` reads the field's trained
  out-of-vocabulary row (also for ids seen in training but not admitted), ``zero`` a row of zeros,
  both rows of the same matrix after the trained ones, so that a key's row or its field's
  fallback row is picked before the one gather (no op on the ids that miss); ``init`` computes
  the initial values of the ids that miss, only those, with the same splitmix64 streams in uint64
  ops (``des/hashtable/tf_init.py``, the twin of ``des/hashtable/init.py``), as ``des.evaluate``
  looks them up;
* the field-sliced weights, the dense features' weights and the top network, applied through each
  substitution's ``reference`` form (the whole-model forward, as ``des.evaluate`` computes it).

TensorFlow is imported only inside the functions: importing this module loads none of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from des import runtime  # noqa: F401  (quiets TensorFlow before it is imported)
from des.hashtable.tf_init import initial_values


def request_fields(schema: Any, request: dict[str, Any]) -> Any:
    """A request's :class:`des.data.features.ServedFeatures` (the schema's key transform), after
    one check that every column has the first one's number of rows (an error names the first
    column that has not)."""
    import tensorflow as tf

    from des.data.features import ServingFeatures

    by_dtype: dict[Any, list[str]] = {}
    for name, column in request.items():
        by_dtype.setdefault(column.dtype, []).append(name)
    names = [name for group in by_dtype.values() for name in group]
    lengths = tf.concat([tf.concat(tf.shape_n([request[n] for n in group], out_type=tf.int64), 0)
                         for group in by_dtype.values()], 0)
    wrong = tf.not_equal(lengths, lengths[0])
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(wrong)), [
        "column", tf.gather(tf.constant(names), tf.argmax(wrong)), f"has another number of rows than {names[0]}"])
    with tf.control_dependencies([check]):
        return ServingFeatures(schema)(request)


def request_signature(schema: Any) -> dict[str, Any]:
    """``serving_default``'s inputs: a name -> ``tf.TensorSpec([None], dtype)`` per raw column."""
    from des.data.features import ServingFeatures

    return ServingFeatures(schema).signature()


#: the second signature's name, and its one input's: a batch of serialized ``tf.Example`` s
EXAMPLES = "examples"


#: the text of a float64 feature ``parsed_examples`` accepts (RE2): a decimal number, optionally
#: signed, with an exponent, or nan / inf / infinity (any case), spaces around it
DECIMAL_TEXT = r"\s*[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|(?i:nan|inf|infinity))\s*"


def parsed_examples(schema: Any, examples: Any) -> dict[str, Any]:
    """The named request of ``examples`` (``[B]`` serialized ``tf.Example`` s, one a row), in one
    ``ParseExampleV2``: each raw column a feature of its name, int64 as an ``int64_list``, string as
    a ``bytes_list``, float64 as a ``bytes_list`` of its decimal text (a ``float_list`` holds
    float32, which would round the value before the schema's buckets and standardization see it;
    the text parsed here is the same correctly rounded float64 as a CSV cell's). A feature left out
    is the column's missing value (int64 ``-2**63``, string ``""``, float64 NaN; ``""`` also
    stands for NaN), so every column has the batch's length by construction; other features are ignored (as
    ``tf.Example`` consumers do); a feature of another type or with more than one value fails in
    the parse, naming its key, and a float64 feature's text that is not a number
    (:data:`DECIMAL_TEXT`) fails naming the feature."""
    import tensorflow as tf

    from des.data.features import MISSING_INT

    columns = request_signature(schema)
    spec = {name: tf.io.FixedLenFeature([], tf.int64 if c.dtype == tf.int64 else tf.string,
                                        default_value=MISSING_INT if c.dtype == tf.int64 else "")
            for name, c in columns.items()}
    parsed = tf.io.parse_example(examples, spec)
    for name, c in columns.items():
        if c.dtype == tf.float64:  # "" (missing) -> NaN, as the named form's missing float64
            text = parsed[name]
            bad = ~(tf.equal(text, "") | tf.strings.regex_full_match(text, DECIMAL_TEXT))
            check = tf.debugging.Assert(~tf.reduce_any(bad), [f"feature {name}: not a decimal number:",
                                                               tf.boolean_mask(text, bad)[:1]])
            with tf.control_dependencies([check]):  # TF's own parse error would not name the feature
                parsed[name] = tf.strings.to_number(tf.where(tf.equal(text, ""), "nan", text), tf.float64)
    return {name: parsed[name] for name in columns}


def field_salts(keys: list[np.ndarray]) -> np.ndarray:
    """Per field an int64 that its keys are XORed with to share one table with the other fields':
    zeros when all fields' keys are distinct already (key scheme 1's carry their field), else
    splitmix64 draws, drawn again until the salted keys are distinct (a clash has odds of about
    ``n^2 / 2^64``)."""
    from des.errors import DesError
    from des.splitmix import splitmix64_of

    total = sum(k.size for k in keys)
    for attempt in range(8):
        salts = np.array([splitmix64_of((attempt << 32) | f) if attempt else 0 for f in range(len(keys))],
                         dtype=np.uint64).view(np.int64)
        if np.unique(np.concatenate([k ^ s for k, s in zip(keys, salts)] or [np.zeros(0, np.int64)])).size == total:
            return salts
    raise DesError("the fields' keys clash in one table under every salt tried")


#: how an export may store its table rows (``des.export --export-dtype``)
ROW_DTYPES = ("float32", "int8")


def quantize_rows(values: np.ndarray, columns: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8-bit rows, as FBGEMM's and Monolith's served tables hold them: each row's values of each
    block (``columns``: its ``[start, end)``) mapped onto 256 levels between their minimum and
    maximum. Returns ``(q int8 [rows, Σ widths], scale, offset float32 [rows, blocks])``; a value
    is ``(q + 128) · scale + offset``, within ``scale / 2`` of the original (a block whose values
    are all equal: exactly)."""
    rows = values.shape[0]
    q = np.empty((rows, sum(end - start for start, end in columns)), dtype=np.int8)
    scale, offset = np.zeros((rows, len(columns)), np.float32), np.zeros((rows, len(columns)), np.float32)
    at = 0
    for b, (start, end) in enumerate(columns):
        block = values[:, start:end].astype(np.float64)
        lo, hi = block.min(axis=1), block.max(axis=1)
        offset[:, b], scale[:, b] = lo, (hi - lo) / 255.0
        step = np.where(scale[:, b] > 0, scale[:, b], 1.0)[:, None]
        levels = np.rint((block - offset[:, b:b + 1]) / step)
        q[:, at:at + end - start] = (np.clip(levels, 0, 255) - 128).astype(np.int8)
        at += end - start
    return q, scale, offset


class ServedModel:
    """The trained model as TF variables and one hash table (held by :attr:`module`, the
    ``tf.Module`` that is saved), and its forward on a request's features. ``rows_dtype``: the
    table rows as they are (``float32``: in the model's dtype) or ``int8`` (:func:`quantize_rows`,
    dequantized in the SavedModel for the rows a request reads)."""

    def __init__(self, model: Any, state: dict[str, Any], rows_dtype: str = "float32") -> None:
        import tensorflow as tf

        from des.hashtable import Initializer

        self.model, self.substitutions = model, model.substitutions()
        self.dtype = tf.as_dtype(state["dtype"])
        self.unadmitted, self.specs = state["unadmitted"], state["specs"]
        self.salts = field_salts(state["keys"])
        # rows as int32 where they fit (all but tables of 2^31 rows): the saved table's values take half
        self.row_dtype = np.int32 if state["offsets"][-1] + len(state["keys"]) < 2**31 else np.int64
        offsets = np.asarray(state["offsets"], dtype=self.row_dtype)
        self.first_row, self.end_row = offsets[:-1], offsets[1:]  # field f's rows: [first_row[f], end_row[f])
        # one table for all fields: salted key -> row of the values
        self.table = tf.lookup.experimental.MutableHashTable(tf.int64, self.row_dtype, default_value=-1)
        if offsets[-1]:
            self.table.insert(tf.constant(np.concatenate([k ^ s for k, s in zip(state["keys"], self.salts)])),
                              tf.range(int(offsets[-1]), dtype=self.row_dtype))
        # every block's values side by side, one row per key: block b is columns [start[b], end[b])
        self.blocks = list(self.specs)
        ends = np.cumsum([self.specs[b].dim for b in self.blocks])
        self.columns = {b: (int(e) - self.specs[b].dim, int(e)) for b, e in zip(self.blocks, ends)}
        values = np.concatenate([state["values"][b] for b in self.blocks], axis=1)
        # After the trained rows, the rows an id that misses is read from (``fallback[f]``: field f's):
        # --unadmitted shared: every field's shared row; zero: one row of zeros; init: none (its values
        # are computed, row 0 stands in)
        fields, trained = len(state["keys"]), int(offsets[-1])
        if self.unadmitted == "shared":
            values = np.concatenate([values, np.concatenate([state["shared"][b] for b in self.blocks], axis=1)])
            self.fallback = trained + np.arange(fields, dtype=self.row_dtype)
        else:
            if self.unadmitted == "zero":
                values = np.concatenate([values, np.zeros((1, values.shape[1]), values.dtype)])
            self.fallback = np.full(fields, trained if self.unadmitted == "zero" else 0, dtype=self.row_dtype)
        if rows_dtype not in ROW_DTYPES:
            raise ValueError(f"rows_dtype must be one of {', '.join(ROW_DTYPES)}, got {rows_dtype!r}")
        # int8: the blocks of 2 or more columns in 8 bits (a scale and an offset per row and block),
        # the others (order-1 weights: one value a row) as they are
        self.quantized = [b for b in self.blocks if rows_dtype == "int8" and self.specs[b].dim > 1]
        if self.quantized:
            q, scale, offset = quantize_rows(values, [self.columns[b] for b in self.quantized])
            self.codes = tf.Variable(q, trainable=False, name="codes")
            self.scale = tf.Variable(scale, trainable=False, name="scale")
            self.offset = tf.Variable(offset, trainable=False, name="offset")
            exact = [b for b in self.blocks if b not in self.quantized]
            values = np.concatenate([values[:, slice(*self.columns[b])] for b in exact], axis=1) if exact else \
                np.zeros((values.shape[0], 0), values.dtype)
            # the codes' columns, then the exact ones: each column's place in the model's order
            order = [c for b in (*self.quantized, *exact) for c in range(*self.columns[b])]
            self.column_of = np.argsort(order)
            self.code_block = np.concatenate([np.full(self.specs[b].dim, k) for k, b in enumerate(self.quantized)])
        self.values = tf.Variable(values, trainable=False, name="values")
        self.field_params = {k: tf.Variable(v, trainable=False, name=k.replace(":", "_"))
                             for k, v in state["field_params"].items()}
        self.top = {k: tf.Variable(v, trainable=False, name=k.replace(":", "_")) for k, v in state["top"].items()}
        # uint64 stream bases per (block, field), as des.hashtable.init.Initializer.stream_base (as int64
        # bits; of the table's field: a field using another's table draws as that one)
        self.bases = {b: np.array([Initializer.stream_base(state["seed"], owner, b) for owner in state["owners"]],
                                  dtype=np.uint64).view(np.int64) for b in self.specs}
        #: what is saved: the table and every variable above
        self.module = tf.Module(name="des_export")
        self.module.table, self.module.values = self.table, self.values
        self.module.field_params, self.module.top = self.field_params, self.top
        if self.quantized:
            self.module.codes, self.module.scale, self.module.offset = self.codes, self.scale, self.offset

    def lookup(self, keys: Any, per_field: Any) -> tuple[Any, Any]:
        """``(rows, known)`` of ``keys`` (int64, any shape), ``per_field(a)`` giving each key its
        field's entry of a per-field array (broadcast to the keys' shape): one lookup of the salted
        keys; ``known`` false where the key is unknown or the row found is another field's."""
        import tensorflow as tf

        salted = tf.bitwise.bitwise_xor(keys, per_field(self.salts)) if self.salts.any() else keys
        rows = self.table.lookup(salted)
        rows.set_shape(keys.shape)  # (the lookup's shape function gives none: later ops need the static one)
        return rows, tf.logical_and(rows >= per_field(self.first_row), rows < per_field(self.end_row))

    def rows(self, keys: Any, per_field: Any) -> Any:
        """The rows of ``keys`` (:meth:`lookup`), -1 where not known."""
        import tensorflow as tf

        rows, known = self.lookup(keys, per_field)
        return tf.where(known, rows, tf.constant(-1, rows.dtype))

    def initial(self, keys: Any, fields: Any) -> Any:
        """``[n, dims]``: what unknown (or unadmitted) ``keys`` (``[n]``) of ``fields`` are looked up as
        under ``--unadmitted init``, every block's values side by side."""
        import tensorflow as tf

        parts = []
        for b in self.blocks:
            dim, init = self.specs[b].dim, self.specs[b].init
            if init.kind == "zeros":
                parts.append(tf.zeros([tf.shape(keys)[0], dim], self.dtype))
            else:
                bases = tf.bitcast(tf.gather(tf.constant(self.bases[b]), fields), tf.uint64)
                parts.append(tf.cast(initial_values(keys, bases, init.kind, init.scale, dim), self.dtype))
        return tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]

    def gathered(self, index: Any) -> Any:
        """``[..., dims]``: every block's values of the rows ``index`` (any shape), in one gather
        (int8 rows: dequantized, then in the model's column order)."""
        import tensorflow as tf

        out = tf.gather(self.values, index)
        if self.quantized:  # (q + 128) · scale + offset, each code by its block's; then the model's column order
            scale = tf.gather(tf.gather(self.scale, index), self.code_block, axis=-1)
            offset = tf.gather(tf.gather(self.offset, index), self.code_block, axis=-1)
            codes = tf.cast((tf.cast(tf.gather(self.codes, index), tf.float32) + 128.0) * scale + offset, self.dtype)
            out = tf.gather(tf.concat([codes, out], axis=-1), self.column_of, axis=-1)
        return out

    def values_of(self, keys: Any, fields: Any) -> Any:
        """``[..., dims]``: every block's values of ``keys``, whose fields are ``fields``: a numpy
        array ``[k]`` (``keys`` ``[B, k]``, column j of field ``fields[j]``: per-field entries are
        constants broadcast over the rows) or an int64 tensor of the keys' shape. One gather: a
        known key's row, else its field's fallback row (:attr:`fallback`: shared or zero);
        ``--unadmitted init`` then computes the initial values of the ids that miss, only those."""
        import tensorflow as tf

        if isinstance(fields, np.ndarray):
            def per_field(table: np.ndarray) -> Any:
                return tf.constant(table[fields])

            def fields_at(where: Any) -> Any:
                return tf.gather(tf.constant(fields.astype(np.int64)), where[:, -1])
        else:
            def per_field(table: np.ndarray) -> Any:
                return tf.gather(tf.constant(table), fields)

            def fields_at(where: Any) -> Any:
                return tf.gather_nd(fields, where)
        rows, known = self.lookup(keys, per_field)
        out = self.gathered(tf.where(known, rows, per_field(self.fallback)))
        if self.unadmitted != "init":
            return out
        unknown = tf.where(tf.logical_not(known))
        return tf.tensor_scatter_nd_update(out, unknown, self.initial(tf.gather_nd(keys, unknown), fields_at(unknown)))

    def pooled(self, features: Any, size: Any) -> dict[str, Any]:
        """Per block ``[B, fields, dim]``: every field's values pooled per sample (as the tables'
        gather pools them: each id's value times its weight, summed, in the ids' order): the
        one-hot fields' ``[B, k]`` keys looked up as they are, the multi-valued fields' ids together."""
        import tensorflow as tf

        names, multi = list(features.field_names), list(features.multi_valued)
        dims = sum(spec.dim for spec in self.specs.values())
        parts = []
        if features.one_hot_names:
            parts.append(self.values_of(features.one_hot, np.array([names.index(n) for n in features.one_hot_names])))
        if multi:  # pooled into segment row * len(multi) + j
            keys, fields, segments, weights = [], [], [], []
            for j, name in enumerate(multi):
                ragged = features.multi_valued[name]
                keys.append(ragged.flat_values)
                fields.append(tf.fill(tf.shape(ragged.flat_values), tf.constant(names.index(name), tf.int64)))
                segments.append(ragged.value_rowids() * len(multi) + j)
                weights.append(tf.cast(features.weights[name].flat_values, self.dtype) if name in features.weights
                               else tf.ones(tf.shape(ragged.flat_values), self.dtype))
            values = self.values_of(tf.concat(keys, 0), tf.concat(fields, 0))
            sums = tf.math.unsorted_segment_sum(values * tf.concat(weights, 0)[:, None], tf.concat(segments, 0),
                                                size * len(multi))
            parts.append(tf.reshape(sums, [-1, len(multi), dims]))
        pooled = tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]
        order = [*features.one_hot_names, *multi]
        if order != names:
            pooled = tf.gather(pooled, [order.index(n) for n in names], axis=1)
        if len(self.blocks) == 1:
            return {self.blocks[0]: pooled}
        return {b: pooled[:, :, start:end] for b, (start, end) in self.columns.items()}

    def forward(self, pooled: dict[str, Any], dense: Any) -> Any:
        """The whole model's forward on its dense inputs (each substitution's ``reference``, then
        the top network): per block ``[B, fields, dim]`` and the dense features ``[B, D]`` (or None)."""
        import tensorflow as tf

        dense = None if dense is None else tf.cast(dense, self.dtype)
        outputs = []
        for i, sub in enumerate(self.substitutions):
            params = _named(self.field_params, f"{i}:{sub.name}:")
            if sub.reads_dense:
                outputs.append(sub.reference(pooled[sub.block], params, dense, _named(self.top, f"{i}:{sub.name}:")))
            else:
                outputs.append(sub.reference(pooled[sub.block], params))
        return tf.sigmoid(self.model.top(self.top, outputs))

    def probability(self, features: Any, dense: Any, size: Any) -> Any:
        """The whole model on a request's features: :meth:`pooled`, then :meth:`forward`."""
        return self.forward(self.pooled(features, size), dense)


def _named(weights: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The weights named ``prefix`` + name, by name."""
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def build_module(model: Any, state: dict[str, Any], schema: Any, rows_dtype: str = "float32") -> Any:
    """A ``tf.Module`` whose ``serve`` is the ``serving_default`` signature (see the module doc)
    and ``serve_examples`` the :data:`EXAMPLES` one (the same rows as serialized ``tf.Example`` s,
    :func:`parsed_examples`, then a call of ``serve``: the same graph, so the same probabilities,
    held once in the SavedModel); ``rows_dtype``: how the table rows are held (:class:`ServedModel`)."""
    import tensorflow as tf

    served = ServedModel(model, state, rows_dtype)
    module, signature = served.module, request_signature(schema)

    # A signature function takes keyword arguments: each column is its own named input. The graph is
    # built in it, not in a function it calls: one function in the SavedModel, a smaller graph file.
    @tf.function(input_signature=list(signature.values()), autograph=False)
    def serve(*columns):
        request = dict(zip(signature, columns))
        features = request_fields(schema, request)
        dense = features.dense if schema.dense_names else None
        return {"probability": served.probability(features, dense, tf.shape(columns[0])[0])}

    # One string input: the call binds one tensor, not one per column; then serve's graph, called
    # (the SavedModel holds it once; TF inlines the call when it optimizes the graph, adding no op)
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES)], autograph=False)
    def serve_examples(examples):
        return serve(*parsed_examples(schema, examples).values())

    module.serve, module.serve_examples = serve, serve_examples
    return module


def signatures(module: Any) -> dict[str, Any]:
    """The SavedModel's signatures of a :func:`build_module` module: ``serving_default`` (named
    columns) and :data:`EXAMPLES`."""
    return {"serving_default": module.serve, EXAMPLES: module.serve_examples}


def describe_inputs(schema: Any) -> str:
    """The request's columns, for ``des_export.json`` and the user."""
    from des.data.features import ServingFeatures

    kinds = {"int64": "int64 (missing: -2**63)", "float64": "float64 (missing: NaN)", "string": "string ('' = missing)"}
    notes = {c.name: " (a delimited list)" if c.is_list else " (8 hex digits)" if c.dtype == "hex"
             else "" for c in schema.read_columns}
    return ", ".join(f"{name} {kinds[dtype]}{notes[name]}"
                     for name, dtype in ServingFeatures(schema).request_columns().items())
