"""Target attention over a behaviour sequence (DIN, Zhou et al. 2018), and two wrappers models
reading a sequence's items compose with it: an operator on some of the fields, and an operator
whose ``combine`` the top network runs.

**The items.** A sequence column declared with ``pooling = "none"`` becomes ``max_length`` fields,
``name@1`` (the most recent id) .. ``name@L``, each holding at most one id and sharing the
candidate's table (``table = "<column>"``): a slot's pooled value is its item's row, an empty
slot's is zero. Fields sharing a table are placed on one rank as one unit
(``des/strategies/table_groups.py``), so a candidate and its items are always together.

**Target attention** (:class:`TargetAttention`), per group ``(c, (i_1 .. i_L))`` of a candidate
field and its items:

    F(V, W)  = Σ_t a(e_c, e_{i_t}; W_c) e_{i_t}         [B, k]   (DIN's eq. 3; softmax optional)
    M(V_r)   = F on the rank holding the group, 0 elsewhere
    F̃(R)    = R

``W_c`` (the attention unit's MLP, :class:`des.layers.AttentionUnit`, and with ``recency`` its
slots' position vectors) is the candidate field's slice of the operator's field parameters: it lives, and is trained, where the group lives. A
rank's partials read only its own fields and its own slices, the group is never split, and every
other rank adds exact zeros, so the sum over ranks is the operator in any precision; its
gradients (autodiff of :meth:`TargetAttention.local`, from ``G``) are the candidate's rank's
alone: no gradient crosses the network. Its output is a pooled ``k``-vector, which the layers
above read like any pooled field (DIN: one more block of its DNN's first layer).

:class:`FieldSubset` runs another operator on some fields only (the others' embeddings zeroed):
DIN's first layer reads the candidate and the other fields but not the items, which it sees
through the attention only.

:class:`Uncombined` hands another operator's reduced partials to the top network as they are, so
the top can add terms of its own before the operator's ``combine``: DIN's FM takes the
attention-pooled history as one more field, whose vector exists only after the reduction (the
attention runs on the candidate's rank, the other fields' sums on theirs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from des.substitutions.base import FieldParam, ParamSpec, Substitution


def _selection(indices: tf.Tensor, wanted: Sequence[int], dtype: tf.DType) -> tf.Tensor:
    """``[len(wanted), F_i]``: 1 where local field j is ``wanted[g]`` (a row of zeros where absent)."""
    return tf.cast(tf.equal(tf.constant(list(wanted), tf.int32)[:, None], tf.cast(indices, tf.int32)[None, :]), dtype)


class TargetAttention(Substitution):
    """DIN's attention pooling of each group's items by its candidate; width ``groups · dim``.
    ``groups``: ``(candidate field, (item fields...))`` pairs; ``hidden``, ``activation``: the
    attention unit's MLP; ``softmax``: its scores normalized over a row's present items;
    ``recency``: the unit reads each slot's position (:class:`des.layers.AttentionUnit`), one
    ``[L, dim]`` table of them a field slice like the MLP's (``L`` the longest group's items), so
    a group's positions are its candidate's and live, are trained and are saved with it."""

    name = "target_attention"
    reads_field_indices = True

    def __init__(self, num_fields: int, dim: int, groups: Sequence[tuple[int, Sequence[int]]],
                 hidden: Sequence[int] = (80, 40), activation: str = "prelu", block: str = "embedding",
                 softmax: bool = False, recency: str = "none") -> None:
        from des.layers.attention import AttentionUnit  # the layers import this package's base

        super().__init__(block=block, dim=dim, num_fields=num_fields)
        self.groups = tuple((int(c), tuple(int(i) for i in items)) for c, items in groups)
        seen = [f for c, items in self.groups for f in (c, *items)]
        if not self.groups or any(not items for _, items in self.groups):
            raise ValueError("target attention needs a candidate field with at least one item field")
        if len(set(seen)) != len(seen) or not all(0 <= f < num_fields for f in seen):
            raise ValueError(f"target attention: groups {self.groups} must name distinct fields of {num_fields}")
        self.unit = AttentionUnit(dim, hidden, activation, prefix="attention", softmax=softmax, recency=recency,
                                  positions=max(len(items) for _, items in self.groups))

    @classmethod
    def example(cls, num_fields: int) -> "TargetAttention":
        groups = [(0, (1, 2))] + ([(3, (num_fields - 1,))] if num_fields >= 5 else [])
        return cls(num_fields, dim=3, groups=groups, hidden=(4, 3))

    @property
    def colocated(self) -> list[tuple[int, ...]]:
        return [(c, *items) for c, items in self.groups]

    @property
    def width(self) -> int:
        return self.dim * len(self.groups)

    @property
    def output_dim(self) -> int:
        return self.width

    def field_params(self) -> dict[str, FieldParam]:
        """The attention unit's weights, a slice per field: the candidate's are the group's."""
        return dict(self.unit.params())

    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        indices = params["field_indices"]
        pooled = []
        for candidate, items in self.groups:
            picked = tf.einsum("bfk,gf->bgk", emb, _selection(indices, (candidate, *items), emb.dtype))
            own = _selection(indices, (candidate,), emb.dtype)[0]  # the candidate's slices, or zeros
            weights = {name: tf.tensordot(own, params[name], axes=1) for name in self.unit.params()}
            pooled.append(self.unit(weights, picked[:, 0], picked[:, 1:]))
        return tf.concat(pooled, axis=1) if len(pooled) > 1 else pooled[0]

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        return reduced

    def reference(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        pooled = []
        for candidate, items in self.groups:
            weights = {name: params[name][candidate] for name in self.unit.params()}
            pooled.append(self.unit(weights, emb[:, candidate], tf.gather(emb, list(items), axis=1)))
        return tf.concat(pooled, axis=1) if len(pooled) > 1 else pooled[0]

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "groups": [[c, list(items)] for c, items in self.groups],
                "hidden": list(self.unit.hidden), "softmax": self.unit.softmax, "recency": self.unit.recency}


