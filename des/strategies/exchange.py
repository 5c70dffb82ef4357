"""The planner's **exchange** mode inside the hybrid DES step (``des/planner.py`` has the
cost model): the pooled inputs of the exchanged operators travel to the row owners per distinct id,
instead of their partial sums travelling as ``[B, w]`` columns.

Every rank reads its own fields of the whole global batch and every field of its row block (the
reader's ``block``), so both sides of the exchange know, without asking, which ids row block ``q``
uses in field ``f``: the distinct keys of the field in those rows
in order of first occurrence (:func:`distinct_in_segments`), ``U_{q,f}`` of them. Hence no keys and
no counts travel, only values:

* forward: owner ``o`` gathers the values of its fields' distinct ids per row block (one fused
  gather of a *synthetic batch* whose samples are those ids, :func:`distinct_ids`) and sends row
  block ``q``'s to rank ``q`` (one Alltoallv for every exchanged block, side by side); rank ``q``
  pools them per sample with its rows' ids (``des.hashtable.pooling.pool_fields``);
* backward: rank ``q`` sums the pooled gradients per distinct id (its adjoint) and
  sends them back (one Alltoallv); the owner scatters them onto its synthetic batch and the sparse
  optimizer runs ONCE per row on that batch joined to the real one (:func:`join_samples`), so a
  row that a split operator also reads gets the sum of both gradients in one optimizer step.
  Every block updated on one batch goes in one pass; where the whole update is on one batch (every
  operator exchanged, say), the pipelined step runs it in the next step's gather pass
  (``DESStep.sparse_update``: fusable).

The owner's key -> row lookup (inserts, admission counts) is the DES lookup of the whole batch, so
admission, initial values and the set of updated rows are the same in every plan and on every N.

:class:`RowExchange` (``--exchange-by rows``) moves the same operators' inputs pooled instead, one
value per row and field: fewer bytes where rows hold more ids than a row block repeats (multi-hot
fields), and no per-id work beyond the partials plan's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from des.hashtable.distinct import distinct_in_segments
from des.hashtable.fused import Touched
from des.hashtable.pooling import FieldIds, one_hot_fields, pool_fields
from des.strategies.components import FieldShard
from des.zero_copy import aligned_empty


@dataclass
class Route:
    """One batch's exchange, both sides (this rank as owner of its fields and as row owner)."""

    synthetic: Touched  # the owner's distinct ids of every row block, one per sample
    send_samples: np.ndarray  # int64 [n]: sample of the synthetic batch of each value sent, in send order
    send_fields: np.ndarray  # int64 [n]: its field position in the shard
    send_counts: np.ndarray  # int64 [N]: values sent to each row owner
    recv_counts: np.ndarray  # int64 [N]: values received from each owner
    rows: int  # b_r: this rank's rows
    ids: tuple  # FieldIds (as pool_fields takes them): the row owner's ids, every field (receive order) of its rows


def distinct_ids(touched: Touched, bounds: Sequence[int]) -> tuple[Touched, np.ndarray]:
    """The distinct ids of every field (shard order) in every row block ``[bounds[q], bounds[q+1])``
    as a batch of one id per sample: field j's ids are its first ``Σ_q U_{q,j}`` samples, row block
    after row block, in order of first occurrence within a block; the other samples are empty.
    Rows and admission are those of the first occurrence in ``touched``. Returns it and ``U[j, q]``."""
    fields, blocks = len(touched.key_offsets) - 1, len(bounds) - 1
    edges = touched.key_offsets[:-1, None] + touched.offsets[:, np.asarray(bounds)]  # [F, N + 1]
    _, take, counts = distinct_in_segments(touched.keys, edges[:, :-1].reshape(-1), edges[:, 1:].reshape(-1))
    counts = counts.reshape(fields, blocks)
    sizes = counts.sum(axis=1)
    samples = int(sizes.max()) if fields else 0
    key_offsets = np.zeros(fields + 1, dtype=np.int64)
    np.cumsum(sizes, out=key_offsets[1:])
    offsets = np.minimum(np.arange(samples + 1, dtype=np.int64)[None, :], sizes[:, None])
    synthetic = Touched(keys=touched.keys[take], key_offsets=key_offsets, offsets=offsets,
                        weights=np.zeros(0, np.float64), weighted=np.zeros(fields, np.bool_), rows=touched.rows[take],
                        admitted=touched.admitted[take], train=touched.train, step=touched.step)
    return synthetic, counts


