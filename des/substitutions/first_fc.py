"""The first fully connected layer of the DNN over field blocks: the DES paper, section 4.3,
eqs. (7)-(9).

    F_dnn = Vᵀ W = [V_1ᵀ | … | V_Nᵀ] [W_1; …; W_N] = Σ_i V_iᵀ W_i        eqs. (7), (8)
    M_1(V_i, W_i) = V_iᵀ W_i                                            eq. (9)
    F̃ = ⊕ M_1

``V`` is the concatenation of the field embeddings ``[B, F·k]`` and ``W`` the layer's kernel
``[F·k, H]``; the kernel is stored as field blocks ``W_f`` of shape ``[k, H]`` next to the field's
embeddings, so neither ``V`` nor ``W`` nor their gradients ever leave the rank. Width ``H``. The
bias and activation of the layer belong to the top network (they are not weight-rich). Dense
features ``x [B, D]`` are more rows of the layer's input (DeepCTR concatenates a ``DenseFeat`` to
the DNN's input): ``x W_x`` with ``W_x [D, H]`` is added to the reduced sum.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from des.substitutions.base import FieldParam, ParamSpec, Substitution


class FirstFC(Substitution):
    """``concat_f(e_f) @ W`` computed as ``Σ_f e_f W_f``; width ``units``. ``input_dim``: the
    layer's whole input width for its Glorot fans, when it reads less or more than every field's
    embedding and the dense features (DIN's: the fields but the items, and the attention's output)."""

    name = "first_fc"
    low_precision_local = True  # two matmuls (eq. (9) and its gradient): bf16 with float32 accumulation

    def __init__(self, num_fields: int, dim: int, units: int, block: str = "embedding", num_dense: int = 0,
                 input_dim: int | None = None) -> None:
        super().__init__(block=block, dim=dim, num_fields=num_fields, num_dense=num_dense)
        self.units = units
        self.input_dim = input_dim

    @classmethod
    def example(cls, num_fields: int) -> "FirstFC":
        return cls(num_fields=num_fields, dim=3, units=5)

    @property
    def _fan_in(self) -> int:
        return self.input_dim or self.num_fields * self.dim + self.num_dense

    @property
    def width(self) -> int:
        return self.units

    @property
    def output_dim(self) -> int:
        return self.units

    def field_params(self) -> dict[str, FieldParam]:
        return {
            "kernel": FieldParam(
                shape=(self.dim, self.units),
                init="glorot_uniform",
                fan_in=self._fan_in,
                fan_out=self.units,
            )
        }

    def dense_params(self) -> dict[str, ParamSpec]:
        if not self.num_dense:
            return {}
        return {"dense_kernel": ParamSpec((self.num_dense, self.units), "glorot_uniform", self._fan_in, self.units)}

    def local_dense(self, dense: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return tf.matmul(dense, params["dense_kernel"])

    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return tf.einsum("bfk,fkh->bh", emb, params["kernel"])

    def local_gradient(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], grad: tf.Tensor
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        # eq. (9) differentiated: ∂L/∂V_i = G W_iᵀ and ∂L/∂W_i = V_iᵀ G, two matmuls over the
        # rank's fields flattened to [B, F_i·k] (no forward recomputation).
        shape, kernel_shape = tf.shape(emb), tf.shape(params["kernel"])
        flat = tf.reshape(emb, [shape[0], shape[1] * shape[2]])
        kernel = tf.reshape(params["kernel"], [kernel_shape[0] * kernel_shape[1], kernel_shape[2]])
        emb_grad = tf.reshape(tf.matmul(grad, kernel, transpose_b=True), shape)
        kernel_grad = tf.reshape(tf.matmul(flat, grad, transpose_a=True), kernel_shape)
        return emb_grad, {"kernel": kernel_grad}

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        return reduced

    def reference(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], dense: tf.Tensor | None = None,
                  dense_params: Mapping[str, tf.Tensor] | None = None) -> tf.Tensor:
        concatenated = tf.reshape(emb, [-1, self.num_fields * self.dim])
        kernel = tf.reshape(params["kernel"], [self.num_fields * self.dim, self.units])
        if dense is not None:  # the dense features: more rows of the layer's input and kernel
            concatenated = tf.concat([concatenated, dense], axis=1)
            kernel = tf.concat([kernel, dense_params["dense_kernel"]], axis=0)
        return tf.matmul(concatenated, kernel)

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "units": self.units}
