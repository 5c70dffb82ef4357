"""The served model: the SavedModel's TF graph of a trained model, taking a batch of requests' raw
columns and returning ``{"probability": [batch]}`` (``docs/design.md``, section 11).

Inside are, as plain TensorFlow ops and variables (loading it needs TensorFlow only, never des):

* the key transform of training, the schema's (``des/data/features.py``, each TF op next to its
  numpy twin: string hashing, hex ids, buckets (Criteo's ``log_squared`` too), key scheme 1's
  field tags, time parts, crosses, multi-valued splitting, truncation and pooling weights, the
  dense features' transforms with the training statistics);
* one hash table per field from key to row and, per value block, the matrix of the trained rows
  (``state.py``: rows of ids not yet admitted keep what training gives them, their initial value
  or zero; with ``--unadmitted shared`` only admitted ids are kept);
* the run's unknown-id behaviour: ``--unadmitted zero`` gives zeros, ``init`` the id's
  deterministic initial value, recomputed with the same splitmix64 streams in uint64 ops
  (``des/hashtable/tf_init.py``, the twin of ``des/hashtable/init.py``), ``shared`` the field's
  trained out-of-vocabulary row (also for ids seen in training but not admitted), as
  ``des.evaluate`` looks them up;
* the field-sliced weights, the dense features' weights and the top network, applied through each
  substitution's ``reference`` form (the whole-model forward, as ``des.evaluate`` computes it).

TensorFlow is imported only inside the functions: importing this module loads none of it.
"""

from __future__ import annotations

from typing import Any

from des import runtime  # noqa: F401  (quiets TensorFlow before it is imported)
from des.hashtable.tf_init import initial_values


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
    None): the schema's key transform (``des.data.features.ServingFeatures``)."""
    import tensorflow as tf

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
        # uint64 stream bases per (block, field), as des.hashtable.init.Initializer.stream_base (of the
        # table's field: a field using another's table draws as that one)
        self.bases = {b: [Initializer.stream_base(state["seed"], owner, b) for owner in state["owners"]]
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
    from des.data.features import ServingFeatures

    kinds = {"int64": "int64 (missing: -2**63)", "float64": "float64 (missing: NaN)", "string": "string ('' = missing)"}
    notes = {c.name: " (a delimited list)" if c.is_list else " (8 hex digits)" if c.dtype == "hex"
             else "" for c in schema.read_columns}
    return ", ".join(f"{name} {kinds[dtype]}{notes[name]}"
                     for name, dtype in ServingFeatures(schema).request_columns().items())
