"""The conformance checker every substitution passes (in the spirit of scikit-learn's
``check_estimator``).

For random inputs and weights, with the fields split over 1..4 virtual ranks in random,
non-contiguous groups (the fields a substitution needs together, :attr:`Substitution.colocated`,
kept together), it checks in float64:

1. shapes: each rank's partials are ``[B, width]``, the combined output is ``[B, output_dim]``;
2. forward: ``combine(Σ_i local_i) == reference(all fields)``, and ``combine`` is row-wise (its
   output on a subset of the rows is the subset of its output on all rows);
3. backward, the way the engine does it: ``G = ∂L/∂(reduced buffer)`` is handed to every rank
   unchanged and back-propagated through its own fields by ``local_backward`` (autodiff of
   ``local``, or the substitution's closed form); the gradients of every embedding and every field
   parameter equal those of the reference operator;
4. initialization: a rank's slices of the field parameters equal the slices of the whole, so they
   do not depend on the number of ranks or the placement;
5. dense features, when the substitution reads them (:attr:`Substitution.reads_dense`): ``local_dense`` is added to
   the reduced partials before ``combine`` on each row block (it is row-wise), and the forward and
   the gradients of those weights equal the reference operator's.

It returns a :class:`ConformanceReport` with the partial width next to the weights a sample touches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from des.substitutions.base import Substitution


class SubstitutionConformanceError(AssertionError):
    """A substitution's split form does not reproduce its reference operator."""


@dataclass(frozen=True)
class ConformanceReport:
    name: str
    width: int
    weights_per_sample: int
    max_forward_error: float
    max_gradient_error: float
    rank_counts: tuple[int, ...]

    def __str__(self) -> str:
        return (
            f"{self.name}: width {self.width} per sample vs {self.weights_per_sample} weights touched;"
            f" max |Δ| forward {self.max_forward_error:.2e}, gradients {self.max_gradient_error:.2e}"
            f" over {self.rank_counts} ranks"
        )


def check_substitution(
    substitution: Substitution | type[Substitution],
    *,
    num_fields: int = 7,
    batch_size: int = 6,
    rank_counts: tuple[int, ...] = (1, 2, 3, 4),
    seed: int = 0,
    rtol: float = 1e-9,
) -> ConformanceReport:
    """Check that ``substitution`` (an instance, or a class built with ``cls.example``) is exact."""
    sub = substitution.example(num_fields) if isinstance(substitution, type) else substitution
    name = getattr(sub, "name", type(sub).__name__)
    if sub.collective != "allreduce":
        raise SubstitutionConformanceError(
            f"{name}: collective {sub.collective!r} is not supported; the step reduces every partial "
            "with one AllReduce-sum ('allreduce')")
    rng = np.random.default_rng(seed)
    probe = _Probe.draw(sub, name, batch_size, seed, rng, rtol)
    units = _units(sub)
    checked = tuple(n for n in rank_counts if 1 <= n <= len(units))  # a rank owns at least one field
    if not checked:
        raise ValueError(f"check_substitution: no rank count in {rank_counts} fits {sub.num_fields} fields")
    forward_err = grad_err = 0.0
    for n in checked:
        groups = [sorted((f for u in group for f in units[u]), reverse=bool(r % 2))
                  for r, group in enumerate(_random_partition(len(units), n, rng))]
        buffer_grad, err, dense_err = probe.forward(groups, rng)
        forward_err, grad_err = max(forward_err, err), max(grad_err, dense_err, probe.backward(groups, buffer_grad))
    return ConformanceReport(name, sub.width, probe.weights, forward_err, grad_err, checked)


