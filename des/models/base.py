"""What a model is, for the engine: embedding blocks, substitutions, and a replicated top network.

A model file declares

* :meth:`Model.blocks` -- the value blocks every field's hash table keeps per id (e.g. a 1-wide
  ``"linear"`` weight and a ``k``-wide ``"embedding"``), with their initializers;
* :meth:`Model.substitutions` -- the weight-rich operators, in the order their partials are packed
  into the step buffer;
* :meth:`Model.top_params` and :meth:`Model.top` -- the small network that runs, replicated, on the
  combined outputs of the substitutions and produces one logit per sample;
* :attr:`Model.defaults` -- what ``auto`` means for its options (:class:`ModelDefaults`): a
  subclass inherits its parent's or declares its own.

There is no MPI, no hash table and no optimizer here: the same model runs under any strategy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import tensorflow as tf

from des.substitutions.base import ParamSpec, Substitution

CRITEO_NUM_FIELDS = 39

_ACTIVATIONS = {"relu": tf.nn.relu, "tanh": tf.tanh, "sigmoid": tf.sigmoid, "linear": tf.identity}


@dataclass(frozen=True)
class ModelDefaults:
    """What ``auto`` means for a model's training options (``des.train --help``), chosen on the
    shipped sample's validation split (``scripts/select_defaults.py``). These are those of W&D,
    DeepFM and user models; LR and FM declare their own, a user model may too (``defaults =
    dataclasses.replace(Model.defaults, l2_embedding=0.001)``)."""

    #: ``--linear-optimizer`` (the order-1 weights)
    linear_optimizer: str = "ftrl:alpha=0.05,beta=1.0,l1=0.0,l2=0.0"
    #: ``--embedding-optimizer`` (``catchup=1``: TensorFlow's dense Adam semantics)
    embedding_optimizer: str = "adam:lr=0.001,catchup=1"
    #: ``--l2-embedding``
    l2_embedding: float = 0.0
    #: ``--unadmitted`` (and so ``--min-count``: 2 with ``shared``, else 1)
    unadmitted: str = "shared"
    #: ``--early-stop`` of a run by ``--epochs`` on data with validation rows (0: off; 6 chosen on
    #: validation over the Criteo sample, Avazu and MovieLens: scripts/select_patience.py)
    early_stop: int = 6

    def __post_init__(self) -> None:
        if self.unadmitted not in ("init", "zero", "shared"):
            raise ValueError(f"ModelDefaults.unadmitted must be init, zero or shared, got {self.unadmitted!r}")
        if self.l2_embedding < 0 or self.early_stop < 0:
            raise ValueError("ModelDefaults.l2_embedding and early_stop must not be negative")


@dataclass(frozen=True)
class EmbeddingBlock:
    """One value block of the per-field tables: ``dim`` floats per id, initialized by ``init``
    (``zeros``, ``normal``, ``uniform`` or ``truncated_normal``) with ``scale``."""

    name: str
    dim: int
    init: str = "normal"
    scale: float = 0.01


class Model(ABC):
    """Base class of LR, FM, W&D, DeepFM and user models."""

    name: ClassVar[str]
    #: what ``auto`` means for this model's options
    defaults: ClassVar[ModelDefaults] = ModelDefaults()

    def __init__(self, num_fields: int = CRITEO_NUM_FIELDS, l2_embedding: float = 0.0, l2_dense: float = 0.0,
                 num_dense: int = 0) -> None:
        self.num_fields = num_fields
        self.l2_embedding = l2_embedding
        self.l2_dense = l2_dense
        #: dense (numeric) features per sample, read by the substitutions that declare weights for
        #: them (the linear term and the first FC layer: DeepCTR's ``DenseFeat``)
        self.num_dense = num_dense

    @abstractmethod
    def blocks(self) -> list[EmbeddingBlock]:
        """Value blocks kept per id."""

    @abstractmethod
    def substitutions(self) -> list[Substitution]:
        """Weight-rich operators; their partials fill the step buffer in this order."""

    def top_params(self) -> dict[str, ParamSpec]:
        """Replicated dense parameters of the top network."""
        return {"bias": ParamSpec(shape=(1,), init="zeros")}

    @abstractmethod
    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        """Logits ``[B]`` from the substitutions' outputs (same order as :meth:`substitutions`)."""

    def regularized_params(self) -> list[str]:
        """Top parameters that ``l2_dense`` applies to (kernels, not biases)."""
        return [name for name in self.top_params() if "kernel" in name]

    def config(self) -> dict[str, Any]:
        """Constructor arguments, for run folders and checkpoints."""
        return {"model": self.name, **self._hyper}

    @property
    def _hyper(self) -> dict[str, Any]:
        hyper: dict[str, Any] = {
            "num_fields": self.num_fields,
            "l2_embedding": self.l2_embedding,
            "l2_dense": self.l2_dense,
        }
        if self.num_dense:  # recorded only when there are some: configs of data without any stay as they were
            hyper["num_dense"] = self.num_dense
        return hyper

    def describe(self) -> dict[str, Any]:
        return {
            **self.config(),
            "blocks": [asdict(b) for b in self.blocks()],
            "substitutions": [s.describe() for s in self.substitutions()],
            "buffer_width": sum(s.width for s in self.substitutions()),
        }


