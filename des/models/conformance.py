"""``check_model``: the in-process conformance check of a model's declarations (no MPI), in the
spirit of scikit-learn's ``check_estimator``. The N-ranks-vs-1 training check is ``python -m
des.check``; this one is fast and says what is wrong with the declarations themselves:

1. ``blocks()``: at least one, unique names, positive widths, a known initializer;
2. ``substitutions()``: each a :class:`Substitution` of a registered class (so it passed
   ``check_substitution`` at registration), reading a declared block of matching width, conforming
   on this instance's sizes, with the one supported collective;
3. dense features: a model given some (``num_dense``) has a substitution that reads them;
4. ``top_params()`` / ``top()``: parameters drawn by name, and logits of shape ``[B]`` from the
   substitutions' outputs (combined from random partials) that depend on every output and are
   row-wise (logits of a subset of rows = that subset of the logits: the data-parallel upper
   network runs ``top`` on each rank's own rows).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from des.models.base import Model
from des.substitutions.base import Substitution, draw_param
from des.substitutions.conformance import check_substitution
from des.substitutions.registry import registered_substitutions

INITIALIZERS = ("zeros", "normal", "uniform", "truncated_normal")


class ModelConformanceError(AssertionError):
    """A model's declarations are not something the engine can train."""


@dataclass(frozen=True)
class ModelReport:
    name: str
    blocks: tuple[str, ...]
    substitutions: tuple[str, ...]
    buffer_width: int
    top_params: int

    def __str__(self) -> str:
        return (f"{self.name}: blocks {', '.join(self.blocks)}; substitutions {', '.join(self.substitutions)}; "
                f"buffer {self.buffer_width} floats/sample; {self.top_params} top weights: ok")


def small_instance(cls: type[Model], num_fields: int = 5, num_dense: int = 2) -> Model:
    """``cls`` with small sizes for the constructor arguments it accepts; with ``num_dense`` dense
    features when one of its substitutions reads them, else with none."""
    sizes = {"num_fields": num_fields, "embedding_dim": 3, "hidden": (6, 4), "num_dense": num_dense,
             "shared_tables": "1:0,2:0", "attention_hidden": (4,)}  # DIN: field 0 attends over 1 and 2
    accepted = inspect.signature(cls.__init__).parameters
    model = cls(**{k: v for k, v in sizes.items() if k in accepted})
    if getattr(model, "num_dense", 0) and not any(sub.reads_dense for sub in model.substitutions()):
        return small_instance(cls, num_fields, 0)  # a model for data without dense features
    return model


def check_model(model: type[Model] | Model, *, batch_size: int = 5, seed: int = 0) -> ModelReport:
    """Check ``model`` (a class, instantiated small, or an instance); raise
    :class:`ModelConformanceError` naming the first problem, or return a :class:`ModelReport`."""
    if isinstance(model, type):
        if not issubclass(model, Model):
            raise ModelConformanceError(f"{model!r} is not a des.models.Model subclass")
        model = small_instance(model)
    name = getattr(model, "name", None)
    if not isinstance(name, str) or not name:
        raise ModelConformanceError(f"{type(model).__name__} must set a class attribute `name`")
    dims = _check_blocks(model, name)
    subs = _check_substitutions(model, name, dims)
    specs = model.top_params()
    _check_top(model, name, subs, specs, batch_size, seed)
    return ModelReport(name, tuple(dims), tuple(s.name for s in subs), sum(s.width for s in subs),
                       int(sum(np.prod(s.shape) for s in specs.values())))


def _check_blocks(model: Model, name: str) -> dict[str, int]:
    """``blocks()``: at least one, unique names, positive widths, known initializers; name -> dim."""
    blocks = model.blocks()
    if not blocks:
        raise ModelConformanceError(f"{name}: blocks() declares no embedding block")
    names = [b.name for b in blocks]
    if len(set(names)) != len(names):
        raise ModelConformanceError(f"{name}: duplicate block names {names}")
    for b in blocks:
        if b.dim < 1 or b.init not in INITIALIZERS:
            raise ModelConformanceError(f"{name}: block {b.name!r} needs dim >= 1 and an init in {INITIALIZERS}")
    return {b.name: b.dim for b in blocks}


