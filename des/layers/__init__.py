"""Layers: the small blocks that models' top networks are built of.

A layer holds its sizes and no state: :meth:`params` declares its weights (``ParamSpec``, named
under the layer's ``prefix``, so a model composes several without collisions), and calling it with
the model's parameter mapping computes on tensors. Weights live in the engine, as every top
parameter does; a layer's names are the names checkpoints store.

* :class:`DeepTower` -- a stack of dense layers (an MLP), optionally started from a substituted
  first layer;
* :class:`CrossNetwork` -- DCN-v2's cross layers, full-rank or a mixture of low-rank experts;
* :class:`DotInteraction` -- DLRM's pairwise dot products;
* :class:`FieldGate` -- FinalMLP's context-free feature gating;
* :class:`BilinearFusion` -- FinalMLP's multi-head bilinear fusion of two streams;
* :class:`CompressedInteraction` -- xDeepFM's CIN;
* :class:`AttentionUnit` -- DIN's target attention over a behaviour sequence.

The floor (tests/test_layout.py): layers import nothing of des.models, des.strategies or des.data,
only TensorFlow and :class:`des.substitutions.ParamSpec`.
"""

from des.layers.attention import AttentionUnit
from des.layers.cross import CrossNetwork
from des.layers.fusion import BilinearFusion, FieldGate
from des.layers.interaction import CompressedInteraction, DotInteraction
from des.layers.mlp import ACTIVATIONS, DeepTower

__all__ = ["ACTIVATIONS", "AttentionUnit", "BilinearFusion", "CompressedInteraction", "CrossNetwork", "DeepTower", "DotInteraction",
           "FieldGate"]
