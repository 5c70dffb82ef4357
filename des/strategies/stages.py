"""The DES step as stage objects chosen by one plan (``docs/design.md``, "The DES step").

TorchRec's sharded modules split a step into public stages (input_dist, lookup, output_dist), each
sharding type its own object, and one pipeline (``TrainPipelineSparseDist``) owns their overlap.
DES's step is cut the same way; a :class:`Plan`, made once in set-up, chooses the objects:

* **field holders** (:class:`Whole`, :class:`Shares`): a rank's tables of whole fields and of its
  shares of the fields split by key: ``prepare`` (the key -> row lookup: parameter-free),
  ``gather`` (values gathered and pooled; given the previous step's sparse update, the fused
  apply-then-gather in one pass) and ``update`` (the sparse optimizers);
* **transports**, per operator: :class:`Partials` (the paper's sub-operators: ``local`` on the
  rank's fields into one buffer ``[B, P]``, and ``G`` back through it) or :class:`Exchange` (the
  operator's pooled inputs sent to the row owners per distinct id, and their gradients back);
* the **upper network** (:class:`OneRank`, :class:`Replicated`, :class:`DataParallel`): how the
  partials are summed and where ``combine`` + the top network run, with the **top reduction** it
  uses (:class:`AllRanks`; hierarchical training sums over a group instead);
* the **sparse-update stage** (:class:`ImmediateSparse`; Persia's delays it).

:class:`DESStep` walks them: ``prepare`` -> ``gather`` -> ``compute`` (transports forward, upper
network, transports backward) giving a :class:`StepResult` whose dense and sparse updates the
:class:`~des.strategies.pipeline.Pipeline` runs now or defers. No stage calls the pipeline; the
pipeline asks a step for its parts. Every stage runs the same arithmetic in the same order as the
unstaged step did, so N ranks still train what one rank trains, bit for bit where it did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from des.strategies.base import untimed
from des.strategies.components import DenseParams, FieldShard
from des.strategies.pipeline import StepRates
from des.zero_copy import to_numpy

PARTIALS, EXCHANGE = "partials", "exchange"
UPPERS = ("data-parallel", "replicated")


@dataclass(frozen=True)
class Plan:
    """How one DES step moves its operators, made once in set-up (``--plan`` resolved, ``--upper``):
    ``operators`` maps each substitution (in the model's order) to ``"partials"`` or
    ``"exchange"``. The plan changes what travels, never the model (``des.check``)."""

    operators: Mapping[str, str]
    upper: str = "data-parallel"

    @property
    def exchanged(self) -> list[int]:
        """Indices of the exchanged substitutions."""
        return [i for i, mode in enumerate(self.operators.values()) if mode == EXCHANGE]

    def upper_for(self, ranks: int) -> str:
        """The upper network's object: ``one-rank`` where nothing is reduced nor exchanged."""
        return "one-rank" if ranks == 1 and not self.exchanged else self.upper


# ---------------------------------------------------------------------------------------------- the batch
@dataclass
class Work:
    """One batch's way through the stages: what each stage leaves for the next."""

    batch: Any
    step: int
    train: bool
    lookups: list  # per holder (the plan's order), its lookup of the batch
    route: Any = None  # the exchange's route (None: no operator exchanged)
    pooled: list = field(default_factory=list)  # per holder, its pooled blocks
    values: Any = None  # the exchange's gathered values (owner side)

    @property
    def rows(self) -> int:
        return len(self.batch.labels)


@dataclass
class SparseUpdate:
    """One step's sparse update: ``(holder, lookup, {block: gradients})`` parts, every row's
    gradients summed into ONE optimizer step (``step``, schedule factor ``rate``). ``fusable``: it
    may run in the next step's gather pass (one part per holder, in the plan's holder order)."""

    parts: list[tuple[Any, Any, Any]]
    step: int
    rate: float
    fusable: bool

    def apply(self) -> None:
        for holder, lookup, grads in self.parts:
            holder.update(lookup, grads, self.step, self.rate)


@dataclass
class DenseUpdate:
    """One step's dense optimizer step (field slices and top network) at its own schedule factor."""

    params: DenseParams
    fields: list
    top: list
    rate: float

    def apply(self) -> None:
        self.params.apply(self.fields, self.top, self.rate)


@dataclass
class StepResult:
    """What a step hands the pipeline: its mean loss and its two updates, run when the pipeline says."""

    loss: float
    dense: DenseUpdate
    sparse: SparseUpdate


# ---------------------------------------------------------------------------------------------- holders
class FieldHolder:
    """A rank's tables of one kind of field (a :class:`FieldShard`) and the blocks it pools."""

    kind = "fields"

    def __init__(self, shard: FieldShard, blocks: Sequence[str]) -> None:
        self.shard, self.blocks = shard, list(blocks)

    def prepare(self, batch: Any, *, train: bool, step: int) -> Any:
        """The key -> row lookup (inserts and admission counts only; reads no value)."""
        return self.shard.touch(batch, train=train, step=step)

    def gather(self, lookup: Any, *, catch_up_to: int | None, pending: tuple | None = None) -> list[np.ndarray]:
        """The pooled blocks of ``lookup``; with ``pending`` (the previous step's lookup, gradients,
        step and factor) that update first, in the same pass over the fields: the same bytes."""
        if pending is None:
            return self.shard.gather_pooled(lookup, self.blocks, catch_up_to=catch_up_to)
        before, grads, step, rate = pending
        return self.shard.apply_then_gather(before, grads, step, rate, lookup, self.blocks, catch_up_to=catch_up_to)

    def update(self, lookup: Any, grads: Any, step: int, rate: float) -> None:
        self.shard.apply_pooled(lookup, grads, step, rate)


class Whole(FieldHolder):
    """The fields this rank holds whole."""

    kind = "whole"


class Shares(FieldHolder):
    """This rank's shares of the fields split by key (``des/placement.py``)."""

    kind = "shares"


# ---------------------------------------------------------------------------------------------- transports
class Partials:
    """The paper's sub-operators: each split substitution's ``local`` on this rank's fields into
    ONE buffer ``[B, P]`` (the split fields' pooled values follow as columns), and the buffer
    gradient ``G`` back through ``local`` (eq. 9: since ⊕ is a sum, ``∂L/∂M_i = G``)."""

    def __init__(self, form: Any, dense: DenseParams, share_dims: Sequence[int]) -> None:
        self.form, self.dense = form, dense
        self._share_dims = list(share_dims)  # per share block its dim (zero-wide blocks where no share is held)

    @property
    def width(self) -> int:
        return self.form.width

    def params(self) -> list[Any]:
        """The split operators' field weights (this rank's slices) as TF tensors over their memory."""
        return self.dense.as_tensors(self.dense.field_params[n] for n in self.form.split_params)

    def share_values(self, work: Work) -> list[np.ndarray]:
        """This rank's shares' pooled values, or zero-wide blocks where it holds no share."""
        if len(work.pooled) > 1:
            return work.pooled[1]
        return [np.zeros((work.rows, 0, dim), dtype=self.dense.dtype) for dim in self._share_dims]

    def forward(self, work: Work, *, copy: bool = False) -> np.ndarray:
        """This rank's partials of the whole batch (``copy``: an array of its own, for a collective
        that sums in place: TF's memory is not ours)."""
        if not self.width:  # every operator exchanged
            return np.zeros((work.rows, 0), dtype=self.dense.dtype)
        buffer = to_numpy(self.form.partials(work.pooled[0], self.params(), self.share_values(work)))
        return np.array(buffer, order="C", copy=True) if copy else buffer

    def backward(self, work: Work, buffer_grad: Any) -> tuple[list, list, list]:
        """``G`` back through ``local``: the gradients of this rank's pooled blocks, its field slices
        and its shares' pooled values (their columns of ``G``)."""
        if not self.width:
            return [], [], []
        pooled, fields, shares = self.form.local_backward(work.pooled[0], self.params(), buffer_grad)
        return _arrays(pooled), _arrays(fields), _arrays(shares)


class Exchange:
    """The planner's exchange (``des/strategies/exchange.py``): the exchanged operators' inputs
    travel to the row owners, which run them whole, and their gradients back. ``by_rows`` False:
    per distinct id (:class:`~des.strategies.exchange.BlockExchange`, applied on the owner's
    synthetic batch); True: pooled per row and field (:class:`~des.strategies.exchange.RowExchange`:
    the whole holder pools them with its own blocks, ``holder_blocks``, and their gradients are
    applied on the real batch)."""

    def __init__(self, exchange: Any, form: Any, dense: DenseParams, timer: Any, *, by_rows: bool = False,
                 holder_blocks: Sequence[str] = ()) -> None:
        self.exchange, self.form, self.dense, self.timer = exchange, form, dense, timer
        self.by_rows, self.holder_blocks = by_rows, list(holder_blocks)

    def route(self, batch: Any, whole_lookup: Any) -> Any:
        """Who sends what (parameter-free: it runs with the lookup, also in the background)."""
        return self.exchange.route(batch, whole_lookup)

    def gather(self, work: Work) -> None:
        """The owner's values to send (``work.values``): per distinct id, gathered now; pooled, taken
        out of the whole holder's blocks (which keep the split operators' only)."""
        if not self.by_rows:
            work.values = self.exchange.gather(work.route)
            return
        by_name = dict(zip(self.holder_blocks, work.pooled[0]))
        work.values = [by_name[name] for name in self.form.exchange_blocks]
        work.pooled[0] = [by_name[name] for name in self.form.split_blocks]

    def params(self) -> list[Any]:
        """The exchanged operators' field weights (every field, replicated)."""
        return [self.dense.field_params[n] for n in self.form.exchange_params]

    def forward(self, work: Work) -> np.ndarray:
        """The values' Alltoallv, then the row owner's pooled exchanged blocks of its rows, side by
        side (``ModelSplitForm.exchanged_blocks``)."""
        phase = self.timer if work.train else untimed
        with phase("exchange_values"):
            got = self.exchange.send_values(work.route, work.values, train=work.train)
        with phase("lookup"):
            return self.exchange.pool(work.route, got)

    def backward(self, work: Work, pooled_grads: Any) -> list[np.ndarray]:
        """Per-id gradient sums (from the gradients of the packed inputs) back to the owners,
        scattered onto their synthetic batch."""
        with self.timer("sparse_backward"):
            send = self.exchange.sum_gradients(work.route, to_numpy(pooled_grads))
        with self.timer("exchange_gradients"):
            got = self.exchange.send_gradients(work.route, send)
        with self.timer("sparse_backward"):
            return self.exchange.scatter_gradients(work.route, got)


# ---------------------------------------------------------------------------------------------- top reduction
class TopReduction(Protocol):
    """Sums the loss shares and the replicated weights' gradients over the ranks that train one
    replica of them; ``start`` returns a pending request (``wait()``)."""

    def start(self, packed: np.ndarray, rows: int) -> Any: ...


class AllRanks:
    """Every rank trains one replica: an AllReduce over the job (des)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def start(self, packed: np.ndarray, rows: int) -> Any:
        return self.comm.start_allreduce_sum_(packed, "top_gradients")


# ---------------------------------------------------------------------------------------------- sparse stage
class ImmediateSparse:
    """A step's sparse update applied when the step hands it over (des, alltoall)."""

    #: whether it applies updates later than the step after theirs (the pipeline then never fuses them)
    holds_back = False

    def submit(self, update: SparseUpdate) -> None:
        update.apply()

    def settle(self) -> None:
        """Nothing is held back."""


# ---------------------------------------------------------------------------------------------- the step
@dataclass
class Gradients:
    """What the upper network and the transports give back: the loss, the gradients of the holders'
    pooled blocks (per holder), of the exchanged ids, of the field weights and of the top network."""

    loss: float
    pooled: list
    shares: list
    exchanged: list
    fields: list
    top: list


class DESStep:
    """One DES step as a walk over the plan's stages (the module docstring). ``holders``: whole
    fields first, then the shares (if any); ``partials``/``exchange``: the transports (an exchange
    only when the plan exchanges an operator); ``upper``: the upper network."""

    def __init__(self, *, holders: Sequence[FieldHolder], partials: Partials, exchange: Exchange | None,
                 upper: Any, dense: DenseParams, model: Any, timer: Any) -> None:
        self.holders, self.partials, self.exchange, self.upper = list(holders), partials, exchange, upper
        self.dense, self.model, self.timer = dense, model, timer

    # -- parameter-free (the pipeline may run it in the background) ----------------------------------
    def prepare(self, batch: Any, step: int, *, train: bool = True) -> Work:
        """The lookup of every holder and the exchange's routing (untimed: it may run on the
        background thread; the pipeline times it where it runs in the step)."""
        lookups = [h.prepare(batch, train=train, step=step) for h in self.holders]
        route = self.exchange.route(batch, lookups[0]) if self.exchange else None
        return Work(batch, step, train, lookups, route)

    # -- reads values ---------------------------------------------------------------------------------
    def gather(self, work: Work, pending: SparseUpdate | None = None) -> None:
        """Every holder's pooled blocks (after ``pending``, the previous step's fusable sparse update,
        in the same pass), then the exchange's values. A training step first catches its rows up."""
        phase = self.timer if work.train else untimed
        catch_up_to = work.step if work.train else None
        for j, (holder, lookup) in enumerate(zip(self.holders, work.lookups)):
            if pending is not None:
                _, before, grads = pending.parts[j]
                with phase("update"):
                    work.pooled.append(holder.gather(lookup, catch_up_to=catch_up_to,
                                                     pending=(before, grads, pending.step, pending.rate)))
            else:
                with phase("lookup"):
                    work.pooled.append(holder.gather(lookup, catch_up_to=catch_up_to))
        if self.exchange is not None:
            with phase("exchange_gather"):  # the owner's values of its distinct ids (per id: a table pass)
                self.exchange.gather(work)

    # -- TF and collectives ---------------------------------------------------------------------------
    def compute(self, work: Work, rates: StepRates) -> StepResult:
        """The transports' forward, the upper network, the transports' backward: the step's updates."""
        grads = self.upper.train(work, self)
        dense = DenseUpdate(self.dense, grads.fields, grads.top, rates.dense)
        return StepResult(grads.loss, dense, self.sparse_update(work, grads, rates.sparse))

    def sparse_update(self, work: Work, grads: Gradients, rate: float) -> SparseUpdate:
        """The holders' parts; with an exchange, a block both a split and an exchanged operator read
        is updated ONCE on the real batch joined to the exchange's synthetic one."""
        whole, lookup = self.holders[0], work.lookups[0]
        shares = [(h, lk, g) for h, lk, g in zip(self.holders[1:], work.lookups[1:], [grads.shares])]
        if self.exchange is None:
            return SparseUpdate([(whole, lookup, grads.pooled), *shares], work.step, rate, fusable=True)
        from des.strategies.exchange import join_samples

        form, joined = self.partials.form, None
        split = dict(zip(form.split_blocks, grads.pooled))
        exchanged = dict(zip(form.exchange_blocks, grads.exchanged))
        if self.exchange.by_rows:  # both on the real batch: a block two operators read, its gradients summed
            both = {k: [g for g in (split.get(b.name), exchanged.get(b.name)) if g is not None]
                    for k, b in enumerate(self.model.blocks())}
            summed = {k: g[0] if len(g) == 1 else g[0] + g[1] for k, g in both.items() if g}
            return SparseUpdate([(whole, lookup, summed), *shares], work.step, rate, fusable=True)
        # per batch the whole holder's update runs on (the real one, the exchange's synthetic one,
        # or both joined), its blocks' gradients: one pass over the fields per batch
        synthetic, by_batch = work.route.synthetic, {"joined": {}, "real": {}, "synthetic": {}}
        for k, block in enumerate(self.model.blocks()):
            if block.name in split and block.name in exchanged:
                by_batch["joined"][k] = np.concatenate([split[block.name], exchanged[block.name]], axis=0)
            elif block.name in split:
                by_batch["real"][k] = split[block.name]
            elif block.name in exchanged:
                by_batch["synthetic"][k] = exchanged[block.name]
        if by_batch["joined"]:
            joined = join_samples(lookup, synthetic)
        batches = {"joined": joined, "real": lookup, "synthetic": synthetic}
        parts = [(whole, batches[name], grads) for name, grads in by_batch.items() if grads]
        # one batch: the update may run in the next step's gather pass (the whole holder's first)
        return SparseUpdate([*parts, *shares], work.step, rate, fusable=len(parts) == 1)

    def predict(self, work: Work) -> np.ndarray:
        return self.upper.predict(work, self)

    # -- pieces the upper networks share --------------------------------------------------------------
    def top_weights(self) -> list[Any]:
        """The top network's weights (and the dense features'), as TF tensors over their memory."""
        return self.dense.as_tensors(self.dense.top_params.values())

    def labels(self, work: Work, lo: int = 0, hi: int | None = None) -> np.ndarray:
        return np.asarray(work.batch.labels, dtype=self.dense.dtype)[lo:hi]

    def exchanged_inputs(self, work: Work) -> tuple[list, list]:
        """The row owner's pooled exchanged blocks and the exchanged operators' field weights."""
        if self.exchange is None:
            return [], [self.dense.field_params[n] for n in self.partials.form.exchange_params]
        return self.exchange.forward(work), self.exchange.params()

    def field_gradients(self, split: list, exchanged: list, shares: list) -> list[np.ndarray]:
        """The field weights' gradients in :attr:`DenseParams.field_params` order: a split operator's
        slices of this rank's fields, then (``shares``) of the fields split by key."""
        form = self.partials.form
        if form.split_fields:
            split = [np.concatenate([own, rest]) for own, rest in zip(split, shares)]
        by_name = dict(zip(form.split_params, split))
        by_name.update(zip(form.exchange_params, exchanged))
        return [by_name[name] for name in self.dense.field_params]


# ---------------------------------------------------------------------------------------------- upper networks
class OneRank:
    """One rank, every operator split: the row block is the batch and nothing is reduced, so the
    partials, the top network and the local backward run as ONE TF call (phase ``fused_step``)."""

    name = "one-rank"

    def __init__(self, form: Any) -> None:
        self.form = form

    def train(self, work: Work, step: DESStep) -> Gradients:
        with step.timer("fused_step"):
            loss, pooled_grads, field_grads, top_grads = self.form.train_whole(
                work.pooled[0], step.partials.params(), step.top_weights(), step.labels(work), work.rows,
                self.form.dense_rows(work.batch))
            return Gradients(float(loss), _arrays(pooled_grads), [], [], _arrays(field_grads), _arrays(top_grads))

    def predict(self, work: Work, step: DESStep) -> np.ndarray:
        buffer = step.partials.forward(work)
        return self.form.top_predict(buffer, [], [], step.partials.params(), step.top_weights(),
                                     self.form.dense_rows(work.batch)).numpy()


class Replicated(OneRank):
    """The paper's step: ONE AllReduce of the partials, the top network on the whole batch on every
    rank (its gradients are the same everywhere: nothing else travels)."""

    name = "replicated"

    def __init__(self, form: Any, comm: Any) -> None:
        super().__init__(form)
        self.comm = comm

    def train(self, work: Work, step: DESStep) -> Gradients:
        form, timer = self.form, step.timer
        with timer("partials"):
            buffer = step.partials.forward(work, copy=self.comm.size > 1)
        with timer("allreduce"):
            self.comm.allreduce_sum_(buffer, "forward_partials")
        with timer("top"):
            loss, buffer_grad, _, _, sparam_grads, top_grads = form.top_train(
                buffer, [], [], step.partials.params(), step.labels(work), step.top_weights(), work.rows,
                form.dense_rows(work.batch))
        with timer("local_backward"):
            pooled_grads, field_grads, share_grads = step.partials.backward(work, buffer_grad)
        return Gradients(float(loss), pooled_grads, share_grads, [],
                         step.field_gradients(field_grads, [], _arrays(sparam_grads)), _arrays(top_grads))

    def predict(self, work: Work, step: DESStep) -> np.ndarray:
        buffer = step.partials.forward(work, copy=self.comm.size > 1)
        self.comm.allreduce_sum_(buffer, "eval_partials")
        return self.form.top_predict(buffer, [], [], step.partials.params(), step.top_weights(),
                                     self.form.dense_rows(work.batch)).numpy()


class DataParallel:
    """The upper network on this rank's row block: the partials reduce-scattered by rows (and the
    exchanged operators' inputs sent to the row owners), ``combine`` + the top network on ``B/N``
    rows, its gradients summed by the top reduction while ``G`` is all-gathered and sent back
    through ``local``."""

    name = "data-parallel"

    def __init__(self, form: Any, comm: Any, reduction: TopReduction) -> None:
        self.form, self.comm, self.reduction = form, comm, reduction

    def _rows(self, work: Work, buffer: np.ndarray, site: str) -> tuple[np.ndarray, int, int]:
        lo, hi = self.comm.row_bounds(work.rows)[self.comm.rank : self.comm.rank + 2]
        rows = (self.comm.reduce_scatter_rows_sum(buffer, site) if self.form.width
                else np.zeros((hi - lo, 0), dtype=buffer.dtype))
        return rows, lo, hi

    def train(self, work: Work, step: DESStep) -> Gradients:
        form, comm, timer = self.form, self.comm, step.timer
        with timer("partials"):
            buffer = step.partials.forward(work)
        xpooled, xparams = step.exchanged_inputs(work)
        with timer("reduce_scatter"):
            rows, lo, hi = self._rows(work, buffer, "partials_reduce_scatter")
        with timer("top"):
            rows_grad, xpooled_grads, packed = form.top_train_packed(
                rows, xpooled, xparams, step.partials.params(), step.labels(work, lo, hi), step.top_weights(),
                work.rows, form.dense_rows(work.batch, lo, hi))
            # this rank's loss share and dense gradients, summed over the ranks while G travels (a
            # copy: the reduction writes into it, and TF's buffers are never written to)
            packed = np.array(to_numpy(packed), dtype=step.dense.dtype)
        with timer("allreduce"):
            pending = self.reduction.start(packed, work.rows)
        exchanged = step.exchange.backward(work, xpooled_grads) if step.exchange else []
        buffer_grad = None
        if form.width:
            with timer("allgather"):
                # read in place: local_backward is done with it before the next step's all-gather
                buffer_grad = comm.allgather_rows(to_numpy(rows_grad), work.rows, "gradient_allgather", transient=True)
        with timer("local_backward"):
            pooled_grads, field_grads, share_grads = step.partials.backward(work, buffer_grad)
        with timer("allreduce"):
            pending.wait()
            loss, xparam_grads, sparam_grads, top_grads = self._unpack(packed, step)
        return Gradients(loss, pooled_grads, share_grads, exchanged,
                         step.field_gradients(field_grads, xparam_grads, sparam_grads), top_grads)

    def _unpack(self, packed: np.ndarray, step: DESStep) -> tuple[float, list, list, list]:
        """The summed loss, the gradients of the exchanged field weights, of the split fields' slices
        and of the top network, from the reduction's buffer."""
        form, dense, offset = self.form, step.dense, 1
        shapes = [dense.field_params[name].shape for name in form.exchange_params]
        if form.split_fields:
            shapes += [(len(form.split_fields), *dense.field_params[name].shape[1:]) for name in form.split_params]
        out = []
        for shape in shapes:
            out.append(packed[offset : offset + int(np.prod(shape))].reshape(shape))
            offset += out[-1].size
        exchanged = len(form.exchange_params)
        return float(packed[0]), out[:exchanged], out[exchanged:], dense.split_top(packed[offset:])

    def predict(self, work: Work, step: DESStep) -> np.ndarray:
        buffer = step.partials.forward(work)
        xpooled, xparams = step.exchanged_inputs(work)
        rows, lo, hi = self._rows(work, buffer, "eval_partials")
        p = np.ascontiguousarray(self.form.top_predict(rows, xpooled, xparams, step.partials.params(),
                                                       step.top_weights(), self.form.dense_rows(work.batch, lo, hi)
                                                       ).numpy(), dtype=step.dense.dtype)
        return self.comm.allgather_rows(p, work.rows, "eval_predictions")


def upper_network(name: str, form: Any, comm: Any, reduction: TopReduction) -> Any:
    """The upper-network object of :meth:`Plan.upper_for`'s name."""
    if name == "one-rank":
        return OneRank(form)
    if name == "replicated":
        return Replicated(form, comm)
    return DataParallel(form, comm, reduction)


def _arrays(tensors: Any) -> list[np.ndarray]:
    return [to_numpy(t) for t in tensors]

