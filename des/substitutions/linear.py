"""First-order linear term (LR, the wide part): the DES paper, section 4.1, eqs. (2)-(3).

    F_lr(W, X) = Σ_j w_j x_j                          (the bias and σ belong to the top network)
    M_1(W_i)   = Σ_{w_j ∈ W_i} w_j x_j                 eq. (2), one scalar per sample
    F̃(R)       = R                                    eq. (3) without σ and b

Reads the 1-wide ``"linear"`` block; the pooled value of a field is already ``Σ_t w_t x_t``. Dense
features add ``x · w_x`` (DeepCTR's linear part of a ``DenseFeat``) to the reduced sum.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from des.substitutions.base import ParamSpec, Substitution


class FirstOrderLinear(Substitution):
    """``Σ_j w_j x_j`` over all fields (and ``x · w_x`` over the dense features); width 1."""

    name = "linear"

    def __init__(self, num_fields: int, block: str = "linear", num_dense: int = 0) -> None:
        super().__init__(block=block, dim=1, num_fields=num_fields, num_dense=num_dense)

    @property
    def width(self) -> int:
        return 1

    @property
    def output_dim(self) -> int:
        return 1

    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return tf.reduce_sum(emb[:, :, 0], axis=1, keepdims=True)

    def local_gradient(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], grad: tf.Tensor
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        # ∂M_1/∂w_f = 1 for every field: each field's pooled weight gets the sample's gradient.
        return tf.broadcast_to(grad[:, None, :], tf.shape(emb)), {}

    def dense_params(self) -> dict[str, ParamSpec]:
        return {"dense_weight": ParamSpec(shape=(self.num_dense,), init="zeros")} if self.num_dense else {}

    def local_dense(self, dense: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return tf.linalg.matvec(dense, params["dense_weight"])[:, None]

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        return reduced

    def reference(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], dense: tf.Tensor | None = None,
                  dense_params: Mapping[str, tf.Tensor] | None = None) -> tf.Tensor:
        # W^T X with X the one-hot (or weighted multi-hot) indicator and the dense features: the sum
        # of looked-up weights plus x · w_x.
        shape = tf.TensorShape(emb.shape)
        width = shape[1] * shape[2] if shape[1:].is_fully_defined() else None
        # a static width (a served model's): no shape ops per call, the ones a constant
        flat = tf.reshape(emb, [-1, width] if width is not None else [tf.shape(emb)[0], -1])
        weights = tf.ones([width if width is not None else tf.shape(flat)[1]], dtype=flat.dtype)
        if dense is not None:
            flat = tf.concat([flat, dense], axis=1)
            weights = tf.concat([weights, dense_params["dense_weight"]], axis=0)
        return tf.linalg.matvec(flat, weights)[:, None]