class Wrapping(Substitution):
    """A substitution made of another, ``inner``: its block, sizes, field parameters, dense
    features' weights and part of the buffer are ``inner``'s; a wrapper changes only what it says
    (which fields ``inner`` reads, or where its ``combine`` runs)."""

    def __init__(self, inner: Substitution) -> None:
        super().__init__(block=inner.block, dim=inner.dim, num_fields=inner.num_fields, num_dense=inner.num_dense)
        self.inner = inner
        self.low_precision_local = inner.low_precision_local

    @property
    def width(self) -> int:
        return self.inner.width

    @property
    def output_dim(self) -> int:
        return self.inner.output_dim

    def field_params(self) -> dict[str, FieldParam]:
        return self.inner.field_params()

    def dense_params(self) -> dict[str, ParamSpec]:
        return self.inner.dense_params()

    @property
    def reads_dense(self) -> bool:
        return self.inner.reads_dense

    def local_dense(self, dense: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return self.inner.local_dense(dense, params)

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "inner": self.inner.describe()}


class FieldSubset(Wrapping):
    """``inner`` on ``fields`` only: the other fields' embeddings enter as zeros (their slices of
    ``inner``'s weights unused, their gradients zero). Exact as ``inner`` is: zeroing is per field,
    so a rank's partials are ``inner``'s partials of its fields in the subset."""

    name = "field_subset"
    reads_field_indices = True

    def __init__(self, inner: Substitution, fields: Sequence[int]) -> None:
        super().__init__(inner)
        self.fields = tuple(sorted(int(f) for f in fields))
        if not self.fields or not all(0 <= f < inner.num_fields for f in self.fields):
            raise ValueError(f"a field subset needs fields of 0..{inner.num_fields - 1}, got {list(fields)}")

    @classmethod
    def example(cls, num_fields: int) -> "FieldSubset":
        from des.substitutions.first_fc import FirstFC

        return cls(FirstFC(num_fields, dim=3, units=5, num_dense=2), fields=range(0, num_fields, 2))

    def _inner_params(self, params: Mapping[str, tf.Tensor]) -> dict[str, Any]:
        return {k: v for k, v in params.items() if k != "field_indices" or self.inner.reads_field_indices}

    def _masked(self, emb: tf.Tensor, indices: tf.Tensor) -> tf.Tensor:
        keep = tf.reduce_sum(_selection(indices, self.fields, emb.dtype), axis=0)
        return emb * keep[None, :, None]

    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return self.inner.local(self._masked(emb, params["field_indices"]), self._inner_params(params))

    def local_gradient(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], grad: tf.Tensor
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        masked = self._masked(emb, params["field_indices"])
        emb_grad, grads = self.inner.local_backward(masked, self._inner_params(params), grad)
        return self._masked(emb_grad, params["field_indices"]), grads

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        return self.inner.combine(reduced)

    def reference(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], dense: tf.Tensor | None = None,
                  dense_params: Mapping[str, tf.Tensor] | None = None) -> tf.Tensor:
        masked = self._masked(emb, tf.range(self.num_fields))
        inner = dict(params)
        if self.inner.reads_field_indices:
            inner["field_indices"] = tf.range(self.num_fields)
        return self.inner.reference(masked, inner, dense, dense_params) if self.reads_dense else \
            self.inner.reference(masked, inner)

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "fields": list(self.fields)}


class Uncombined(Wrapping):
    """``inner``'s partials summed over the ranks, ``combine`` left to the model's top network
    (``combine`` here is the identity; width and output ``inner.width``). The reference is the sum
    of ``inner``'s partials over all fields (and its dense part): exact as ``inner``'s split is,
    since the reduction is the same sum. A top network that adds ``inner.local`` of one more field
    (a vector computed above the reduction) and then runs ``inner.combine`` gets ``inner`` over the
    fields and that vector: for FM, every pairwise product with it, each once."""

    name = "uncombined"

    def __init__(self, inner: Substitution) -> None:
        super().__init__(inner)
        self.reads_field_indices = inner.reads_field_indices

    @classmethod
    def example(cls, num_fields: int) -> "Uncombined":
        from des.substitutions.fm import FMOrder2

        return cls(FieldSubset(FMOrder2(num_fields, dim=3), fields=range(1, num_fields, 2)))

    @property
    def output_dim(self) -> int:
        return self.inner.width

    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return self.inner.local(emb, params)

    def local_gradient(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], grad: tf.Tensor
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        return self.inner.local_backward(emb, params, grad)

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        return reduced

    def reference(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], dense: tf.Tensor | None = None,
                  dense_params: Mapping[str, tf.Tensor] | None = None) -> tf.Tensor:
        whole = dict(params)
        if self.inner.reads_field_indices:
            whole["field_indices"] = tf.range(self.num_fields)
        summed = self.inner.local(emb, whole)
        return summed + self.inner.local_dense(dense, dense_params) if self.reads_dense else summed
