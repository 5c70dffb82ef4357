"""Field interactions over a row's embeddings side by side (``[B, m, k]``: ``m`` vectors of ``k``).

* :class:`DotInteraction` -- DLRM's (Naumov et al., 2019) dot products of every pair of distinct
  vectors, ``[<T_i, T_j> for i < j]`` row-major (TorchRec's ``InteractionArch``); no weights.
* :class:`CompressedInteraction` -- xDeepFM's CIN (Lian et al., KDD 2018, eq. 6):
  ``X^l_{h,*} = act(Σ_{i,j} W^{l,h}_{ij} (X^{l-1}_{i,*} ⊙ X^0_{j,*}) + b^l_h)``, each layer's maps
  (with ``split_half`` the second half of each but the last, DeepCTR's ``CIN``) sum-pooled over the
  embedding axis and concatenated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from des.layers.mlp import ACTIVATIONS
from des.substitutions.base import ParamSpec


class DotInteraction:
    """``[B, m, k]`` -> the ``m (m - 1) / 2`` dot products of distinct vectors, ``i < j`` row-major."""

    @staticmethod
    def output_dim(vectors: int) -> int:
        return vectors * (vectors - 1) // 2

    def params(self) -> dict[str, ParamSpec]:
        return {}

    def __call__(self, vectors: tf.Tensor) -> tf.Tensor:
        count = int(vectors.shape[1])
        dots = tf.matmul(vectors, vectors, transpose_b=True)
        upper = np.triu_indices(count, k=1)
        return tf.gather(tf.reshape(dots, [-1, count * count]), upper[0] * count + upper[1], axis=1)


class CompressedInteraction:
    """CIN over ``num_fields`` vectors with ``layer_sizes`` feature maps per layer. Weights
    ``{prefix}_kernel_l`` (``[m·H_{l-1}, H_l]``, DeepCTR's width-1 convolution) and ``{prefix}_bias_l``."""

    def __init__(self, num_fields: int, layer_sizes: Sequence[int], activation: str = "relu", split_half: bool = True,
                 prefix: str = "cin") -> None:
        self.layer_sizes = tuple(int(s) for s in layer_sizes)
        if not self.layer_sizes or min(self.layer_sizes) < 1:
            raise ValueError(f"the CIN needs positive layer sizes, got {list(self.layer_sizes)}")
        if split_half and any(s % 2 for s in self.layer_sizes[:-1]):
            raise ValueError(f"with split_half the CIN's layer sizes but the last must be even, got "
                             f"{list(self.layer_sizes)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r} (known: {', '.join(ACTIVATIONS)})")
        self.num_fields, self.activation, self.split_half, self.prefix = int(num_fields), activation, split_half, prefix

    def _maps(self) -> list[tuple[int, int]]:
        """Per layer: (maps carried to the next layer, maps pooled into the output)."""
        last = len(self.layer_sizes) - 1
        return [(s // 2, s - s // 2) if self.split_half and i < last else (0 if i == last else s, s)
                for i, s in enumerate(self.layer_sizes)]

    @property
    def output_dim(self) -> int:
        return sum(pooled for _, pooled in self._maps())

    def params(self) -> dict[str, ParamSpec]:
        specs, previous = {}, self.num_fields
        for layer, (size, (carried, _)) in enumerate(zip(self.layer_sizes, self._maps())):
            fan_in = previous * self.num_fields
            specs[f"{self.prefix}_kernel_{layer}"] = ParamSpec((fan_in, size), "glorot_uniform", fan_in, size)
            specs[f"{self.prefix}_bias_{layer}"] = ParamSpec((size,), init="zeros")
            previous = carried
        return specs

    def __call__(self, params: Mapping[str, tf.Tensor], x0: tf.Tensor) -> tf.Tensor:
        """``x0 [B, m, k]`` -> ``[B, output_dim]``."""
        act, m, k = ACTIVATIONS[self.activation], self.num_fields, int(x0.shape[2])
        hidden, pooled = x0, []
        for layer, (carried, _) in enumerate(self._maps()):
            # z[b, d, i, j] = X^0_{i,d} X^{l-1}_{j,d}: DeepCTR's outer product, the field of x0 major
            outer = tf.einsum("bid,bjd->bdij", x0, hidden)
            flat = tf.reshape(outer, [-1, int(hidden.shape[1]) * m])
            maps = act(tf.matmul(flat, params[f"{self.prefix}_kernel_{layer}"]) + params[f"{self.prefix}_bias_{layer}"])
            maps = tf.transpose(tf.reshape(maps, [-1, k, self.layer_sizes[layer]]), [0, 2, 1])  # [B, H_l, k]
            pooled.append(tf.reduce_sum(maps[:, carried:], axis=2))
            hidden = maps[:, :carried]
        return tf.concat(pooled, axis=1)
