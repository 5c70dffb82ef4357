"""FinalMLP (Mao et al., AAAI 2023): two MLP streams over the field embeddings, each behind its own
feature gate, fused by a multi-head bilinear layer (FuxiCTR's ``FinalMLP`` is the reference).

    x     = [e_1 | … | e_F | x_dense]                 the concatenated inputs, d = F·k + D wide
    g_s   = 2 σ(MLP_gate_s(c_s))                       stream s's gate, c_s a learned k-vector (zeros at first)
    y_1   = MLP_1(x ⊙ g_1),   y_2 = MLP_2(x ⊙ g_2)      the two streams
    logit = b + w_1ᵀ y_1 + w_2ᵀ y_2 + Σ_h y_{1,h}ᵀ W_h y_{2,h}   the fusion, ``num_heads`` heads

(:class:`des.layers.FieldGate`, :class:`des.layers.DeepTower`, :class:`des.layers.BilinearFusion`.)
The gate is FuxiCTR's without context fields (its default, ``fs1_context = fs2_context = []``):
the same for every row. Its context starts at zero and its biases too (FuxiCTR's
``reset_parameters``), so its hidden layers start at ``relu(0)``, whose gradient is 0 in
TensorFlow as in PyTorch: only the gate MLP's last bias ``b`` ever trains, and the gate is in effect
a learned per-column ``2 σ(b)``, as in FuxiCTR's (so ``fs_hidden`` changes the weights kept, not
what is learned). Dense features are more columns of ``x`` (gated too), as DeepCTR feeds a
``DenseFeat`` to its DNN. No dropout nor batch normalization (des's towers have none).

What is substituted, and why it is exact:

* ``use_fs=False`` (no gates: FuxiCTR's ``use_fs``): each stream's first layer is ``x W_s`` over
  all fields, ``Σ_f e_f W_{s,f}`` (the DES paper's eqs. 7-9). Both are one first FC layer over the
  fields, ``[W_1 | W_2]`` (:class:`~des.substitutions.FirstFC`, ``H_1 + H_2`` units; one reduce;
  Glorot-initialized with the joined kernel's fans), whose columns the top network splits: exact
  as DeepFM's first layer.
* ``use_fs=True`` (default): the first layers read ``x ⊙ g_s``, ``Σ_f (e_f ⊙ g_{s,f}) W_{s,f}``. The
  gate does not depend on the row, but it is computed from the gate MLP's weights, which are
  replicated with the top network; a rank's partials see only its fields' embeddings and field
  weights, so they cannot apply it, and folding it into ``W_s`` would be another parametrization
  (other gradients: another training). (A gate over context fields, FuxiCTR's ``fs_context``,
  would moreover depend on other fields of the row; it is not offered.) So the concatenation
  ``x`` itself is substituted (:class:`~des.substitutions.FieldEmbeddings`: each field's values in
  its own columns, zeros elsewhere, a sum exact in any precision; on one-hot data the planner
  exchanges it), and the gates and both streams, first layers included, run in the top network
  where the rows are: the textbook computation on every rank's rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from des.layers import BilinearFusion, DeepTower, FieldGate
from des.models.base import CRITEO_NUM_FIELDS, EmbeddingBlock, EmbeddingModel
from des.substitutions import FieldEmbeddings, FirstFC, ParamSpec, Substitution


class FinalMLP(EmbeddingModel):
    """FinalMLP; ``hidden``: stream 1's widths, ``mlp2_hidden``: stream 2's, ``fs_hidden``: each
    gate's MLP before its ``d`` sigmoid units, ``num_heads``: the fusion's heads (they must divide
    both streams' last widths), ``use_fs``: the gates. Defaults chosen on the validation split of
    the Criteo sample (``scripts/select_defaults.py --models finalmlp --seeds 0,1``, docs/benchmarks.md):
    the baseline, DeepFM's optimizer with stream 2 of 800 and one head, was not beaten by more
    than the split's ~0.002 noise (10 heads, stream 2 400-400-400, no gates, Adam 3e-3); a gate MLP
    of 64 (FuxiCTR's signature default) scored the same to the last bit as one of 800 (see the
    module's docstring) at a twelfth of its weights."""

    name = "finalmlp"

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
        mlp2_hidden: Sequence[int] = (800,),
        fs_hidden: Sequence[int] = (64,),
        num_heads: int = 1,
        use_fs: bool = True,
    ) -> None:
        super().__init__(num_fields, embedding_dim, init_scale, l2_embedding, l2_dense, num_dense)
        self.use_fs = bool(use_fs)
        #: the width of x
        self.input_dim = num_fields * embedding_dim + num_dense
        inputs = self.input_dim if self.use_fs else None  # without gates the first layers are substituted
        try:
            self.streams = (DeepTower(hidden, activation, input_dim=inputs, output_units=0, prefix="mlp1"),
                            DeepTower(mlp2_hidden, activation, input_dim=inputs, output_units=0, prefix="mlp2"))
            self.gates = (FieldGate(self.input_dim, embedding_dim, fs_hidden, prefix="fs1"),
                          FieldGate(self.input_dim, embedding_dim, fs_hidden, prefix="fs2")) if self.use_fs else ()
            self.fusion = BilinearFusion(self.streams[0].output_dim, self.streams[1].output_dim, num_heads)
        except ValueError as exc:
            raise ValueError(f"finalmlp: {exc}") from None
        self.fs_hidden = tuple(int(h) for h in fs_hidden)

    @property
    def _hyper(self) -> dict[str, Any]:
        first, second = self.streams
        return {**super()._hyper, "hidden": list(first.hidden), "activation": first.activation,
                "mlp2_hidden": list(second.hidden), "fs_hidden": list(self.fs_hidden),
                "num_heads": self.fusion.heads, "use_fs": self.use_fs}

    def blocks(self) -> list[EmbeddingBlock]:  # no order-1 term
        return [block for block in super().blocks() if block.name != "linear"]

    def substitutions(self) -> list[Substitution]:
        f, k, d = self.num_fields, self.embedding_dim, self.num_dense
        if self.use_fs:
            return [FieldEmbeddings(f, k, num_dense=d)]
        return [FirstFC(f, k, self.streams[0].hidden[0] + self.streams[1].hidden[0], num_dense=d)]

    def top_params(self) -> dict[str, ParamSpec]:
        specs = dict(super().top_params())
        for block in (*self.gates, *self.streams, self.fusion):
            specs.update(block.params())
        return specs

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        (inputs,) = outputs
        first, second = self.streams
        if self.use_fs:  # x itself: gated, then each stream's whole first layer
            y1, y2 = (stream(params, gate(params, inputs)) for stream, gate in zip(self.streams, self.gates))
        else:  # [x W_1 | x W_2], substituted
            y1, y2 = first(params, inputs[:, : first.hidden[0]]), second(params, inputs[:, first.hidden[0]:])
        return self.fusion(params, y1, y2) + params["bias"][0]
