"""One DES training step (``DESIGN.md`` section 3), on every rank, for the same global batch:

1. ids      this rank's fields of the batch (CSR per field)
2. lookup   numba hash tables: key -> row, insert-on-miss with deterministic init; gather + pool
3. partials TF: each substitution's ``local`` on this rank's fields -> ONE buffer ``[B, P]``
4. reduce   ONE AllReduce-sum of the buffer                                   (the only traffic)
5. top      TF: ``combine`` + top network + loss, replicated; gradients of the top parameters and
            ``G = ∂L/∂buffer``, identical on every rank
6. local bw TF: ``G`` back through ``local`` (since ⊕ is a sum, ∂L/∂partials_i = G)
7. update   sparse optimizers on the touched rows (duplicates summed), dense optimizers on this
            rank's field slices and on the replicated top parameters
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from des.collectives import Communicator
from des.errors import ConfigError, PlacementError
from des.hashtable import BlockSpec, DenseOptimizerState, EmbeddingTable, Initializer
from des.models.base import Model
from des.options import Optimizers, TableOptions
from des.pooling import pool, unpool
from des.substitutions.base import draw_param

PHASES = ("lookup", "partials", "allreduce", "top", "local_backward", "update")


class PhaseTimer:
    """Wall seconds per named phase, accumulated over steps."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def ms_per_step(self) -> dict[str, float]:
        steps = max(self.steps, 1)
        return {phase: 1000.0 * self.seconds[phase] / steps for phase in self.seconds}

    def reset(self) -> None:
        self.seconds.clear()
        self.steps = 0


