"""The conformance checker every substitution passes (in the spirit of scikit-learn's
``check_estimator``).

For random inputs and weights, with the fields split over 1..4 virtual ranks in random,
non-contiguous groups, it checks in float64:

1. shapes: each rank's partials are ``[B, width]``, the combined output is ``[B, output_dim]``;
2. forward: ``combine(Σ_i local_i) == reference(all fields)``, and ``combine`` is row-wise (its
   output on a subset of the rows is the subset of its output on all rows);
3. backward, the way the engine does it: ``G = ∂L/∂(reduced buffer)`` is handed to every rank
   unchanged and back-propagated through its own fields by ``local_backward`` (autodiff of
   ``local``, or the substitution's closed form); the gradients of every embedding and every field
   parameter equal those of the reference operator;
4. initialization: a rank's slices of the field parameters equal the slices of the whole, so they
   do not depend on the number of ranks or the placement;
5. dense features, when the substitution declares weights for them: ``local_dense`` is added to
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
    num_fields = sub.num_fields
    name = getattr(sub, "name", type(sub).__name__)
    if sub.collective != "allreduce":
        raise SubstitutionConformanceError(
            f"{name}: collective {sub.collective!r} is not supported; the step reduces every partial "
            "with one AllReduce-sum ('allreduce')")
    rng = np.random.default_rng(seed)

    emb = tf.constant(rng.normal(size=(batch_size, num_fields, sub.dim)))
    all_fields = list(range(num_fields))
    params_np = sub.init_field_params(seed, all_fields, np.float64)
    # Perturb so zero-initialized parameters still get a non-trivial test.
    params = {k: tf.constant(v + rng.normal(scale=0.1, size=v.shape)) for k, v in params_np.items()}
    upstream = tf.constant(rng.normal(size=(batch_size, sub.output_dim)))

    _check_init_slices(sub, seed, params_np, rng)
    dense_np = sub.init_dense_params(seed, np.float64)
    dense_params = {k: tf.constant(v + rng.normal(scale=0.1, size=v.shape)) for k, v in dense_np.items()}
    dense = tf.constant(rng.normal(size=(batch_size, sub.num_dense))) if dense_params else None
    dense_args = (dense, dense_params) if dense_params else ()

    with tf.GradientTape() as tape:
        tape.watch([emb, *params.values(), *dense_params.values()])
        reference = sub.reference(emb, params, *dense_args)
        objective = tf.reduce_sum(upstream * reference)
    _expect_shape(name, "reference", reference, (batch_size, sub.output_dim))
    ref_grads = tape.gradient(objective, [emb, *params.values(), *dense_params.values()], unconnected_gradients="zero")
    ref_grads, ref_dense_grads = ref_grads[: 1 + len(params)], ref_grads[1 + len(params):]

    checked = tuple(n for n in rank_counts if 1 <= n <= num_fields)  # a rank owns at least one field
    if not checked:
        raise ValueError(f"check_substitution: no rank count in {rank_counts} fits {num_fields} fields")
    forward_err = grad_err = 0.0
    for n in checked:
        groups = _random_partition(num_fields, n, rng)
        partials = []
        for group in groups:
            local = sub.local(tf.gather(emb, group, axis=1), _slice(params, group))
            _expect_shape(name, f"local (fields {group})", local, (batch_size, sub.width))
            partials.append(local)
        reduced = tf.add_n(partials)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([reduced, *dense_params.values()])
            summed = reduced + _local_dense(sub, name, dense, dense_params, batch_size) if dense_params else reduced
            output = sub.combine(summed)
            objective = tf.reduce_sum(upstream * output)
        _expect_shape(name, "combine", output, (batch_size, sub.output_dim))
        forward_err = max(forward_err, _compare(name, f"forward, {n} ranks", output, reference, rtol))
        # Row-wise: sample i's output depends on row i only (the data-parallel upper network
        # combines each rank's own row block, with the dense features of those rows).
        rows = np.sort(rng.choice(batch_size, size=max(1, batch_size // 2), replace=False))
        on_rows = tf.gather(reduced, rows)
        if dense_params:
            on_rows += sub.local_dense(tf.gather(dense, rows), dense_params)
        _compare(name, f"combine on rows {rows.tolist()} (combine must be row-wise"
                       f"{', and so must local_dense' if dense_params else ''})",
                 sub.combine(on_rows), tf.gather(output, rows), rtol)
        buffer_grad = tape.gradient(objective, reduced)
        for (key, g), ref in zip(zip(dense_params, tape.gradient(objective, list(dense_params.values()))),
                                 ref_dense_grads):
            grad_err = max(grad_err, _compare(name, f"gradient of the dense features' {key}, {n} ranks", g, ref, rtol))
        del tape

        emb_grad = np.zeros(emb.shape)
        param_grads = {k: np.zeros(v.shape) for k, v in params.items()}
        for group in groups:
            local_emb = tf.gather(emb, group, axis=1)
            local_params = _slice(params, group)
            local_emb_grad, local_param_grads = sub.local_backward(local_emb, local_params, buffer_grad)
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
        grad_err = max(grad_err, _compare(name, f"embedding gradient, {n} ranks", emb_grad, ref_grads[0], rtol))
        for (key, g), ref in zip(param_grads.items(), ref_grads[1:]):
            grad_err = max(grad_err, _compare(name, f"gradient of {key}, {n} ranks", g, ref, rtol))

    weights = (num_fields * sub.dim + sum(int(np.prod(v.shape)) for v in params_np.values())
               + sum(int(np.prod(v.shape)) for v in dense_np.values()))
    return ConformanceReport(name, sub.width, weights, forward_err, grad_err, checked)


def _local_dense(sub: Substitution, name: str, dense: tf.Tensor, params: dict[str, tf.Tensor],
                 batch_size: int) -> tf.Tensor:
    out = sub.local_dense(dense, params)
    _expect_shape(name, "local_dense", out, (batch_size, sub.width))
    return out


def _random_partition(num_fields: int, n: int, rng: np.random.Generator) -> list[list[int]]:
    """``n`` non-empty, non-contiguous, shuffled groups of field indices."""
    order = rng.permutation(num_fields)
    owners = np.concatenate([np.arange(n), rng.integers(0, n, size=num_fields - n)])
    return [sorted(order[owners == r].tolist(), reverse=bool(r % 2)) for r in range(n)]


def _slice(params: dict[str, tf.Tensor], group: list[int]) -> dict[str, tf.Tensor]:
    return {k: tf.gather(v, group, axis=0) for k, v in params.items()}


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
