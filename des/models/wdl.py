"""Wide & Deep (Cheng et al. 2016): a linear wide part plus a DNN over the field embeddings,
``σ(b + Σ_j w_j x_j + MLP(act(concat_f(e_f) W_1 + b_1)))``; the first FC layer is substituted
(the DES paper, section 4.3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.layers import DeepTower
from des.models.base import CRITEO_NUM_FIELDS, EmbeddingModel
from des.substitutions import FirstFC, FirstOrderLinear, ParamSpec, Substitution


class WideAndDeep(EmbeddingModel):
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
        num_dense: int = 0,
    ) -> None:
        super().__init__(num_fields, embedding_dim, init_scale, l2_embedding, l2_dense, num_dense)
        self.tower = DeepTower(hidden, activation)

    @property
    def _hyper(self) -> dict:
        return {**super()._hyper, "hidden": list(self.tower.hidden), "activation": self.tower.activation}

    def substitutions(self) -> list[Substitution]:
        return [
            FirstOrderLinear(self.num_fields, num_dense=self.num_dense),
            FirstFC(self.num_fields, self.embedding_dim, self.tower.hidden[0], num_dense=self.num_dense),
        ]

    def top_params(self) -> dict[str, ParamSpec]:
        return {**super().top_params(), **self.tower.params()}

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        linear, first_layer = outputs
        return linear[:, 0] + self.tower(params, first_layer) + params["bias"][0]
