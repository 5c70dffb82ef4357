"""DIN's activation unit (Zhou et al. 2018, fig. 2 and eq. 3): target attention over a behaviour
sequence, the candidate item's embedding ``q`` against each item ``e_t`` of the sequence.

    a_t    = MLP([q, e_t, q − e_t, q ⊙ e_t])       a score per item (one output unit; softmax: optional)
    pooled = Σ_t a_t e_t                          [B, k]

The scores are not normalized (the paper's choice, keeping the intensity of a user's interests);
an empty slot's item is the zero vector (nothing was looked up), so it adds ``a_t · 0 = 0`` to the
sum and nothing to any gradient: the mask is exact without a mask tensor. With ``softmax`` (the
variant DeepCTR calls ``weight_normalization``) the scores of a row's present slots are normalized
to sum to one, ``a_t = exp(s_t) / Σ_{u present} exp(s_u)``: a zero score would still take a share,
so the mask is read from the items, a slot being present when its vector is not all zeros (an
id's row; an empty slot, or an id that looks up nothing under ``--unadmitted zero``, is absent).
A row without any present slot pools to zero. The mask is a function of the row's own items, so
the pooling stays row-wise and the same wherever the group is computed. The MLP is a
:class:`~des.layers.DeepTower` over ``4k`` inputs; DIN's Dice normalizes with batch statistics,
which would make a row's output depend on the other rows (and N ranks differ from 1), so PReLU, a
learned slope per unit, stands in for it (as DeepCTR's ``att_activation="prelu"``).

**Recency** (``recency``, off by default): the unit sees where item ``t`` sits in the sequence, a
learned vector ``p_t`` per slot (``t = 1`` the most recent .. ``positions``), as BST, DIEN and TWIN
give their models the position or time; ``"concat"`` appends it to the unit's input,
``[q, e_t, q − e_t, q ⊙ e_t, p_t]`` (``5k`` wide), ``"add"`` keys the item by it,
``e'_t = e_t + p_t`` in place of ``e_t`` in the four features. Either way only the score reads
``p_t``: the pooled vector is still ``Σ_t a_t e_t`` of the items themselves and the mask still
reads ``e_t``, so an empty slot adds nothing and gives ``p_t`` no gradient. ``p_t`` is a weight of
the unit like its MLP's (the slots, not the items: the same ``p_t`` whichever item is there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.layers.mlp import DeepTower
from des.substitutions.base import ParamSpec


class AttentionUnit:
    """DIN's local activation unit for ``dim``-wide embeddings: ``hidden`` widths with
    ``activation``, then one linear score (``softmax``: normalized over a row's present slots);
    weights named ``{prefix}_kernel_i``/``_bias_i``/``_alpha_i``. ``recency`` (one of
    :attr:`RECENCY`): the slots' position vectors ``{prefix}_position`` (``[positions, dim]``, row
    ``t - 1`` for slot ``t``) concatenated to the unit's input or added to the items it scores."""

    RECENCY = ("none", "concat", "add")

    def __init__(self, dim: int, hidden: Sequence[int] = (80, 40), activation: str = "prelu",
                 prefix: str = "attention", softmax: bool = False, recency: str = "none",
                 positions: int = 0) -> None:
        if recency not in self.RECENCY:
            raise ValueError(f"recency must be one of {', '.join(self.RECENCY)}, got {recency!r}")
        if recency != "none" and positions < 1:
            raise ValueError(f"recency {recency!r} needs the number of slots (positions >= 1), got {positions}")
        self.dim = int(dim)
        self.softmax = bool(softmax)
        self.recency = recency
        self.positions = int(positions) if recency != "none" else 0
        self.position_name = f"{prefix}_position"
        width = (5 if recency == "concat" else 4) * self.dim
        self.tower = DeepTower(hidden, activation, input_dim=width, output_units=1, prefix=prefix)

    @property
    def hidden(self) -> tuple[int, ...]:
        return self.tower.hidden

    def params(self) -> dict[str, ParamSpec]:
        """The MLP's weights, and with ``recency`` the position vectors (``N(0, 0.01²)``, as an
        embedding's rows: a small start the MLP's Glorot kernel reads like the items)."""
        specs = self.tower.params()
        if self.recency != "none":
            specs[self.position_name] = ParamSpec((self.positions, self.dim), "normal", scale=0.01)
        return specs

    def scores(self, params: Mapping[str, tf.Tensor], query: tf.Tensor, items: tf.Tensor) -> tf.Tensor:
        """``a_t``: ``query [B, k]`` and ``items [B, L, k]`` -> ``[B, L]``, row by row and item by item
        (with ``recency``, ``L <= positions``: slot ``t`` reads position row ``t - 1``)."""
        shape = tf.shape(items)
        q = tf.broadcast_to(query[:, None, :], shape)
        keyed = items
        if self.recency != "none":
            slots = tf.broadcast_to(params[self.position_name][None, : items.shape[1]], shape)
            keyed = items + slots if self.recency == "add" else items
        features = [q, keyed, q - keyed, q * keyed] + ([slots] if self.recency == "concat" else [])
        flat = tf.reshape(tf.concat(features, axis=2), [shape[0] * shape[1], self.tower.input_dim])
        return tf.reshape(self.tower(params, flat), [shape[0], shape[1]])

    def __call__(self, params: Mapping[str, tf.Tensor], query: tf.Tensor, items: tf.Tensor) -> tf.Tensor:
        """``Σ_t a_t e_t``: the items pooled by their scores (or their softmax), ``[B, k]``."""
        scores = self.scores(params, query, items)
        return tf.einsum("bl,blk->bk", present_softmax(scores, items) if self.softmax else scores, items)


def present_softmax(scores: tf.Tensor, items: tf.Tensor) -> tf.Tensor:
    """``scores [B, L]`` normalized over each row's present slots (``items [B, L, k]`` not all zero),
    0 at absent slots and in a row with none. Shifted by the row's largest present score (softmax
    is shift-invariant, so the shift carries no gradient); absent slots never reach ``exp``."""
    present = tf.reduce_any(tf.not_equal(items, 0), axis=2)
    floor = tf.reduce_min(scores, axis=1, keepdims=True)
    shift = tf.stop_gradient(tf.reduce_max(tf.where(present, scores, floor), axis=1, keepdims=True))
    zeros = tf.zeros_like(scores)
    exps = tf.where(present, tf.exp(tf.where(present, scores - shift, zeros)), zeros)
    empty = 1.0 - tf.cast(tf.reduce_any(present, axis=1, keepdims=True), scores.dtype)
    return exps / (tf.reduce_sum(exps, axis=1, keepdims=True) + empty)
