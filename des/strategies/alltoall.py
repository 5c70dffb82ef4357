"""The synchronous all-to-all baseline: model parallelism of the embeddings, data parallelism of the
rest, as TorchRec, HugeCTR and PICASSO do it (``docs/design.md``, "Strategies").

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

from typing import Any

import numpy as np

from des.strategies.base import ShardState, Strategy, StrategyContext, untimed
from des.strategies.components import DenseParams, FieldShard, RowLayout
from des.strategies.forms import ModelReferenceForm


class AllToAll(Strategy):
    """Tables of its own fields (as DES), full replicas of every dense weight; checkpoints are
    interchangeable with DES's."""

    name = "alltoall"
    description = "embedding rows exchanged with Alltoallv, dense gradients AllReduced (TorchRec-style)"
    phases = {"lookup": "lookup", "exchange_rows": "communication", "forward_backward": "top",
              "allreduce": "communication", "sparse_backward": "backward", "exchange_gradients": "communication",
              "update": "update"}
    traffic_sites = ("embedding_keys", "embedding_rows", "embedding_gradients", "dense_gradients")
    allreduce_sites = ("dense_gradients",)
    communication_plan = "exchange"

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        num_fields = self.model.num_fields
        self.shard = FieldShard(self.placement[self.comm.rank], self.model.blocks(), context.optimizers,
                                seed=self.seed, dtype=self.dtype, tables=context.tables)
        # Field-sliced weights are replicated (data parallel), with a state per field slice as in DES.
        self.all_fields = list(range(num_fields))
        self.dense = DenseParams(self.model, self.all_fields, context.optimizers, seed=self.seed, dtype=self.dtype)
        self.layout = RowLayout(self.model.blocks(), num_fields, self.dtype)
        self.reference = ModelReferenceForm(self.model, self.dense, self.dtype, context.compute_dtype)
        self.owner = np.empty(num_fields, dtype=np.int64)
        for rank, fields in enumerate(self.placement):
            self.owner[fields] = rank
        # fields in the order their rows travel: by owner rank, then by field
        self._by_owner = [[f for f in self.all_fields if self.owner[f] == r] for r in range(self.comm.size)]

    @property
    def fields(self) -> list[int]:
        return self.shard.fields

    def reader_options(self) -> dict[str, Any]:
        """Each rank reads only its part of every global batch, with all fields."""
        return {"fields": self.all_fields, "shard": (self.comm.rank, self.comm.size)}

    # ------------------------------------------------------------------------------ exchange
    def _exchange_rows(self, batch: Any, *, train: bool) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Steps 2-3: pooled embeddings ``[b, F, dim]`` per block for this rank's rows, and what
        the backward pass needs to route row gradients back."""
        comm, num_fields = self.comm, self.model.num_fields
        prefix = "" if train else "eval_"  # evaluation traffic is not counted as training traffic
        phase = self.timer if train else untimed
        with phase("lookup"):
            unique = {f: np.unique(batch.fields[f].keys, return_inverse=True) for f in self.all_fields}
            field_counts = np.zeros((comm.size, num_fields), dtype=np.int64)
            for f, (keys, _) in unique.items():
                field_counts[self.owner[f], f] = keys.size
            parts = [unique[f][0] for fields in self._by_owner for f in fields]
            send_keys = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        with phase("exchange_rows"):
            # Per-field counts first, so an owner can split what it receives by field.
            counts_in, _ = comm.alltoallv(field_counts.reshape(-1), np.full(comm.size, num_fields),
                                          prefix + "embedding_keys")
            counts_in = counts_in.reshape(comm.size, num_fields)
            keys_in, _ = comm.alltoallv(send_keys.astype(np.int64), field_counts.sum(axis=1), prefix + "embedding_keys")
        with phase("lookup"):
            # Owner side: look up every requested id, in (requester, field) order.
            rows_in = np.empty(keys_in.size, dtype=np.int64)
            values_out = np.empty((keys_in.size, self.layout.width), dtype=self.dtype)
            served: list[tuple[int, int, int]] = []  # (field, start, stop) in keys_in
            start = 0
            for requester in range(comm.size):
                for field in self.fields:
                    n = int(counts_in[requester, field])
                    if n:
                        rows_in[start : start + n], values_out[start : start + n] = self.shard.rows(
                            field, keys_in[start : start + n], insert=train, step=self.step_count)
                        served.append((field, start, start + n))
                        start += n
        with phase("exchange_rows"):
            values_back, _ = comm.alltoallv(values_out, counts_in.sum(axis=1), prefix + "embedding_rows")
        with phase("lookup"):
            # Requester side: values arrive in the order the keys were sent.
            pooled = self.layout.empty_pooled(batch.size)
            offset = 0
            for fields in self._by_owner:
                for f in fields:
                    keys, inverse = unique[f]
                    self.layout.pool(batch.fields[f], f, values_back[offset : offset + keys.size], inverse, pooled)
                    offset += keys.size
        return pooled, {"unique": unique, "rows_in": rows_in, "served": served}

    def _send_row_gradients(self, batch: Any, pooled_grads: list[np.ndarray], route: dict[str, Any]) -> None:
        """Step 5 (sparse): per-id gradient sums to the owners, who apply the sparse optimizer."""
        timer, unique = self.timer, route["unique"]
        with timer("sparse_backward"):
            chunks = [self.layout.sum_gradients(batch.fields[f], f, unique[f][1], unique[f][0].size, pooled_grads)
                      for fields in self._by_owner for f in fields]
            send = np.concatenate(chunks) if chunks else np.zeros((0, self.layout.width), self.dtype)
            send_counts = np.array([sum(unique[f][0].size for f in fields) for fields in self._by_owner], np.int64)
        with timer("exchange_gradients"):
            grads_in, _ = self.comm.alltoallv(send, send_counts, "embedding_gradients")
        with timer("update"):
            rows_in = route["rows_in"]
            for field in self.fields:
                spans = [(a, b) for f, a, b in route["served"] if f == field]
                if spans:
                    self.shard.apply_row_gradients(field, np.concatenate([rows_in[a:b] for a, b in spans]),
                                                   np.concatenate([grads_in[a:b] for a, b in spans]), self.step_count)

    # ------------------------------------------------------------------------------ the step
    def train_step(self, batch: Any) -> float:
        timer = self.timer
        pooled, route = self._exchange_rows(batch, train=True)  # times lookup and exchange_rows
        with timer("forward_backward"):
            loss, pooled_grads, field_grads, top_grads = self.reference.train(pooled, batch.labels, batch.global_size)
            # The dense gradients and the loss in one buffer (summed over the ranks next).
            buffer = np.concatenate([np.array([loss], self.dtype)] +
                                    [g.reshape(-1) for g in (*field_grads, *top_grads)]).astype(self.dtype)
        with timer("allreduce"):
            self.comm.allreduce_sum_(buffer, "dense_gradients")
        # times sparse_backward, exchange_gradients and update (the owners' sparse optimizer)
        self._send_row_gradients(batch, pooled_grads, route)
        with timer("update"):
            self.dense.apply_flat(buffer[1:])
        self.step_count += 1
        timer.steps += 1
        return float(buffer[0])

    def predict(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        """Probabilities and labels of this rank's rows, gathered so every rank has them all."""
        pooled, _ = self._exchange_rows(batch, train=False)
        local = np.asarray(self.reference.predict(pooled), dtype=self.dtype)
        labels, _ = self.comm.allgatherv(np.asarray(batch.labels), "eval_predictions")
        return self.comm.allgatherv(local, "eval_predictions")[0], labels

    def state(self) -> ShardState:
        return ShardState(self.model, self.dtype, self.seed, self.placement, self.step_count, self.shard.tables,
                          self.dense)

    def memory(self) -> dict[str, int]:
        return {**self.shard.memory(), "dense_bytes": self.dense.nbytes}