def join_samples(a: Touched, b: Touched) -> Touched:
    """The batch of ``a``'s samples followed by ``b``'s (same fields): one optimizer step per row
    for the gradients of both."""
    fields = len(a.key_offsets) - 1
    na, nb = np.diff(a.key_offsets), np.diff(b.key_offsets)
    key_offsets = np.zeros(fields + 1, dtype=np.int64)
    np.cumsum(na + nb, out=key_offsets[1:])
    order = np.concatenate([np.concatenate([np.arange(a.key_offsets[j], a.key_offsets[j + 1]),
                                            a.keys.size + np.arange(b.key_offsets[j], b.key_offsets[j + 1])])
                            for j in range(fields)]) if fields else np.zeros(0, np.int64)
    weighted = a.weighted | b.weighted
    weights = np.zeros(0, np.float64)
    if weighted.any():
        wa = a.weights if a.weighted.any() else np.ones(a.keys.size)
        wb = b.weights if b.weighted.any() else np.ones(b.keys.size)
        weights = np.concatenate([wa, wb])[order]
    offsets = np.concatenate([a.offsets, b.offsets[:, 1:] + na[:, None]], axis=1)
    return Touched(keys=np.concatenate([a.keys, b.keys])[order], key_offsets=key_offsets, offsets=offsets,
                   weights=weights, weighted=weighted, rows=np.concatenate([a.rows, b.rows])[order],
                   admitted=np.concatenate([a.admitted, b.admitted])[order], train=a.train, step=a.step)


class BlockExchange:
    """Moves the exchanged blocks' values between field owners and row owners (module docstring).

    ``blocks``: the model's blocks in table order; ``exchanged``: the names of those that travel;
    ``placement``: the fields each rank holds whole (``num_fields``: the model's, when it leaves some out).
    """

    def __init__(self, shard: FieldShard, comm: Any, placement: Sequence[Sequence[int]], blocks: Sequence[Any],
                 exchanged: Sequence[str], dtype: np.dtype, num_fields: int | None = None) -> None:
        self.shard, self.comm = shard, comm
        self.dtype = np.dtype(dtype)
        self.block_index = [k for k, b in enumerate(blocks) if b.name in exchanged]
        self.dims = [blocks[k].dim for k in self.block_index]
        self.width = int(sum(self.dims))  # the exchanged blocks of an id, side by side
        held = sum(len(p) for p in placement)
        #: the model's fields: those the placement leaves out (split by key) travel in the partials' sum
        self.num_fields = held if num_fields is None else int(num_fields)
        self._all_held = held == self.num_fields
        #: fields in the order their values arrive: by owner rank, each owner's in shard order
        self.receive_order = np.array([f for fields in placement for f in sorted(fields)], dtype=np.int64)
        self._owner_of = np.array([r for r, fields in enumerate(placement) for _ in fields], dtype=np.int64)

    # -------------------------------------------------------------------------------- routing
    def route(self, batch: Any, touched: Touched) -> Route:
        """Parameter-free: who sends what for ``batch`` (``touched``: this rank's lookup of it).
        It may run on the background thread with the lookup (``Strategy.prepare``)."""
        comm = self.comm
        bounds = comm.row_bounds(len(batch.labels))
        synthetic, counts = distinct_ids(touched, bounds)  # counts [F_i, N]
        # send order: row block q, then field j, then distinct id (field j's samples run block by block)
        start = np.cumsum(counts, axis=1) - counts  # [F_i, N]: field j's first sample of block q
        send_counts = counts.sum(axis=0)
        n = int(send_counts.sum())
        send_fields = np.repeat(np.tile(np.arange(counts.shape[0]), comm.size), counts.T.reshape(-1))
        first_of_run = np.repeat((start.T.reshape(-1)), counts.T.reshape(-1))
        run_begin = np.repeat(np.cumsum(counts.T.reshape(-1)) - counts.T.reshape(-1), counts.T.reshape(-1))
        send_samples = first_of_run + (np.arange(n) - run_begin)
        # the row owner's side: every field's ids of its rows
        lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
        # keyed-jagged: every field's ids of its rows (cut to the rows first: the reordering copies only them)
        mine = batch.ids_of_rows(self.receive_order, lo, hi)
        keys, offsets, weighted = mine.keys, mine.offsets, mine.weighted
        id_start, sizes = mine.key_offsets[:-1], np.diff(mine.key_offsets)
        weights = np.asarray(mine.weights, np.float64) if weighted.any() else np.zeros(0, np.float64)
        inverse, _, distinct = distinct_in_segments(keys, id_start, id_start + sizes)
        base = np.cumsum(distinct) - distinct
        recv_counts = np.zeros(comm.size, dtype=np.int64)
        np.add.at(recv_counts, self._owner_of, distinct)
        ids = tuple(FieldIds(inverse, base, id_start, offsets, weights, weighted, one_hot_fields(offsets, weighted)))
        return Route(synthetic, send_samples.astype(np.int64), send_fields.astype(np.int64), send_counts.astype(np.int64),
                     recv_counts, hi - lo, ids)

    # -------------------------------------------------------------------------------- forward
    def gather(self, route: Route) -> np.ndarray:
        """Owner, local: the values of its fields' distinct ids, in send order, every exchanged
        block side by side ``[n, Σ dim]`` (as they are now: after the previous step's update)."""
        parts = []
        for k, d in zip(self.block_index, self.dims):
            out = np.empty((route.synthetic.keys.shape[0], d), dtype=self.dtype)
            self.shard.gather_ids(route.synthetic, k, out)
            parts.append(out)
        values = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        return values[route.synthetic.key_offsets[route.send_fields] + route.send_samples]

    def send_values(self, route: Route, values: np.ndarray, *, train: bool) -> np.ndarray:
        """The values' Alltoallv: what this rank's rows need, by owner, field and distinct id."""
        got, _ = self.comm.alltoallv(values, route.send_counts, ("" if train else "eval_") + "exchange_values",
                                     recv_counts=route.recv_counts)
        return got

    def pool(self, route: Route, got: np.ndarray) -> np.ndarray:
        """Row owner, local: the exchanged blocks pooled for its rows, side by side ``[b_r, F, Σ dim]``
        (the packed inputs of ``ModelSplitForm.exchanged_blocks``)."""
        # every held field is written; a split field's values come from the partials' sum (zeros here)
        out = _packed_inputs(route.rows, self.num_fields, self.width, self.dtype, self._all_held)
        pool_fields(out, np.ascontiguousarray(got), route.ids, self.receive_order, False)
        return out

    # -------------------------------------------------------------------------------- backward
    def sum_gradients(self, route: Route, pooled_grads: np.ndarray) -> np.ndarray:
        """Row owner, local: the gradient of every distinct id it received, summed over its rows,
        from the gradients of its packed inputs ``[b_r, F, Σ dim]`` (one pass over the ids)."""
        out = np.zeros((int(route.recv_counts.sum()), self.width), dtype=self.dtype)
        pool_fields(np.ascontiguousarray(pooled_grads, dtype=self.dtype), out, route.ids, self.receive_order, True)
        return out

    def send_gradients(self, route: Route, grads: np.ndarray) -> np.ndarray:
        """The gradients' Alltoallv, back along the values' way."""
        got, _ = self.comm.alltoallv(grads, route.recv_counts, "exchange_gradients", recv_counts=route.send_counts)
        return got

    def scatter_gradients(self, route: Route, got: np.ndarray) -> list[np.ndarray]:
        """Owner, local: per exchanged block, the gradients ``[samples, F_i, dim]`` of its synthetic
        batch (what the sparse optimizer applies)."""
        out, column = [], 0
        for d in self.dims:
            g = np.zeros((route.synthetic.size, len(self.shard.fields), d), dtype=self.dtype)
            g[route.send_samples, route.send_fields] = got[:, column : column + d]
            out.append(g)
            column += d
        return out