class EmbeddingModel(Model):
    """A model with a first-order ``"linear"`` block and a ``k``-wide ``"embedding"`` block per id."""

    def __init__(
        self,
        num_fields: int = CRITEO_NUM_FIELDS,
        embedding_dim: int = 8,
        init_scale: float = 0.01,
        l2_embedding: float = 0.0,
        l2_dense: float = 0.0,
        num_dense: int = 0,
    ) -> None:
        super().__init__(num_fields, l2_embedding, l2_dense, num_dense)
        self.embedding_dim = embedding_dim
        self.init_scale = init_scale

    @property
    def _hyper(self) -> dict[str, Any]:
        return {**super()._hyper, "embedding_dim": self.embedding_dim, "init_scale": self.init_scale}

    def blocks(self) -> list[EmbeddingBlock]:
        return [
            EmbeddingBlock("linear", 1, init="zeros"),
            EmbeddingBlock("embedding", self.embedding_dim, init="normal", scale=self.init_scale),
        ]


class DeepTower:
    """A stack of dense layers, ``act(h W_i + b_i)`` over ``hidden``, then ``output_units`` linear
    units (1: the logit, returned as ``[B]``; 0: none, the last hidden activations are returned).

    By default its first layer's product ``h = x W_0`` comes from outside (the substituted first FC
    layer: W&D, DeepFM, DCN-v2's parallel tower), so it starts at ``act(h + b_0)``; with
    ``input_dim`` it holds ``W_0`` itself and is called on its input (DLRM's two MLPs, DCN-v2's
    stacked tower). Weights are named ``{prefix}_kernel_i`` and ``{prefix}_bias_i``."""

    def __init__(self, hidden: Sequence[int], activation: str = "relu", *, input_dim: int | None = None,
                 output_units: int = 1, prefix: str = "deep") -> None:
        if not hidden:
            raise ValueError("the deep tower needs at least one hidden layer (the first FC layer)")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r} (known: {', '.join(_ACTIVATIONS)})")
        if output_units not in (0, 1):
            raise ValueError(f"output_units must be 0 or 1, got {output_units}")
        self.hidden = tuple(int(h) for h in hidden)
        self.activation = activation
        self.input_dim = input_dim
        self.output_units = output_units
        self.prefix = prefix

    @property
    def output_dim(self) -> int:
        """Columns of what a call returns (before the logit's squeeze)."""
        return self.output_units or self.hidden[-1]

    def params(self) -> dict[str, ParamSpec]:
        kernel, bias = f"{self.prefix}_kernel_", f"{self.prefix}_bias_"
        specs = {}
        if self.input_dim is not None:
            specs[kernel + "0"] = ParamSpec((self.input_dim, self.hidden[0]), "glorot_uniform", self.input_dim,
                                            self.hidden[0])
        specs[bias + "0"] = ParamSpec(shape=(self.hidden[0],), init="zeros")
        sizes = list(self.hidden) + ([1] if self.output_units else [])
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
            specs[f"{kernel}{i}"] = ParamSpec((fan_in, fan_out), "glorot_uniform", fan_in, fan_out)
            specs[f"{bias}{i}"] = ParamSpec((fan_out,), init="zeros")
        return specs

    def __call__(self, params: Mapping[str, tf.Tensor], first_layer: tf.Tensor) -> tf.Tensor:
        """``first_layer``: ``x W_0`` (``[B, hidden[0]]``), or with ``input_dim`` the input ``x``."""
        act = _ACTIVATIONS[self.activation]
        kernel, bias = f"{self.prefix}_kernel_", f"{self.prefix}_bias_"
        if self.input_dim is not None:
            first_layer = tf.matmul(first_layer, params[kernel + "0"])
        h = act(first_layer + params[bias + "0"])
        depth = len(self.hidden)
        for i in range(1, depth):
            h = act(tf.matmul(h, params[f"{kernel}{i}"]) + params[f"{bias}{i}"])
        if not self.output_units:
            return h
        return (tf.matmul(h, params[f"{kernel}{depth}"]) + params[f"{bias}{depth}"])[:, 0]
