"""Fields that share one table (a schema's ``table = "<column>"``: a history and its candidate).

A shared table holds its keys, rows and optimizer state once, and the placement keeps the fields
that share it on one rank (``des/placement.py``). :class:`TableGroups` is how a
:class:`~des.strategies.components.FieldShard` drives such a table with the fused kernels, which
run one field per table: a group's fields are laid one after another along the samples, ``m``
fields of ``B`` rows becoming ONE field of ``m·B`` rows of the owner's table. So a lookup inserts
and counts every id of the group in one pass, a gather pools each field's rows as before, and an
update sums the gradients of every occurrence of a row, whichever field it came from, before ONE
optimizer step: what a single table read by several fields trains (a textbook model's shared
embedding), on one rank as on N, since a group is never split.

Everything outside the shard sees one field per field (a :class:`~des.hashtable.fused.Touched`
with every field of the shard, in order): :meth:`TableGroups.compose` builds it from the parts'
lookups and :meth:`TableGroups.split` cuts any such ``Touched`` (the step's, the exchange's
synthetic or joined ones) into the parts again; gradients and pooled values are moved between
the layouts by copies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from des.hashtable.fused import Touched


def _field(t: Any, j: int) -> tuple[np.ndarray, ...]:
    """Field ``j`` of a Touched: (keys, offsets [S + 1], weights or None, rows, admitted)."""
    a, b = int(t.key_offsets[j]), int(t.key_offsets[j + 1])
    weights = t.weights[a:b] if t.weighted[j] and t.weights.size else None
    return t.keys[a:b], t.offsets[j], weights, t.rows[a:b], t.admitted[a:b]


def _samples(t: Any, i: int, rows: int) -> tuple[np.ndarray, ...]:
    """Sample block ``i`` (rows ``i·rows`` on) of a one-field Touched, as :func:`_field` gives a field."""
    offsets = t.offsets[0, i * rows:(i + 1) * rows + 1]
    a, b = int(offsets[0]), int(offsets[-1])
    weights = t.weights[a:b] if t.weighted[0] and t.weights.size else None
    return t.keys[a:b], offsets - a, weights, t.rows[a:b], t.admitted[a:b]


def _touched(parts: Sequence[tuple[np.ndarray, ...]], train: bool, step: int, *, merged: bool = False,
             looked_up: tuple | None = None) -> Touched:
    """A Touched of the fields ``parts`` (each as :func:`_field` gives it), or with ``merged`` of
    one field whose samples are theirs one after another; ``looked_up``: the parts' own lookups."""
    sizes = [int(p[0].shape[0]) for p in parts]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    weighted = np.array([p[2] is not None for p in parts], dtype=np.bool_)
    weights = (np.concatenate([np.ones(n) if p[2] is None else np.asarray(p[2], np.float64)
                               for p, n in zip(parts, sizes)]) if weighted.any() else np.ones(0))
    keys, rows, admitted = (np.concatenate([p[k] for p in parts]) for k in (0, 3, 4))
    if merged:
        offsets = np.concatenate([[0]] + [p[1][1:] + s for p, s in zip(parts, starts)]).astype(np.int64)[None, :]
        key_offsets, weighted = np.array([0, starts[-1]], np.int64), np.array([weighted.any()])
    else:
        offsets, key_offsets = np.stack([np.asarray(p[1], np.int64) for p in parts]), starts
    return Touched(keys, key_offsets, offsets, weights, weighted, rows, admitted, train, step, parts=looked_up)


