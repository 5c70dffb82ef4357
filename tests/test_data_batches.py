"""BatchReader: deterministic order, drop_last, resume, Batch.take, CSR gathers."""

import numpy as np
import pytest

from des.data import Batch, BatchReader, DataError, FieldBatch
from des.data.synth import BLOCK_ROWS, default_config, synthesize_store

MULTI_HOT = ("C6", "C14", "C24")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    config = default_config(
        seed=11, multi_hot_fields=MULTI_HOT, max_hot=3, weighted=True, vocab_scale=0.01, calibration_rows=BLOCK_ROWS
    )
    return synthesize_store(tmp_path_factory.mktemp("batches") / "store", 2500, config, split=(0.8, 0.1, 0.1))


def naive_rows(store, field, rows):
    """Per-row key and weight lists, straight from the stored arrays."""
    offsets, keys, weights = store.field(field)
    spans = [slice(offsets[r], offsets[r + 1]) for r in rows]
    return [(list(keys[s]), None if weights is None else list(weights[s])) for s in spans]


def rows_of(block: FieldBatch):
    return [
        (list(block.keys[a:b]), None if block.weights is None else list(block.weights[a:b]))
        for a, b in zip(block.offsets[:-1], block.offsets[1:])
    ]


def assert_same_batch(a: Batch, b: Batch):
    assert (a.epoch, a.index) == (b.epoch, b.index)
    assert (a.rows == b.rows).all() and (a.labels == b.labels).all()
    assert a.fields.fields == b.fields.fields
    for field in a.fields:
        assert rows_of(a.fields[field]) == rows_of(b.fields[field])


def test_order_is_the_same_for_every_field_subset(store):
    everything = BatchReader(store, "train", None, batch_size=64, seed=5, epoch=2)
    one = BatchReader(store, "train", [20], batch_size=64, seed=5, epoch=2)
    names = BatchReader(store, "train", ["C6", "I1"], batch_size=64, seed=5, epoch=2)
    assert len(everything) == len(one) == len(names) > 10
    for a, b, c in zip(everything, one, names):
        assert (a.rows == b.rows).all() and (a.rows == c.rows).all()
        assert set(b.fields) == {20} and set(c.fields) == {18, 0}
        assert rows_of(a.fields[20]) == rows_of(b.fields[20])
    order = everything.row_order
    assert sorted(order) == list(store.split_rows("train"))
    assert not (BatchReader(store, "train", [0], 64, seed=5, epoch=3).row_order == order).all()
    expected = store.split_rows("train")[np.random.default_rng([5, 2]).permutation(len(order))]
    assert (order == expected).all()


