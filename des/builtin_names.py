"""The built-in models and strategies by name, readable without importing them: the command
line's help and checks list them before TensorFlow is loaded, and the registries
(``des.models``, ``des.strategies``) import the classes on first use.
"""

from __future__ import annotations

#: ``--model`` values of the built-in models (``des.models.default_models``, in that order)
MODELS = ("lr", "fm", "wdl", "deepfm", "dcnv2", "dlrm", "finalmlp", "xdeepfm", "din")

#: ``--strategy`` value -> (module, class) of the built-in strategies, in this order
STRATEGIES = {"des": ("des.strategies.des", "DES"), "alltoall": ("des.strategies.alltoall", "AllToAll"),
              "ps": ("des.strategies.ps", "ParameterServer"), "persia": ("des.strategies.persia", "Persia"),
              "hierarchical": ("des.strategies.hierarchical", "Hierarchical")}


def default_strategy_names() -> tuple[str, ...]:
    """The built-in strategies' names (without importing them)."""
    return tuple(STRATEGIES)
