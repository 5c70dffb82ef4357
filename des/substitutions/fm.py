"""Factorization machine, order 2: the DES paper, section 4.2, eqs. (4)-(6).

    F_fm(2) = Σ_{i<j} <v_i, v_j> x_i x_j
            = ½ <Σ_i v_i x_i, Σ_i v_i x_i> − ½ Σ_i <v_i x_i, v_i x_i>        eq. (4)
    M_1(V_i) = Σ_{v_j ∈ V_i} v_j x_j            (a k-vector per sample)   eq. (5)
    M_2(V_i) = Σ_{v_j ∈ V_i} <v_j x_j, v_j x_j>  (a scalar per sample)     eq. (5)
    F̃ = ½ <⊕M_1, ⊕M_1> − ½ ⊕M_2                                          eq. (6)

The pairwise interactions are between fields (multi-hot fields are sum-pooled first, as DeepFM and
DeepCTR do); for one-hot data such as Criteo this is exactly the formula above. Width ``k + 1``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from des.substitutions.base import Substitution


class FMOrder2(Substitution):
    """Pairwise interactions ``Σ_{i<j} <e_i, e_j>``; partials ``[Σ e_f, Σ ‖e_f‖²]``."""

    name = "fm2"

    def __init__(self, num_fields: int, dim: int, block: str = "embedding") -> None:
        super().__init__(block=block, dim=dim, num_fields=num_fields)

    @classmethod
    def example(cls, num_fields: int) -> "FMOrder2":
        return cls(num_fields=num_fields, dim=4)

    @property
    def width(self) -> int:
        return self.dim + 1

    @property
    def output_dim(self) -> int:
        return 1

    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        sum_of_vectors = tf.reduce_sum(emb, axis=1)  # M_1: [B, k]
        sum_of_squares = tf.reduce_sum(tf.square(emb), axis=[1, 2])[:, None]  # M_2: [B, 1]
        return tf.concat([sum_of_vectors, sum_of_squares], axis=1)

    def local_gradient(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], grad: tf.Tensor
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        # eq. (5): ∂M_1/∂v_f = I (each field gets G_1) and ∂M_2/∂v_f = 2 v_f (scaled by G_2).
        return grad[:, None, : self.dim] + 2.0 * emb * grad[:, None, self.dim :], {}

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        sum_of_vectors, sum_of_squares = reduced[:, : self.dim], reduced[:, self.dim :]
        return 0.5 * (tf.reduce_sum(tf.square(sum_of_vectors), axis=1, keepdims=True) - sum_of_squares)

    def reference(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        # The double sum over field pairs i < j, as written on the first line of eq. (4).
        # (the pairs i < j as a constant [F, F] mask of ones above the diagonal: the same products
        # and sums as a mask built per batch, without its two [B, F, F] tensors each call)
        gram = tf.einsum("bik,bjk->bij", emb, emb)
        fields = emb.shape[1] if emb.shape[1] is not None else self.num_fields
        upper = tf.constant(np.triu(np.ones((fields, fields)), 1), dtype=gram.dtype)
        return tf.reduce_sum(gram * upper, axis=[1, 2])[:, None]