@dataclass
class RowRoute:
    """One batch's pooled exchange (``--exchange-by rows``): how many ``Σ dim``-wide rows go each way."""

    rows: int  # b_r: this rank's rows
    send_counts: np.ndarray  # int64 [N]: b_q · |F_i| pooled (row, field) values to row owner q
    recv_counts: np.ndarray  # int64 [N]: b_r · |F_o| from owner o
    batch: int  # B: the global batch's rows


class RowExchange:
    """``--exchange-by rows``: the exchanged blocks travel pooled, one value per (row, field), as in
    TorchRec's and HugeCTR's pooled all-to-all, instead of per distinct id (:class:`BlockExchange`).

    * forward: owner ``o`` pools its fields' ids over the whole batch, as for the partials (the
      whole holder's gather, fused with the previous step's update), and sends row block ``q``'s
      ``[b_q, F_o, Σ dim]`` to rank ``q`` (one Alltoallv); rank ``q`` places them in its
      ``[b_q, F, dim]`` inputs (a field split by key: zeros, its values come in the partials' sum);
    * backward: rank ``q`` sends each owner its fields' columns of the pooled gradients (one
      Alltoallv); the owner's gradients of the whole batch, ``[B, F_o, dim]``, are the partials
      plan's, applied on the real batch by the same fused update (a block a split operator also
      reads: the two gradients summed first).

    What a rank sends is ``(B - b_r) · |F_r| · Σ dim`` floats each way, where the partials send
    ``(B - b_r) · w`` (the operators' widths, the first FC layer's ``H``): with ``N`` ranks ``|F_r|`` is
    about ``F/N``, so its bytes fall as ``1/N`` where the partials' do not; the per-id exchange sends
    each row block's distinct ids, fewer than its rows only where an id repeats in a block (one-hot
    fields with heavy hitters). No keys and no counts travel. Both sides run the arithmetic of the
    other plans on the same values (the owner's pooling is the partials plan's, the row owner's
    operators the exchange's), so ``des.check`` holds as for them.
    """

    def __init__(self, comm: Any, placement: Sequence[Sequence[int]], blocks: Sequence[Any], exchanged: Sequence[str],
                 dtype: np.dtype, num_fields: int | None = None) -> None:
        self.comm, self.dtype = comm, np.dtype(dtype)
        self.dims = [b.dim for b in blocks if b.name in exchanged]
        self.width = int(sum(self.dims))
        self.owned = [sorted(int(f) for f in fields) for fields in placement]  # each owner's fields, shard order
        held = sum(len(fields) for fields in placement)
        self.num_fields = held if num_fields is None else int(num_fields)
        self._all_held = held == self.num_fields
        self._counts = np.array([len(fields) for fields in self.owned], dtype=np.int64)

    def route(self, batch: Any, touched: Any = None) -> RowRoute:
        """Parameter-free: the row blocks' sizes times the fields each side holds."""
        comm = self.comm
        sizes = np.diff(np.asarray(comm.row_bounds(len(batch.labels)), dtype=np.int64))
        rows = int(sizes[comm.rank])
        return RowRoute(rows, sizes * self._counts[comm.rank], rows * self._counts, int(sizes.sum()))

    def send_values(self, route: RowRoute, pooled: Sequence[np.ndarray], *, train: bool) -> np.ndarray:
        """The owner's pooled exchanged blocks ``[B, F_o, dim]`` by row block (rows are row-major, so
        a row block's values are contiguous once the blocks sit side by side)."""
        values = np.concatenate(pooled, axis=2) if len(pooled) > 1 else np.asarray(pooled[0])
        got, _ = self.comm.alltoallv(values.reshape(-1, self.width), route.send_counts,
                                     ("" if train else "eval_") + "exchange_values", recv_counts=route.recv_counts)
        return got

    def pool(self, route: RowRoute, got: np.ndarray) -> np.ndarray:
        """Row owner: the exchanged blocks of its rows side by side ``[b_r, F, Σ dim]`` (every
        owner's fields in place)."""
        out = _packed_inputs(route.rows, self.num_fields, self.width, self.dtype, self._all_held)
        start = 0
        for fields in self.owned:
            size = route.rows * len(fields)
            out[:, fields] = got[start : start + size].reshape(route.rows, len(fields), self.width)
            start += size
        return out

    def sum_gradients(self, route: RowRoute, pooled_grads: np.ndarray) -> np.ndarray:
        """Row owner: its rows' gradients of every owner's fields (from those of its packed inputs
        ``[b_r, F, Σ dim]``), owner after owner ``[Σ_o b_r·|F_o|, Σ dim]``."""
        joined = np.asarray(pooled_grads, dtype=self.dtype)
        return np.concatenate([joined[:, fields].reshape(-1, self.width) for fields in self.owned])

    def send_gradients(self, route: RowRoute, grads: np.ndarray) -> np.ndarray:
        """The gradients' Alltoallv, back along the values' way."""
        got, _ = self.comm.alltoallv(grads, route.recv_counts, "exchange_gradients", recv_counts=route.send_counts)
        return got

    def scatter_gradients(self, route: RowRoute, got: np.ndarray) -> list[np.ndarray]:
        """Owner: per exchanged block, the gradients ``[B, F_o, dim]`` of the whole batch (row blocks
        arrive in rank order: the batch's rows in order)."""
        grads = got.reshape(route.batch, int(self._counts[self.comm.rank]), self.width)  # a rank may hold none
        return [np.ascontiguousarray(g) for g in _by_dims(grads, self.dims)]


def _packed_inputs(rows: int, fields: int, width: int, dtype: np.dtype, every_field_written: bool) -> np.ndarray:
    """A row owner's ``[rows, fields, width]`` exchanged inputs, aligned for TF to take without a copy
    (zeros where some field is not written: a field split by key)."""
    out = aligned_empty((rows, fields, width), dtype)
    if not every_field_written:
        out.fill(0)
    return out


def _by_dims(values: np.ndarray, dims: Sequence[int]) -> list[np.ndarray]:
    """``[..., Σ dim]`` cut into one view per block."""
    if len(dims) == 1:
        return [values]
    cuts = np.cumsum([0, *dims])
    return [values[..., a:b] for a, b in zip(cuts[:-1], cuts[1:])]
