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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from des.collectives import Communicator
from des.engine import DESEngine
from des.hashtable import DenseOptimizerState
from des.models.base import Model
from des.options import Optimizers, TableOptions
from des.pooling import pool, unpool


class AllToAllEngine(DESEngine):
    """Same state layout as :class:`DESEngine` for tables (own fields) and the top network, but
    full replicas of the field-sliced dense weights; checkpoints are interchangeable."""

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
        super().__init__(model, comm, placement, optimizers, seed=seed, dtype=dtype, tables=tables)
        self.all_fields = list(range(model.num_fields))
        self.owner = np.empty(model.num_fields, dtype=np.int64)
        for rank, fields in enumerate(self.placement):
            self.owner[fields] = rank
        # Field-sliced weights are replicated (data parallel); state per field slice, as in DES.
        self.field_params = {}
        for i, sub in enumerate(self.substitutions):
            for pname, value in sub.init_field_params(seed, self.all_fields, self.dtype).items():
                self.field_params[f"{i}:{sub.name}:{pname}"] = value
        self.field_states = {
            (name, field): DenseOptimizerState(optimizers.dense, value.shape[1:], self.dtype)
            for name, value in self.field_params.items()
            for field in self.all_fields
        }
        self._block_dims = [b.dim for b in self.blocks]
        self._row_width = int(sum(self._block_dims))
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
        by_block = dict(zip((b.name for b in self.blocks), pooled))
        named = dict(zip(self.field_params, field_params))
        outputs = []
        for i, sub in enumerate(self.substitutions):
            prefix = f"{i}:{sub.name}:"
            sub_params = {k[len(prefix):]: v for k, v in named.items() if k.startswith(prefix)}
            outputs.append(sub.reference(by_block[sub.block], sub_params))
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
        unique: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        per_owner_keys: list[list[np.ndarray]] = [[] for _ in range(comm.size)]
        field_counts = np.zeros((comm.size, self.model.num_fields), dtype=np.int64)
        for field in self.all_fields:
            keys, inverse = np.unique(batch.fields[field].keys, return_inverse=True)
            unique[field] = (keys, inverse)
            owner = int(self.owner[field])
            per_owner_keys[owner].append(keys)
            field_counts[owner, field] = keys.size
        send_keys = np.concatenate([k for parts in per_owner_keys for k in parts]) if size else np.zeros(0, np.int64)
        send_counts = np.array([sum(k.size for k in parts) for parts in per_owner_keys], dtype=np.int64)
        # Per-field counts first, so an owner can split what it receives by field.
        counts_in, _ = comm.alltoallv(field_counts.reshape(-1), np.full(comm.size, self.model.num_fields),
                                      "embedding_keys")
        counts_in = counts_in.reshape(comm.size, self.model.num_fields)
        keys_in, _ = comm.alltoallv(send_keys.astype(np.int64), send_counts, "embedding_keys")

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
                    values_out[start : start + n, column : column + block.dim] = table.gather(block.name, keys, rows)
                    column += block.dim
                served.append((field, start, start + n))
                start += n
        values_back, _ = comm.alltoallv(values_out, counts_in.sum(axis=1), "embedding_rows")

        # Requester side: values arrive in the order the keys were sent.
        pooled = [np.zeros((size, self.model.num_fields, b.dim), dtype=self.dtype) for b in self.blocks]
        offset = 0
        for owner in range(comm.size):
            for field in self.all_fields:
                if self.owner[field] != owner:
                    continue
                keys, inverse = unique[field]
                values = values_back[offset : offset + keys.size]
                offset += keys.size
                ids = batch.fields[field]
                column = 0
                for k, block in enumerate(self.blocks):
                    per_id = values[inverse, column : column + block.dim]
                    pool(per_id, ids.offsets, ids.weights, pooled[k][:, field, :])
                    column += block.dim
        route = {"unique": unique, "rows_in": rows_in, "served": served, "counts_in": counts_in}
        return pooled, route

    def _send_row_gradients(self, batch: Any, pooled_grads: list[np.ndarray], route: dict[str, Any]) -> None:
        """Step 5 (sparse): per-id gradient sums to the owners, who apply the sparse optimizer."""
        comm = self.comm
        unique = route["unique"]
        chunks: list[np.ndarray] = []
        send_counts = np.zeros(comm.size, dtype=np.int64)
        for owner in range(comm.size):
            for field in self.all_fields:
                if self.owner[field] != owner:
                    continue
                keys, inverse = unique[field]
                ids = batch.fields[field]
                summed = np.zeros((keys.size, self._row_width), dtype=self.dtype)
                column = 0
                for k, block in enumerate(self.blocks):
                    per_occurrence = unpool(pooled_grads[k][:, field, :], ids.offsets, ids.weights)
                    np.add.at(summed[:, column : column + block.dim], inverse, per_occurrence)
                    column += block.dim
                chunks.append(summed)
                send_counts[owner] += keys.size
        send = np.concatenate(chunks) if chunks else np.zeros((0, self._row_width), self.dtype)
        grads_in, _ = comm.alltoallv(send, send_counts, "embedding_gradients")
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

    # ------------------------------------------------------------------------------ the step
    def train_step(self, batch: Any) -> float:
        timer = self.timer
        with timer("lookup"):
            pooled, route = self._exchange_rows(batch, train=True)
        with timer("top"):
            labels = np.asarray(batch.labels, dtype=self.dtype)
            loss, (pooled_grads, field_grads, top_grads) = self._reference_train(
                pooled, list(self.field_params.values()), list(self.top_params.values()), labels,
                tf.constant(batch.global_size, self.tf_dtype),
            )
        with timer("allreduce"):
            dense = [g.numpy() for g in (*field_grads, *top_grads)]
            buffer = np.concatenate([np.array([float(loss)], self.dtype)] + [g.reshape(-1) for g in dense])
            self.comm.allreduce_sum_(buffer, "dense_gradients")
        with timer("update"):
            self._send_row_gradients(batch, [g.numpy() for g in pooled_grads], route)
            offset = 1
            for (name, value), grad in zip(self.field_params.items(), dense[: len(self.field_params)]):
                summed = buffer[offset : offset + grad.size].reshape(grad.shape)
                offset += grad.size
                if self.model.l2_dense:
                    summed = summed + 2.0 * self.model.l2_dense * value
                for field in self.all_fields:
                    self.field_states[(name, field)].apply(value[field], np.ascontiguousarray(summed[field]))
            for (name, value), grad in zip(self.top_params.items(), dense[len(self.field_params):]):
                summed = buffer[offset : offset + grad.size].reshape(grad.shape)
                offset += grad.size
                if self.model.l2_dense and name in self._regularized_top:
                    summed = summed + 2.0 * self.model.l2_dense * value
                self.top_states[name].apply(value, np.ascontiguousarray(summed))
        self.step_count += 1
        timer.steps += 1
        return float(buffer[0])

    def predict(self, batch: Any) -> np.ndarray:
        """Probabilities for this rank's part of the batch, gathered so every rank has them all."""
        pooled, _ = self._exchange_rows(batch, train=False)
        local = self._reference_predict(pooled, list(self.field_params.values()), list(self.top_params.values()))
        everything, _ = self.comm.allgatherv(np.asarray(local.numpy(), dtype=self.dtype), "eval_predictions")
        return everything
