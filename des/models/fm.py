"""Factorization machine (Rendle 2010): ``σ(b + Σ_j w_j x_j + Σ_{i<j} <v_i, v_j> x_i x_j)``
(the DES paper, section 4.2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.models.base import CRITEO_NUM_FIELDS, EmbeddingBlock, Model
from des.substitutions import FirstOrderLinear, FMOrder2, Substitution


class FM(Model):
    name = "fm"

    def __init__(
        self,
        num_fields: int = CRITEO_NUM_FIELDS,
        embedding_dim: int = 8,
        init_scale: float = 0.01,
        l2_embedding: float = 0.0,
        l2_dense: float = 0.0,
    ) -> None:
        super().__init__(num_fields, l2_embedding, l2_dense)
        self.embedding_dim = embedding_dim
        self.init_scale = init_scale

    @property
    def _hyper(self) -> dict:
        return {**super()._hyper, "embedding_dim": self.embedding_dim, "init_scale": self.init_scale}

    def blocks(self) -> list[EmbeddingBlock]:
        return [
            EmbeddingBlock("linear", 1, init="zeros"),
            EmbeddingBlock("embedding", self.embedding_dim, init="normal", scale=self.init_scale),
        ]

    def substitutions(self) -> list[Substitution]:
        return [FirstOrderLinear(self.num_fields), FMOrder2(self.num_fields, self.embedding_dim)]

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        linear, pairwise = outputs
        return linear[:, 0] + pairwise[:, 0] + params["bias"][0]
