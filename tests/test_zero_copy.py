"""numpy arrays in and out of TF without copies (``des/zero_copy.py``): what goes in by reference,
what falls back to a copy, and that a step leaves the arrays it was handed as they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from des.zero_copy import aligned_copy, aligned_empty, is_aligned, to_numpy, to_tensor


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_an_aligned_array_goes_in_by_reference_and_anything_else_is_left_to_tf() -> None:
    aligned = aligned_copy(np.arange(24, dtype=np.float64).reshape(4, 6))
    assert is_aligned(aligned) and aligned.flags.c_contiguous
    tensor = to_tensor(aligned)
    assert isinstance(tensor, tf.Tensor) and _address(np.from_dlpack(tensor)) == _address(aligned)
    np.testing.assert_array_equal(tensor.numpy(), aligned)
    # not aligned, not C order, empty, not an array: unchanged (TF copies it when it converts it)
    raw = aligned_empty(4 * 6 * 8 + 8, np.uint8)
    unaligned = raw[8:].view(np.float64).reshape(4, 6)
    assert not is_aligned(unaligned)
    for value in (unaligned, aligned.T, aligned_empty((0, 3), np.float32), [1.0, 2.0], 3.0):
        assert to_tensor(value) is value


def test_to_numpy_is_the_tensors_values_without_a_copy_and_outlives_it() -> None:
    tensor = tf.reshape(tf.range(12, dtype=tf.float32), (3, 4)) * 2.0
    out = to_numpy(tensor)
    assert out.flags.writeable and out.flags.c_contiguous and out.dtype == np.float32
    assert _address(out) == _address(np.from_dlpack(tensor))
    expected = tensor.numpy()
    del tensor
    _ = [tf.ones((256, 256)) * 3.0 for _ in range(4)]  # TF reuses freed buffers
    np.testing.assert_array_equal(out, expected)
    # bfloat16 (no DLPack type) and empty tensors come through .numpy()
    assert to_numpy(tf.cast(tf.ones(3), tf.bfloat16)).dtype.name == "bfloat16"
    assert to_numpy(tf.zeros((0, 2))).shape == (0, 2)
    assert to_numpy(tf.constant(1.5)) == 1.5


def test_a_training_step_leaves_the_arrays_it_was_handed_unchanged(tmp_path: Path) -> None:
    """TF never writes into memory it was lent: the pooled embeddings and the dense weights a
    one-rank step hands to its graph by reference are the same bytes afterwards, and the step's
    results are those of the same graph fed copies."""
    from mpi4py import MPI

    from des.collectives import Communicator
    from des.data import prepare
    from des.data.batch_reader import BatchReader
    from des.hashtable import FTRL, Adam
    from des.models import get_model
    from des.options import Optimizers
    from des.placement import place_fields
    from des.strategies.des import DES

    from tests.conftest import criteo_head

    store = prepare(criteo_head(tmp_path / "head.tsv", 300), tmp_path / "store", split=(0.9, 0.1, 0.0), seed=1)
    model = get_model("deepfm")(num_fields=store.num_fields, embedding_dim=4, hidden=(16, 8))
    optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": Adam(0.01)}, dense=Adam(0.01))
    engine = DES.build(model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1), optimizers,
                       dtype=np.float64)
    batch = next(iter(BatchReader(store, "train", batch_size=64, seed=0, **engine.reader_options())))
    pooled = engine.shard.gather_pooled(engine.shard.touch(batch, train=False, step=0), engine.split_form.split_blocks)
    dense = engine.dense
    params = [dense.field_params[name] for name in engine.split_form.split_params]
    top = list(dense.top_params.values())
    lent = [*pooled, *params, *top]
    assert all(is_aligned(a) for a in lent)  # they do go in by reference
    # the step hands TF the weights as tensors made once over their memory (DenseParams.as_tensors)
    held = dense.as_tensors([*params, *top])
    assert all(np.shares_memory(to_numpy(t), a) for t, a in zip(held, [*params, *top]))
    assert all(x is y for x, y in zip(held, [*dense.as_tensors(params), *dense.as_tensors(top)]))
    before = [a.copy() for a in lent]
    labels = np.asarray(batch.labels, dtype=np.float64)
    form = engine.split_form
    by_reference = form.train_whole(pooled, params, top, labels, len(labels), None)
    for a, b in zip(lent, before):
        assert a.tobytes() == b.tobytes()
    by_copy = form.train_whole([tf.constant(a) for a in pooled], [tf.constant(a) for a in params],
                               [tf.constant(a) for a in top], labels, len(labels), None)
    for x, y in zip(tf.nest.flatten(by_reference), tf.nest.flatten(by_copy)):
        assert to_numpy(x).tobytes() == y.numpy().tobytes()


def test_a_row_owners_exchanged_inputs_go_in_packed_by_reference_with_the_bits_of_separate_blocks() -> None:
    """The exchange gives the row owner its exchanged blocks side by side in ONE aligned array,
    which TF takes by reference and cuts in the graph (column views of it were copied every step);
    packed or one array per block, the step's results are the same bits, and the blocks' gradients
    come back packed alike. The step is called on its flat inputs (``forms._Compiled``)."""
    from des.hashtable import optimizer_from_spec
    from des.models import DeepFM
    from des.options import Optimizers
    from des.strategies.components import DenseParams
    from des.strategies.exchange import _packed_inputs
    from des.strategies.forms import ModelSplitForm

    model = DeepFM(num_fields=5, embedding_dim=4, hidden=(6, 3))
    dense = DenseParams(model, range(5), Optimizers(sparse={}, dense=optimizer_from_spec("adam:lr=0.001")), seed=0,
                        dtype=np.float64)
    form = ModelSplitForm(model, dense, np.float64, exchanged=range(len(model.substitutions())))
    assert form.exchange_dims == [1, 4] and form.width == 0  # DeepFM's linear and embedding blocks, all exchanged
    rows = 7
    packed = _packed_inputs(rows, 5, 5, np.float64, every_field_written=True)
    packed[...] = np.random.default_rng(0).standard_normal(packed.shape)
    assert is_aligned(packed) and to_tensor(packed) is not packed  # goes in by reference
    blocks = [np.ascontiguousarray(packed[..., :1]), np.ascontiguousarray(packed[..., 1:])]
    xparams = [dense.field_params[name] for name in form.exchange_params]
    top = list(dense.top_params.values())
    labels = np.array([0, 1, 1, 0, 1, 0, 0], dtype=np.float64)
    buffer = np.zeros((rows, 0), dtype=np.float64)
    grad_packed, pooled_packed, flat_packed = form.top_train_packed(buffer, packed, xparams, [], labels, top, rows, None)
    grad_blocks, pooled_blocks, flat_blocks = form.top_train_packed(buffer, blocks, xparams, [], labels, top, rows, None)
    assert tuple(pooled_packed.shape) == (rows, 5, 5) and len(pooled_blocks) == 2
    joined = np.concatenate([to_numpy(g) for g in pooled_blocks], axis=-1)
    assert to_numpy(pooled_packed).tobytes() == joined.tobytes()
    assert to_numpy(flat_packed).tobytes() == to_numpy(flat_blocks).tobytes()
    assert to_numpy(grad_packed).tobytes() == to_numpy(grad_blocks).tobytes()
    predicted = [form.top_predict(buffer, x, xparams, [], top, None).numpy() for x in (packed, blocks)]
    assert predicted[0].tobytes() == predicted[1].tobytes()
    assert all(flat is not None for _, flat in form.top_train_packed._concrete.values())  # the flat call
