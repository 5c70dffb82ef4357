"""xDeepFM (Lian et al., KDD 2018): a linear term, a compressed interaction network (CIN) over the
field embeddings and a DNN, their logits summed (DeepCTR's ``xDeepFM``).

    X^0   = [e_1; …; e_F]                                  F vectors of k
    p^+   = CIN(X^0)                                       eq. (6), sum-pooled maps (:class:`des.layers.CompressedInteraction`)
    logit = b + Σ_j w_j x_j + w_cinᵀ p^+ + MLP([e_1 | … | e_F | x])

What is substituted, and why it is exact: the linear term and the DNN's first layer decompose by
fields (the DES paper's eqs. 2-3 and 7-9: :class:`~des.substitutions.FirstOrderLinear`,
:class:`~des.substitutions.FirstFC`, dense features in both, as DeepCTR's); the CIN's outer
products ``X^{l-1}_i ⊙ X^0_j`` need a row's embeddings side by side, so the concatenation of the
embeddings is substituted (:class:`~des.substitutions.FieldEmbeddings`, without the dense
features: DeepCTR's CIN reads the sparse embeddings only; each field's values in its own columns,
a sum exact in any precision, exchanged by the planner on one-hot data) and the CIN runs in the
top network where the rows are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from des.layers import CompressedInteraction, DeepTower
from des.models.base import CRITEO_NUM_FIELDS, EmbeddingModel
from des.substitutions import FieldEmbeddings, FirstFC, FirstOrderLinear, ParamSpec, Substitution


class XDeepFM(EmbeddingModel):
    """xDeepFM; ``cin_layers``: the CIN's feature maps per layer, ``split_half``: half of each
    layer's maps (but the last's) go to the output, half to the next layer, ``cin_activation``
    (DeepCTR's defaults: 256,128, split, relu)."""

    name = "xdeepfm"

    def __init__(
        self,
        num_fields: int = CRITEO_NUM_FIELDS,
        embedding_dim: int = 8,
        hidden: Sequence[int] = (400, 400, 400),
        activation: str = "relu",
        init_scale: float = 0.01,
        l2_embedding: float = 0.0,
        l2_dense: float = 0.0,
        num_dense: int = 0,
        cin_layers: Sequence[int] = (256, 128),
        split_half: bool = True,
        cin_activation: str = "relu",
    ) -> None:
        super().__init__(num_fields, embedding_dim, init_scale, l2_embedding, l2_dense, num_dense)
        self.tower = DeepTower(hidden, activation)
        try:
            self.cin = CompressedInteraction(num_fields, cin_layers, cin_activation, split_half)
        except ValueError as exc:
            raise ValueError(f"xdeepfm: {exc}") from None

    @property
    def _hyper(self) -> dict[str, Any]:
        return {**super()._hyper, "hidden": list(self.tower.hidden), "activation": self.tower.activation,
                "cin_layers": list(self.cin.layer_sizes), "split_half": self.cin.split_half,
                "cin_activation": self.cin.activation}

    def substitutions(self) -> list[Substitution]:
        f, k, d = self.num_fields, self.embedding_dim, self.num_dense
        return [FirstOrderLinear(f, num_dense=d), FieldEmbeddings(f, k), FirstFC(f, k, self.tower.hidden[0], num_dense=d)]

    def top_params(self) -> dict[str, ParamSpec]:
        width = self.cin.output_dim
        return {**super().top_params(), **self.tower.params(), **self.cin.params(),
                "cin_output_kernel": ParamSpec((width,), "glorot_uniform", width, 1)}

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        linear, embeddings, first_layer = outputs
        x0 = tf.reshape(embeddings, [-1, self.num_fields, self.embedding_dim])
        cin = tf.linalg.matvec(self.cin(params, x0), params["cin_output_kernel"])
        return linear[:, 0] + cin + self.tower(params, first_layer) + params["bias"][0]
