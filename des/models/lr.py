"""Logistic regression: ``σ(Σ_j w_j x_j + b)`` (the DES paper, section 4.1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.models.base import EmbeddingBlock, Model, ModelDefaults
from des.substitutions import FirstOrderLinear, Substitution


class LR(Model):
    name = "lr"
    #: AdaGrad on the weights, l2 on the looked-up ones; all --epochs (early stopping on the sample's
    #: ~1.6k validation rows ended LR runs before their best held-out AUC)
    defaults = ModelDefaults(linear_optimizer="adagrad:lr=0.1", embedding_optimizer="adam:lr=0.001",
                             l2_embedding=0.01, early_stop=0)

    def blocks(self) -> list[EmbeddingBlock]:
        return [EmbeddingBlock("linear", 1, init="zeros")]

    def substitutions(self) -> list[Substitution]:
        return [FirstOrderLinear(self.num_fields, num_dense=self.num_dense)]

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        (linear,) = outputs
        return linear[:, 0] + params["bias"][0]
