"""DCN-v2 (Wang et al., WWW 2021): a cross network and a deep tower over the field embeddings.

    x_0     = [e_1 | … | e_F | x]                                     the concatenated inputs, d wide
    x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l                             eq. (1), full-rank W_l [d, d]
    x_{l+1} = Σ_e G_e(x_l) · x_0 ⊙ (U_e g(C_e g(V_eᵀ x_l)) + b_l) + x_l   eq. (3), ``cross="mix"``
    parallel: logit = w_out · [x_L | MLP(x_0)] (+ Σ_j w_j x_j)          figure 2 (b)
    stacked:  logit = MLP(x_L) (+ Σ_j w_j x_j)                          figure 2 (a)

(``g = tanh``, ``G`` the softmax over the experts of ``x_l · w_gate_e``, as DeepCTR's ``DCNMix``;
the optional linear term is DeepCTR's ``DCN``'s.) What decomposes by fields is substituted: the
linear term, the concatenation ``x_0`` itself (:class:`~des.substitutions.FieldEmbeddings`), the
first cross layer's ``W_0 x_0`` (or, mixed, ``V_eᵀ x_0`` and the gates' ``x_0 · w_gate_e``: linear
in ``x_0``, so a first FC layer over the fields) and, parallel, the deep tower's first layer; the
other cross layers need ``x_l`` whole and run in the top network. The planner exchanges the
concatenation on one-hot data (its inputs never cost more than its partials there); dense features
are the last columns of ``x_0``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from des.models.base import CRITEO_NUM_FIELDS, DeepTower, EmbeddingBlock, EmbeddingModel
from des.substitutions import FieldEmbeddings, FirstFC, FirstOrderLinear, ParamSpec, Substitution


class DCNv2(EmbeddingModel):
    """DCN-v2; ``cross="matrix"`` (DeepCTR's ``DCN(cross_parameterization="matrix")``) or ``"mix"``
    (``DCNMix``: ``experts`` low-rank experts of rank ``low_rank``), ``structure`` ``"parallel"`` or
    ``"stacked"``."""

    name = "dcnv2"

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
        cross_layers: int = 3,
        structure: str = "parallel",
        cross: str = "matrix",
        low_rank: int = 32,
        experts: int = 4,
        linear: bool = True,
    ) -> None:
        super().__init__(num_fields, embedding_dim, init_scale, l2_embedding, l2_dense, num_dense)
        if cross_layers < 1:
            raise ValueError(f"dcnv2: cross_layers must be at least 1, got {cross_layers}")
        if structure not in ("parallel", "stacked"):
            raise ValueError(f"dcnv2: structure must be parallel or stacked, got {structure!r}")
        if cross not in ("matrix", "mix"):
            raise ValueError(f"dcnv2: cross must be matrix or mix, got {cross!r}")
        if low_rank < 1 or experts < 1:
            raise ValueError("dcnv2: low_rank and experts must be at least 1")
        self.cross_layers, self.structure, self.cross = int(cross_layers), structure, cross
        self.low_rank, self.experts, self.linear = int(low_rank), int(experts), bool(linear)
        #: the width of x_0
        self.input_dim = num_fields * embedding_dim + num_dense
        if structure == "parallel":  # its first layer is substituted: x_0 W_0 over the fields
            self.tower = DeepTower(hidden, activation, output_units=0)
        else:
            self.tower = DeepTower(hidden, activation, input_dim=self.input_dim)

    @property
    def _hyper(self) -> dict[str, Any]:
        return {**super()._hyper, "hidden": list(self.tower.hidden), "activation": self.tower.activation,
                "cross_layers": self.cross_layers, "structure": self.structure, "cross": self.cross,
                "low_rank": self.low_rank, "experts": self.experts, "linear": self.linear}

    @property
    def _first_cross_units(self) -> int:
        """Columns of the first cross layer's substituted product: ``W_0 x_0``, or every expert's
        ``V_eᵀ x_0`` then every gate's ``x_0 · w_gate_e``."""
        return self.input_dim if self.cross == "matrix" else self.experts * (self.low_rank + 1)

    def substitutions(self) -> list[Substitution]:
        f, k, d = self.num_fields, self.embedding_dim, self.num_dense
        subs: list[Substitution] = [FirstOrderLinear(f, num_dense=d)] if self.linear else []
        subs += [FieldEmbeddings(f, k, num_dense=d), FirstFC(f, k, self._first_cross_units, num_dense=d)]
        if self.structure == "parallel":
            subs.append(FirstFC(f, k, self.tower.hidden[0], num_dense=d))
        return subs

    def blocks(self) -> list[EmbeddingBlock]:
        return [block for block in super().blocks() if self.linear or block.name != "linear"]

    def top_params(self) -> dict[str, ParamSpec]:
        d, r, e = self.input_dim, self.low_rank, self.experts
        specs = {**super().top_params(), **self.tower.params()}
        for layer in range(self.cross_layers):
            specs[f"cross_bias_{layer}"] = ParamSpec((d,), init="zeros")
            if self.cross == "matrix":
                if layer:  # W_0 x_0 is substituted
                    specs[f"cross_kernel_{layer}"] = ParamSpec((d, d), "glorot_uniform", d, d)
                continue
            if layer:  # V_0 and the first gates are substituted
                specs[f"cross_v_kernel_{layer}"] = ParamSpec((e, d, r), "glorot_uniform", d, r)
                specs[f"cross_gate_kernel_{layer}"] = ParamSpec((d, e), "glorot_uniform", d, 1)
            specs[f"cross_c_kernel_{layer}"] = ParamSpec((e, r, r), "glorot_uniform", r, r)
            specs[f"cross_u_kernel_{layer}"] = ParamSpec((e, r, d), "glorot_uniform", r, d)
        if self.structure == "parallel":
            width = d + self.tower.output_dim
            specs["output_kernel"] = ParamSpec((width, 1), "glorot_uniform", width, 1)
        return specs

    def _mixed_layer(self, params: Mapping[str, tf.Tensor], layer: int, x0: tf.Tensor, xl: tf.Tensor,
                     first: tf.Tensor | None) -> tf.Tensor:
        """``Σ_e G_e(x_l) E_e(x_l)`` (eq. 3) given ``first``: the substituted ``[V_eᵀ x_0 | x_0 · w_gate_e]``
        of layer 0, or None for a later layer."""
        r, e = self.low_rank, self.experts
        if first is None:
            projected = tf.einsum("bd,edr->ber", xl, params[f"cross_v_kernel_{layer}"])
            gates = tf.matmul(xl, params[f"cross_gate_kernel_{layer}"])
        else:
            projected = tf.reshape(first[:, : e * r], [-1, e, r])
            gates = first[:, e * r:]
        hidden = tf.tanh(tf.einsum("ber,ers->bes", tf.tanh(projected), params[f"cross_c_kernel_{layer}"]))
        up = tf.einsum("ber,erd->bed", hidden, params[f"cross_u_kernel_{layer}"])
        experts = x0[:, None, :] * (up + params[f"cross_bias_{layer}"])
        return tf.einsum("bed,be->bd", experts, tf.nn.softmax(gates, axis=1))

    def cross_network(self, params: Mapping[str, tf.Tensor], x0: tf.Tensor, first: tf.Tensor) -> tf.Tensor:
        """``x_L`` from ``x_0`` and the first layer's substituted product ``first``."""
        xl = x0
        for layer in range(self.cross_layers):
            if self.cross == "mix":
                xl = self._mixed_layer(params, layer, x0, xl, first if layer == 0 else None) + xl
                continue
            product = first if layer == 0 else tf.matmul(xl, params[f"cross_kernel_{layer}"])
            xl = x0 * (product + params[f"cross_bias_{layer}"]) + xl
        return xl

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        outputs = list(outputs)
        linear = outputs.pop(0)[:, 0] if self.linear else 0.0
        x0, first_cross = outputs[0], outputs[1]
        crossed = self.cross_network(params, x0, first_cross)
        if self.structure == "stacked":
            logit = self.tower(params, crossed)
        else:
            deep = self.tower(params, outputs[2])
            logit = tf.matmul(tf.concat([crossed, deep], axis=1), params["output_kernel"])[:, 0]
        return logit + linear + params["bias"][0]
