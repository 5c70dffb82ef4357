"""DCN-v2's cross network (Wang et al., WWW 2021).

    x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l                                  eq. (1), full-rank W_l [d, d]
    x_{l+1} = Σ_e G_e(x_l) · x_0 ⊙ (U_e g(C_e g(V_eᵀ x_l)) + b_l) + x_l       eq. (3), ``cross="mix"``

(``g = tanh``, ``G`` the softmax over the experts of ``x_l · w_gate_e``, as DeepCTR's ``DCNMix``.)
The first layer's product of ``x_0`` -- ``W_0 x_0``, or every expert's ``V_eᵀ x_0`` then every
gate's ``x_0 · w_gate_e`` -- is linear in ``x_0``, so it comes from outside (a model substitutes it
as a first FC layer over the fields, :attr:`CrossNetwork.first_units` wide); the later layers need
``x_l`` whole. Weights: ``{prefix}_bias_l``, and ``{prefix}_kernel_l`` (full rank, ``l ≥ 1``) or
``{prefix}_v_kernel_l``, ``{prefix}_gate_kernel_l`` (``l ≥ 1``), ``{prefix}_c_kernel_l``,
``{prefix}_u_kernel_l`` (mixed).
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from des.substitutions.base import ParamSpec


class CrossNetwork:
    """``layers`` cross layers over ``x_0`` of ``input_dim`` columns; ``cross="matrix"`` or ``"mix"``
    (``experts`` low-rank experts of rank ``low_rank``)."""

    def __init__(self, input_dim: int, layers: int, cross: str = "matrix", low_rank: int = 32, experts: int = 4,
                 prefix: str = "cross") -> None:
        if layers < 1:
            raise ValueError(f"the cross network needs at least one layer, got {layers}")
        if cross not in ("matrix", "mix"):
            raise ValueError(f"cross must be matrix or mix, got {cross!r}")
        if low_rank < 1 or experts < 1:
            raise ValueError("low_rank and experts must be at least 1")
        self.input_dim, self.layers, self.cross = int(input_dim), int(layers), cross
        self.low_rank, self.experts, self.prefix = int(low_rank), int(experts), prefix

    @property
    def first_units(self) -> int:
        """Columns of the first layer's product of ``x_0``: ``W_0 x_0``, or every expert's
        ``V_eᵀ x_0`` then every gate's ``x_0 · w_gate_e``."""
        return self.input_dim if self.cross == "matrix" else self.experts * (self.low_rank + 1)

    def params(self) -> dict[str, ParamSpec]:
        d, r, e, p = self.input_dim, self.low_rank, self.experts, self.prefix
        specs = {}
        for layer in range(self.layers):
            specs[f"{p}_bias_{layer}"] = ParamSpec((d,), init="zeros")
            if self.cross == "matrix":
                if layer:  # W_0 x_0 comes from outside
                    specs[f"{p}_kernel_{layer}"] = ParamSpec((d, d), "glorot_uniform", d, d)
                continue
            if layer:  # V_0 and the first gates come from outside
                specs[f"{p}_v_kernel_{layer}"] = ParamSpec((e, d, r), "glorot_uniform", d, r)
                specs[f"{p}_gate_kernel_{layer}"] = ParamSpec((d, e), "glorot_uniform", d, 1)
            specs[f"{p}_c_kernel_{layer}"] = ParamSpec((e, r, r), "glorot_uniform", r, r)
            specs[f"{p}_u_kernel_{layer}"] = ParamSpec((e, r, d), "glorot_uniform", r, d)
        return specs

    def _mixed_layer(self, params: Mapping[str, tf.Tensor], layer: int, x0: tf.Tensor, xl: tf.Tensor,
                     first: tf.Tensor | None) -> tf.Tensor:
        """``Σ_e G_e(x_l) E_e(x_l)`` (eq. 3) given ``first``: ``[V_eᵀ x_0 | x_0 · w_gate_e]`` of layer 0,
        or None for a later layer."""
        r, e, p = self.low_rank, self.experts, self.prefix
        if first is None:
            projected = tf.einsum("bd,edr->ber", xl, params[f"{p}_v_kernel_{layer}"])
            gates = tf.matmul(xl, params[f"{p}_gate_kernel_{layer}"])
        else:
            projected = tf.reshape(first[:, : e * r], [-1, e, r])
            gates = first[:, e * r:]
        hidden = tf.tanh(tf.einsum("ber,ers->bes", tf.tanh(projected), params[f"{p}_c_kernel_{layer}"]))
        up = tf.einsum("ber,erd->bed", hidden, params[f"{p}_u_kernel_{layer}"])
        experts = x0[:, None, :] * (up + params[f"{p}_bias_{layer}"])
        return tf.einsum("bed,be->bd", experts, tf.nn.softmax(gates, axis=1))

    def __call__(self, params: Mapping[str, tf.Tensor], x0: tf.Tensor, first: tf.Tensor) -> tf.Tensor:
        """``x_L`` from ``x_0 [B, d]`` and the first layer's product ``first [B, first_units]``."""
        xl = x0
        for layer in range(self.layers):
            if self.cross == "mix":
                xl = self._mixed_layer(params, layer, x0, xl, first if layer == 0 else None) + xl
                continue
            product = first if layer == 0 else tf.matmul(xl, params[f"{self.prefix}_kernel_{layer}"])
            xl = x0 * (product + params[f"{self.prefix}_bias_{layer}"]) + xl
        return xl
