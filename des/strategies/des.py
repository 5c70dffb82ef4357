"""The DES step (the paper, Algorithm 1; ``docs/design.md``, "The DES step"), on every rank, for
the same global batch of B rows:

1. lookup    numba hash tables: key -> row, insert-on-miss with deterministic init; gather + pool
2. partials  TF: each substitution's ``local`` on this rank's fields -> ONE buffer ``[B, P]``

then, with ``--upper data-parallel`` (default; the upper network is never repeated):

3. reduce_scatter  rank r receives the summed partials of its row block (``r·B//N`` ..)
4. top       TF: ``combine`` + top network + loss on those rows only (loss normalised by B):
             ``G_r = ∂L/∂buffer`` of its rows and its share of the top gradients
5. allgather every rank gets ``G [B, P]``
6. local_backward  TF: ``G`` back through ``local`` (since ⊕ is a sum, ∂L/∂partials_i = G, eq. 9)
7. allreduce the top gradients and the loss (started after step 4, completed after step 6)
8. update    sparse optimizers on the touched rows, dense optimizers on this rank's field slices
             and, identically on every rank, on the top network

or, with ``--upper replicated`` (the paper's step):

3. allreduce ONE AllReduce-sum of the buffer
4. top       TF: ``combine`` + top network + loss on the whole batch, replicated on every rank
6. local_backward, 8. update as above (no gradient exchange at all)

On one rank nothing is reduced and the row block is the batch: steps 2, 4 and 6 run as one TF call
(phase ``fused_step``; the same graph pieces, no buffer round trip through numpy).

Both need ``combine`` and ``Model.top`` to be row-wise (``check_substitution``/``check_model``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from des.errors import ConfigError
from des.strategies.base import ShardState, Strategy, StrategyContext, untimed
from des.strategies.components import DenseParams, FieldShard
from des.strategies.forms import ModelSplitForm


class DES(Strategy):
    """Distributed Equivalent Substitution: each rank holds its fields' tables and field slices and
    a replica of the top network; one AllReduce of the partials per step, no gradient exchange."""

    name = "des"
    description = "partial sums of the substituted operators, summed over the ranks (the paper)"
    phases = {"lookup": "lookup", "partials": "partials", "reduce_scatter": "communication", "top": "top",
              "allgather": "communication", "local_backward": "backward", "allreduce": "communication",
              "update": "update", "fused_step": "top"}
    #: replicated: the partials' AllReduce; data-parallel: the row blocks of the partials, the
    #: gathered buffer gradient and the top gradients' AllReduce
    traffic_sites = ("forward_partials", "partials_reduce_scatter", "gradient_allgather", "top_gradients")
    allreduce_sites = ("forward_partials", "top_gradients")
    communication_plan = "partials"
    UPPER = ("data-parallel", "replicated")

    @classmethod
    def check_options(cls, options) -> None:
        super().check_options(options)
        if options.get("upper", "data-parallel") not in cls.UPPER:
            raise ConfigError(f"--upper: {options.get('upper')!r} is not one of {', '.join(cls.UPPER)}")

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        owned = sorted(f for fields in self.placement for f in fields)
        if len(self.placement) != self.comm.size or owned != list(range(self.model.num_fields)):
            from des.errors import PlacementError

            raise PlacementError(f"placement {self.placement} does not give each of the {self.model.num_fields} "
                                 f"fields to exactly one of the {self.comm.size} ranks")
        mine = self.placement[self.comm.rank]
        self.shard = FieldShard(mine, self.model.blocks(), context.optimizers, seed=self.seed, dtype=self.dtype,
                                tables=context.tables)
        self.dense = DenseParams(self.model, self.shard.fields, context.optimizers, seed=self.seed, dtype=self.dtype)
        self.split_form = ModelSplitForm(self.model, self.dense, self.dtype, context.compute_dtype)
        self.upper = context.options.get("upper", "data-parallel")

    @property
    def fields(self) -> list[int]:
        return self.shard.fields

    @property
    def buffer_width(self) -> int:
        return self.split_form.width

    def reader_options(self) -> dict[str, Any]:
        """The whole global batch, this rank's fields only."""
        return {"fields": self.fields, "shard": (0, 1)}

    def prepare(self, batch: Any, step: int) -> Any:
        """The key->row lookup of step ``step`` (inserts and admission counts only, no values): on
        the background thread while the previous step computes (``--pipeline on``)."""
        batch.prepared = (step, self.shard.lookup(batch, train=True, step=step))
        return batch

    def _pooled(self, batch: Any, *, train: bool) -> tuple[list, Any]:
        """Step 1: this rank's fields of the whole global batch, looked up, gathered and pooled."""
        phase = self.timer if train else untimed  # evaluation is not timed
        with phase("lookup"):
            if train and batch.prepared is not None:
                step, touched = batch.prepared
                if step != self.step_count:
                    raise RuntimeError(f"batch prepared for step {step} trained at step {self.step_count}")
            else:
                touched = self.shard.lookup(batch, train=train, step=self.step_count)
            pooled = self.shard.gather_pooled(batch, touched)
        if train:
            self.overlap_next()  # the next batch is read and looked up while TF computes this step
        return pooled, touched

    def _partials(self, pooled: list, *, train: bool) -> np.ndarray:
        """Step 2: this rank's partials ``[B, P]`` of the whole global batch."""
        with (self.timer if train else untimed)("partials"):
            field_params = list(self.dense.field_params.values())
            buffer = self.split_form.partials(pooled, field_params).numpy()
            if self.upper == "replicated" and self.comm.size > 1:
                buffer = np.array(buffer, order="C", copy=True)  # the AllReduce sums in place: TF's memory is not ours
        return buffer

    def train_step(self, batch: Any) -> float:
        timer, form, dense, comm = self.timer, self.split_form, self.dense, self.comm
        size = len(batch.labels)
        labels = np.asarray(batch.labels, dtype=self.dtype)
        top, field_params = list(dense.top_params.values()), list(dense.field_params.values())
        pooled, touched = self._pooled(batch, train=True)
        if comm.size == 1:  # the row block is the batch and nothing is reduced: steps 2-6 in one TF call
            with timer("fused_step"):
                loss, pooled_grads, field_grads, top_grads = form.train_whole(pooled, field_params, top, labels, size)
                loss, top_grads = float(loss), [g.numpy() for g in top_grads]
        else:
            buffer = self._partials(pooled, train=True)
            if self.upper == "replicated":
                with timer("allreduce"):
                    comm.allreduce_sum_(buffer, "forward_partials")
                with timer("top"):
                    loss, buffer_grad, top_grads = form.top_train(buffer, labels, top, size)
                    loss, top_grads = float(loss), [g.numpy() for g in top_grads]
            else:
                lo, hi = comm.row_bounds(size)[comm.rank : comm.rank + 2]
                with timer("reduce_scatter"):
                    rows = comm.reduce_scatter_rows_sum(buffer, "partials_reduce_scatter")
                with timer("top"):
                    loss, rows_grad, top_grads = form.top_train(rows, labels[lo:hi], top, size)
                    # this rank's loss share and top gradients, summed over the ranks while G travels
                    packed = np.concatenate([[float(loss)], *[g.numpy().reshape(-1) for g in top_grads]]).astype(self.dtype)
                with timer("allreduce"):
                    pending = comm.start_allreduce_sum_(packed, "top_gradients")
                with timer("allgather"):
                    buffer_grad = comm.allgather_rows(rows_grad.numpy(), size, "gradient_allgather")
            with timer("local_backward"):
                pooled_grads, field_grads = form.local_backward(pooled, field_params, buffer_grad)
            if self.upper != "replicated":
                with timer("allreduce"):
                    pending.wait()
                    loss, top_grads = float(packed[0]), dense.split_top(packed[1:])
        with timer("lookup"):
            self.await_next()  # the next batch's lookup may grow the tables: done before they change
        with timer("update"):
            self.shard.apply_pooled_gradients([g.numpy() for g in pooled_grads], touched, self.step_count)
            dense.apply([g.numpy() for g in field_grads], top_grads)
        self.step_count += 1
        timer.steps += 1
        return loss

    def predict(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        buffer = self._partials(self._pooled(batch, train=False)[0], train=False)
        top, comm = list(self.dense.top_params.values()), self.comm
        if self.upper == "replicated" or comm.size == 1:
            comm.allreduce_sum_(buffer, "eval_partials")
            return self.split_form.top_predict(buffer, top).numpy(), np.asarray(batch.labels)
        rows = comm.reduce_scatter_rows_sum(buffer, "eval_partials")
        p = np.ascontiguousarray(self.split_form.top_predict(rows, top).numpy(), dtype=self.dtype)
        return comm.allgather_rows(p, len(batch.labels), "eval_predictions"), np.asarray(batch.labels)

    def state(self) -> ShardState:
        return ShardState(self.model, self.dtype, self.seed, self.placement, self.step_count, self.shard.tables,
                          self.dense)

    def describe(self) -> str:
        return f"{self.description}; upper network {self.upper}; buffer {self.buffer_width} floats/sample"

    def summary(self) -> dict[str, Any]:
        return {"upper": self.upper}

    def memory(self) -> dict[str, int]:
        return {**self.shard.memory(), "dense_bytes": self.dense.nbytes}

