"""Dense features (numbers the data keeps as numbers, DeepCTR's ``DenseFeat``): the linear term's
``x · w_x`` and the first FC layer's ``x W_x``, added to the reduced partials where the rows are.
The N-vs-1 exactness with dense features is in ``tests/test_exactness.py`` (the synthetic data)."""

from __future__ import annotations

from collections.abc import Mapping
import numpy as np
import pytest
import tensorflow as tf

from des.errors import ConfigError
from des.models.base import EmbeddingBlock, Model
from des.substitutions import FirstFC, FirstOrderLinear, FMOrder2, Substitution, check_substitution
from des.substitutions.conformance import SubstitutionConformanceError


class _HalfDenseLinear(FirstOrderLinear):
    """A linear term whose dense part is not what its reference says."""

    name = "half_dense_linear"

    def local_dense(self, dense: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return 0.5 * super().local_dense(dense, params)


class _RowMixingFC(FirstFC):
    """A first layer whose dense part mixes rows (the data-parallel upper network could not run it)."""

    name = "row_mixing_fc"

    def local_dense(self, dense: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
        out = super().local_dense(dense, params)
        return out - tf.reduce_mean(out, axis=0, keepdims=True) + tf.reduce_mean(out)

    def reference(self, emb, params, dense=None, dense_params=None):
        base = super().reference(emb, params)
        return base + self.local_dense(dense, dense_params) if dense is not None else base


def test_the_built_in_operators_read_dense_features_exactly() -> None:
    for sub in (FirstOrderLinear(6, num_dense=4), FirstFC(6, 3, 5, num_dense=4)):
        report = check_substitution(sub)
        assert report.max_forward_error < 1e-12
    assert FirstOrderLinear(6).dense_params() == {}  # no dense features: nothing declared, nothing read


@pytest.mark.parametrize("sub", [_HalfDenseLinear(5, num_dense=2), _RowMixingFC(5, 3, 4, num_dense=2)])
def test_check_substitution_catches_a_wrong_dense_part(sub) -> None:
    with pytest.raises(SubstitutionConformanceError):
        check_substitution(sub)


def test_a_model_records_dense_features_only_when_it_has_some() -> None:
    from des.models import get_model

    deepfm = get_model("deepfm")
    assert "num_dense" not in deepfm(num_fields=39).config()  # checkpoints written before stay loadable
    assert deepfm(num_fields=5, num_dense=3).config()["num_dense"] == 3


class _PairwiseOnly(Model):
    """A model none of whose operators reads dense features."""

    name = "pairwise_only"

    def blocks(self) -> list[EmbeddingBlock]:
        return [EmbeddingBlock("embedding", 3)]

    def substitutions(self) -> list[Substitution]:
        return [FMOrder2(self.num_fields, 3)]

    def top(self, params, outputs):
        return outputs[0][:, 0] + params["bias"][0]


def test_a_model_that_takes_no_dense_features_is_refused_on_data_that_has_some(monkeypatch) -> None:
    import des.models
    from des.config import TrainConfig
    from des.building import build_model

    assert build_model(TrainConfig(model="deepfm"), 5, num_dense=2).num_dense == 2
    monkeypatch.setattr(des.models, "get_model", lambda name: _PairwiseOnly)
    with pytest.raises(ConfigError, match="takes no dense features"):
        build_model(TrainConfig(model="deepfm"), 5, num_dense=2)
    assert build_model(TrainConfig(model="deepfm"), 5).num_dense == 0


@pytest.fixture(scope="module")
def dense_engine(tmp_path_factory):
    """A one-rank float64 DeepFM on synthetic data with three dense features, and its batches."""
    from mpi4py import MPI

    from des.collectives import Communicator
    from des.data.batch_reader import BatchReader
    from des.data.synth import default_config, synthesize_store
    from des.hashtable import FTRL, Adam
    from des.models import get_model
    from des.options import Optimizers
    from des.placement import place_fields
    from des.strategies.des import DES

    store = synthesize_store(tmp_path_factory.mktemp("dense") / "store", 2000,
                             default_config(seed=4, vocab_scale=0.001, dense=3), split=(0.9, 0.1, 0.0))
    model = get_model("deepfm")(num_fields=store.num_fields, embedding_dim=4, hidden=(8,), num_dense=store.num_dense)
    optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": Adam(0.01)}, dense=Adam(0.01))
    engine = DES.build(model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1), optimizers,
                       dtype=np.float64)
    reader = BatchReader(store, "train", batch_size=64, seed=0, fields=list(range(store.num_fields)))
    return engine, list(reader)[:6]


def test_dense_features_change_the_predictions_and_their_weights_train(dense_engine) -> None:
    engine, batches = dense_engine
    weights = engine.dense.top_params
    before = {name: weights[name].copy() for name in ("0:linear:dense_weight", "2:first_fc:dense_kernel")}
    for batch in batches:
        engine.train_step(batch)
    for name, value in before.items():
        assert not np.array_equal(weights[name], value), f"{name} did not move"
    batch = batches[0]
    p, _ = engine.predict(batch)
    batch.dense = batch.dense + 1.0
    moved, _ = engine.predict(batch)
    batch.dense = batch.dense - 1.0
    assert np.max(np.abs(moved - p)) > 1e-6


def test_data_and_model_of_other_dense_widths_are_refused(dense_engine) -> None:
    engine, batches = dense_engine
    batch = batches[0]
    saved, batch.dense = batch.dense, batch.dense[:, :2]
    try:
        with pytest.raises(ConfigError, match="2 dense features, the model 3"):
            engine.predict(batch)
    finally:
        batch.dense = saved
