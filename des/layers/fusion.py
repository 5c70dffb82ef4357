"""FinalMLP's blocks (Mao et al., AAAI 2023; FuxiCTR's ``FeatureSelection`` and
``InteractionAggregation``).

* :class:`FieldGate` -- stream-specific feature gating without context fields (FuxiCTR's default):
  ``x ⊙ 2 σ(MLP(c))`` with ``c`` a learned ``context_dim``-vector (zeros at first) and the MLP's
  last layer ``input_dim`` wide. The gate depends on weights only, not on the row.
* :class:`BilinearFusion` -- the multi-head bilinear fusion of two streams ``x`` and ``y``:
  ``w_xᵀ x + w_yᵀ y + Σ_h x_hᵀ W_h y_h`` with ``x_h``, ``y_h`` the ``h``-th of ``heads`` equal
  slices; the bias is the model's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from des.layers.mlp import DeepTower
from des.substitutions.base import ParamSpec


class FieldGate:
    """``x [B, input_dim]`` -> ``x ⊙ 2 σ(MLP(c))``; weights ``{prefix}_context`` and the gate MLP's
    ``{prefix}_kernel_i``, ``{prefix}_bias_i`` (hidden ``hidden``, relu)."""

    def __init__(self, input_dim: int, context_dim: int, hidden: Sequence[int], prefix: str) -> None:
        self.input_dim, self.context_dim, self.prefix = int(input_dim), int(context_dim), prefix
        self.mlp = DeepTower(hidden, "relu", input_dim=self.context_dim, output_units=self.input_dim, prefix=prefix)

    def params(self) -> dict[str, ParamSpec]:
        return {f"{self.prefix}_context": ParamSpec((self.context_dim,), init="zeros"), **self.mlp.params()}

    def gate(self, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """``2 σ(MLP(c))``, ``[1, input_dim]`` (the same for every row)."""
        return 2.0 * tf.sigmoid(self.mlp(params, params[f"{self.prefix}_context"][None, :]))

    def __call__(self, params: Mapping[str, tf.Tensor], x: tf.Tensor) -> tf.Tensor:
        return x * self.gate(params)


class BilinearFusion:
    """The logit's fusion of ``x [B, x_dim]`` and ``y [B, y_dim]`` over ``heads`` heads; weights
    ``{prefix}_x_kernel``, ``{prefix}_y_kernel`` and ``{prefix}_xy_kernel`` (``[heads, x_dim/heads,
    y_dim/heads]``, Glorot-normal as FuxiCTR's)."""

    def __init__(self, x_dim: int, y_dim: int, heads: int = 1, prefix: str = "fusion") -> None:
        if heads < 1 or x_dim % heads or y_dim % heads:
            raise ValueError(f"the fusion's heads ({heads}) must divide both streams' widths ({x_dim}, {y_dim})")
        self.x_dim, self.y_dim, self.heads, self.prefix = int(x_dim), int(y_dim), int(heads), prefix

    def params(self) -> dict[str, ParamSpec]:
        hx, hy, p = self.x_dim // self.heads, self.y_dim // self.heads, self.prefix
        pairs = self.heads * hx * hy  # FuxiCTR's w_xy is [heads·hx·hy, 1]: its Glorot-normal fans
        return {f"{p}_x_kernel": ParamSpec((self.x_dim,), "glorot_uniform", self.x_dim, 1),
                f"{p}_y_kernel": ParamSpec((self.y_dim,), "glorot_uniform", self.y_dim, 1),
                f"{p}_xy_kernel": ParamSpec((self.heads, hx, hy), "normal", scale=float(np.sqrt(2.0 / (pairs + 1))))}

    def __call__(self, params: Mapping[str, tf.Tensor], x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """-> ``[B]``."""
        p = self.prefix
        heads_x = tf.reshape(x, [-1, self.heads, self.x_dim // self.heads])
        heads_y = tf.reshape(y, [-1, self.heads, self.y_dim // self.heads])
        bilinear = tf.reduce_sum(tf.einsum("bhi,hij->bhj", heads_x, params[f"{p}_xy_kernel"]) * heads_y, axis=[1, 2])
        return tf.linalg.matvec(x, params[f"{p}_x_kernel"]) + tf.linalg.matvec(y, params[f"{p}_y_kernel"]) + bilinear
