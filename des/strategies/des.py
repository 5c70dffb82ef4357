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
             and, identically on every rank, on the top network (pipelined: the dense step on an
             idle-priority thread until the next step's TF call, the sparse update at the start of
             the next step, in one pass over the fields with the gather of its batch)

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
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from des.errors import ConfigError
from des.strategies.base import ShardState, Strategy, StrategyContext, untimed
from des.strategies.components import DenseParams, FieldShard
from des.strategies.forms import ModelSplitForm
from des.strategies.pipeline import StepRates
from des.zero_copy import to_numpy


class DES(Strategy):
    """Distributed Equivalent Substitution: each rank holds its fields' tables and field slices and
    a replica of the top network; one AllReduce of the partials per step, no gradient exchange.

    ``--plan`` (``des/planner.py``): an operator may instead be *exchanged*: its pooled
    inputs travel to the row owners per distinct id (``des/strategies/exchange.py``) and it runs
    there on its rows, with its field weights replicated (their gradients summed over the ranks
    with the top network's). ``auto`` lets the planner's cost model choose per operator."""

    name = "des"
    description = "partial sums of the substituted operators, summed over the ranks (the paper)"
    phases = {"lookup": "lookup", "partials": "partials", "reduce_scatter": "communication", "top": "top",
              "allgather": "communication", "local_backward": "backward", "allreduce": "communication",
              "update": "update", "fused_step": "top", "exchange_values": "communication",
              "exchange_gradients": "communication", "sparse_backward": "backward"}
    #: replicated: the partials' AllReduce; data-parallel: the row blocks of the partials, the
    #: gathered buffer gradient and the top gradients' AllReduce; exchanged operators: their values
    #: and gradients per distinct id
    traffic_sites = ("forward_partials", "partials_reduce_scatter", "gradient_allgather", "top_gradients",
                     "exchange_values", "exchange_gradients")
    allreduce_sites = ("forward_partials", "top_gradients")
    communication_plan = "partials"
    #: a plan this strategy always runs, whatever ``--plan`` says (``alltoall``: exchange)
    fixed_plan: ClassVar[str | None] = None
    UPPER = ("data-parallel", "replicated")

    @classmethod
    def check_options(cls, options) -> None:
        super().check_options(options)
        if options.get("upper", "data-parallel") not in cls.UPPER:
            raise ConfigError(f"--upper: {options.get('upper')!r} is not one of {', '.join(cls.UPPER)}")
        plan = options.get("plan", "partials")
        if options.get("upper") == "replicated" and plan not in ("partials", "auto"):
            raise ConfigError(f"--plan {plan}: the replicated upper network (--upper replicated) runs every operator "
                              "as partials")

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        from des.placement import check_placement, shares, split_groups, whole_fields

        check_placement(self.placement, self.model.num_fields, self.comm.size)
        split_fields = sorted(split_groups(self.placement))
        if split_fields and context.tables is not None and context.tables.unadmitted == "shared":
            raise ConfigError("--unadmitted shared keeps one out-of-vocabulary row per field, which a field split by "
                              "key over ranks cannot share: use --unadmitted init or zero, or another --placement")
        if split_fields and context.options.get("max_rows_per_field"):
            raise ConfigError("--max-rows-per-field ranks a table's rows by when they were last seen, which the "
                              "shares of a field split by key over ranks cannot do apart: use --ttl, or whole fields")
        self.upper = context.options.get("upper", "data-parallel")
        self.plan = self._resolve_plan(context.options.get("plan", "partials"))
        exchanged = [i for i, mode in enumerate(self.plan.values()) if mode == "exchange"]
        whole = [whole_fields(self.placement, r) for r in range(self.comm.size)]
        self.shard = FieldShard(whole[self.comm.rank], self.model.blocks(), context.optimizers, seed=self.seed,
                                dtype=self.dtype, tables=context.tables)
        mine = shares(self.placement, self.comm.rank)
        #: this rank's shares of the fields split by key (None: it holds none)
        self.share_shard = FieldShard(sorted(mine), self.model.blocks(), context.optimizers, seed=self.seed,
                                      dtype=self.dtype, tables=context.tables, shares=mine) if mine else None
        self.dense = DenseParams(self.model, self.shard.fields, context.optimizers, seed=self.seed, dtype=self.dtype,
                                 replicated=exchanged, split=split_fields)
        self.split_form = ModelSplitForm(self.model, self.dense, self.dtype, context.compute_dtype, exchanged,
                                         shares=sorted(mine))
        self.exchange = None
        if exchanged:
            from des.strategies.exchange import BlockExchange

            self.exchange = BlockExchange(self.shard, self.comm, whole, self.model.blocks(),
                                          self.split_form.exchange_blocks, self.dtype, self.model.num_fields)

    def _resolve_plan(self, text: str) -> dict[str, str]:
        """``--plan`` as ``{operator: mode}``; ``auto`` unresolved (the runner resolves it from the
        data before building a training strategy) means every operator partials: the plan changes
        what travels, never the model, so evaluation and export may use any."""
        from des import planner

        shape = planner.model_shape(self.model)
        try:
            plan = planner.parse_plan(text, shape)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return planner.normalize_plan(shape, "partials" if plan == planner.AUTO else plan)

    @property
    def fields(self) -> list[int]:
        """The fields this rank holds whole or a share of."""
        return sorted(self.shard.fields + (self.share_shard.fields if self.share_shard else []))

    @property
    def buffer_width(self) -> int:
        return self.split_form.width

    def reader_options(self) -> dict[str, Any]:
        """The whole global batch: this rank's fields, or all of them when an operator is exchanged
        (a row owner pools the ids of its rows, an owner finds the distinct ids of every row block)."""
        fields = list(range(self.model.num_fields)) if self.exchange else self.fields
        return {"fields": fields, "shard": (0, 1)}

    def prepare(self, batch: Any, step: int) -> Any:
        """The key->row lookup of step ``step`` (inserts and admission counts only, no values) and
        the exchange's routing: on the background thread while the previous step computes
        (``--pipeline on``)."""
        touched = self._touch(batch, train=True, step=step)
        batch.prepared = (step, touched, self.exchange.route(batch, touched.whole) if self.exchange else None)
        return batch

    def _touch(self, batch: Any, *, train: bool, step: int) -> _Touched:
        """The lookup of this rank's whole fields and of its shares of the split ones."""
        shares = self.share_shard.touch(batch, train=train, step=step) if self.share_shard else None
        return _Touched(self.shard.touch(batch, train=train, step=step), shares)

    # ------------------------------------------------------------------ the step, stage by stage
    def train_step(self, batch: Any) -> float:
        """One step of the paper's Algorithm 1 (the module docstring numbers its stages)."""
        rates = StepRates(self.shard.rates.sparse, self.dense.rates.dense)  # this step's schedule factors
        looked_up = self._lookup(batch, train=True)  # 1
        with self.timer("update"):  # TF reads the dense weights (in place): the previous step's update first
            self.pipeline.dense_done()
        if self.comm.size == 1 and self.exchange is None:
            grads = self._one_rank_step(batch, looked_up)  # 2, 4, 6 in one TF call
        elif self.upper == "replicated":
            grads = self._replicated_step(batch, looked_up)  # 2, 3, 4, 6
        else:
            grads = self._data_parallel_step(batch, looked_up)  # 2 to 7
        self._update(looked_up, grads, rates)  # 8
        self.step_count += 1
        self.timer.steps += 1
        return grads.loss

    def _lookup(self, batch: Any, *, train: bool) -> _LookedUp:
        """Step 1: this rank's fields of the whole global batch, looked up (or as prepared in the
        background), gathered and pooled (the blocks a split operator reads), and the exchange's
        route and gathered values. A training step first catches its rows up (they are read as
        dense Adam would hold them now) and runs the previous step's deferred sparse update in the
        same pass over the fields."""
        phase = self.timer if train else untimed  # evaluation is not timed
        with phase("lookup"):
            if train and batch.prepared is not None:
                step, touched, route = batch.prepared
                if step != self.step_count:
                    raise RuntimeError(f"batch prepared for step {step} trained at step {self.step_count}")
            else:
                touched = self._touch(batch, train=train, step=self.step_count)
                route = self.exchange.route(batch, touched.whole) if self.exchange else None
        catch_up_to = self.step_count if train else None
        late = self.pipeline.take_sparse() if train else None
        pooled, spooled = [], []
        for shard, now, before, grads, blocks in self._shards(touched, late):
            if before is not None:
                with phase("update"):
                    out = shard.apply_then_gather(before, grads, late.step, late.rates.sparse, now, blocks,
                                                  catch_up_to=catch_up_to)
            else:
                with phase("lookup"):
                    out = shard.gather_pooled(now, blocks, catch_up_to=catch_up_to)
            (pooled if shard is self.shard else spooled).extend(out)
        with phase("lookup"):
            gathered = self.exchange.gather(route) if self.exchange else None
        if train:
            self.pipeline.overlap_next()  # the next batch is read and looked up while TF computes this step
        return _LookedUp(pooled, touched, route, gathered, spooled or self._no_shares(len(batch.labels)))

    def _shards(self, touched: _Touched, late: _LateSparse | None) -> list[tuple]:
        """Per shard (whole fields, shares): it, this batch's lookup, the deferred update's lookup and
        gradients (None without one) and the blocks to gather."""
        out = [(self.shard, touched.whole, late and late.touched.whole, late and late.grads,
                self.split_form.split_blocks)]
        if self.share_shard is not None:
            out.append((self.share_shard, touched.shares, late and late.touched.shares, late and late.share_grads,
                        self.split_form.share_blocks))
        return out

    def _no_shares(self, rows: int) -> list[np.ndarray]:
        """The pooled values of no share (a rank outside every split field's group)."""
        dims = {b.name: b.dim for b in self.model.blocks()}
        return [np.zeros((rows, 0, dims[b]), dtype=self.dtype) for b in self.split_form.share_blocks]

    def _one_rank_step(self, batch: Any, looked_up: _LookedUp) -> _Gradients:
        """Steps 2, 4 and 6 on one rank: the row block is the batch and nothing is reduced."""
        form, size = self.split_form, len(batch.labels)
        with self.timer("fused_step"):
            loss, pooled_grads, field_grads, top_grads = form.train_whole(
                looked_up.pooled, self._split_params(), self._top(), self._labels(batch), size, form.dense_rows(batch))
            return _Gradients(float(loss), _arrays(pooled_grads), [], _arrays(field_grads), _arrays(top_grads))

    def _replicated_step(self, batch: Any, looked_up: _LookedUp) -> _Gradients:
        """Steps 2, 3, 4, 6 as in the paper: one AllReduce of the partials, the top network on the
        whole batch on every rank (its gradients are the same everywhere: nothing else travels)."""
        form, size = self.split_form, len(batch.labels)
        buffer = self._partials(looked_up, size, train=True)
        with self.timer("allreduce"):
            self.comm.allreduce_sum_(buffer, "forward_partials")
        with self.timer("top"):
            loss, buffer_grad, _, _, sparam_grads, top_grads = form.top_train(
                buffer, [], [], self._split_params(), self._labels(batch), self._top(), size, form.dense_rows(batch))
        pooled_grads, field_grads, share_grads = self._local_backward(looked_up, buffer_grad)
        return _Gradients(float(loss), pooled_grads, [], self._field_gradients(field_grads, [], _arrays(sparam_grads)),
                          _arrays(top_grads), share_grads)

    def _data_parallel_step(self, batch: Any, looked_up: _LookedUp) -> _Gradients:
        """Steps 2 to 7 with the upper network on this rank's row block: the partials reduce-scattered
        by rows (and the exchanged operators' inputs sent to the row owners), the top network on
        B/N rows, its gradients AllReduced while ``G`` is all-gathered and sent back through
        ``local``."""
        form, comm, timer, size = self.split_form, self.comm, self.timer, len(batch.labels)
        buffer = self._partials(looked_up, size, train=True)
        xpooled, xparams = self._exchanged_inputs(looked_up, train=True)
        lo, hi = comm.row_bounds(size)[comm.rank : comm.rank + 2]
        with timer("reduce_scatter"):
            rows = (comm.reduce_scatter_rows_sum(buffer, "partials_reduce_scatter") if form.width
                    else np.zeros((hi - lo, 0), dtype=self.dtype))
        with timer("top"):
            loss, rows_grad, xpooled_grads, xparam_grads, sparam_grads, top_grads = form.top_train(
                rows, xpooled, xparams, self._split_params(), self._labels(batch)[lo:hi], self._top(), size,
                form.dense_rows(batch, lo, hi))
            # this rank's loss share and dense gradients, summed over the ranks while G travels
            packed = np.concatenate([[float(loss)], *[to_numpy(g).reshape(-1) for g in xparam_grads],
                                     *[to_numpy(g).reshape(-1) for g in sparam_grads],
                                     *[to_numpy(g).reshape(-1) for g in top_grads]]).astype(self.dtype)
        with timer("allreduce"):
            pending = self._reduce_top(packed, size)
        exchange_grads = self._exchange_backward(looked_up.route, xpooled_grads) if self.exchange else []
        buffer_grad = None
        if form.width:
            with timer("allgather"):
                buffer_grad = comm.allgather_rows(to_numpy(rows_grad), size, "gradient_allgather")
        pooled_grads, field_grads, share_grads = self._local_backward(looked_up, buffer_grad)
        with timer("allreduce"):
            pending.wait()
            loss, xparam_grads, sparam_grads, top_grads = self._unpack(packed)
        return _Gradients(loss, pooled_grads, exchange_grads,
                          self._field_gradients(field_grads, xparam_grads, sparam_grads), top_grads, share_grads)

    def _update(self, looked_up: _LookedUp, grads: _Gradients, rates: StepRates) -> None:
        """Step 8: the dense optimizers, then the sparse ones, each with this step's factors. When
        the next step follows (``--pipeline on``) only its TF call reads the dense weights, so their
        step runs on the background thread meanwhile, and (without an exchange) the sparse update
        waits for the next step's gather: the same bytes either way."""
        with self.timer("update"):
            if self.pipeline.follows:
                self.pipeline.defer_dense(self.dense.apply, grads.fields, grads.top, rates.dense)
            else:  # before the sparse update: the next batch's lookup may still be running
                self.dense.apply(grads.fields, grads.top, rates.dense)
        defer = self.pipeline.follows and self.exchange is None
        with self.timer("lookup"):
            self.pipeline.await_next()  # the next batch's lookup may grow the tables: done before they change
        if defer:
            self.pipeline.defer_sparse(_LateSparse(self, grads.pooled, grads.shares, looked_up.touched, self.step_count,
                                                   rates))
        else:
            with self.timer("update"):
                self._apply_sparse(looked_up, grads, rates)

    # ------------------------------------------------------------------ the stages' pieces
    def _partials(self, looked_up: _LookedUp, rows: int, *, train: bool) -> np.ndarray:
        """Step 2: this rank's partials ``[B, P]`` of the whole global batch (and its shares' pooled
        values of the fields split by key)."""
        with (self.timer if train else untimed)("partials"):
            if not self.split_form.width:  # every operator exchanged
                return np.zeros((rows, 0), dtype=self.dtype)
            buffer = to_numpy(self.split_form.partials(looked_up.pooled, self._split_params(), looked_up.spooled))
            if self.upper == "replicated" and self.comm.size > 1:
                buffer = np.array(buffer, order="C", copy=True)  # the AllReduce sums in place: TF's memory is not ours
        return buffer

    def _exchanged_inputs(self, looked_up: _LookedUp, *, train: bool) -> tuple[list, list]:
        """The row owner's pooled values of the exchanged blocks (after the values' Alltoallv) and
        the exchanged operators' field weights (every field)."""
        form = self.split_form
        xparams = [self.dense.field_params[n] for n in form.exchange_params]
        if self.exchange is None:
            return [], xparams
        with (self.timer if train else untimed)("exchange_values"):
            got = self.exchange.send_values(looked_up.route, looked_up.gathered, train=train)
        with (self.timer if train else untimed)("lookup"):
            return self.exchange.pool(looked_up.route, got), xparams

    def _local_backward(self, looked_up: _LookedUp, buffer_grad: Any) -> tuple[list, list, list]:
        """Step 6: ``G`` back through this rank's ``local`` (eq. 9): the gradients of its pooled
        blocks and field slices (none when every operator is exchanged), and of its shares' pooled
        values (their columns of ``G``)."""
        if not self.split_form.width:
            return [], [], []
        with self.timer("local_backward"):
            pooled_grads, field_grads, share_grads = self.split_form.local_backward(looked_up.pooled,
                                                                                    self._split_params(), buffer_grad)
            return _arrays(pooled_grads), _arrays(field_grads), _arrays(share_grads)

    def _top(self) -> list[Any]:
        """The top network's weights (and the dense features'), as TF tensors over their memory."""
        return self.dense.as_tensors(self.dense.top_params.values())

    def _labels(self, batch: Any) -> np.ndarray:
        return np.asarray(batch.labels, dtype=self.dtype)

    def _split_params(self) -> list[Any]:
        """The split operators' field weights (this rank's slices), in the split form's order, as
        TF tensors over their memory (``DenseParams.as_tensors``)."""
        return self.dense.as_tensors(self.dense.field_params[n] for n in self.split_form.split_params)

    def _exchange_backward(self, route: Any, xpooled_grads: list) -> list[np.ndarray]:
        timer = self.timer
        with timer("sparse_backward"):
            send = self.exchange.sum_gradients(route, [to_numpy(g) for g in xpooled_grads])
        with timer("exchange_gradients"):
            got = self.exchange.send_gradients(route, send)
        with timer("sparse_backward"):
            return self.exchange.scatter_gradients(route, got)

    def _reduce_top(self, packed: np.ndarray, size: int) -> Any:
        """Start the sum of the loss shares and the replicated weights' gradients (``packed``) over
        the ranks that train one replica of them: every rank (a pending AllReduce)."""
        return self.comm.start_allreduce_sum_(packed, "top_gradients")

    def _unpack(self, packed: np.ndarray) -> tuple[float, list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """The summed loss, the gradients of the exchanged field weights, of the split fields' slices
        and of the top network, from the AllReduce's buffer."""
        form, offset = self.split_form, 1
        shapes = [self.dense.field_params[name].shape for name in form.exchange_params]
        if form.split_fields:
            shapes += [(len(form.split_fields), *self.dense.field_params[name].shape[1:]) for name in form.split_params]
        out = []
        for shape in shapes:
            out.append(packed[offset : offset + int(np.prod(shape))].reshape(shape))
            offset += out[-1].size
        exchanged = len(form.exchange_params)
        return float(packed[0]), out[:exchanged], out[exchanged:], self.dense.split_top(packed[offset:])

    def _field_gradients(self, split: list, exchanged: list, shares: list) -> list[np.ndarray]:
        """The field weights' gradients in :attr:`DenseParams.field_params` order: a split
        operator's slices of this rank's fields, then (``shares``) of the fields split by key."""
        if self.split_form.split_fields:
            split = [np.concatenate([own, rest]) for own, rest in zip(split, shares)]
        by_name = dict(zip(self.split_form.split_params, split))
        by_name.update(zip(self.split_form.exchange_params, exchanged))
        return [by_name[name] for name in self.dense.field_params]

    def _apply_sparse(self, looked_up: _LookedUp, grads: _Gradients, rates: StepRates) -> None:
        """The sparse optimizers, ONCE per row per step: a block both a split and an exchanged
        operator read is updated on the real batch joined to the exchange's synthetic one."""
        touched, step, scale = looked_up.touched.whole, self.step_count, rates.sparse
        if self.share_shard is not None:
            self.share_shard.apply_pooled(looked_up.touched.shares, grads.shares, step, scale)
        if self.exchange is None:
            self.shard.apply_pooled(touched, grads.pooled, step, scale)
            return
        from des.strategies.exchange import join_samples

        split = dict(zip(self.split_form.split_blocks, grads.pooled))
        exchanged = dict(zip(self.split_form.exchange_blocks, grads.exchanged))
        synthetic = looked_up.route.synthetic
        joined = None
        for k, block in enumerate(self.model.blocks()):
            if block.name in split and block.name in exchanged:
                joined = joined or join_samples(touched, synthetic)
                both = np.concatenate([split[block.name], exchanged[block.name]], axis=0)
                self.shard.apply_pooled(joined, {k: both}, step, scale)
            elif block.name in split:
                self.shard.apply_pooled(touched, {k: split[block.name]}, step, scale)
            elif block.name in exchanged:
                self.shard.apply_pooled(synthetic, {k: exchanged[block.name]}, step, scale)

    # ------------------------------------------------------------------ evaluation and state
    def predict(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        self.settle()
        looked_up = self._lookup(batch, train=False)
        size = len(batch.labels)
        buffer = self._partials(looked_up, size, train=False)
        top, comm, form, sparams = self._top(), self.comm, self.split_form, self._split_params()
        if self.exchange is None and (self.upper == "replicated" or comm.size == 1):
            comm.allreduce_sum_(buffer, "eval_partials")
            return (form.top_predict(buffer, [], [], sparams, top, form.dense_rows(batch)).numpy(),
                    np.asarray(batch.labels))
        xpooled, xparams = self._exchanged_inputs(looked_up, train=False)
        lo, hi = comm.row_bounds(size)[comm.rank : comm.rank + 2]
        rows = (comm.reduce_scatter_rows_sum(buffer, "eval_partials") if form.width
                else np.zeros((hi - lo, 0), dtype=self.dtype))
        p = np.ascontiguousarray(form.top_predict(rows, xpooled, xparams, sparams, top,
                                                  form.dense_rows(batch, lo, hi)).numpy(), dtype=self.dtype)
        return comm.allgather_rows(p, size, "eval_predictions"), np.asarray(batch.labels)

    def state(self) -> ShardState:
        self.settle()
        tables = {**self.shard.tables, **(self.share_shard.tables if self.share_shard else {})}
        return ShardState(self.model, self.dtype, self.seed, self.placement, self.step_count, tables, self.dense)

    def load_state(self, state: ShardState) -> None:
        """Adopt a loaded state: its tables go back to the shard that holds their field (whole or a share)."""
        super().load_state(state)
        for shard in (self.shard, self.share_shard):
            if shard is not None:
                shard.tables.update((f, state.tables[f]) for f in shard.fields)

    def describe(self) -> str:
        from des.planner import format_plan

        plan = "" if self.exchange is None else f"; plan {format_plan(self.plan)}"
        return f"{self.description}; upper network {self.upper}; buffer {self.buffer_width} floats/sample{plan}"

    def summary(self) -> dict[str, Any]:
        return {"upper": self.upper, "plan": dict(self.plan)}

    def memory(self) -> dict[str, int]:
        held = [self.shard.memory()] + ([self.share_shard.memory()] if self.share_shard else [])
        return {key: sum(m[key] for m in held) for key in held[0]} | {"dense_bytes": self.dense.nbytes}


@dataclass
class _LookedUp:
    """Step 1's result: this rank's pooled blocks, its lookup, and the exchange's route and values."""

    pooled: list
    touched: _Touched
    route: Any = None
    gathered: Any = None
    spooled: list = field(default_factory=list)  # this rank's shares' pooled values (per share block)


@dataclass
class _Touched:
    """A batch's lookup in this rank's whole fields and in its shares of the split ones (or None)."""

    whole: Any
    shares: Any = None


@dataclass
class _Gradients:
    """Steps 2 to 7's result: the loss and the gradients of this rank's pooled blocks, of the ids
    the exchange brought back, of the field weights and of the top network's."""

    loss: float
    pooled: list
    exchanged: list
    fields: list
    top: list
    shares: list = field(default_factory=list)  # gradients of this rank's shares' pooled values


@dataclass
class _LateSparse:
    """A pipelined step's sparse update, run by the next step with its gather (or alone)."""

    strategy: DES
    grads: list
    share_grads: list
    touched: _Touched
    step: int
    rates: StepRates

    def apply(self) -> None:
        for shard, _, touched, grads, _ in self.strategy._shards(self.touched, self):
            shard.apply_pooled(touched, grads, self.step, self.rates.sparse)


def _arrays(tensors: Any) -> list[np.ndarray]:
    return [to_numpy(t) for t in tensors]
