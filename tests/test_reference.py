"""The DES engine on one rank against an independent textbook implementation in plain TensorFlow
(``tests/reference_models.py``): same initial values, same optimizers (Keras' own on the reference
side), K steps, same predictions. Together with ``test_exactness`` (N ranks == 1 rank) this shows
that N-rank DES training is the model as written in the papers."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from mpi4py import MPI

from des.collectives import Communicator
from des.data import prepare
from des.data.batch_reader import BatchReader
from des.options import Optimizers
from des.strategies.des import DES
from des.hashtable import FTRL, AdaGrad, Adam
from des.models import get_model
from des.placement import place_fields
from tests.conftest import criteo_head
from tests.reference_models import PlainTFModel

STEPS = 6
HIDDEN = (16, 8)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference-data")
    return prepare(criteo_head(root / "head.tsv", 2000), root / "store", split=(0.9, 0.1, 0.0), seed=4)


def _model(name: str, num_fields: int, **options):
    kwargs = {"lr": {}, "fm": {"embedding_dim": 4}, "dcnv2": {"embedding_dim": 4, "hidden": HIDDEN, "cross_layers": 2}
              }.get(name, {"embedding_dim": 4, "hidden": HIDDEN})
    return get_model(name)(num_fields=num_fields, **kwargs, **options)


# The models' other constructor hyper-parameters (exactly representable l2 factors, see below).
OPTIONS = {"tanh-l2": dict(activation="tanh", l2_embedding=2.0**-6, l2_dense=2.0**-8)}


@pytest.mark.parametrize("name", ["lr", "fm", "wdl", "deepfm", "deepfm-tanh-l2", "dcnv2", "dlrm"])
def test_engine_matches_plain_tensorflow(store, name: str) -> None:
    # Hyper-parameters exactly representable in float32: Keras rounds its hyper-parameters to
    # float32 even for float64 weights, which would otherwise show up as 1e-7..1e-5 differences.
    eps = 2.0**-20
    ftrl = dict(alpha=2.0**-3, beta=1.0, l1=2.0**-7, l2=2.0**-10, initial_accumulator=0.125)
    adagrad = dict(lr=2.0**-4, initial_accumulator=0.125, epsilon=eps)
    adam = dict(lr=2.0**-7, beta1=0.875, beta2=1 - 2.0**-10, epsilon=eps)
    name, _, variant = name.partition("-")
    options = OPTIONS.get(variant, {})
    model = _model(name, store.num_fields, **options)
    fields = list(range(store.num_fields))
    engine = DES.build(
        model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1),
        Optimizers(sparse={"linear": FTRL(**ftrl), "embedding": AdaGrad(**adagrad)}, dense=Adam(**adam)),
        seed=11, dtype=np.float64,
    )
    batches = list(BatchReader(store, "train", fields, 64, seed=2))[:STEPS]
    held_out = next(iter(BatchReader(store, "validation", fields, 200, shuffle=False, drop_last=False)))

    # The reference's vocabulary: every id it will meet; initial values read from the engine.
    vocab = [np.unique(np.concatenate([b.fields[f].keys for b in [*batches, held_out]])) for f in fields]
    blocks = [b.name for b in engine.model.blocks()]
    linear_init = [engine.shard.tables[f].initial_values("linear", vocab[f]) for f in fields] if "linear" in blocks \
        else []
    embedding_init = None
    if "embedding" in blocks:
        embedding_init = [engine.shard.tables[f].initial_values("embedding", vocab[f]) for f in fields]
    # the whole first FC kernels, [F, k, H] -> [F·k, H]: DCN-v2's first cross layer's W_0, then the DNN's
    kernels = [v.reshape(-1, v.shape[-1]).copy() for k, v in engine.dense.field_params.items()
               if k.endswith("first_fc:kernel")]
    cross = kernels.pop(0) if name == "dcnv2" else None
    first_fc = kernels[0] if kernels else None
    reference = PlainTFModel(
        name, vocab, linear_init, embedding_init, first_fc,
        {k: v.copy() for k, v in engine.dense.top_params.items()}, HIDDEN,
        {
            "linear": keras.optimizers.Ftrl(
                learning_rate=ftrl["alpha"], beta=ftrl["beta"], l1_regularization_strength=ftrl["l1"],
                l2_regularization_strength=ftrl["l2"], initial_accumulator_value=ftrl["initial_accumulator"],
            ),
            "embedding": keras.optimizers.Adagrad(
                learning_rate=adagrad["lr"], initial_accumulator_value=adagrad["initial_accumulator"], epsilon=eps
            ),
            "dense": keras.optimizers.Adam(
                learning_rate=adam["lr"], beta_1=adam["beta1"], beta_2=adam["beta2"], epsilon=eps
            ),
        },
        **options, cross_kernel=cross, cross_layers=getattr(engine.model, "cross_layers", 0),
    )

    np.testing.assert_allclose(engine.predict(held_out)[0], reference.predict(held_out), rtol=1e-12)
    engine_losses = [engine.train_step(b) for b in batches]
    reference_losses = [reference.train_step(b) for b in batches]
    np.testing.assert_allclose(engine_losses, reference_losses, rtol=1e-9)
    after = reference.predict(held_out)
    np.testing.assert_allclose(engine.predict(held_out)[0], after, rtol=1e-9)
    assert reference_losses[-1] < reference_losses[0]


def test_engine_refuses_a_placement_that_is_not_a_partition(store) -> None:
    from des.errors import PlacementError

    fields = list(range(store.num_fields))
    optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": AdaGrad(0.1)}, dense=Adam(0.01))
    for placement in ([fields[1:]], [fields + [0]], [fields, []]):
        with pytest.raises(PlacementError, match="does not give each of the"):
            DES.build(_model("fm", store.num_fields), Communicator(MPI.COMM_SELF), placement, optimizers)
