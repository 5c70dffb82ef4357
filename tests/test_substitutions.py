"""The substitution contract: every built-in passes the conformance checker, the checker catches
substitutions that are not exact, and the registry takes user additions."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO

from des.errors import ConfigError
from des.models import get_model
from des.plugins import load_plugins
from des.substitutions import (
    FirstFC,
    FMOrder2,
    FieldEmbeddings,
    FirstOrderLinear,
    Substitution,
    SubstitutionConformanceError,
    check_substitution,
    default_substitutions,
    get_substitution,
    register_substitution,
    registered_substitutions,
    unregister_substitution,
)


@pytest.mark.parametrize("cls", default_substitutions(), ids=lambda c: c.name)
def test_builtins_conform(cls: type[Substitution]) -> None:
    report = check_substitution(cls, num_fields=9, batch_size=7)
    assert report.max_forward_error < 1e-12
    assert report.max_gradient_error < 1e-12
    if cls is FieldEmbeddings:  # its partials are its inputs, the dense features after them
        assert report.width == report.weights_per_sample + cls.example(9).num_dense
        return
    # The partial result is far smaller than the weights a sample touches.
    assert report.width < report.weights_per_sample


def test_builtin_widths_match_the_paper() -> None:
    # LR: one scalar; FM(2): the k-vector and a scalar; first FC: H columns.
    assert FirstOrderLinear(39).width == 1
    assert FMOrder2(39, dim=8).width == 9
    assert FirstFC(39, dim=8, units=400).width == 400


def test_fm_pairwise_on_a_hand_example() -> None:
    emb = tf.constant([[[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]]], dtype=tf.float64)  # 1 sample, 3 fields
    # <e0,e1> + <e0,e2> + <e1,e2> = 2 + 0 + 3 = 5
    sub = FMOrder2(3, dim=2)
    assert float(sub.reference(emb, {})[0, 0]) == pytest.approx(5.0)
    assert float(sub.combine(sub.local(emb, {}))[0, 0]) == pytest.approx(5.0)


class _MissingHalf(FMOrder2):
    """FM(2) that forgets the ½ of eq. (6): must be rejected."""

    name = "broken_fm2"

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        return 2.0 * super().combine(reduced)


class _NotAdditive(FirstOrderLinear):
    """A 'local' that is not a sum over fields (a max): correct on 1 rank, wrong on several."""

    name = "broken_max"

    def local(self, emb: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return tf.reduce_max(emb[:, :, 0], axis=1, keepdims=True) * tf.cast(tf.shape(emb)[1], emb.dtype)

    def reference(self, emb, params):
        return self.local(emb, params)


class _RankDependentInit(FirstFC):
    """Draws field slices from a generator not keyed by field: differs by placement."""

    name = "broken_init"

    def init_field_params(self, seed, fields, dtype=np.float32):
        rng = np.random.default_rng(seed)
        return {"kernel": rng.normal(size=(len(fields), self.dim, self.units)).astype(dtype)}


class _BatchCentred(FirstOrderLinear):
    """Exact, but its combine centres over the batch: sample i's output depends on other rows, so
    it cannot run on each rank's row block (the data-parallel upper network)."""

    name = "broken_rowwise"

    def combine(self, reduced: tf.Tensor) -> tf.Tensor:
        return reduced - tf.reduce_mean(reduced, axis=0, keepdims=True)

    def reference(self, emb, params):
        return self.combine(super().reference(emb, params))


@pytest.mark.parametrize("cls", [_MissingHalf, _NotAdditive, _RankDependentInit])
def test_checker_rejects_inexact_substitutions(cls: type[Substitution]) -> None:
    with pytest.raises(SubstitutionConformanceError):
        check_substitution(cls)


def test_checker_rejects_a_combine_that_is_not_row_wise() -> None:
    with pytest.raises(SubstitutionConformanceError, match="combine must be row-wise"):
        check_substitution(_BatchCentred)


class _AllGatherPartials(FirstOrderLinear):
    """Asks for a collective the step does not have: must be refused, not summed silently."""

    name = "broken_allgather"
    collective = "allgather"


def test_checker_refuses_an_unsupported_collective() -> None:
    with pytest.raises(SubstitutionConformanceError, match="collective 'allgather' is not supported"):
        check_substitution(_AllGatherPartials)


