"""The extension point of the engine: a weight-rich operator written twice.

A :class:`Substitution` is one operator ``F(W, X)`` of a model (the DES paper, section 3.2, Algorithm
1) given in two forms:

* :meth:`Substitution.reference` -- the original operator on all fields' inputs and all weights,
  the textbook formula (what a single process, or a strategy that moves embeddings, computes);
* the split form -- :meth:`Substitution.local` computes the partial results ``M_j(W_i, X_i)`` of
  the fields one rank owns, ``width`` columns per sample; the engine sums them over the ranks
  (the collective ``⊕``, an AllReduce-sum) and :meth:`Substitution.combine` turns the sum into the
  operator's output: ``combine(Σ_i local(W_i, X_i)) == reference(W, X)`` (eq. 1 of the paper).

Inputs are per-field *pooled* embeddings: ``emb[b, j, :] = Σ_t x_t · v_t`` over the ids ``t`` of
field ``j`` in sample ``b`` (a one-hot field is just its id's row), for the value block the
substitution reads (``"linear"``, width 1, or ``"embedding"``, width ``k``). Weights other than the
embedding rows are *field parameters*: dense arrays whose leading axis is the field (e.g. the first
FC layer's block ``W_f`` of shape ``[k, H]``); each rank keeps only the slices of its own fields.

Because ``⊕`` is a sum, the gradient of the loss with respect to each rank's partials is the
gradient with respect to the reduced buffer, so back-propagation needs no communication
(section 3.2.2). :func:`des.substitutions.check_substitution` proves both properties for any
substitution.

**Dense features** (numbers a dataset's schema keeps as numbers, DeepCTR's ``DenseFeat``): an
operator that reads them (the linear term's ``x · w``, the first FC layer's ``x W_x``) declares
their weights in :meth:`Substitution.dense_params` and their part of the buffer in
:meth:`Substitution.local_dense`, which is added to the reduced partials before ``combine``:
``combine(Σ_i local(W_i, X_i) + local_dense(W_x, x)) == reference(W, X, x, W_x)``. It runs where
the rows are (the upper network's side): every rank reads its rows' numbers from the data, so they
never travel, and their weights are replicated with the top network's.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import tensorflow as tf


@dataclass(frozen=True)
class ParamSpec:
    """A dense weight's shape and initializer. As a field parameter of a substitution, ``shape`` is
    one field's slice and the whole weight is ``[num_fields, *shape]``.

    ``init`` is ``"glorot_uniform"`` (limit ``sqrt(6 / (fan_in + fan_out))``, the fans of the whole
    operator), ``"normal"`` (std ``scale``), ``"zeros"`` or ``"ones"``.
    """

    shape: tuple[int, ...]
    init: str = "glorot_uniform"
    fan_in: int = 1
    fan_out: int = 1
    scale: float = 0.01


FieldParam = ParamSpec  # the name used for field-sliced weights


def draw_param(spec: ParamSpec, seed: int, *key: object) -> np.ndarray:
    """Initial value of one weight (or one field's slice), float64, from a generator keyed by
    ``(seed, key...)`` only: never by the number of ranks, the placement or the call order."""
    rng = np.random.default_rng([seed, stable_id(*key)])
    if spec.init == "glorot_uniform":
        limit = np.sqrt(6.0 / (spec.fan_in + spec.fan_out))
        return rng.uniform(-limit, limit, size=spec.shape)
    if spec.init == "normal":
        return rng.normal(0.0, spec.scale, size=spec.shape)
    if spec.init == "zeros":
        return np.zeros(spec.shape)
    if spec.init == "ones":
        return np.ones(spec.shape)
    raise ValueError(f"unknown parameter initializer {spec.init!r}")


def closed_form_applies(cls: type) -> bool:
    """Whether ``cls.local_gradient`` was written for the ``local`` in effect: it is defined by the
    class that defines ``local`` or by a subclass of it."""
    def owner(name: str) -> type | None:
        return next((c for c in cls.__mro__ if name in vars(c)), None)

    local, gradient = owner("local"), owner("local_gradient")
    return gradient is not None and local is not None and issubclass(gradient, local)


def stable_id(*parts: object) -> int:
    """A 63-bit id of ``parts`` that is the same in every process and Python run."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class Substitution(ABC):
    """Base class of every substitution; subclasses set ``name`` and implement the four methods.

    Instances carry the operator's configuration (block read, sizes) and no state: weights live in
    the engine, so models stay free of distribution code.
    """

    #: registry name, e.g. ``"fm2"``
    name: ClassVar[str]
    #: the collective that joins the partials. Only ``"allreduce"`` (sum) exists today: the step
    #: packs every substitution into one buffer and reduces it once; the checker and the engine
    #: refuse anything else rather than summing it silently.
    collective: ClassVar[str] = "allreduce"
    #: ``--compute-dtype bfloat16`` may run :meth:`local` and :meth:`local_backward` in bf16 (on
    #: casts of the float32 embeddings and weights, results cast back): true for a matmul, whose
    #: bf16 kernels accumulate in float32; false (default) for sums of many terms or of squares
    #: (FM's eq. (6)), which bf16's 8-bit mantissa would swamp
    low_precision_local: ClassVar[bool] = False
    #: :meth:`local` and :meth:`local_backward` find the global indices of ``emb``'s fields (int32
    #: ``[F_i]``, in the order of ``emb``'s second axis) in ``params["field_indices"]``: for an
    #: operator that puts each field in columns of its own, as the concatenation of the embeddings
    #: does (:class:`~des.substitutions.embeddings.FieldEmbeddings`). Not a weight: never trained
    #: nor saved.
    reads_field_indices: ClassVar[bool] = False

    def __init__(self, block: str, dim: int, num_fields: int, num_dense: int = 0) -> None:
        self.block = block
        self.dim = dim
        self.num_fields = num_fields
        #: the number of dense features the data has (0: none)
        self.num_dense = num_dense

    @classmethod
    def example(cls, num_fields: int) -> "Substitution":
        """A small instance for the conformance checker; override when the constructor needs more
        than ``num_fields``."""
        return cls(num_fields=num_fields)  # type: ignore[call-arg]

    # -- sizes ------------------------------------------------------------------------------
    @property
    @abstractmethod
    def width(self) -> int:
        """Columns this substitution adds to the step buffer per sample (``S_M`` / 4 bytes)."""

    @property
    @abstractmethod
    def output_dim(self) -> int:
        """Columns of the operator's output per sample."""

    @property
    def colocated(self) -> list[tuple[int, ...]]:
        """Groups of fields ``local`` must see together on one rank (none by default): target
        attention's candidate and its items, which share a table and so are placed as one unit."""
        return []

    def field_params(self) -> dict[str, FieldParam]:
        """Dense weights sliced by field (none by default)."""
        return {}

    def dense_params(self) -> dict[str, ParamSpec]:
        """Weights of the dense features (whole, not sliced; replicated with the top network), when
        this operator reads them: none by default, and none when the data has no dense features."""
        return {}

    @property
    def reads_dense(self) -> bool:
        """Whether :meth:`local_dense` adds the dense features to the reduced partials: when the
        operator declares weights for them (:meth:`dense_params`), or overrides this (an operator
        that passes them on unweighted, as the concatenation of the inputs does)."""
        return bool(self.dense_params())

    # -- the two forms ----------------------------------------------------------------------
    @abstractmethod
    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """Partials of this rank's fields: ``emb [B, F_i, dim]``, ``params[p] [F_i, ...]`` ->
        ``[B, width]``. Must be a sum over fields, so partials of disjoint field sets add up."""

    def local_backward(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], grad: tf.Tensor
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """``∂L/∂emb`` and ``∂L/∂params`` of this rank's fields, given ``grad = ∂L/∂local [B, width]``
        (= ∂L/∂ of the reduced buffer, since ⊕ is a sum: section 3.2.2).

        Uses the substitution's closed form ``local_gradient(emb, params, grad)`` when it was written
        for the ``local`` in effect (defined by the class that defines ``local``, or a subclass: a
        subclass that changes ``local`` is never handed its parent's formula); otherwise differentiates :meth:`local`, which re-runs its
        forward. ``check_substitution`` compares the result with the reference operator's gradients."""
        if closed_form_applies(type(self)):
            return self.local_gradient(emb, params, grad)  # type: ignore[attr-defined]
        weights = {k: v for k, v in params.items() if k != "field_indices"}
        with tf.GradientTape() as tape:
            tape.watch([emb, *weights.values()])
            out = self.local(emb, params)
        grads = tape.gradient(out, [emb, *weights.values()], output_gradients=grad,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return grads[0], dict(zip(weights, grads[1:]))

    def local_dense(self, dense: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """The dense features' part of the buffer: ``dense [B, D]``, ``params`` of
        :meth:`dense_params` -> ``[B, width]``, added to the reduced partials before ``combine``.
        Only called when :attr:`reads_dense`."""
        raise NotImplementedError(f"{type(self).__name__} reads dense features but has no local_dense")

    @abstractmethod
    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        """The cheap ``F̃``: ``[B, width]`` summed over all ranks -> ``[B, output_dim]``."""

    @abstractmethod
    def reference(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor], dense: tf.Tensor | None = None,
                  dense_params: Mapping[str, tf.Tensor] | None = None) -> tf.Tensor:
        """The original operator on all fields: ``emb [B, F, dim]`` -> ``[B, output_dim]``; with the
        dense features ``dense [B, D]`` and their weights (``{}`` if none) when :attr:`reads_dense`
        (an operator that reads none may leave both arguments out of its signature)."""

    # -- helpers ----------------------------------------------------------------------------
    def init_field_params(
        self, seed: int, fields: Sequence[int], dtype: np.dtype | type = np.float32
    ) -> dict[str, np.ndarray]:
        """Initial values of the field parameters of ``fields`` (global field indices).

        Each field's slice is drawn from its own generator keyed by (seed, substitution, parameter,
        field), so a rank's slices are the same whatever the number of ranks or the placement.
        """
        out: dict[str, np.ndarray] = {}
        for pname, spec in self.field_params().items():
            slices = [draw_param(spec, seed, self.name, pname, int(f)) for f in fields]
            out[pname] = np.stack(slices).astype(dtype) if slices else np.zeros(
                (0,) + spec.shape, dtype=dtype
            )
        return out

    def init_dense_params(self, seed: int, dtype: np.dtype | type = np.float32) -> dict[str, np.ndarray]:
        """Initial values of :meth:`dense_params`, each from a generator keyed by (seed,
        substitution, parameter): the same on every rank."""
        return {pname: draw_param(spec, seed, self.name, "dense", pname).astype(dtype)
                for pname, spec in self.dense_params().items()}

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {"name": self.name, "block": self.block, "dim": self.dim, "width": self.width}
        if self.reads_dense:
            described["num_dense"] = self.num_dense
        return described

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block={self.block!r}, dim={self.dim}, width={self.width})"

