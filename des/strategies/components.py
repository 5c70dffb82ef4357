"""The pieces strategies are assembled from (composition, not inheritance):

* :class:`FieldShard` -- one rank's tables (its fields): a batch's lookup (``touch``), then gather +
  pooling (fused kernels over all its fields), serving rows by key, and the sparse optimizers on
  the touched rows;
* :class:`RowLayout` -- all value blocks of a row side by side (``[u, Σ dim]``), for strategies that
  move rows: pooling fetched rows per sample and summing row gradients per unique id (with
  ``des.hashtable.pooling``);
* :class:`DenseParams` -- the field slices of substituted weights (a rank's own fields, or all of
  them where a strategy replicates them) and the top network, their dense optimizers, ``l2_dense``
  added exactly once, flattening for transport and a checksum.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from des.hashtable import BlockSpec, DenseOptimizerState, EmbeddingTable, Initializer
from des.hashtable.fused import ShardTables, Touched
from des.hashtable.pooling import pool, unpool
from des.models.base import EmbeddingBlock, Model
from des.options import Optimizers, TableOptions
from des.placement import keep_share
from des.strategies.table_groups import TableGroups
from des.substitutions.base import draw_param
from des.zero_copy import aligned_copy, aligned_empty, to_tensor


class FieldShard:
    """The hash tables of the fields one rank owns, one value block per model block.

    A DES step drives all the fields at once through fused kernels (``des/hashtable/fused.py``,
    ``ShardTables``, whose face this is, on a batch and the model's blocks): :meth:`touch` (key ->
    row of every field, inserts, admission counts), :meth:`gather_pooled` (values gathered and
    pooled into ``[B, F_i, dim]``, every block in one call) and :meth:`apply_pooled` (un-pooling,
    duplicate sums, the sparse optimizers). The tables stay one per field (``tables``),
    checkpointed and re-sharded by field; fields sharing a table (``TableGroups``) use their
    owner's, driven as one field of their rows one after another, in one call per table.
    """

    def __init__(self, fields: Sequence[int], blocks: Sequence[EmbeddingBlock], optimizers: Optimizers, *,
                 seed: int, dtype: np.dtype, tables: TableOptions | None = None,
                 shares: Mapping[int, tuple[int, int]] | None = None) -> None:
        tables = tables or TableOptions()
        missing = [b.name for b in blocks if b.name not in optimizers.sparse]
        if missing:
            raise ValueError(f"no sparse optimizer for block(s) {missing}")
        self.fields = sorted(int(f) for f in fields)
        self.blocks = list(blocks)
        self.rates = optimizers.rates  # the schedule's factor of the next step (set by the runner)
        self.dtype = np.dtype(dtype)
        #: fields split by key (``des/placement.py``): field -> (this shard's share, group size); a
        #: batch's ids of such a field outside the share are not looked up (another rank holds them)
        self.shares = {int(f): (int(s), int(n)) for f, (s, n) in (shares or {}).items()}
        specs = [BlockSpec(b.name, b.dim, optimizers.sparse[b.name], Initializer(b.init, b.scale)) for b in blocks]
        #: fields sharing a table (``table_groups.py``): a group's table is its owner's, the only one held
        self.groups = TableGroups(self.fields, tables.shared_map())
        if self.groups and self.shares:
            raise ValueError("fields that share a table are never split by key")
        table_fields = self.groups.main_fields + self.groups.owners
        #: the tables, by the field that owns each (a field sharing another's table has none here)
        self.tables: dict[int, EmbeddingTable] = {
            f: EmbeddingTable(f, specs, seed=seed, dtype=self.dtype, capacity=capacity, rows=rows,
                              min_count=tables.min_count, unadmitted=tables.unadmitted, table_dtype=tables.table_dtype,
                              counters=tables.counters)
            for f, (capacity, rows) in ((f, tables.initial_size(f, self.shares.get(f, (0, 1))[1]))
                                        for f in sorted(table_fields))
        }
        # reads self.tables at every call: a checkpoint load replaces tables in that dict
        names = [b.name for b in self.blocks]
        self._fused = None if self.groups else ShardTables(self.tables, self.fields, names)
        #: with shared tables, the kernels of each part (``TableGroups.parts``): one call each
        self._parts = [ShardTables(self.tables, fields, names) for fields in self.groups.part_fields]

    # -- the owner's side of a batch (DES: every rank pools its own fields of the whole batch) --------------
    def touch(self, batch: Any, *, train: bool, step: int) -> Touched:
        """Rows of this shard's ids in ``batch`` (all fields, one kernel call): with ``train``,
        missing keys are inserted with their initial values, counts and ``last_seen`` updated and
        admission decided; else read-only (unknown ids: row -1). Reads no embedding value.

        Thread safety: the kernels release the GIL, so the lookup of step t+1 may run on another
        thread while TensorFlow computes step t, and while :meth:`gather_pooled` of step t has
        returned. It must NOT run concurrently with :meth:`apply_pooled` (or :meth:`gather_pooled`,
        :meth:`apply_then_gather`, or anything else) on this shard: a table may grow, rehash or
        move its arrays during a lookup. Between a lookup and the gather/update of its result no
        eviction or checkpoint load may happen (rows would move). The kernels use the calling
        thread's numba thread count (``numba.set_num_threads``); the results do not depend on it.
        """
        ids = self._ids(batch)
        if self.groups:
            return self.groups.compose([shard.touch(part, train=train, step=step)
                                        for shard, part in zip(self._parts, self.groups.ids(ids))])
        touched = self._fused.touch(ids, train=train, step=step)
        if not self.fields:  # a rank holding only shares of split fields: no ids, but the batch's rows
            touched = dataclasses.replace(touched, offsets=np.zeros((0, len(batch.labels) + 1), np.int64))
        return touched

    def _ids(self, batch: Any) -> Any:
        """This shard's fields of the batch's keyed ids (a field split by key: its share's ids)."""
        ids = batch.fields.select(self.fields)
        if not self.shares:
            return ids
        from des.data.batch import KeyedIds

        return KeyedIds.of(self.fields, [ids[f] if f not in self.shares else keep_share(ids[f], *self.shares[f])
                                         for f in self.fields])

    def gather_pooled(self, touched: Touched, blocks: Sequence[str] | None = None, *,
                      catch_up_to: int | None = None) -> list[np.ndarray]:
        """Per block (of ``blocks``, default all), the pooled embeddings ``[B, F_i, dim]`` of the ids
        ``touched`` (from :meth:`touch`), with the values as they are now: run it after the
        previous step's :meth:`apply_pooled`. ``catch_up_to``: the rows first take the optimizer
        steps they skipped up to that step (Adam's catch-up, every block), in the same pass over
        the fields."""
        outs = self._pooled_outs(touched, blocks)
        if not self.groups:
            self._fused.gather_pooled(touched, outs, catch_up_to, self.rates.sparse)
            return list(outs.values())
        touched_parts = self.groups.split(touched)
        parts = self._part_outs(touched_parts, blocks)
        for shard, t, part in zip(self._parts, touched_parts, parts):
            shard.gather_pooled(t, part, catch_up_to, self.rates.sparse)
        return self._joined(outs, parts)

    def gather_ids(self, touched: Touched, block: int, out: np.ndarray) -> None:
        """Block ``block``'s values of every id of ``touched``, not pooled, into ``out [nnz, dim]``."""
        if not self.groups:
            self._fused.gather_ids(touched, block, out)
            return
        touched_parts = self.groups.split(touched)
        parts = [np.empty((t.keys.shape[0], out.shape[1]), out.dtype) for t in touched_parts]
        for shard, t, part in zip(self._parts, touched_parts, parts):
            shard.gather_ids(t, block, part)
        self.groups.join_ids(touched, out, parts)

    def apply_pooled(self, touched: Touched, grads: Sequence[np.ndarray] | Mapping[int, np.ndarray], step: int,
                     lr_scale: float | None = None) -> None:
        """Un-pool ``[B, F_i, dim]`` gradients to the ids and run the sparse optimizers (the
        gradients of an id that occurs several times are summed first): ``grads`` per block in the
        model's order, or ``{block position: grads}`` for some of them, all in one call.
        ``lr_scale``: the step's schedule factor (default: the current one)."""
        rate = self.rates.sparse if lr_scale is None else lr_scale
        if not self.groups:
            self._fused.apply_pooled(touched, _by_block(grads), step, rate)
            return
        for shard, t, part in zip(self._parts, self.groups.split(touched), self._split_grads(grads)):
            shard.apply_pooled(t, part, step, rate)

    def apply_then_gather(self, touched: Touched, grads: Sequence[np.ndarray], step: int, lr_scale: float,
                          following: Touched, blocks: Sequence[str] | None = None, *,
                          catch_up_to: int | None = None) -> list[np.ndarray]:
        """:meth:`apply_pooled` of step ``step`` (its schedule factor ``lr_scale``), then
        :meth:`gather_pooled` of the next batch (``following``: its lookup, done before this
        update), in one pass over the fields: the same bytes as the two calls."""
        outs = self._pooled_outs(following, blocks)
        if not self.groups:
            self._fused.apply_then_gather(touched, _by_block(grads), step, lr_scale, following, outs, catch_up_to,
                                          self.rates.sparse)
            return list(outs.values())
        following_parts = self.groups.split(following)
        parts = self._part_outs(following_parts, blocks)
        for shard, t, g, f, part in zip(self._parts, self.groups.split(touched), self._split_grads(grads),
                                        following_parts, parts):
            shard.apply_then_gather(t, g, step, lr_scale, f, part, catch_up_to, self.rates.sparse)
        return self._joined(outs, parts)

    def _pooled_outs(self, touched: Touched, blocks: Sequence[str] | None,
                     fields: int | None = None) -> dict[int, np.ndarray]:
        width = len(self.fields) if fields is None else fields
        return {k: aligned_empty((touched.size, width, b.dim), self.dtype)  # TF takes it as it is
                for k, b in enumerate(self.blocks) if blocks is None or b.name in blocks}

    # -- a shard with fields sharing tables: its parts (the main fields, then each shared table) -------------
    def _part_outs(self, parts: Sequence[Touched], blocks: Sequence[str] | None) -> list[dict[int, np.ndarray]]:
        return [self._pooled_outs(t, blocks, width) for t, width in zip(parts, self.groups.widths)]

    def _split_grads(self, grads: Sequence[np.ndarray] | Mapping[int, np.ndarray]) -> list[dict[int, np.ndarray]]:
        """Per part, its gradients by block (``TableGroups.split_pooled``)."""
        parts: list[dict[int, np.ndarray]] = [{} for _ in self._parts]
        for k, g in _by_block(grads).items():
            for part, value in zip(parts, self.groups.split_pooled(g)):
                part[k] = value
        return parts

    def _joined(self, outs: dict[int, np.ndarray], parts: Sequence[dict[int, np.ndarray]]) -> list[np.ndarray]:
        for k, out in outs.items():
            self.groups.join_pooled(out, [p[k] for p in parts])
        return list(outs.values())

    # -- serving rows by key (strategies that move rows) -------------------------------------------------
    def rows(self, field: int, keys: np.ndarray, *, insert: bool, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Table rows of ``keys`` and their values, all blocks side by side: ``[n, Σ dim]``."""
        table = self.tables[field]
        rows = table.lookup(keys, insert=insert, step=step)
        values = np.concatenate([table.gather(b.name, keys, rows) for b in self.blocks], axis=1)
        return rows, values

    def apply_row_gradients(self, field: int, rows: np.ndarray, grads: np.ndarray, step: int) -> None:
        """Sparse optimizers on ``rows`` of ``field`` with gradients ``[n, Σ dim]``."""
        column = 0
        for block in self.blocks:
            self.tables[field].apply_gradients(block.name, rows,
                                               np.ascontiguousarray(grads[:, column : column + block.dim]), step,
                                               self.rates.sparse)
            column += block.dim

    def memory(self) -> dict[str, int]:
        return {"rows": sum(len(t) for t in self.tables.values()),
                "table_bytes": sum(int(t.memory()["bytes"]) for t in self.tables.values())}


def _by_block(grads: Sequence[np.ndarray] | Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Gradients by block position: a mapping as it is, a sequence in the blocks' order."""
    items = grads.items() if isinstance(grads, Mapping) else enumerate(grads)
    return {int(k): np.asarray(g) for k, g in items}


class RowLayout:
    """All value blocks of a row side by side, as rows travel between ranks."""

    def __init__(self, blocks: Sequence[EmbeddingBlock], num_fields: int, dtype: np.dtype) -> None:
        self.blocks = list(blocks)
        self.width = int(sum(b.dim for b in blocks))
        self.num_fields = num_fields
        self.dtype = np.dtype(dtype)

    def empty_pooled(self, size: int) -> list[np.ndarray]:
        """Per block, zeros ``[size, F, dim]`` for all fields."""
        return [np.zeros((size, self.num_fields, b.dim), dtype=self.dtype) for b in self.blocks]

    def pool(self, ids: Any, field: int, unique_values: np.ndarray, inverse: np.ndarray,
             pooled: list[np.ndarray]) -> None:
        """Pool one field's rows (``unique_values [u, width]``, ``inverse``: id -> unique) per sample."""
        column = 0
        for k, block in enumerate(self.blocks):
            pool(unique_values[:, column : column + block.dim], ids.offsets, ids.weights, pooled[k][:, field, :],
                 inverse)
            column += block.dim

    def sum_gradients(self, ids: Any, field: int, inverse: np.ndarray, num_unique: int,
                      pooled_grads: Sequence[np.ndarray]) -> np.ndarray:
        """Gradient sum per unique id of one field: ``[u, width]``."""
        summed = np.zeros((num_unique, self.width), dtype=self.dtype)
        column = 0
        for k, block in enumerate(self.blocks):
            np.add.at(summed[:, column : column + block.dim], inverse,
                      unpool(pooled_grads[k][:, field, :], ids.offsets, ids.weights))
            column += block.dim
        return summed


class DenseParams:
    """Dense weights and their optimizer states.

    Field parameters of substitution ``i`` are named ``"{i}:{substitution}:{param}"`` (the checkpoint
    names) and held as ``[len(fields), *slice]`` with one optimizer state of the same shape: the
    dense optimizers are elementwise, so the whole weight is one kernel call per step and a
    checkpoint still stores (and re-shards) each field's slice of the state. Each slice is drawn
    from a generator keyed by (seed, substitution, parameter, field) and each top weight by (seed,
    model, name): never by N.

    ``fields`` are the fields whose slices this rank holds; the substitutions in ``replicated``
    (indices) hold the slices of every field instead (an operator the planner exchanges runs on
    the row owner, which needs all of them; their gradients are summed over the ranks). The fields
    in ``split`` (split by key over ranks) have their slices on every rank, after ``fields``: their
    part of an operator runs where the rows are, on the pooled values the partials' sum brings.

    The dense features' weights of substitution ``i`` (``Substitution.dense_params``, also named
    ``"{i}:{substitution}:{param}"``) are among :attr:`top_params`: the operators' dense part runs
    where the rows are, so they are replicated, trained and saved with the top network.
    """

    def __init__(self, model: Model, fields: Sequence[int], optimizers: Optimizers, *, seed: int,
                 dtype: np.dtype, replicated: Sequence[int] = (), split: Sequence[int] = ()) -> None:
        own = [int(f) for f in fields]
        every = list(range(model.num_fields))
        #: the fields split by key (``des/placement.py``): every rank holds their slices, after its own
        self.split_fields = sorted(int(f) for f in split)
        self.dtype = np.dtype(dtype)
        self.l2 = float(model.l2_dense)
        self.rates = optimizers.rates
        #: the fields this rank owns (a split operator's partials are theirs)
        self.own_fields = own
        self.field_params: dict[str, np.ndarray] = {}
        #: name -> the fields of its leading axis, in order
        self.param_fields: dict[str, list[int]] = {}
        for i, sub in enumerate(model.substitutions()):
            held = every if i in replicated else own + self.split_fields
            for pname, value in sub.init_field_params(seed, held, self.dtype).items():
                self.field_params[f"{i}:{sub.name}:{pname}"] = aligned_copy(value)  # TF reads it in place
                self.param_fields[f"{i}:{sub.name}:{pname}"] = held
        #: every field some slice is held of (a checkpoint reads their files)
        self.fields = sorted(set(own).union(*self.param_fields.values()))
        self._position = {name: {f: j for j, f in enumerate(held)} for name, held in self.param_fields.items()}
        # one state per weight, [fields, ...] like the weight: one optimizer call per weight and step
        self.field_param_states = {name: DenseOptimizerState(optimizers.dense, value.shape, self.dtype)
                                   for name, value in self.field_params.items()}
        self.top_params: dict[str, np.ndarray] = {
            name: aligned_copy(draw_param(spec, seed, model.name, "top", name).astype(self.dtype))
            for name, spec in model.top_params().items()
        }
        # the dense features' weights of substitution i ("{i}:{substitution}:{param}"): replicated with
        # the top network, as the operators' dense part runs where the rows are (Substitution.local_dense)
        dense_weights = {f"{i}:{sub.name}:{pname}": value for i, sub in enumerate(model.substitutions())
                         for pname, value in sub.init_dense_params(seed, self.dtype).items()}
        self.top_params.update((name, aligned_copy(value)) for name, value in dense_weights.items())
        self.top_states = {name: DenseOptimizerState(optimizers.dense, v.shape, self.dtype)
                           for name, v in self.top_params.items()}
        # l2_dense: the top kernels and, like every field weight, the dense features' weights
        self.regularized_top = set(model.regularized_params()) | set(dense_weights)
        self._tensors: dict[int, tuple[np.ndarray, Any]] = {}  # see as_tensors

    def as_tensors(self, weights: Any) -> list[Any]:
        """These weights (arrays of this object) as TF tensors over their memory
        (``zero_copy.to_tensor``), each made once: the optimizers and loads write the arrays in
        place, so the tensors stay current, and a step's TF call does not import them again
        (which costs more once TF has left the caches cold)."""
        out = []
        for value in weights:
            held = self._tensors.get(id(value))
            if held is None or held[0] is not value:
                held = self._tensors[id(value)] = (value, to_tensor(value))
            out.append(held[1])
        return out

    def field_state(self, name: str, field: int) -> Any:
        """The optimizer state of ``field``'s slice of field parameter ``name`` (checkpoints: per field)."""
        return self.field_param_states[name].slice(self._position[name][field])

    def index(self, name: str, field: int) -> int | None:
        """Position of ``field``'s slice in the leading axis of field parameter ``name`` (None: not held)."""
        return self._position[name].get(field)

    # -- updates -------------------------------------------------------------------------------------
    def apply(self, field_grads: Sequence[np.ndarray], top_grads: Sequence[np.ndarray],
              lr_scale: float | None = None) -> None:
        """One dense optimizer step; ``l2_dense`` (on every field weight and the top kernels) is
        added here and nowhere else. ``lr_scale``: the schedule's factor of this step (default: the
        current one; a step applied later, in the background, passes the factor of its own step)."""
        rate = self.rates.dense if lr_scale is None else lr_scale
        for (name, value), grad in zip(self.field_params.items(), field_grads):
            grad = np.asarray(grad)
            if self.l2:
                grad = grad + 2.0 * self.l2 * value
            self.field_param_states[name].apply(value, np.ascontiguousarray(grad), rate)
        for (name, value), grad in zip(self.top_params.items(), top_grads):
            grad = np.asarray(grad)
            if self.l2 and name in self.regularized_top:
                grad = grad + 2.0 * self.l2 * value
            self.top_states[name].apply(value, np.ascontiguousarray(grad), rate)

    # -- transport -----------------------------------------------------------------------------------
    def _arrays(self) -> list[np.ndarray]:
        return [*self.field_params.values(), *self.top_params.values()]

    @property
    def size(self) -> int:
        return int(sum(a.size for a in self._arrays()))

    def flat(self) -> np.ndarray:
        """Every weight, field parameters first, in one vector."""
        return np.concatenate([a.reshape(-1) for a in self._arrays()]) if self._arrays() else np.zeros(0, self.dtype)

    def set_flat(self, flat: np.ndarray) -> None:
        for value, part in zip(self._arrays(), self.split(flat)):
            value[...] = part

    def split(self, flat: np.ndarray) -> list[np.ndarray]:
        """A vector in :meth:`flat` order -> one array per weight (views)."""
        out, offset = [], 0
        for value in self._arrays():
            out.append(flat[offset : offset + value.size].reshape(value.shape))
            offset += value.size
        return out

    def split_top(self, flat: np.ndarray) -> list[np.ndarray]:
        """A vector of the top weights only (in :attr:`top_params` order) -> one array per weight."""
        out, offset = [], 0
        for value in self.top_params.values():
            out.append(flat[offset : offset + value.size].reshape(value.shape))
            offset += value.size
        return out

    def apply_flat(self, flat: np.ndarray) -> None:
        """:meth:`apply` with gradients in :meth:`flat` order."""
        parts = self.split(flat)
        self.apply(parts[: len(self.field_params)], parts[len(self.field_params):])

    # -- reporting -----------------------------------------------------------------------------------
    def top_checksum(self) -> str:
        """sha256 of the top parameters (a replicated top is equal on every rank, bit for bit)."""
        digest = hashlib.sha256()
        for name, value in self.top_params.items():
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        return digest.hexdigest()

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self._arrays()))
