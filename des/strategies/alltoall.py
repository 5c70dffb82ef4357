"""The synchronous all-to-all baseline: model parallelism of the embeddings, data parallelism of the
rest, as TorchRec, HugeCTR and PICASSO do it (``DESIGN.md`` section 7).

Per step, for the same global batch as DES, on every rank:

1. rows     take rows ``r·B/N .. (r+1)·B/N`` of the global batch, all fields
2. keys     unique ids per field; send each field's ids to the field's owner (Alltoallv)
3. rows     the owner looks them up (insert on miss) and sends every block's row back (Alltoallv)
4. forward  each substitution's ``reference`` on the local rows and *all* fields, the top network
            and the loss (mean over the global batch), with full replicas of every dense weight
5. backward row gradients summed per id and sent back to the owners (Alltoallv), which apply the
            sparse optimizer (summing the gradients of an id that several ranks sent); dense
            gradients (and the loss) AllReduced in one buffer, then the dense optimizer on every rank

It computes the same model with the same optimizers as DES, so it reaches the same parameters (up
to float reassociation): a test checks that. What differs is what crosses the network: ids, rows
and row gradients per step instead of ``B·P`` partials. Admission counts: an owner sees each id
once per requesting rank and step (the requesters de-duplicate), not once per occurrence.

Phase timers (``ms_per_phase`` of the summary; training steps only, evaluation is not timed). Each
phase is either communication or local work, never both:

* ``lookup``             local: unique ids per field, the owner's table lookups and gathers, pooling
* ``exchange_rows``      communication: the Alltoallv of per-field counts, ids and rows (step 2-3)
* ``forward_backward``   local: the whole model's forward and backward on this rank's rows (one
                         tf.function, the ``reference`` of every substitution and the top network)
* ``sparse_backward``    local: the per-id sums of the row gradients (backward through pooling)
* ``exchange_gradients`` communication: the Alltoallv of the row gradients
* ``allreduce``          communication: the AllReduce of the dense gradients and the loss
* ``update``             local: the sparse optimizer on the owner's rows and the dense optimizer
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import tensorflow as tf

from des.engine import DESEngine
from des.pooling import pool, unpool


def _untimed(phase: str) -> nullcontext:
    """Stands in for the phase timer outside training steps (evaluation is not timed)."""
    return nullcontext()


class AllToAllEngine(DESEngine):
    """Same state layout as :class:`DESEngine` for tables (own fields) and the top network, but
    full replicas of the field-sliced dense weights; checkpoints are interchangeable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.all_fields = list(range(self.model.num_fields))
        self.owner = np.empty(self.model.num_fields, dtype=np.int64)
        for rank, fields in enumerate(self.placement):
            self.owner[fields] = rank
        # Field-sliced weights are replicated (data parallel), with a state per field slice as in DES.
        self.field_params, self.field_states = self._field_slices(self.all_fields)
        self._row_width = int(sum(b.dim for b in self.blocks))  # all blocks of a row side by side
        self._build_reference_functions()

    def field_param_index(self, field: int) -> int:
        return field

    def reader_options(self) -> dict[str, Any]:
        """Each rank reads only its part of every global batch, with all fields."""
        return {"fields": self.all_fields, "shard": (self.comm.rank, self.comm.size)}

    def predict_with_labels(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        labels, _ = self.comm.allgatherv(np.asarray(batch.labels), "eval_predictions")
        return self.predict(batch), labels

    # ------------------------------------------------------------------------------ TF functions
    def _reference_logits(self, pooled, field_params, top_params) -> tf.Tensor:
        outputs = [sub.reference(emb, p) for sub, emb, p in self._substitution_inputs(pooled, field_params)]
        return self.model.top(dict(zip(self.top_params, top_params)), outputs)

    def _build_reference_functions(self) -> None:
        @tf.function(reduce_retracing=True)
        def reference_train(pooled, field_params, top_params, labels, global_size):
            with tf.GradientTape() as tape:
                tape.watch([pooled, field_params, top_params])
                logits = self._reference_logits(pooled, field_params, top_params)
                # This rank's share of the global mean loss: Σ_local l_i / B.
                loss = tf.reduce_sum(
                    tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
                ) / global_size
                if self.model.l2_embedding:
                    loss += self.model.l2_embedding * tf.add_n([tf.reduce_sum(tf.square(p)) for p in pooled]) / global_size
            grads = tape.gradient(loss, [pooled, field_params, top_params],
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            return loss, grads

        @tf.function(reduce_retracing=True)
        def reference_predict(pooled, field_params, top_params):
            return tf.sigmoid(self._reference_logits(pooled, field_params, top_params))

        self._reference_train = reference_train
        self._reference_predict = reference_predict

    # ------------------------------------------------------------------------------ exchange
    def _exchange_rows(self, batch: Any, *, train: bool) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Steps 2-3: pooled embeddings ``[b, F, dim]`` per block for this rank's rows, and what
        the backward pass needs to route row gradients back."""
        comm, size = self.comm, batch.size
        prefix = "" if train else "eval_"  # evaluation traffic is not counted as training traffic
        phase = self.timer if train else _untimed
        with phase("lookup"):
            unique: dict[int, tuple[np.ndarray, np.ndarray]] = {}
            per_owner_keys: list[list[np.ndarray]] = [[] for _ in range(comm.size)]
            field_counts = np.zeros((comm.size, self.model.num_fields), dtype=np.int64)
            for field in self.all_fields:
                keys, inverse = np.unique(batch.fields[field].keys, return_inverse=True)
                unique[field] = (keys, inverse)
                owner = int(self.owner[field])
                per_owner_keys[owner].append(keys)
                field_counts[owner, field] = keys.size
            send_keys = (np.concatenate([k for parts in per_owner_keys for k in parts]) if size
                         else np.zeros(0, np.int64))
            send_counts = np.array([sum(k.size for k in parts) for parts in per_owner_keys], dtype=np.int64)
        with phase("exchange_rows"):
            # Per-field counts first, so an owner can split what it receives by field.
            counts_in, _ = comm.alltoallv(field_counts.reshape(-1), np.full(comm.size, self.model.num_fields),
                                          prefix + "embedding_keys")
            counts_in = counts_in.reshape(comm.size, self.model.num_fields)
            keys_in, _ = comm.alltoallv(send_keys.astype(np.int64), send_counts, prefix + "embedding_keys")

        with phase("lookup"):
            # Owner side: look up every requested id, in (requester, field) order.
            rows_in = np.empty(keys_in.size, dtype=np.int64)
            values_out = np.empty((keys_in.size, self._row_width), dtype=self.dtype)
            start = 0
            served: list[tuple[int, int, int]] = []  # (field, start, stop) in keys_in
            for requester in range(comm.size):
                for field in self.fields:
                    n = int(counts_in[requester, field])
                    if n == 0:
                        continue
                    keys = keys_in[start : start + n]
                    table = self.tables[field]
                    rows = table.lookup(keys, insert=train, step=self.step_count)
                    rows_in[start : start + n] = rows
                    column = 0
                    for block in self.blocks:
                        values_out[start : start + n, column : column + block.dim] = table.gather(
                            block.name, keys, rows)
                        column += block.dim
                    served.append((field, start, start + n))
                    start += n
        with phase("exchange_rows"):
            values_back, _ = comm.alltoallv(values_out, counts_in.sum(axis=1), prefix + "embedding_rows")

        with phase("lookup"):
            # Requester side: values arrive in the order the keys were sent.
            pooled = self._empty_pooled(size)
            offset = 0
            for owner in range(comm.size):
                for field in self.all_fields:
                    if self.owner[field] == owner:
                        keys, inverse = unique[field]
                        self._pool_field(batch, field, values_back[offset : offset + keys.size], inverse, pooled)
                        offset += keys.size
        route = {"unique": unique, "rows_in": rows_in, "served": served, "counts_in": counts_in}
        return pooled, route

    def _send_row_gradients(self, batch: Any, pooled_grads: list[np.ndarray], route: dict[str, Any]) -> None:
        """Step 5 (sparse): per-id gradient sums to the owners, who apply the sparse optimizer."""
        comm, timer = self.comm, self.timer
        unique = route["unique"]
        with timer("sparse_backward"):
            chunks: list[np.ndarray] = []
            send_counts = np.zeros(comm.size, dtype=np.int64)
            for owner in range(comm.size):
                for field in self.all_fields:
                    if self.owner[field] == owner:
                        chunks.append(self._sum_row_gradients(batch, field, unique[field][1], unique[field][0].size,
                                                              pooled_grads))
                        send_counts[owner] += unique[field][0].size
            send = np.concatenate(chunks) if chunks else np.zeros((0, self._row_width), self.dtype)
        with timer("exchange_gradients"):
            grads_in, _ = comm.alltoallv(send, send_counts, "embedding_gradients")
        with timer("update"):
            rows_in = route["rows_in"]
            for field in self.fields:
                spans = [(a, b) for f, a, b in route["served"] if f == field]
                if not spans:
                    continue
                rows = np.concatenate([rows_in[a:b] for a, b in spans])
                grads = np.concatenate([grads_in[a:b] for a, b in spans])
                column = 0
                for block in self.blocks:
                    self.tables[field].apply_gradients(
                        block.name, rows, np.ascontiguousarray(grads[:, column : column + block.dim]), self.step_count
                    )
                    column += block.dim

    # ------------------------------------------------------------------------------ shared pieces
    def _empty_pooled(self, size: int) -> list[np.ndarray]:
        return [np.zeros((size, self.model.num_fields, b.dim), dtype=self.dtype) for b in self.blocks]

    def _pool_field(self, batch: Any, field: int, unique_values: np.ndarray, inverse: np.ndarray,
                    pooled: list[np.ndarray]) -> None:
        """Pool one field's rows (``unique_values [u, Σdim]``, all blocks side by side) per sample."""
        ids = batch.fields[field]
        column = 0
        for k, block in enumerate(self.blocks):
            pool(unique_values[inverse, column : column + block.dim], ids.offsets, ids.weights, pooled[k][:, field, :])
            column += block.dim

    def _sum_row_gradients(self, batch: Any, field: int, inverse: np.ndarray, num_unique: int,
                           pooled_grads: list[np.ndarray]) -> np.ndarray:
        """Gradient sum per unique id of one field, all blocks side by side: ``[u, Σdim]``."""
        ids = batch.fields[field]
        summed = np.zeros((num_unique, self._row_width), dtype=self.dtype)
        column = 0
        for k, block in enumerate(self.blocks):
            np.add.at(summed[:, column : column + block.dim], inverse,
                      unpool(pooled_grads[k][:, field, :], ids.offsets, ids.weights))
            column += block.dim
        return summed

    def _reference_step(self, pooled: list[np.ndarray], batch: Any, global_size: int):
        """Forward and backward of the reference model on these rows: the loss (this rank's share of
        the global mean), per-block pooled gradients and the dense gradients (field weights, top)."""
        labels = np.asarray(batch.labels, dtype=self.dtype)
        loss, (pooled_grads, field_grads, top_grads) = self._reference_train(
            pooled, list(self.field_params.values()), list(self.top_params.values()), labels,
            tf.constant(global_size, self.tf_dtype),
        )
        return float(loss), [g.numpy() for g in pooled_grads], [g.numpy() for g in (*field_grads, *top_grads)]

    def _apply_dense(self, grads: Sequence[np.ndarray]) -> None:
        """Dense optimizer on every replicated weight (``grads`` in field-weight, top order), with
        ``l2_dense`` added here once (it is not part of the per-rank loss)."""
        l2 = self.model.l2_dense
        for (name, value), grad in zip(self.field_params.items(), grads[: len(self.field_params)]):
            grad = grad + 2.0 * l2 * value if l2 else grad
            for field in self.all_fields:
                self.field_states[(name, field)].apply(value[field], np.ascontiguousarray(grad[field]))
        for (name, value), grad in zip(self.top_params.items(), grads[len(self.field_params):]):
            grad = grad + 2.0 * l2 * value if l2 and name in self._regularized_top else grad
            self.top_states[name].apply(value, np.ascontiguousarray(grad))

    # ------------------------------------------------------------------------------ the step
    def train_step(self, batch: Any) -> float:
        timer = self.timer
        pooled, route = self._exchange_rows(batch, train=True)  # times lookup and exchange_rows
        with timer("forward_backward"):
            loss, pooled_grads, dense = self._reference_step(pooled, batch, batch.global_size)
            # The dense gradients and the loss in one buffer (summed over the ranks next).
            buffer = np.concatenate([np.array([loss], self.dtype)] + [g.reshape(-1) for g in dense])
        with timer("allreduce"):
            self.comm.allreduce_sum_(buffer, "dense_gradients")
        # times sparse_backward, exchange_gradients and update (the owners' sparse optimizer)
        self._send_row_gradients(batch, pooled_grads, route)
        with timer("update"):
            offset, summed = 1, []
            for grad in dense:
                summed.append(buffer[offset : offset + grad.size].reshape(grad.shape))
                offset += grad.size
            self._apply_dense(summed)
        self.step_count += 1
        timer.steps += 1
        return float(buffer[0])

    def predict(self, batch: Any) -> np.ndarray:
        """Probabilities for this rank's part of the batch, gathered so every rank has them all."""
        pooled, _ = self._exchange_rows(batch, train=False)
        local = self._reference_predict(pooled, list(self.field_params.values()), list(self.top_params.values()))
        everything, _ = self.comm.allgatherv(np.asarray(local.numpy(), dtype=self.dtype), "eval_predictions")
        return everything
