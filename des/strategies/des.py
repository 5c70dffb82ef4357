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

The stages are objects chosen once by the :class:`~des.strategies.stages.Plan`
(``des/strategies/stages.py``): field holders, a transport per operator, the upper network with its
top reduction, the sparse-update stage; the :class:`~des.strategies.pipeline.Pipeline` drives them.
Related systems change one stage through a public hook: :meth:`DES.top_reduction` (hierarchical
training: over a group) and :meth:`DES.sparse_stage` (Persia: delayed).

Both need ``combine`` and ``Model.top`` to be row-wise (``check_substitution``/``check_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from des.errors import ConfigError
from des.strategies import stages
from des.strategies.base import ShardState, Strategy, StrategyContext, StrategyOptions
from des.strategies.components import DenseParams, FieldShard
from des.strategies.forms import ModelSplitForm
from des.strategies.pipeline import Pipeline, StepRates


class DES(Strategy):
    """Distributed Equivalent Substitution: each rank holds its fields' tables and field slices and
    a replica of the top network; one AllReduce of the partials per step, no gradient exchange.

    ``--plan`` (``des/planner.py``): an operator may instead be *exchanged*: its pooled
    inputs travel to the row owners per distinct id or, ``--exchange-by rows``, pooled per row and
    field (``des/strategies/exchange.py``) and it runs there on its rows, with its field weights
    replicated (their gradients summed over the ranks with the top network's). ``auto`` lets the
    planner's cost model choose per operator."""

    name = "des"
    shares_tables = True
    description = "partial sums of the substituted operators, summed over the ranks (the paper)"
    phases = {"lookup": "lookup", "partials": "partials", "reduce_scatter": "communication", "top": "top",
              "allgather": "communication", "local_backward": "backward", "allreduce": "communication",
              "update": "update", "fused_step": "top", "exchange_values": "communication",
              "exchange_gradients": "communication", "sparse_backward": "backward", "exchange_gather": "lookup"}
    #: replicated: the partials' AllReduce; data-parallel: the row blocks of the partials, the
    #: gathered buffer gradient and the top gradients' AllReduce; exchanged operators: their values
    #: and gradients per distinct id
    traffic_sites = ("forward_partials", "partials_reduce_scatter", "gradient_allgather", "top_gradients",
                     "exchange_values", "exchange_gradients")
    allreduce_sites = ("forward_partials", "top_gradients")
    communication_plan = "partials"
    #: a plan this strategy always runs, whatever ``--plan`` says (``alltoall``: exchange)
    fixed_plan: ClassVar[str | None] = None

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        """``--plan`` (per operator: partials or exchange; ``auto``/``measure`` are resolved in set-up,
        and mean all partials where nothing resolved them), ``--upper`` and ``--xla``."""

        plan: str = "auto"
        upper: str = "data-parallel"
        xla: str = "off"
        exchange_by: str = "auto"

        def check(self) -> None:
            if self.upper not in stages.UPPERS:
                raise ConfigError(f"--upper: {self.upper!r} is not one of {', '.join(stages.UPPERS)}")
            if self.upper == "replicated" and self.plan not in ("partials", "auto", "measure"):
                raise ConfigError(f"--plan {self.plan}: the replicated upper network (--upper replicated) runs every "
                                  "operator as partials")

    @classmethod
    def place(cls, num_fields, ranks, distinct, config, work=None) -> list[list[int]]:
        from des.placement import split_groups

        placement = super().place(num_fields, ranks, distinct, config, work)
        if split_groups(placement) and config.max_rows_per_field:
            raise ConfigError("--max-rows-per-field ranks a table's rows by when they were last seen, which the "
                              "shares of a field split by key over ranks cannot do apart: use --ttl, or whole fields")
        return placement

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        from des.hashtable import background_thread
        from des.placement import check_placement, shares, split_groups, whole_fields

        check_placement(self.placement, self.model.num_fields, self.comm.size)
        split_fields = sorted(split_groups(self.placement))
        if split_fields and context.tables is not None and context.tables.unadmitted == "shared":
            raise ConfigError("--unadmitted shared keeps one out-of-vocabulary row per field, which a field split by "
                              "key over ranks cannot share: use --unadmitted init or zero, or another --placement")
        options = context.options
        self.plan = stages.Plan(self._resolve_plan(self.fixed_plan or options.plan), options.upper)
        exchanged = self.plan.exchanged
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
                                         shares=sorted(mine), jit=options.xla == "on")
        self.exchange = None
        self.by_rows = bool(exchanged) and options.exchange_by == "rows"
        if self.by_rows:
            from des.strategies.exchange import RowExchange

            self.exchange = RowExchange(self.comm, whole, self.model.blocks(), self.split_form.exchange_blocks,
                                        self.dtype, self.model.num_fields)
        elif exchanged:
            from des.strategies.exchange import BlockExchange

            self.exchange = BlockExchange(self.shard, self.comm, whole, self.model.blocks(),
                                          self.split_form.exchange_blocks, self.dtype, self.model.num_fields)
        self.pipeline = Pipeline(self.prepare, background=background_thread)
        self._sparse_stage = self.sparse_stage()
        self.step = self.build_step()

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

    # ------------------------------------------------------------------ the stages and their hooks
    def build_step(self) -> stages.DESStep:
        """The plan's stage objects: field holders, transports, the upper network (module docstring)."""
        form = self.split_form
        pooled = [b.name for b in self.model.blocks() if b.name in form.split_blocks
                  or (self.by_rows and b.name in form.exchange_blocks)]  # the whole holder pools these
        holders: list[stages.FieldHolder] = [stages.Whole(self.shard, pooled)]
        if self.share_shard is not None:
            holders.append(stages.Shares(self.share_shard, form.share_blocks))
        dims = {b.name: b.dim for b in self.model.blocks()}
        partials = stages.Partials(form, self.dense, [dims[b] for b in form.share_blocks])
        exchange = (stages.Exchange(self.exchange, form, self.dense, self.timer, by_rows=self.by_rows,
                                    holder_blocks=pooled) if self.exchange else None)
        upper = stages.upper_network(self.plan.upper_for(self.comm.size), form, self.comm, self.top_reduction())
        return stages.DESStep(holders=holders, partials=partials, exchange=exchange, upper=upper, dense=self.dense,
                              model=self.model, timer=self.timer)

    def top_reduction(self) -> stages.TopReduction:
        """Hook: how the loss shares and top gradients are summed (des: over every rank)."""
        return stages.AllRanks(self.comm)

    def sparse_stage(self) -> Any:
        """Hook: the stage that takes a step's sparse update when it is not deferred (des: applied now)."""
        return stages.ImmediateSparse()

    @property
    def fields(self) -> list[int]:
        """The fields this rank holds whole or a share of."""
        return sorted(self.shard.fields + (self.share_shard.fields if self.share_shard else []))

    @property
    def buffer_width(self) -> int:
        return self.split_form.width

    def reader_options(self) -> dict[str, Any]:
        """The whole global batch, this rank's fields; with an operator exchanged per distinct id
        also every field of this rank's row block (a row owner pools the ids of its rows, an owner
        finds the distinct ids of every row block in its own fields)."""
        block = (list(range(self.model.num_fields)), self.comm.rank, self.comm.size)
        return {"fields": self.fields, "shard": (0, 1), **({"block": block} if self.exchange and not self.by_rows else {})}

    def prepare(self, batch: Any, step: int) -> stages.Work:
        """The key->row lookup of step ``step`` (inserts and admission counts only, no values) and
        the exchange's routing: on the background thread while the previous step computes
        (``--pipeline on``)."""
        return self.step.prepare(batch, step)

    # ------------------------------------------------------------------ the step
    def train_step(self, batch: Any) -> float:
        """One step of the paper's Algorithm 1 (the module docstring numbers its stages), driven by
        the pipeline with this step's schedule factors."""
        rates = StepRates(self.shard.rates.sparse, self.dense.rates.dense)
        loss = self.pipeline.progress(self.step, batch, self.step_count, rates, self.timer, self._sparse_stage)
        self.step_count += 1
        self.timer.steps += 1
        return loss

    def settle(self) -> None:
        """The pipeline's deferred updates, then whatever the sparse stage holds back."""
        super().settle()
        self._sparse_stage.settle()

    # ------------------------------------------------------------------ evaluation and state
    def predict(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        self.settle()
        work = self.step.prepare(batch, self.step_count, train=False)
        self.step.gather(work)
        return self.step.predict(work), np.asarray(batch.labels)

    def state(self) -> ShardState:
        self.settle()
        tables = {**self.shard.tables, **(self.share_shard.tables if self.share_shard else {})}
        shared = dict(self.shard.groups.shared)
        return ShardState(self.model, self.dtype, self.seed, self.placement, self.step_count, tables, self.dense,
                          shared)

    def load_state(self, state: ShardState) -> None:
        """Adopt a loaded state: its tables go back to the shard that holds their field (whole or a share)."""
        super().load_state(state)
        for shard in (self.shard, self.share_shard):
            if shard is not None:
                shard.tables.update((f, state.tables[f]) for f in list(shard.tables))

    def describe(self) -> str:
        from des.planner import format_plan

        plan = "" if self.exchange is None else (f"; plan {format_plan(dict(self.plan.operators))}, exchanged by "
                                                 + ("rows" if self.by_rows else "ids"))
        return f"{self.description}; upper network {self.plan.upper}; buffer {self.buffer_width} floats/sample{plan}"

    def summary(self) -> dict[str, Any]:
        return {"upper": self.plan.upper, "plan": dict(self.plan.operators),
                **({"exchange_by": "rows" if self.by_rows else "ids"} if self.exchange is not None else {})}

    def memory(self) -> dict[str, int]:
        held = [self.shard.memory()] + ([self.share_shard.memory()] if self.share_shard else [])
        return {key: sum(m[key] for m in held) for key in held[0]} | {"dense_bytes": self.dense.nbytes}
