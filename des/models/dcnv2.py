"""DCN-v2 (Wang et al., WWW 2021): a cross network and a deep tower over the field embeddings.

    x_0     = [e_1 | … | e_F | x]                                     the concatenated inputs, d wide
    x_L     = CrossNetwork(x_0)                                       eq. (1), or eq. (3) with ``cross="mix"``
    parallel: logit = w_out · [x_L | MLP(x_0)] (+ Σ_j w_j x_j)          figure 2 (b)
    stacked:  logit = MLP(x_L) (+ Σ_j w_j x_j)                          figure 2 (a)

(the cross layers: :class:`des.layers.CrossNetwork`; the optional linear term is DeepCTR's
``DCN``'s.) What decomposes by fields is substituted: the linear term, the concatenation ``x_0`` itself (:class:`~des.substitutions.FieldEmbeddings`), the
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

from des.layers import CrossNetwork, DeepTower
from des.models.base import CRITEO_NUM_FIELDS, EmbeddingBlock, EmbeddingModel
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
        if low_rank < 1 or experts < 1:
            raise ValueError(f"dcnv2: low_rank and experts must be at least 1, got {low_rank} and {experts}")
        self.structure, self.linear = structure, bool(linear)
        #: the width of x_0
        self.input_dim = num_fields * embedding_dim + num_dense
        try:
            self.cross_network = CrossNetwork(self.input_dim, cross_layers, cross, low_rank, experts)
        except ValueError as exc:
            raise ValueError(f"dcnv2: {exc}") from None
        self.cross_layers, self.cross = self.cross_network.layers, cross
        self.low_rank, self.experts = self.cross_network.low_rank, self.cross_network.experts
        if structure == "parallel":  # its first layer is substituted: x_0 W_0 over the fields
            self.tower = DeepTower(hidden, activation, output_units=0)
        else:
            self.tower = DeepTower(hidden, activation, input_dim=self.input_dim)

    @property
    def _hyper(self) -> dict[str, Any]:
        return {**super()._hyper, "hidden": list(self.tower.hidden), "activation": self.tower.activation,
                "cross_layers": self.cross_layers, "structure": self.structure, "cross": self.cross,
                "low_rank": self.low_rank, "experts": self.experts, "linear": self.linear}

    def substitutions(self) -> list[Substitution]:
        f, k, d = self.num_fields, self.embedding_dim, self.num_dense
        subs: list[Substitution] = [FirstOrderLinear(f, num_dense=d)] if self.linear else []
        subs += [FieldEmbeddings(f, k, num_dense=d), FirstFC(f, k, self.cross_network.first_units, num_dense=d)]
        if self.structure == "parallel":
            subs.append(FirstFC(f, k, self.tower.hidden[0], num_dense=d))
        return subs

    def blocks(self) -> list[EmbeddingBlock]:
        return [block for block in super().blocks() if self.linear or block.name != "linear"]

    def top_params(self) -> dict[str, ParamSpec]:
        specs = {**super().top_params(), **self.tower.params(), **self.cross_network.params()}
        if self.structure == "parallel":
            width = self.input_dim + self.tower.output_dim
            specs["output_kernel"] = ParamSpec((width, 1), "glorot_uniform", width, 1)
        return specs

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
