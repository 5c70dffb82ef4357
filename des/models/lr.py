"""Logistic regression: ``σ(Σ_j w_j x_j + b)`` (the DES paper, section 4.1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.models.base import EmbeddingBlock, Model
from des.substitutions import FirstOrderLinear, Substitution


class LR(Model):
    name = "lr"

    def blocks(self) -> list[EmbeddingBlock]:
        return [EmbeddingBlock("linear", 1, init="zeros")]

    def substitutions(self) -> list[Substitution]:
        return [FirstOrderLinear(self.num_fields, num_dense=self.num_dense)]

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        (linear,) = outputs
        return linear[:, 0] + params["bias"][0]
