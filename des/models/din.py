"""DIN (Zhou et al., KDD 2018): the candidate item attends over the user's behaviour sequence, and
the attention-pooled history joins the other fields' embeddings in an MLP (DeepCTR's ``DIN`` is
the reference):

    v_h   = Σ_t a(e_c, e_t) e_t                     a: DIN's activation unit (des.layers.AttentionUnit)
    logit = MLP([e_f for the fields but the items | v_h | x_dense])
          + Σ_f w_f + x·w_x + Σ_{i<j} <u_i, u_j>    (wide = "fm"; u: the fields but the items, and v_h)

``wide`` adds DeepFM's shallow part (Guo et al. 2017) beside the MLP: ``"linear"`` the order-1
weights of the fields but the items (and the dense features'), ``"fm"`` those and FM's pairwise
products over the same fields with the attention-pooled history as one more field vector.

The sequence is a column declared with ``pooling = "none"`` and ``table = "<candidate>"``: its
items are fields ``name@1`` .. ``name@L`` sharing the candidate's table (``--shared-tables``
says which; every field that shares a table is an item of the table's owner, the candidate).

What is substituted, and why it is exact:

* the MLP's first layer over the candidate and the other fields, ``Σ_f e_f W_f`` (the DES paper's
  eqs. 7-9; :class:`~des.substitutions.FieldSubset` of :class:`~des.substitutions.FirstFC`: the
  items' slices are unused), and
* the attention pooling (:class:`~des.substitutions.TargetAttention`): local to the rank holding
  the candidate and its items (a shared table's fields are placed together), its MLP the
  candidate field's slices, trained there from ``G`` alone; only ``v_h`` (``k`` floats a row)
  enters the buffer.

* the order-1 term over the fields but the items (:class:`~des.substitutions.FieldSubset` of
  :class:`~des.substitutions.FirstOrderLinear`, eqs. 2-3), and FM's sums over them
  (:class:`~des.substitutions.Uncombined` of a field subset of :class:`~des.substitutions.FMOrder2`:
  ``[Σ_f e_f, Σ_f ‖e_f‖²]`` reduced, eq. 5), when ``wide`` asks for them.

``v_h``'s block of the first layer, ``v_h W_h``, is added in the top network (``attention_kernel``,
replicated: a ``[k, H_1]`` matmul on the rows). So are its FM products: ``v_h`` exists only on the
candidate's rank and the other fields' sums only after the reduction, so the top adds FM's own
partials of ``v_h`` as one more field (``[v_h, ‖v_h‖²]``) to the reduced sums and runs FM's
``combine`` on the rows: ``Σ_{i<j}`` over the fields and ``v_h``, each product once, a function of
the row's reduced buffer only (row-wise, the same on N ranks as on 1).

``recency`` gives the activation unit each item's slot, a learned ``p_t`` (``t = 1`` the most
recent) appended to its input (``concat``) or added to the item it scores (``add``): a field
parameter of :class:`~des.substitutions.TargetAttention` like the unit's MLP, so it lives and
trains on the candidate's rank and is exact as the attention is. Off by default: on MovieLens
100K's time-ordered split ``concat``, chosen on validation, was +0.0008 over ``din`` without it
and still below DeepFM with the same history mean-pooled (docs/benchmarks.md, "DIN's activation
unit reading each item's recency").

DIN's Dice activation normalizes by batch statistics, which would tie a row's output to the other
rows (and N ranks to differ from 1), so the MLP and the attention unit use PReLU (DeepCTR's
``prelu`` activations). The scores are normalized by a softmax over a row's present items
(``attention_softmax``, chosen on MovieLens's validation split: docs/benchmarks.md, "DIN with
DeepFM's shallow part"; false: the paper's eq. 3, unnormalized, where an empty slot adds
``a · 0``, exactly nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from des.layers import DeepTower
from des.models.base import CRITEO_NUM_FIELDS, EmbeddingBlock, EmbeddingModel
from des.substitutions import (FieldSubset, FirstFC, FirstOrderLinear, FMOrder2, ParamSpec, Substitution,
                               TargetAttention, Uncombined)


def attention_groups(shared_tables: str) -> list[tuple[int, tuple[int, ...]]]:
    """``--shared-tables`` as resolved (``FIELD:OWNER`` numbers) -> ``(candidate, items)`` per owner."""
    groups: dict[int, list[int]] = {}
    for pair in filter(None, (p.strip() for p in ("" if shared_tables in ("auto", "none") else shared_tables).split(","))):
        field, _, owner = pair.partition(":")
        groups.setdefault(int(owner), []).append(int(field))
    return [(owner, tuple(sorted(items))) for owner, items in sorted(groups.items())]


class DIN(EmbeddingModel):
    """DIN; ``hidden``: the MLP's widths (the first substituted), ``activation``: its activation
    (``prelu``, DIN's with Dice's batch statistics left out), ``attention_hidden``: the activation
    unit's widths; ``shared_tables``: the run's resolved ``--shared-tables`` (the candidates and
    their items); ``wide``: DeepFM's shallow part beside the MLP (``none``, ``linear`` or ``fm``);
    ``attention_softmax``: the attention scores normalized over a row's present items (false: the
    paper's unnormalized scores); ``recency``: the activation unit reads each item's slot
    (``none``, ``concat`` or ``add``, :class:`des.layers.AttentionUnit`). ``des.train`` sets the tower by ``--hidden`` and ``--activation``
    (the paper's: ``--hidden 200,80 --activation prelu``; the flags' defaults, DeepFM's 400-400-400
    ReLU, scored higher on MovieLens's validation split with ``wide`` and the softmax, their
    defaults: docs/benchmarks.md, "DIN with DeepFM's shallow part")."""

    WIDE = ("none", "linear", "fm")

    name = "din"

    def __init__(
        self,
        num_fields: int = CRITEO_NUM_FIELDS,
        embedding_dim: int = 8,
        hidden: Sequence[int] = (200, 80),
        activation: str = "prelu",
        init_scale: float = 0.01,
        l2_embedding: float = 0.0,
        l2_dense: float = 0.0,
        num_dense: int = 0,
        shared_tables: str = "none",
        attention_hidden: Sequence[int] = (80, 40),
        wide: str = "fm",
        attention_softmax: bool = True,
        recency: str = "none",
    ) -> None:
        super().__init__(num_fields, embedding_dim, init_scale, l2_embedding, l2_dense, num_dense)
        self.groups = attention_groups(shared_tables)
        if not self.groups:
            raise ValueError("din attends over a sequence's items, fields sharing the candidate's table, and no "
                             "field shares a table (declare a sequence column with pooling = \"none\" and "
                             "table = \"<candidate column>\")")
        if wide not in self.WIDE:
            raise ValueError(f"wide must be one of {', '.join(self.WIDE)}, got {wide!r}")
        self.wide = wide
        self.items = sorted(f for _, items in self.groups for f in items)
        self.tower = DeepTower(hidden, activation, prefix="deep")
        self.attention = TargetAttention(num_fields, embedding_dim, self.groups, attention_hidden, "prelu",
                                         softmax=attention_softmax, recency=recency)
        self.fm = FMOrder2(num_fields, embedding_dim)

    @property
    def _hyper(self) -> dict[str, Any]:
        return {**super()._hyper, "hidden": list(self.tower.hidden), "activation": self.tower.activation,
                "attention_hidden": list(self.attention.unit.hidden), "wide": self.wide,
                "attention_softmax": self.attention.unit.softmax, "recency": self.attention.unit.recency}

    def blocks(self) -> list[EmbeddingBlock]:  # an order-1 term only with the wide part
        return [block for block in super().blocks() if block.name != "linear" or self.wide != "none"]

    def substitutions(self) -> list[Substitution]:
        first = FirstFC(self.num_fields, self.embedding_dim, self.tower.hidden[0], num_dense=self.num_dense,
                        input_dim=self.input_dim)
        subs: list[Substitution] = [FieldSubset(first, self.others), self.attention]
        if self.wide != "none":
            subs.append(FieldSubset(FirstOrderLinear(self.num_fields, num_dense=self.num_dense), self.others))
        if self.wide == "fm":
            subs.append(Uncombined(FieldSubset(self.fm, self.others)))
        return subs

    @property
    def others(self) -> list[int]:
        """The fields the MLP reads directly: all but the items."""
        return [f for f in range(self.num_fields) if f not in set(self.items)]

    @property
    def input_dim(self) -> int:
        """The MLP's input width (its first layer's Glorot fan-in, as DeepCTR's): the other fields'
        embeddings, the attention's pooled vectors and the dense features."""
        return (len(self.others) + len(self.groups)) * self.embedding_dim + self.num_dense

    def top_params(self) -> dict[str, ParamSpec]:
        width, units = self.attention.width, self.tower.hidden[0]
        return {**super().top_params(), **self.tower.params(),
                "attention_kernel": ParamSpec((width, units), "glorot_uniform", self.input_dim, units)}

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        first_layer, pooled, *wide = outputs
        logit = self.tower(params, first_layer + tf.matmul(pooled, params["attention_kernel"])) + params["bias"][0]
        if self.wide != "none":
            logit += wide[0][:, 0]
        if self.wide == "fm":
            logit += self.pairwise(wide[1], pooled)
        return logit

    def pairwise(self, field_sums: tf.Tensor, pooled: tf.Tensor) -> tf.Tensor:
        """FM's ``Σ_{i<j} <u_i, u_j>`` over the fields but the items and the pooled histories, ``[B]``:
        ``field_sums`` (the fields' reduced ``[Σ e_f, Σ ‖e_f‖²]``) plus each pooled vector's own
        partials as one more field, then FM's ``combine``."""
        histories = tf.reshape(pooled, [-1, len(self.groups), self.embedding_dim])
        return self.fm.combine(field_sums + self.fm.local(histories, {}))[:, 0]
