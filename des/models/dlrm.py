"""DLRM (Naumov et al., 2019): a bottom MLP on the dense features, the pairwise dot products of
its output and the field embeddings, a top MLP.

    z   = MLP_bottom(x)                                  [B, k] (relu on every layer, as TorchRec's DenseArch)
    T   = [z, e_1, …, e_F]                               F + 1 vectors of k (F without dense features)
    I   = [z | <T_i, T_j> for i < j]                      the interaction (TorchRec's InteractionArch)
    logit = MLP_top(I)                                   ``hidden`` then one unit (TorchRec's OverArch)

The dot products (:class:`des.layers.DotInteraction`) need the embeddings of a row side by side,
so DLRM's one substitution is the concatenation of the embeddings (:class:`~des.substitutions.FieldEmbeddings`, the dense features in
its last columns): on one-hot data the planner exchanges it (moves the pooled inputs to the row
owners), and the bottom MLP, the interaction and the top MLP run where the rows are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import tensorflow as tf

from des.layers import DeepTower, DotInteraction
from des.models.base import CRITEO_NUM_FIELDS, EmbeddingBlock, EmbeddingModel, ModelDefaults
from des.substitutions import FieldEmbeddings, ParamSpec, Substitution


class DLRM(EmbeddingModel):
    """DLRM; ``bottom``: the bottom MLP's hidden widths before its last layer of ``embedding_dim``
    units (none without dense features), ``hidden``: the top MLP's before its logit."""

    name = "dlrm"
    #: Adam at 3e-3 on the embeddings (its interaction is all embeddings, no order-1 term), chosen on
    #: the validation split of the Criteo sample with dense features (scripts/select_defaults.py)
    defaults = replace(ModelDefaults(), embedding_optimizer="adam:lr=0.003,catchup=1")

    def __init__(
        self,
        num_fields: int = CRITEO_NUM_FIELDS,
        embedding_dim: int = 8,
        hidden: Sequence[int] = (400, 400, 400),
        bottom: Sequence[int] = (512, 256),
        activation: str = "relu",
        init_scale: float = 0.01,
        l2_embedding: float = 0.0,
        l2_dense: float = 0.0,
        num_dense: int = 0,
    ) -> None:
        super().__init__(num_fields, embedding_dim, init_scale, l2_embedding, l2_dense, num_dense)
        self.bottom = tuple(int(h) for h in bottom)
        self.bottom_mlp = DeepTower((*self.bottom, embedding_dim), activation, input_dim=num_dense, output_units=0,
                                    prefix="bottom") if num_dense else None
        self.dot = DotInteraction()
        #: the interaction's width: the bottom MLP's output and the dot products of distinct vectors
        vectors = num_fields + (1 if num_dense else 0)
        self.interaction_dim = (embedding_dim if num_dense else 0) + self.dot.output_dim(vectors)
        self.tower = DeepTower(hidden, activation, input_dim=self.interaction_dim)

    @property
    def _hyper(self) -> dict[str, Any]:
        return {**super()._hyper, "hidden": list(self.tower.hidden), "bottom": list(self.bottom),
                "activation": self.tower.activation}

    def blocks(self) -> list[EmbeddingBlock]:  # no order-1 term
        return [block for block in super().blocks() if block.name != "linear"]

    def substitutions(self) -> list[Substitution]:
        return [FieldEmbeddings(self.num_fields, self.embedding_dim, num_dense=self.num_dense)]

    def top_params(self) -> dict[str, ParamSpec]:
        specs = dict(self.tower.params())  # the tower's last bias is the logit's: no separate "bias"
        if self.bottom_mlp is not None:
            specs.update(self.bottom_mlp.params())
        return specs

    def interaction(self, params: Mapping[str, tf.Tensor], inputs: tf.Tensor) -> tf.Tensor:
        """``I`` from the concatenation ``[e_1 | … | e_F | x]``."""
        f, k = self.num_fields, self.embedding_dim
        vectors = tf.reshape(inputs[:, : f * k], [-1, f, k])
        head = []
        if self.bottom_mlp is not None:
            z = self.bottom_mlp(params, inputs[:, f * k:])
            vectors, head = tf.concat([z[:, None, :], vectors], axis=1), [z]
        return tf.concat([*head, self.dot(vectors)], axis=1)

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        return self.tower(params, self.interaction(params, outputs[0]))
