"""Wide & Deep (Cheng et al. 2016): a linear wide part plus a DNN over the field embeddings,
``σ(b + Σ_j w_j x_j + MLP(act(concat_f(e_f) W_1 + b_1)))``; the first FC layer is substituted
(the DES paper, section 4.3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.models.base import CRITEO_NUM_FIELDS, DeepTower, EmbeddingBlock, Model
from des.substitutions import FirstFC, FirstOrderLinear, ParamSpec, Substitution


class WideAndDeep(Model):
    name = "wdl"

    def __init__(
        self,
        num_fields: int = CRITEO_NUM_FIELDS,
        embedding_dim: int = 8,
        hidden: Sequence[int] = (400, 400, 400),
        activation: str = "relu",
        init_scale: float = 0.01,
        l2_embedding: float = 0.0,
        l2_dense: float = 0.0,
    ) -> None:
        super().__init__(num_fields, l2_embedding, l2_dense)
        self.embedding_dim = embedding_dim
        self.init_scale = init_scale
        self.tower = DeepTower(hidden, activation)

    @property
    def _hyper(self) -> dict:
        return {
            **super()._hyper,
            "embedding_dim": self.embedding_dim,
            "hidden": list(self.tower.hidden),
            "activation": self.tower.activation,
            "init_scale": self.init_scale,
        }

    def blocks(self) -> list[EmbeddingBlock]:
        return [
            EmbeddingBlock("linear", 1, init="zeros"),
            EmbeddingBlock("embedding", self.embedding_dim, init="normal", scale=self.init_scale),
        ]

    def substitutions(self) -> list[Substitution]:
        return [
            FirstOrderLinear(self.num_fields),
            FirstFC(self.num_fields, self.embedding_dim, self.tower.hidden[0]),
        ]

    def top_params(self) -> dict[str, ParamSpec]:
        return {**super().top_params(), **self.tower.params()}

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        linear, first_layer = outputs
        return linear[:, 0] + self.tower(params, first_layer) + params["bias"][0]