@dataclass
class _Probe:
    """Random inputs and weights of one substitution, its reference operator's output and gradients
    (float64), and the checks of its split form against them on a partition of the fields."""

    sub: Substitution
    name: str
    rtol: float
    emb: tf.Tensor
    params: dict[str, tf.Tensor]
    dense: tf.Tensor | None
    dense_params: dict[str, tf.Tensor]
    upstream: tf.Tensor
    reference: tf.Tensor = None
    ref_grads: list = None
    ref_dense_grads: list = None
    weights: int = 0

    @classmethod
    def draw(cls, sub: Substitution, name: str, batch_size: int, seed: int, rng: np.random.Generator,
             rtol: float) -> "_Probe":
        params_np = sub.init_field_params(seed, list(range(sub.num_fields)), np.float64)
        _check_init_slices(sub, seed, params_np, rng)
        dense_np = sub.init_dense_params(seed, np.float64)
        # Perturbed so zero-initialized parameters still get a non-trivial test.
        perturbed = lambda arrays: {k: tf.constant(v + rng.normal(scale=0.1, size=v.shape))  # noqa: E731
                                    for k, v in arrays.items()}
        emb = tf.constant(rng.normal(size=(batch_size, sub.num_fields, sub.dim)))
        params, dense_params = perturbed(params_np), perturbed(dense_np)
        upstream = tf.constant(rng.normal(size=(batch_size, sub.output_dim)))
        dense = tf.constant(rng.normal(size=(batch_size, sub.num_dense))) if sub.reads_dense else None
        probe = cls(sub, name, rtol, emb, params, dense, dense_params, upstream)
        probe.weights = sum(int(np.prod(v.shape)) for v in (*params_np.values(), *dense_np.values()))
        probe.weights += sub.num_fields * sub.dim
        probe._reference()
        return probe

    @property
    def batch_size(self) -> int:
        return int(self.emb.shape[0])

    def _reference(self) -> None:
        """The reference operator's output and its gradients (embeddings, field and dense weights)."""
        watched = [self.emb, *self.params.values(), *self.dense_params.values()]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            dense_args = (self.dense, self.dense_params) if self.sub.reads_dense else ()
            self.reference = self.sub.reference(self.emb, self.params, *dense_args)
            objective = tf.reduce_sum(self.upstream * self.reference)
        _expect_shape(self.name, "reference", self.reference, (self.batch_size, self.sub.output_dim))
        grads = tape.gradient(objective, watched, unconnected_gradients="zero")
        self.ref_grads, self.ref_dense_grads = grads[: 1 + len(self.params)], grads[1 + len(self.params):]

    def forward(self, groups: list[list[int]], rng: np.random.Generator) -> tuple[tf.Tensor, float, float]:
        """``combine(Σ local + local_dense)`` against the reference, row-wise; returns ``G`` (the
        gradient of the reduced buffer), the forward error and the dense weights' gradient error."""
        sub, name, n, size = self.sub, self.name, len(groups), self.batch_size
        partials = []
        for group in groups:
            local = sub.local(tf.gather(self.emb, group, axis=1), _local_params(sub, self.params, group))
            _expect_shape(name, f"local (fields {group})", local, (size, sub.width))
            partials.append(local)
        reduced = tf.add_n(partials)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([reduced, *self.dense_params.values()])
            summed = reduced + _local_dense(sub, name, self.dense, self.dense_params, size) if sub.reads_dense \
                else reduced
            output = sub.combine(summed)
            objective = tf.reduce_sum(self.upstream * output)
        _expect_shape(name, "combine", output, (size, sub.output_dim))
        forward_err = _compare(name, f"forward, {n} ranks", output, self.reference, self.rtol)
        # Row-wise: sample i's output depends on row i only (the data-parallel upper network
        # combines each rank's own row block, with the dense features of those rows).
        rows = np.sort(rng.choice(size, size=max(1, size // 2), replace=False))
        on_rows = tf.gather(reduced, rows)
        if sub.reads_dense:
            on_rows += sub.local_dense(tf.gather(self.dense, rows), self.dense_params)
        _compare(name, f"combine on rows {rows.tolist()} (combine must be row-wise"
                       f"{', and so must local_dense' if sub.reads_dense else ''})",
                 sub.combine(on_rows), tf.gather(output, rows), self.rtol)
        buffer_grad = tape.gradient(objective, reduced)
        dense_err = 0.0
        for (key, g), ref in zip(zip(self.dense_params, tape.gradient(objective, list(self.dense_params.values()))),
                                 self.ref_dense_grads):
            dense_err = max(dense_err, _compare(name, f"gradient of the dense features' {key}, {n} ranks", g, ref,
                                                self.rtol))
        del tape
        return buffer_grad, forward_err, dense_err

    def backward(self, groups: list[list[int]], buffer_grad: tf.Tensor) -> float:
        """``G`` back through each group's ``local_backward``, against the reference's gradients."""
        sub, name, n = self.sub, self.name, len(groups)
        emb_grad = np.zeros(self.emb.shape)
        param_grads = {k: np.zeros(v.shape) for k, v in self.params.items()}
        for group in groups:
            local_emb, local_params = tf.gather(self.emb, group, axis=1), _slice(self.params, group)
            local_emb_grad, local_param_grads = sub.local_backward(
                local_emb, _local_params(sub, self.params, group), buffer_grad)
            _expect_shape(name, f"local_backward's embedding gradient (fields {group})", local_emb_grad,
                          tuple(local_emb.shape))
            if set(local_param_grads) != set(local_params):
                raise SubstitutionConformanceError(
                    f"{name}: local_backward returns gradients of {sorted(local_param_grads)}, "
                    f"expected {sorted(local_params)}")
            emb_grad[:, group] = local_emb_grad.numpy()
            for key, g in local_param_grads.items():
                _expect_shape(name, f"local_backward's gradient of {key} (fields {group})", g,
                              tuple(local_params[key].shape))
                param_grads[key][group] = g.numpy()
        err = _compare(name, f"embedding gradient, {n} ranks", emb_grad, self.ref_grads[0], self.rtol)
        for (key, g), ref in zip(param_grads.items(), self.ref_grads[1:]):
            err = max(err, _compare(name, f"gradient of {key}, {n} ranks", g, ref, self.rtol))
        return err


def _local_dense(sub: Substitution, name: str, dense: tf.Tensor, params: dict[str, tf.Tensor],
                 batch_size: int) -> tf.Tensor:
    out = sub.local_dense(dense, params)
    _expect_shape(name, "local_dense", out, (batch_size, sub.width))
    return out


def _units(sub: Substitution) -> list[tuple[int, ...]]:
    """The fields as placed: each colocated group (:attr:`Substitution.colocated`) one unit, every
    other field its own."""
    together = [tuple(g) for g in sub.colocated]
    grouped = {f for g in together for f in g}
    return together + [(f,) for f in range(sub.num_fields) if f not in grouped]


def _random_partition(num_fields: int, n: int, rng: np.random.Generator) -> list[list[int]]:
    """``n`` non-empty, non-contiguous, shuffled groups of field indices."""
    order = rng.permutation(num_fields)
    owners = np.concatenate([np.arange(n), rng.integers(0, n, size=num_fields - n)])
    return [sorted(order[owners == r].tolist(), reverse=bool(r % 2)) for r in range(n)]


def _slice(params: dict[str, tf.Tensor], group: list[int]) -> dict[str, tf.Tensor]:
    return {k: tf.gather(v, group, axis=0) for k, v in params.items()}


def _local_params(sub: Substitution, params: dict[str, tf.Tensor], group: list[int]) -> dict[str, tf.Tensor]:
    """What a rank owning ``group`` hands ``local``: its slices and, to an operator that reads
    them, its fields' global indices."""
    local = _slice(params, group)
    if sub.reads_field_indices:
        local["field_indices"] = tf.constant(group, dtype=tf.int32)
    return local


def _check_init_slices(
    sub: Substitution, seed: int, whole: dict[str, np.ndarray], rng: np.random.Generator
) -> None:
    subset = sorted(rng.choice(sub.num_fields, size=max(1, sub.num_fields // 2), replace=False).tolist())
    part = sub.init_field_params(seed, subset, np.float64)
    for key, value in part.items():
        if not np.array_equal(value, whole[key][subset]):
            raise SubstitutionConformanceError(
                f"{sub.name}: initial {key} of fields {subset} differs from the slice of the whole"
            )


def _expect_shape(name: str, what: str, tensor: tf.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise SubstitutionConformanceError(f"{name}: {what} has shape {tuple(tensor.shape)}, expected {shape}")


def _compare(name: str, what: str, got, expected, rtol: float) -> float:
    got, expected = np.asarray(got), np.asarray(expected)
    err = float(np.max(np.abs(got - expected))) if got.size else 0.0
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    if not np.isfinite(err) or err > rtol * max(scale, 1.0):
        raise SubstitutionConformanceError(
            f"{name}: {what} differs from the reference by {err:.3e} (scale {scale:.3e})"
        )
    return err
