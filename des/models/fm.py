"""Factorization machine (Rendle 2010): ``σ(b + Σ_j w_j x_j + Σ_{i<j} <v_i, v_j> x_i x_j)``
(the DES paper, section 4.2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.models.base import EmbeddingModel, ModelDefaults
from des.substitutions import FirstOrderLinear, FMOrder2, Substitution


class FM(EmbeddingModel):
    name = "fm"
    #: FTRL's larger step without a deep part; every id its own row on first sight
    defaults = ModelDefaults(linear_optimizer="ftrl:alpha=0.5,beta=1.0,l1=0.0,l2=0.0",
                             embedding_optimizer="adam:lr=0.001", unadmitted="init")

    def substitutions(self) -> list[Substitution]:
        return [FirstOrderLinear(self.num_fields, num_dense=self.num_dense), FMOrder2(self.num_fields, self.embedding_dim)]

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        linear, pairwise = outputs
        return linear[:, 0] + pairwise[:, 0] + params["bias"][0]
