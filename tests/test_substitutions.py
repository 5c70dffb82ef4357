"""The substitution contract: every built-in passes the conformance checker, the checker catches
substitutions that are not exact, and the registry takes user additions."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import tensorflow as tf

from des.errors import ConfigError
from des.substitutions import (
    FirstFC,
    FMOrder2,
    FirstOrderLinear,
    ParamSpec,
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


@pytest.mark.parametrize("cls", [_MissingHalf, _NotAdditive, _RankDependentInit])
def test_checker_rejects_inexact_substitutions(cls: type[Substitution]) -> None:
    with pytest.raises(SubstitutionConformanceError):
        check_substitution(cls)


class FieldBias(Substitution):
    """A per-field scalar bias ``Σ_f b_f`` held as a field parameter (a user addition)."""

    name = "field_bias"

    def __init__(self, num_fields: int, block: str = "linear") -> None:
        super().__init__(block=block, dim=1, num_fields=num_fields)

    @property
    def width(self) -> int:
        return 1

    @property
    def output_dim(self) -> int:
        return 1

    def field_params(self) -> dict[str, ParamSpec]:
        return {"bias": ParamSpec(shape=(1,), init="normal", scale=0.1)}

    def local(self, emb, params):
        batch = tf.shape(emb)[0]
        return tf.fill([batch, 1], tf.reduce_sum(params["bias"]))

    def combine(self, reduced):
        return reduced

    def reference(self, emb, params):
        return tf.ones([tf.shape(emb)[0], 1], emb.dtype) * tf.reduce_sum(params["bias"])


def test_registry_defaults_and_user_addition() -> None:
    assert [c.name for c in default_substitutions()] == ["linear", "fm2", "first_fc"]
    assert get_substitution("first_fc") is FirstFC
    with pytest.raises(ConfigError, match="unknown substitution 'nope'"):
        get_substitution("nope")
    register_substitution(FieldBias)
    try:
        assert registered_substitutions()["field_bias"] is FieldBias
        with pytest.raises(ValueError, match="already registered"):
            register_substitution(FieldBias)
    finally:
        unregister_substitution("field_bias")
    assert "field_bias" not in registered_substitutions()


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