class DESEngine:
    """The state one rank holds (its fields' tables and slices, a replica of the top network) and
    the DES step over it. The same object with a 1-rank communicator is the single-process trainer.
    """

    def __init__(
        self,
        model: Model,
        comm: Communicator,
        placement: Sequence[Sequence[int]],
        optimizers: Optimizers,
        *,
        seed: int = 0,
        dtype: type | np.dtype = np.float32,
        tables: TableOptions = TableOptions(),
    ) -> None:
        self.model = model
        self.comm = comm
        self.placement = [list(p) for p in placement]
        owned = sorted(f for fields in self.placement for f in fields)
        if len(self.placement) != comm.size or owned != list(range(model.num_fields)):
            raise PlacementError(f"placement {self.placement} does not give each of the {model.num_fields} fields "
                                 f"to exactly one of the {comm.size} ranks")
        self.fields: list[int] = sorted(self.placement[comm.rank])
        self.seed = seed
        self.dtype = np.dtype(dtype)
        self.tf_dtype = tf.as_dtype(self.dtype)
        self.timer = PhaseTimer()
        self.step_count = 0

        self.blocks = model.blocks()
        self.substitutions = model.substitutions()
        block_names = [b.name for b in self.blocks]
        for sub in self.substitutions:
            if sub.block not in block_names:
                raise ValueError(f"substitution {sub.name} reads block {sub.block!r}, not declared by {model.name}")
            if sub.collective != "allreduce":
                raise ConfigError(f"substitution {sub.name} asks for collective {sub.collective!r}; "
                                  "only 'allreduce' is supported")
        missing = [b for b in block_names if b not in optimizers.sparse]
        if missing:
            raise ValueError(f"no sparse optimizer for block(s) {missing}")

        specs = [
            BlockSpec(b.name, b.dim, optimizers.sparse[b.name], Initializer(b.init, b.scale))
            for b in self.blocks
        ]
        self.tables: dict[int, EmbeddingTable] = {
            f: EmbeddingTable(
                f, specs, seed=seed, dtype=self.dtype, capacity=tables.capacity,
                min_count=tables.min_count, unadmitted=tables.unadmitted,
            )
            for f in self.fields
        }

        # Buffer layout: substitution s owns columns [start_s, start_s + width_s).
        widths = [s.width for s in self.substitutions]
        self.buffer_starts = np.concatenate([[0], np.cumsum(widths)]).astype(int).tolist()
        self.buffer_width = int(self.buffer_starts[-1])

        # Dense parameters: this rank's field slices of substituted layers, and the replicated top.
        self._dense_optimizer = optimizers.dense
        self.field_params, self.field_states = self._field_slices(self.fields)
        self.top_params: dict[str, np.ndarray] = {
            name: draw_param(spec, seed, model.name, "top", name).astype(self.dtype)
            for name, spec in model.top_params().items()
        }
        self.top_states: dict[str, DenseOptimizerState] = {
            name: DenseOptimizerState(optimizers.dense, value.shape, self.dtype)
            for name, value in self.top_params.items()
        }
        self._regularized_top = set(model.regularized_params())
        self._build_functions()

    def _field_slices(
        self, fields: Sequence[int]
    ) -> tuple[dict[str, np.ndarray], dict[tuple[str, int], DenseOptimizerState]]:
        """Initial field-sliced weights ``name -> [len(fields), ...]`` and an optimizer state per
        (weight, field): the dense optimizers are elementwise, so a state per slice is the same
        math as one for the whole weight, and lets a checkpoint be re-sharded by field."""
        params: dict[str, np.ndarray] = {}
        for i, sub in enumerate(self.substitutions):
            for pname, value in sub.init_field_params(self.seed, fields, self.dtype).items():
                params[f"{i}:{sub.name}:{pname}"] = value
        states = {
            (name, field): DenseOptimizerState(self._dense_optimizer, value.shape[1:], self.dtype)
            for name, value in params.items()
            for field in fields
        }
        return params, states

    # ------------------------------------------------------------------------------ TF functions
    def _substitution_inputs(self, pooled: Sequence[tf.Tensor], params: Sequence[tf.Tensor]):
        """For each substitution: its block's pooled embeddings and its own field weights."""
        by_block = dict(zip((b.name for b in self.blocks), pooled))
        named = dict(zip(self.field_params, params))
        for i, sub in enumerate(self.substitutions):
            prefix = f"{i}:{sub.name}:"
            yield sub, by_block[sub.block], {k[len(prefix):]: v for k, v in named.items() if k.startswith(prefix)}

    def _local_partials(self, pooled: Sequence[tf.Tensor], params: Sequence[tf.Tensor]) -> tf.Tensor:
        parts = [sub.local(emb, p) for sub, emb, p in self._substitution_inputs(pooled, params)]
        return tf.concat(parts, axis=1)

    def _local_regularizer(self, pooled: Sequence[tf.Tensor], params: Sequence[tf.Tensor]) -> tf.Tensor:
        batch = tf.cast(tf.shape(pooled[0])[0], self.tf_dtype)
        reg = tf.zeros([], self.tf_dtype)
        if self.model.l2_embedding:
            reg += self.model.l2_embedding * tf.add_n([tf.reduce_sum(tf.square(p)) for p in pooled]) / batch
        if self.model.l2_dense and params:
            reg += self.model.l2_dense * tf.add_n([tf.reduce_sum(tf.square(p)) for p in params])
        return reg

    def _logits(self, buffer: tf.Tensor, params: Sequence[tf.Tensor]) -> tf.Tensor:
        outputs = [
            sub.combine(buffer[:, self.buffer_starts[i] : self.buffer_starts[i + 1]])
            for i, sub in enumerate(self.substitutions)
        ]
        return self.model.top(dict(zip(self.top_params, params)), outputs)

    def _build_functions(self) -> None:
        @tf.function(reduce_retracing=True)
        def local_forward(pooled, params):
            return self._local_partials(pooled, params)

        @tf.function(reduce_retracing=True)
        def local_backward(pooled, params, buffer_grad):
            with tf.GradientTape() as tape:
                tape.watch([pooled, params])
                partials = self._local_partials(pooled, params)
                reg = self._local_regularizer(pooled, params)
            grads = tape.gradient(
                [partials, reg], [pooled, params],
                output_gradients=[buffer_grad, tf.ones_like(reg)],
                unconnected_gradients=tf.UnconnectedGradients.ZERO,
            )
            return grads

        @tf.function(reduce_retracing=True)
        def top_train(buffer, labels, params):
            with tf.GradientTape() as tape:
                tape.watch([buffer, params])
                logits = self._logits(buffer, params)
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
                reg = tf.zeros([], self.tf_dtype)
                if self.model.l2_dense:
                    for name, p in zip(self.top_params, params):
                        if name in self._regularized_top:
                            reg += self.model.l2_dense * tf.reduce_sum(tf.square(p))
                objective = loss + reg  # inside the tape: an op outside it would be unconnected
            buffer_grad, param_grads = tape.gradient(
                objective, [buffer, params], unconnected_gradients=tf.UnconnectedGradients.ZERO
            )
            return loss, logits, buffer_grad, param_grads

        @tf.function(reduce_retracing=True)
        def top_predict(buffer, params):
            return tf.sigmoid(self._logits(buffer, params))

        self._local_forward = local_forward
        self._local_backward = local_backward
        self._top_train = top_train
        self._top_predict = top_predict

    # ------------------------------------------------------------------------------ the step
    def _lookup_and_pool(self, batch: Any, *, train: bool) -> tuple[list[np.ndarray], list[tuple]]:
        """Steps 1-2: per block, the pooled embeddings ``[B, F_i, dim]`` of this rank's fields."""
        size = len(batch.labels)
        pooled = [np.zeros((size, len(self.fields), b.dim), dtype=self.dtype) for b in self.blocks]
        touched = []
        for j, field in enumerate(self.fields):
            ids = batch.fields[field]
            table = self.tables[field]
            rows = table.lookup(ids.keys, insert=train, step=self.step_count)
            for k, block in enumerate(self.blocks):
                values = table.gather(block.name, ids.keys, rows)
                pool(values, ids.offsets, ids.weights, pooled[k][:, j, :])
            touched.append((table, rows, ids.offsets, ids.weights))
        return pooled, touched

    def _partials(self, pooled: list[np.ndarray]) -> np.ndarray:
        buffer = self._local_forward(pooled, list(self.field_params.values()))
        return np.array(buffer, dtype=self.dtype, order="C", copy=True)

    def train_step(self, batch: Any) -> float:
        """One synchronous step on the global batch; returns the batch's mean logloss."""
        timer = self.timer
        with timer("lookup"):
            pooled, touched = self._lookup_and_pool(batch, train=True)
        with timer("partials"):
            buffer = self._partials(pooled)
        with timer("allreduce"):
            self.comm.allreduce_sum_(buffer, "forward_partials")
        with timer("top"):
            labels = np.asarray(batch.labels, dtype=self.dtype)
            loss, _, buffer_grad, top_grads = self._top_train(buffer, labels, list(self.top_params.values()))
        with timer("local_backward"):
            pooled_grads, param_grads = self._local_backward(pooled, list(self.field_params.values()), buffer_grad)
        with timer("update"):
            for k, block in enumerate(self.blocks):
                grads = pooled_grads[k].numpy()
                for j, (table, rows, offsets, weights) in enumerate(touched):
                    per_id = unpool(grads[:, j, :], offsets, weights)
                    table.apply_gradients(block.name, rows, per_id, self.step_count)
            for (name, value), grad in zip(self.field_params.items(), param_grads):
                grad = grad.numpy()
                for j, field in enumerate(self.fields):
                    self.field_states[(name, field)].apply(value[j], grad[j])
            for (name, value), grad in zip(self.top_params.items(), top_grads):
                self.top_states[name].apply(value, grad.numpy())
        self.step_count += 1
        timer.steps += 1
        return float(loss)

    def predict(self, batch: Any) -> np.ndarray:
        """Click probabilities for the global batch (identical on every rank); ids not in the
        tables are looked up without being inserted."""
        pooled, _ = self._lookup_and_pool(batch, train=False)
        buffer = self._partials(pooled)
        self.comm.allreduce_sum_(buffer, "eval_partials")
        return self._top_predict(buffer, list(self.top_params.values())).numpy()

    def reader_options(self) -> dict[str, Any]:
        """What a :class:`des.data.BatchReader` must read for this engine: DES reads the whole
        global batch, this rank's fields only."""
        return {"fields": self.fields, "shard": (0, 1)}

    def predict_with_labels(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        """Predictions and labels of the whole global batch (identical on every rank)."""
        return self.predict(batch), np.asarray(batch.labels)

    def field_param_index(self, field: int) -> int:
        """Position of ``field``'s slice in the leading axis of :attr:`field_params`."""
        return self.fields.index(field)

    # ------------------------------------------------------------------------------ reporting
    def dense_checksum(self) -> str:
        """sha256 of the replicated top parameters (equal on every rank, bit for bit)."""
        import hashlib

        digest = hashlib.sha256()
        for name, value in self.top_params.items():
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        return digest.hexdigest()

    def memory(self) -> dict[str, int]:
        rows = sum(len(t) for t in self.tables.values())
        table_bytes = sum(int(t.memory()["bytes"]) for t in self.tables.values())
        dense = sum(v.nbytes for v in {**self.field_params, **self.top_params}.values())
        return {"rows": rows, "table_bytes": table_bytes, "dense_bytes": dense}