def test_drop_last_and_keep(store):
    n = len(store.split_rows("train"))
    dropped = BatchReader(store, "train", [0], batch_size=300, seed=0)
    kept = BatchReader(store, "train", [0], batch_size=300, seed=0, drop_last=False)
    assert n % 300 and len(dropped) == n // 300 and len(kept) == n // 300 + 1
    sizes = [b.size for b in kept]
    assert sizes[:-1] == [300] * (n // 300) and sizes[-1] == n % 300
    assert all(b.size == 300 for b in dropped)
    assert sorted(np.concatenate([b.rows for b in kept])) == list(store.split_rows("train"))


def test_start_batch_equals_skipping(store):
    full = list(BatchReader(store, "validation", [0, 18, 36], batch_size=16, seed=9, drop_last=False))
    resumed = list(BatchReader(store, "validation", [0, 18, 36], batch_size=16, seed=9, drop_last=False, start_batch=4))
    assert len(resumed) == len(full) - 4
    for a, b in zip(full[4:], resumed):
        assert_same_batch(a, b)


def test_no_shuffle_is_store_order(store):
    reader = BatchReader(store, "test", [0], batch_size=50, shuffle=False, drop_last=False)
    assert (np.concatenate([b.rows for b in reader]) == store.split_rows("test")).all()


def test_gather_matches_naive_reconstruction(store):
    reader = BatchReader(store, "train", None, batch_size=128, seed=1)
    batch = reader.batch(3)
    assert batch.labels.dtype == np.float32
    assert (batch.labels == np.asarray(store.labels)[batch.rows]).all()
    for field, block in batch.fields.items():
        assert block.offsets.dtype == np.int64 and block.keys.dtype == np.int64
        assert block.offsets[0] == 0 and len(block.offsets) == 129
        assert rows_of(block) == naive_rows(store, field, batch.rows)
        if store.field_names[field] in MULTI_HOT:
            assert not store.is_one_hot(field) and block.weights.dtype == np.float32
        else:
            assert store.is_one_hot(field) and block.weights is None
    lengths = np.diff(batch.fields[18].offsets)
    assert lengths.min() == 0 and lengths.max() == 3


def test_fields_read_together_equal_fields_read_alone(store):
    """``gather_fields`` (one-hot fields from one row-major read, multi-hot weighted ones by their
    CSR) in any order and subset equals ``gather`` field by field."""
    rows = store.split_rows("train")[[40, 3, 3, 977, 12]]
    fields = [store.field_index(name) for name in ("C24", "I1", "C6", "C1", "I13")]
    together = store.gather_fields(fields, rows)
    assert list(together) == fields
    for field in fields:
        alone = store.gather(field, rows)
        assert rows_of(together[field]) == rows_of(alone) == naive_rows(store, field, rows)


def test_a_few_one_hot_fields_read_by_their_keys_alone_equal_whole_rows(store):
    """A fifth of the one-hot fields or fewer are read by their keys alone, more by whole rows:
    the same ids either way."""
    rows = store.split_rows("train")[np.random.default_rng(2).permutation(1000)[:300]]
    one_hot = [f for f in range(store.num_fields) if store.is_one_hot(f)]
    assert 5 * 7 <= len(one_hot) < 5 * 20  # the sizes below fall on both sides of the fifth
    for fields in (one_hot[3:5], one_hot[::-3][:7], one_hot[: len(one_hot) // 5], one_hot[:20], one_hot):
        together = store.gather_fields(fields, rows)
        for field in fields:
            assert rows_of(together[field]) == naive_rows(store, field, rows)


def test_a_row_block_reads_every_field_of_its_rows_only(store):
    """``block=(fields, r, n)``: the batch's own fields for every row, and ``fields`` for part
    ``r`` of ``n`` of its rows, as a full read cut to them; ``ids_of_rows`` takes them from there."""
    everything = BatchReader(store, "train", None, batch_size=100, seed=4)
    for part in range(3):
        reader = BatchReader(store, "train", [0, 20], batch_size=100, seed=4, block=(None, part, 3))
        batch, full = reader.batch(2), everything.batch(2)
        assert batch.block_rows == (part * 100 // 3, (part + 1) * 100 // 3)
        lo, hi = batch.block_rows
        cut = full.fields.take(lo, hi)
        assert list(batch.fields) == [0, 20] and list(batch.block) == list(full.fields)
        for field in full.fields:
            assert rows_of(batch.block[field]) == rows_of(cut[field])
        order = [20, 18, 3]
        assert [rows_of(v) for v in batch.ids_of_rows(order, lo, hi).values()] == [rows_of(cut[f]) for f in order]
        other = (0, 10) if (lo, hi) != (0, 10) else (10, 20)  # other rows: from the batch's own fields
        assert rows_of(batch.ids_of_rows([20], *other)[20]) == rows_of(full.fields.take(*other)[20])
    with pytest.raises(DataError, match="row block 3 of 3 does not exist"):
        BatchReader(store, "train", [0], batch_size=4, block=(None, 3, 3))
    with pytest.raises(DataError, match="reads whole batches"):
        BatchReader(store, "train", [0], batch_size=4, shard=(0, 2), block=(None, 0, 2))


def test_batch_take_rebases_csr(store):
    batch = BatchReader(store, "train", None, batch_size=100, seed=4).batch(0)
    pieces = [batch.take(lo, hi) for lo, hi in [(0, 33), (33, 33), (33, 67), (67, 100)]]
    assert [p.size for p in pieces] == [33, 0, 34, 33]
    for field in batch.fields:
        joined = []
        for piece in pieces:
            assert piece.fields[field].offsets[0] == 0
            joined += rows_of(piece.fields[field])
        assert joined == rows_of(batch.fields[field])
    assert (np.concatenate([p.rows for p in pieces]) == batch.rows).all()
    assert (np.concatenate([p.labels for p in pieces]) == batch.labels).all()
    with pytest.raises(ValueError):
        batch.take(50, 101)


def test_reader_argument_errors(store):
    with pytest.raises(DataError, match="batch_size"):
        BatchReader(store, "train", [0], batch_size=0)
    with pytest.raises(DataError, match="no field named 'X1'"):
        BatchReader(store, "train", ["X1"], batch_size=4)
    with pytest.raises(DataError, match="unknown split"):
        BatchReader(store, "dev", [0], batch_size=4)
