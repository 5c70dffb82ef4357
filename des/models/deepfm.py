"""DeepFM (Guo et al. 2017): FM and a DNN sharing the field embeddings,
``σ(b + Σ_j w_j x_j + Σ_{i<j} <e_i, e_j> + MLP(act(concat_f(e_f) W_1 + b_1)))``.
Three substitutions (the DES paper, sections 4.1-4.3); buffer width ``1 + (k + 1) + H_1``. Dense
features join the linear term and the DNN's input, not the FM term (as DeepCTR's DeepFM)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from des.models.wdl import WideAndDeep
from des.substitutions import FirstFC, FirstOrderLinear, FMOrder2, Substitution


class DeepFM(WideAndDeep):
    name = "deepfm"

    def substitutions(self) -> list[Substitution]:
        return [
            FirstOrderLinear(self.num_fields, num_dense=self.num_dense),
            FMOrder2(self.num_fields, self.embedding_dim),
            FirstFC(self.num_fields, self.embedding_dim, self.tower.hidden[0], num_dense=self.num_dense),
        ]

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        linear, pairwise, first_layer = outputs
        return linear[:, 0] + pairwise[:, 0] + self.tower(params, first_layer) + params["bias"][0]