def test_report_names_the_rank_counts_actually_checked() -> None:
    assert check_substitution(FirstFC, num_fields=2).rank_counts == (1, 2)
    with pytest.raises(ValueError, match="no rank count"):
        check_substitution(FirstFC, num_fields=2, rank_counts=(3, 4))


def test_registry_defaults_and_user_addition() -> None:
    assert [c.name for c in default_substitutions()] == ["linear", "fm2", "first_fc", "embeddings", "field_subset",
                                                         "target_attention", "uncombined"]
    assert get_substitution("first_fc") is FirstFC
    with pytest.raises(ConfigError, match="unknown substitution 'nope'"):
        get_substitution("nope")
    # docs/models.md's example, defined outside the package, registers itself when imported.
    load_plugins(str(REPO / "examples" / "field_weighted_lr.py"))
    try:
        added = registered_substitutions()["field_weighted_linear"]
        assert added.__module__ == "des_plugin_field_weighted_lr"
        # it subclasses the linear term with a new ``local``: it gets autodiff, not the parent's
        # closed-form gradient (which ignores its importance weights)
        report = check_substitution(added)
        assert report.width == 1 and report.max_gradient_error < 1e-12
        with pytest.raises(ValueError, match="already registered"):
            register_substitution(added)
        assert get_model("fwlr").__name__ == "FieldWeightedLR"
    finally:
        unregister_substitution("field_weighted_linear")
    assert "field_weighted_linear" not in registered_substitutions()
    # the plugin module stays imported (a later load_plugins does not run it again): registered
    # again, as the rest of the test process found it
    register_substitution(added, check=False)


def test_registry_refuses_an_inexact_substitution() -> None:
    with pytest.raises(SubstitutionConformanceError):
        register_substitution(_MissingHalf)
    assert "broken_fm2" not in registered_substitutions()


def test_field_param_init_is_placement_independent() -> None:
    sub = FirstFC(10, dim=4, units=6)
    whole = sub.init_field_params(7, list(range(10)), np.float64)["kernel"]
    part = sub.init_field_params(7, [9, 2, 5], np.float64)["kernel"]
    np.testing.assert_array_equal(part, whole[[9, 2, 5]])
    limit = np.sqrt(6.0 / (10 * 4 + 6))
    assert np.abs(whole).max() <= limit


class _WrongClosedForm(FirstFC):
    """Its own closed-form gradient is off by a factor: the checker must catch it."""

    name = "broken_gradient"

    def local_gradient(self, emb, params, grad):
        emb_grad, grads = super().local_gradient(emb, params, grad)
        return 1.5 * emb_grad, grads


def test_checker_rejects_a_wrong_closed_form_gradient() -> None:
    with pytest.raises(SubstitutionConformanceError, match="embedding gradient"):
        check_substitution(_WrongClosedForm)


# target attention's gradient needs its scores, a function of the items: autodiff re-runs its forward
@pytest.mark.parametrize("cls", [c for c in default_substitutions() if c.name != "target_attention"],
                         ids=lambda c: c.name)
def test_builtins_backpropagate_without_recomputing_the_forward(cls: type[Substitution]) -> None:
    """The local backward of a built-in never calls ``local`` (its closed form), and equals autodiff."""
    sub = cls.example(5)
    rng = np.random.default_rng(0)
    emb = tf.constant(rng.normal(size=(4, 3, sub.dim)))
    weights = {k: tf.constant(v) for k, v in sub.init_field_params(0, [0, 2, 4], np.float64).items()}
    params = {**weights, "field_indices": tf.constant([0, 2, 4])} if sub.reads_field_indices else weights
    grad = tf.constant(rng.normal(size=(4, sub.width)))
    with tf.GradientTape() as tape:
        tape.watch([emb, *weights.values()])
        out = sub.local(emb, params)
    expected = tape.gradient(out, [emb, *weights.values()], output_gradients=grad, unconnected_gradients="zero")

    def forbidden(*args):
        raise AssertionError("local_backward re-ran the forward")

    sub.local = forbidden  # an instance attribute: the class's closed form must not need it
    emb_grad, param_grads = sub.local_backward(emb, params, grad)
    np.testing.assert_allclose(emb_grad.numpy(), expected[0].numpy(), rtol=1e-12)
    for (name, g), e in zip(param_grads.items(), expected[1:]):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12, err_msg=name)