class TableGroups:
    """The fields of a shard (``fields``, in order) that share a table, by ``shared`` (field ->
    the field whose table it uses; of this shard's fields, both on it): ``main`` the positions
    of the fields with a table of their own, ``groups`` per shared table its fields' positions
    (in field order) and :attr:`owners` the fields owning them."""

    def __init__(self, fields: Sequence[int], shared: Mapping[int, int]) -> None:
        position = {f: j for j, f in enumerate(fields)}
        by_owner: dict[int, list[int]] = {}
        for member, owner in sorted(shared.items()):
            if member in position or owner in position:
                if member not in position or owner not in position:
                    raise ValueError(f"fields {member} and {owner} share a table but are not on one shard")
                by_owner.setdefault(owner, [owner]).append(member)
        self.owners = sorted(by_owner)
        #: field -> the field whose table it uses, of this shard's fields
        self.shared = {f: o for o, group in by_owner.items() for f in group if f != o}
        self.groups = [sorted(position[f] for f in by_owner[o]) for o in self.owners]
        grouped = {j for g in self.groups for j in g}
        self.main = [j for j in range(len(fields)) if j not in grouped]
        self.fields = list(fields)

    def __bool__(self) -> bool:
        return bool(self.groups)

    @property
    def main_fields(self) -> list[int]:
        return [self.fields[j] for j in self.main]

    @property
    def parts(self) -> list[list[int]]:
        """Each part's fields' positions: the main fields' (when there are any), then each group's."""
        return ([self.main] if self.main else []) + self.groups

    @property
    def part_fields(self) -> list[list[int]]:
        """Each part's fields as the fused kernels take them: the main ones, then each group's owner."""
        return ([self.main_fields] if self.main else []) + [[o] for o in self.owners]

    @property
    def widths(self) -> list[int]:
        """Each part's fields in the kernels' layout (a group's: one)."""
        return ([len(self.main)] if self.main else []) + [1] * len(self.groups)

    # -- ids and lookups ---------------------------------------------------------------------------
    def ids(self, ids: Any) -> list[Any]:
        """A shard's keyed ids -> each part's: the main fields', and per group one field of its
        fields' rows one after another."""
        from des.data.batch import FieldBatch, KeyedIds

        out = [KeyedIds.of(self.main_fields, [ids[f] for f in self.main_fields])] if self.main else []
        for owner, group in zip(self.owners, self.groups):
            parts = [ids[self.fields[j]] for j in group]
            starts = np.cumsum([0] + [int(p.keys.shape[0]) for p in parts])
            offsets = np.concatenate([[0]] + [np.asarray(p.offsets[1:], np.int64) + s for p, s in zip(parts, starts)])
            weights = None
            if any(p.weights is not None for p in parts):
                weights = np.concatenate([np.ones(p.keys.shape[0], np.float32) if p.weights is None else p.weights
                                          for p in parts])
            out.append(KeyedIds.of([owner], [FieldBatch(offsets, np.concatenate([p.keys for p in parts]), weights)]))
        return out

    def compose(self, parts: Sequence[Touched]) -> Touched:
        """The shard's Touched (every field, in order) from its parts' lookups."""
        rows = parts[0].size // len(self.parts[0]) if not self.main else parts[0].size
        fields: list[Any] = [None] * len(self.fields)
        for part, positions in zip(parts, self.parts):
            for i, j in enumerate(positions):
                fields[j] = _field(part, i) if positions is self.main else _samples(part, i, rows)
        return _touched(fields, parts[0].train, parts[0].step, looked_up=tuple(parts))

    def split(self, t: Touched) -> list[Touched]:
        """A shard's Touched -> its parts' (a group's: the one field of its fields' samples): the
        lookups it was composed from, or cut from it (the exchange's synthetic and joined ones)."""
        if t.parts is not None:
            return list(t.parts)
        return [_touched([_field(t, j) for j in positions], t.train, t.step, merged=positions is not self.main)
                for positions in self.parts]

    # -- values and gradients ----------------------------------------------------------------------
    def split_pooled(self, pooled: np.ndarray) -> list[np.ndarray]:
        """``[B, F, dim]`` (a block's gradients) -> each part's: the main fields' ``[B, F_main, dim]``,
        a group's ``[m·B, 1, dim]``."""
        return [np.ascontiguousarray(pooled[:, positions, :]) if positions is self.main else
                np.ascontiguousarray(pooled[:, positions, :].transpose(1, 0, 2).reshape(-1, 1, pooled.shape[2]))
                for positions in self.parts]

    def join_pooled(self, out: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        """The inverse of :meth:`split_pooled`, into ``out [B, F, dim]``."""
        for positions, values in zip(self.parts, parts):
            if positions is self.main:
                out[:, positions, :] = values
            else:
                out[:, positions, :] = values.reshape(len(positions), out.shape[0], out.shape[2]).transpose(1, 0, 2)

    def join_ids(self, t: Touched, out: np.ndarray, parts: Sequence[np.ndarray]) -> None:
        """Per-id values of the parts of ``t`` (as :meth:`split` cut it) into ``out [nnz, dim]``, in
        ``t``'s order."""
        ko = t.key_offsets
        for positions, values in zip(self.parts, parts):
            at = 0
            for j in positions:
                n = int(ko[j + 1] - ko[j])
                out[ko[j]:ko[j + 1]] = values[at:at + n]
                at += n
