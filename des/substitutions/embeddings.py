"""The field embeddings themselves, concatenated: the input ``x_0`` of DCN-v2's cross network and
of DLRM's interaction, as an operator the engine can split or exchange.

    F_emb(V) = [e_1 | … | e_F | x]              the concatenation, [B, F·k + D]
    M(V_i)   = Σ_{f ∈ i} e_f P_f                  P_f: the [k, F·k] placement of field f's columns
    F̃(R)    = R

The concatenation is the sum of every field's embedding placed in its own columns (zeros
elsewhere), so it splits by fields as the first FC layer does (eq. 7 with the kernel a placement);
a sum of one value and zeros is that value in any order, so the split form is exact in any
precision. Partials cost ``F·k`` columns per sample; an exchange moves each remote distinct id's
``k`` values instead: on one-hot data never more (a row block has at most ``F`` distinct ids per
row), on multi-hot data it can be, and the planner's cost model chooses.
Dense features ``x [B, D]`` take the last ``D`` columns, unweighted (``local_dense``).
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from des.substitutions.base import Substitution


class FieldEmbeddings(Substitution):
    """``concat_f(e_f)`` (then the dense features); width ``F·dim + D``."""

    name = "embeddings"
    reads_field_indices = True

    def __init__(self, num_fields: int, dim: int, block: str = "embedding", num_dense: int = 0) -> None:
        super().__init__(block=block, dim=dim, num_fields=num_fields, num_dense=num_dense)

    @classmethod
    def example(cls, num_fields: int) -> "FieldEmbeddings":
        return cls(num_fields=num_fields, dim=3, num_dense=2)

    @property
    def width(self) -> int:
        return self.num_fields * self.dim + self.num_dense

    @property
    def output_dim(self) -> int:
        return self.width

    @property
    def reads_dense(self) -> bool:
        return self.num_dense > 0

    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        # field f's columns take local field j where field_indices[j] == f, else a zero slot (index F_i)
        indices = params["field_indices"]
        own = tf.shape(indices)[0]
        slot = tf.tensor_scatter_nd_update(tf.fill([self.num_fields], own), indices[:, None], tf.range(own))
        padded = tf.concat([emb, tf.zeros_like(emb[:, :1])], axis=1)
        placed = tf.gather(padded, slot, axis=1)
        flat = tf.reshape(placed, [tf.shape(emb)[0], self.num_fields * self.dim])
        return tf.pad(flat, [[0, 0], [0, self.num_dense]]) if self.num_dense else flat

    def local_gradient(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], grad: tf.Tensor
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        # each local field's embedding receives its own columns of G
        by_field = tf.reshape(grad[:, : self.num_fields * self.dim], [tf.shape(grad)[0], self.num_fields, self.dim])
        return tf.gather(by_field, params["field_indices"], axis=1), {}

    def local_dense(self, dense: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return tf.pad(dense, [[0, 0], [self.num_fields * self.dim, 0]])

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        return reduced

    def reference(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], dense: tf.Tensor | None = None,
                  dense_params: Mapping[str, tf.Tensor] | None = None) -> tf.Tensor:
        flat = tf.reshape(emb, [tf.shape(emb)[0], self.num_fields * self.dim])
        return tf.concat([flat, dense], axis=1) if dense is not None else flat