def _check_substitutions(model: Model, name: str, dims: dict[str, int]) -> list[Substitution]:
    """``substitutions()``: registered (so checked at registration), reading declared blocks of
    their width, of the model's fields and dense features, conforming at this size."""
    subs = model.substitutions()
    if not subs:
        raise ModelConformanceError(f"{name}: substitutions() declares none (the step buffer would be empty)")
    registry = registered_substitutions()
    for sub in subs:
        if not isinstance(sub, Substitution):
            raise ModelConformanceError(f"{name}: {sub!r} is not a Substitution")
        if registry.get(sub.name) is not type(sub):
            raise ModelConformanceError(f"{name}: substitution {sub.name!r} ({type(sub).__name__}) is not registered "
                                        "(register_substitution checks it first)")
        if sub.block not in dims or dims[sub.block] != sub.dim:
            raise ModelConformanceError(f"{name}: substitution {sub.name} reads block {sub.block!r} of dim {sub.dim}, "
                                        f"but the model declares {dims}")
        if sub.num_fields != model.num_fields:
            raise ModelConformanceError(f"{name}: substitution {sub.name} has {sub.num_fields} fields, "
                                        f"the model {model.num_fields}")
        if sub.reads_dense and sub.num_dense != model.num_dense:
            raise ModelConformanceError(f"{name}: substitution {sub.name} reads {sub.num_dense} dense features, "
                                        f"the model has {model.num_dense}")
        try:
            check_substitution(sub, rank_counts=(1, 2, 3))
        except (AssertionError, ValueError) as exc:
            raise ModelConformanceError(f"{name}: {exc}") from None
    if getattr(model, "num_dense", 0) and not any(sub.reads_dense for sub in subs):
        raise ModelConformanceError(f"{name}: the model has {model.num_dense} dense features but no substitution "
                                    "reads them (declare dense_params and local_dense, as FirstOrderLinear does)")
    return subs


def _check_top(model: Model, name: str, subs: list[Substitution], specs: dict[str, Any], batch_size: int,
               seed: int) -> None:
    """``top_params()`` / ``top()``: logits ``[B]`` from the substitutions' outputs (combined from
    random partials), depending on every output, row-wise."""
    rng = np.random.default_rng(seed)
    params = {k: tf.constant(draw_param(spec, seed, name, "top", k) + rng.normal(0, 0.1, spec.shape))
              for k, spec in specs.items()}
    unknown = sorted(set(model.regularized_params()) - set(specs))
    if unknown:
        raise ModelConformanceError(f"{name}: regularized_params() names unknown top parameters {unknown}")
    partials = [tf.constant(rng.normal(size=(batch_size, s.width))) for s in subs]
    with tf.GradientTape() as tape:
        tape.watch(partials)
        outputs = [s.combine(p) for s, p in zip(subs, partials)]
        for s, out in zip(subs, outputs):
            if tuple(out.shape) != (batch_size, s.output_dim):
                raise ModelConformanceError(f"{name}: {s.name}.combine gives {tuple(out.shape)}, "
                                            f"expected {(batch_size, s.output_dim)}")
        logits = model.top(params, outputs)
    if tuple(logits.shape) != (batch_size,):
        raise ModelConformanceError(f"{name}: top() gives logits of shape {tuple(logits.shape)}, expected ({batch_size},)")
    rows = np.sort(rng.choice(batch_size, size=max(1, batch_size // 2), replace=False))
    subset = model.top(params, [tf.gather(o, rows) for o in outputs])
    if not np.allclose(subset.numpy(), tf.gather(logits, rows).numpy(), rtol=1e-12, atol=1e-12):
        raise ModelConformanceError(f"{name}: top() is not row-wise: its logits on rows {rows.tolist()} differ from "
                                    "those rows of its logits on the whole batch (the data-parallel upper network "
                                    "runs it on each rank's rows)")
    grads = tape.gradient(logits, partials, unconnected_gradients=tf.UnconnectedGradients.NONE)
    unused = [s.name for s, g in zip(subs, grads) if g is None]
    if unused:
        raise ModelConformanceError(f"{name}: top() ignores the output of {', '.join(unused)}")


__all__ = ["ModelConformanceError", "ModelReport", "check_model", "small_instance"]
