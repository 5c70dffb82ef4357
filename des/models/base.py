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

from des.layers import DeepTower
from des.substitutions.base import ParamSpec, Substitution

__all__ = ["CRITEO_NUM_FIELDS", "DeepTower", "EmbeddingBlock", "EmbeddingModel", "Model", "ModelDefaults"]

CRITEO_NUM_FIELDS = 39

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
