"""The fused shard kernels (des/hashtable/fused.py, FieldShard) against the per-table path they
replace (EmbeddingTable.lookup/gather + des.hashtable.pooling.pool, unpool + EmbeddingTable.apply_gradients,
field by field): bit-identical pooled values and table states; plus growth inside a lookup, the
pipelined order (lookup of the next batch before this batch's update), thread counts, errors, a
table replaced by a checkpoint load, and the reserved row storage (des/hashtable/_memory.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from des.data.batch import KeyedIds
from des.hashtable import FTRL, SGD, AdaGrad, Adam, BlockSpec, EmbeddingTable, Initializer, RowwiseAdaGrad, RowwiseAdam
from des.hashtable import _threads
from des.hashtable._memory import RESERVE, grow_in_place, row_array
from des.hashtable.fused import ShardTables
from des.hashtable.table import SHARED_KEY
from des.hashtable.pooling import pool, unpool


@dataclass
class Ids:
    offsets: np.ndarray
    keys: np.ndarray
    weights: np.ndarray | None


BLOCK_NAMES = ["linear", "embedding", "extra"]


def keyed(ids):
    """A shard's fields' ids (per-field CSR, in shard order) in the keyed-jagged form the tables take."""
    return KeyedIds.of(range(len(ids)), ids)


def make_tables(fields, dtype, *, optimizer, min_count=1, unadmitted="init", capacity=64, dims=(1, 4, 3),
                table_dtype=None, counters=True, store_w=0):
    """The order-1 block's FTRL holds z and n only (w computed when read) unless ``store_w``."""
    blocks = [BlockSpec("linear", dims[0], FTRL(0.05, l1=0.01, store_w=store_w), Initializer("zeros")),
              BlockSpec("embedding", dims[1], optimizer, Initializer("normal", 0.1)),
              BlockSpec("extra", dims[2] if len(dims) > 2 else 1, AdaGrad(0.1), Initializer("truncated_normal", 0.5))]
    blocks = blocks[:len(dims)]
    return {f: EmbeddingTable(f, blocks, seed=11, dtype=dtype, capacity=capacity, min_count=min_count,
                              unadmitted=unadmitted, table_dtype=table_dtype, counters=counters) for f in fields}


def make_ids(rng, fields, size, vocab, step):
    """Field 0 one-hot, field 1 multi-hot (0-3 ids), field 2 weighted multi-hot, others one-hot."""
    out = []
    for j, f in enumerate(fields):
        counts = np.ones(size, np.int64) if j % 3 == 0 else rng.integers(0, 4, size)
        offsets = np.zeros(size + 1, np.int64)
        offsets[1:] = np.cumsum(counts)
        ranks = np.minimum(rng.zipf(1.3, int(offsets[-1])), vocab + 5 * step)
        keys = (np.int64(f + 1) << 40) | ranks.astype(np.int64)
        weights = rng.uniform(0.5, 2.0, keys.size).astype(np.float32) if j % 3 == 2 else None
        out.append(Ids(offsets, keys, weights))
    return out


def reference_step(tables, fields, ids, *, train, step, grads=None, lr_scale=1.0):
    """The per-field path (FieldShard before the fused kernels)."""
    blocks = tables[fields[0]].blocks
    size = ids[0].offsets.shape[0] - 1
    dtype = tables[fields[0]].dtype
    pooled = [np.zeros((size, len(fields), b.dim), dtype) for b in blocks]
    touched = []
    for j, f in enumerate(fields):
        t = tables[f]
        rows = t.lookup(ids[j].keys, insert=train, step=step)
        for k, b in enumerate(blocks):
            pool(t.gather(b.name, ids[j].keys, rows), ids[j].offsets, ids[j].weights, pooled[k][:, j, :])
        touched.append(rows)
    if grads is not None:
        for k, b in enumerate(blocks):
            for j, f in enumerate(fields):
                tables[f].apply_gradients(b.name, touched[j], unpool(grads[k][:, j, :], ids[j].offsets,
                                                                    ids[j].weights), step, lr_scale)
    return pooled


def fused_step(shard, ids, *, train, step, grads=None, lr_scale=1.0, together=False):
    """Block by block, or (``together``) all blocks in one call each (``gather_pooled``, ``apply_pooled``)."""
    touched = shard.touch(keyed(ids), train=train, step=step)
    blocks = shard.tables[shard.fields[0]].blocks
    dtype = shard.tables[shard.fields[0]].dtype
    pooled = [np.empty((touched.size, len(shard.fields), b.dim), dtype) for b in blocks]
    if together:
        shard.gather_pooled(touched, dict(enumerate(pooled)))
    else:
        for k, out in enumerate(pooled):
            shard.gather_pooled(touched, {k: out})
    if grads is not None:
        if together:
            shard.apply_pooled(touched, dict(enumerate(grads)), step, lr_scale)
        else:
            for k, g in enumerate(grads):
                shard.apply_pooled(touched, {k: g}, step, lr_scale)
    return pooled


def assert_same_tables(a: EmbeddingTable, b: EmbeddingTable, meta: bool = True) -> None:
    """The same rows, values, slots and step counts bit for bit (and with ``meta``, counts and last_seen)."""
    n = len(a)
    assert len(b) == n and a.admitted_total == b.admitted_total and a.last_update_step == b.last_update_step
    assert a.admitted_count == b.admitted_count
    np.testing.assert_array_equal(a.arrays.keys[:n], b.arrays.keys[:n])
    if meta:
        np.testing.assert_array_equal(a.arrays.meta[:n], b.arrays.meta[:n])
    for x, y in zip(a.arrays.blocks, b.arrays.blocks):
        assert x[:n].tobytes() == y[:n].tobytes()
    for x, y in zip(a.arrays.steps, b.arrays.steps):
        if x.size:
            np.testing.assert_array_equal(x[:n], y[:n])


OPTIMIZERS = {"sgd": SGD(0.1), "adagrad": AdaGrad(0.05), "adam": Adam(0.01),
              "adam-catchup": Adam(0.01, catchup=1), "ftrl": FTRL(0.1, l1=0.01),
              "rowwise-adagrad": RowwiseAdaGrad(0.05), "rowwise-adam": RowwiseAdam(0.01)}


# the update sums two blocks per pass, widths 1, 8 and 16 with their own code: three blocks (a pair,
# then one), two, and those widths
@pytest.mark.parametrize("dtype,optimizer,min_count,unadmitted,dims", [
    (np.float64, "adam-catchup", 1, "init", (1, 4, 3)),
    (np.float32, "adam", 3, "zero", (1, 4, 3)),
    (np.float64, "sgd", 2, "shared", (1, 4, 3)),
    (np.float32, "ftrl", 2, "init", (1, 4, 3)),
    (np.float64, "adagrad", 0, "shared", (1, 4, 3)),
    (np.float32, "adam-catchup", 2, "shared", (1, 8)),
    (np.float64, "adam", 1, "init", (8, 16, 1)),
    (np.float32, "rowwise-adagrad", 2, "init", (1, 8)),  # a row-wise slot of one column per row
    (np.float64, "rowwise-adam", 1, "shared", (1, 4, 3)),
    ("bfloat16", "rowwise-adagrad", 2, "shared", (1, 8)),  # float32 compute on bfloat16 rows
    ("bfloat16", "adam", 1, "init", (1, 4, 3)),
])
def test_fused_equals_the_per_table_path(dtype, optimizer, min_count, unadmitted, dims) -> None:
    """Besides: the order-1 FTRL rows hold z and n only where the rate is constant (FTRL cases,
    bfloat16 rows), else they store w, as a rate schedule needs (a factor refused otherwise)."""
    fields = [0, 3, 5, 7]
    dtype, table_dtype = (np.float32, "bfloat16") if dtype == "bfloat16" else (dtype, None)
    computed = optimizer == "ftrl" or table_dtype == "bfloat16"
    rate = (lambda step: 1.0) if computed else (lambda step: 0.5 + step / 8)
    ref = make_tables(fields, dtype, optimizer=OPTIMIZERS[optimizer], min_count=min_count, unadmitted=unadmitted,
                      dims=dims, table_dtype=table_dtype, store_w=int(not computed))
    new = make_tables(fields, dtype, optimizer=OPTIMIZERS[optimizer], min_count=min_count, unadmitted=unadmitted,
                      dims=dims, table_dtype=table_dtype, store_w=int(not computed))
    assert new[0].blocks[0].computed == computed
    shard = ShardTables(new, fields, BLOCK_NAMES[:len(dims)])
    rng = np.random.default_rng(3)
    for step in range(8):
        size = 200 if step % 2 else 64  # one-hot fields go tile by tile (fused._TILE = 128): a partial second
        ids = make_ids(rng, fields, size, 300, step)
        if step == 5:  # the shared row's own key, where unadmitted keys share its row (or a key as any other)
            for x in ids[:2]:
                x.keys[[0, -1]] = SHARED_KEY
        grads = [rng.normal(size=(size, len(fields), d)).astype(dtype) for d in dims]
        expected = reference_step(ref, fields, ids, train=True, step=step, grads=grads, lr_scale=rate(step))
        got = fused_step(shard, ids, train=True, step=step, grads=grads, lr_scale=rate(step), together=step % 4 >= 2)
        for e, g in zip(expected, got):
            assert e.tobytes() == g.tobytes()
        if step % 3 == 2:  # evaluation: unknown keys read as init/zero/shared, nothing inserted
            eval_ids = make_ids(rng, fields, 32, 600, step)
            expected = reference_step(ref, fields, eval_ids, train=False, step=step)
            got = fused_step(shard, eval_ids, train=False, step=step)
            for e, g in zip(expected, got):
                assert e.tobytes() == g.tobytes()
    for f in fields:
        assert_same_tables(ref[f], new[f])
        assert new[f].capacity > 64  # the lookups grew the tables (inside the fused lookup)
    if computed:
        with pytest.raises(ValueError, match="FTRL computing its weights from z and n needs a constant rate"):
            fused_step(shard, ids, train=True, step=9, grads=grads, lr_scale=0.5)


@pytest.mark.parametrize("dtype,optimizer,min_count,unadmitted", [
    (np.float64, "adam-catchup", 1, "init"),
    (np.float32, "ftrl", 0, "zero"),
    ("bfloat16", "rowwise-adagrad", 1, "shared"),
])
def test_tables_without_counters_train_the_same_rows(dtype, optimizer, min_count, unadmitted) -> None:
    """The compact layout (no count or last_seen, 4-byte index slots) through the fused kernels and
    through the per-table path trains what a table with counters trains, bit for bit, through
    growth and the shared row's own key; its key, index and metadata take under 24 B a row."""
    fields = [0, 3, 5]
    dtype, table_dtype = (np.float32, "bfloat16") if dtype == "bfloat16" else (dtype, None)
    kw = dict(optimizer=OPTIMIZERS[optimizer], min_count=min_count, unadmitted=unadmitted, table_dtype=table_dtype)
    ref, per_table = make_tables(fields, dtype, **kw), make_tables(fields, dtype, counters=False, **kw)
    new = make_tables(fields, dtype, counters=False, **kw)
    shard = ShardTables(new, fields, BLOCK_NAMES)
    rng = np.random.default_rng(5)
    for step in range(6):
        ids = make_ids(rng, fields, 150, 400, step)
        if step == 3:
            ids[1].keys[[0, -1]] = SHARED_KEY
        grads = [rng.normal(size=(150, len(fields), d)).astype(dtype) for d in (1, 4, 3)]
        expected = reference_step(ref, fields, ids, train=True, step=step, grads=grads)
        for got in (reference_step(per_table, fields, ids, train=True, step=step, grads=grads),
                    fused_step(shard, ids, train=True, step=step, grads=grads, together=step % 2 == 1)):
            assert all(e.tobytes() == g.tobytes() for e, g in zip(expected, got))
        eval_ids = make_ids(rng, fields, 32, 800, step)
        expected = reference_step(ref, fields, eval_ids, train=False, step=step)
        got = fused_step(shard, eval_ids, train=False, step=step)
        assert all(e.tobytes() == g.tobytes() for e, g in zip(expected, got))
    for f in fields:
        for other in (per_table[f], new[f]):
            assert_same_tables(ref[f], other, meta=False)
            assert other.arrays.meta.shape[1] == 0 and other.arrays.index.shape[1] == 1
            memory = other.memory()
            assert memory["metadata_bytes"] == 8 * other.row_capacity and other.capacity > 64
            assert (memory["metadata_bytes"] + memory["index_bytes"]) / len(other) < 24


def test_fields_with_different_optimizers_in_one_call(monkeypatch) -> None:
    """A block whose fields use different optimizers: ``apply_pooled`` runs one kernel per
    optimizer over the same field ranges (a mask of its fields), on 1 and 2 threads; each field
    gets exactly its own optimizer's step, as the per-table path."""
    fields = [0, 3, 5, 7]
    by_field = {0: Adam(0.01, catchup=1), 3: SGD(0.1), 5: Adam(0.01, catchup=1), 7: AdaGrad(0.05)}

    def tables():
        return {f: make_tables([f], np.float64, optimizer=opt)[f] for f, opt in by_field.items()}

    for n_threads in (1, 2):
        monkeypatch.setattr(_threads, "threads", lambda n=n_threads: n)
        monkeypatch.setattr("des.hashtable.fused._MIN_PARALLEL", 0)  # split even this small batch
        ref, new = tables(), tables()
        shard = ShardTables(new, fields, ["linear", "embedding", "extra"])
        rng = np.random.default_rng(7)
        for step in range(4):
            ids = make_ids(rng, fields, 150, 200, step)
            grads = [rng.normal(size=(150, len(fields), d)) for d in (1, 4, 3)]
            expected = reference_step(ref, fields, ids, train=True, step=step, grads=grads)
            got = fused_step(shard, ids, train=True, step=step, grads=grads, together=True)
            for e, g in zip(expected, got):
                assert e.tobytes() == g.tobytes()
        for f in fields:
            assert_same_tables(ref[f], new[f])


def test_growth_inside_one_lookup_and_thread_counts(monkeypatch) -> None:
    """One batch far larger than the tables: every field grows (rows and index) in the middle of
    the fused lookup; 1, 2 and 3 threads (ranges of fields, rows of a table) give the same bytes."""
    fields = list(range(6))
    results = []
    for n_threads in (1, 2, 3):
        monkeypatch.setattr(_threads, "threads", lambda n=n_threads: n)  # conftest pins numba to 1
        tables = make_tables(fields, np.float32, optimizer=Adam(0.01), capacity=16)
        shard = ShardTables(tables, fields, ["linear", "embedding", "extra"])
        ids = make_ids(np.random.default_rng(5), fields, 5000, 10**6, 0)
        grads = [np.random.default_rng(6).normal(size=(5000, 6, d)).astype(np.float32) for d in (1, 4, 3)]
        pooled = fused_step(shard, ids, train=True, step=0, grads=grads)
        reference = make_tables(fields, np.float32, optimizer=Adam(0.01), capacity=16)
        expected = reference_step(reference, fields, ids, train=True, step=0, grads=grads)
        for e, g in zip(expected, pooled):
            assert e.tobytes() == g.tobytes()
        for f in fields:
            assert_same_tables(reference[f], tables[f])
        results.append([p.tobytes() for p in pooled])
    assert results[0] == results[1] == results[2]
    assert _threads.split(np.array([5, 0, 0, 9, 1]), 2) == [(0, 3), (3, 5)] and _threads.split(7, 3) == [(0, 2), (2, 4), (4, 7)]


def test_pipelined_order_gives_the_same_result() -> None:
    """lookup(t+1) between gather(t) and update(t) (the pipelined step) changes nothing, with
    admission (min_count 2): the update of t uses the admission decided at lookup t."""
    fields = [1, 2, 4]
    states = []
    for pipelined in (False, True):
        tables = make_tables(fields, np.float64, optimizer=Adam(0.01, catchup=1), min_count=2, capacity=16)
        shard = ShardTables(tables, fields, ["linear", "embedding", "extra"])
        rng = np.random.default_rng(9)
        batches = [make_ids(rng, fields, 128, 400, s) for s in range(6)]
        grads = [[rng.normal(size=(128, 3, d)) for d in (1, 4, 3)] for _ in range(6)]
        pooled_all = []
        touched = shard.touch(keyed(batches[0]), train=True, step=0)
        for step in range(6):
            pooled = [np.empty((128, 3, d)) for d in (1, 4, 3)]
            for k in range(3):
                shard.gather_pooled(touched, {k: pooled[k]})
            pooled_all.append(pooled)
            if pipelined and step + 1 < 6:
                following = shard.touch(keyed(batches[step + 1]), train=True, step=step + 1)
            for k in range(3):
                shard.apply_pooled(touched, {k: grads[step][k]}, step)
            if not pipelined and step + 1 < 6:
                following = shard.touch(keyed(batches[step + 1]), train=True, step=step + 1)
            touched = following
        states.append((tables, pooled_all))
    (a, pa), (b, pb) = states
    for x, y in zip(pa, pb):
        for u, v in zip(x, y):
            assert u.tobytes() == v.tobytes()
    for f in fields:
        assert_same_tables(a[f], b[f])


@pytest.mark.parametrize("n_threads", [1, 2])
def test_update_and_next_gather_in_one_pass(monkeypatch, n_threads) -> None:
    """``apply_then_gather`` (a pipelined step's update, then the next batch's gather with its
    catch-up, in one pass over the fields) gives the bytes of ``apply_pooled`` then
    ``gather_pooled``, with each call's own schedule factor, on 1 and 2 threads."""
    monkeypatch.setattr(_threads, "threads", lambda n=n_threads: n)
    monkeypatch.setattr("des.hashtable.fused._MIN_PARALLEL", 0)  # split even this small batch
    fields, dims = [1, 2, 4, 6], (1, 4, 3)
    states = []
    for merged in (False, True):
        tables = make_tables(fields, np.float64, optimizer=Adam(0.01, catchup=1), min_count=2, capacity=16, store_w=1)
        shard = ShardTables(tables, fields, BLOCK_NAMES)
        rng = np.random.default_rng(9)
        batches = [make_ids(rng, fields, 128, 400, s) for s in range(6)]
        grads = [[rng.normal(size=(128, len(fields), d)) for d in dims] for _ in range(6)]

        def outs():
            return {k: np.empty((128, len(fields), d)) for k, d in enumerate(dims)}

        touched, pooled = shard.touch(keyed(batches[0]), train=True, step=0), outs()
        shard.gather_pooled(touched, pooled, catch_up_to=0)
        gathered = [pooled]
        for step in range(5):
            following, pooled, scale = shard.touch(keyed(batches[step + 1]), train=True, step=step + 1), outs(), 1 - step / 8
            if merged:
                shard.apply_then_gather(touched, dict(enumerate(grads[step])), step, scale, following, pooled,
                                        step + 1, 1.5)
            else:
                shard.apply_pooled(touched, dict(enumerate(grads[step])), step, scale)
                shard.gather_pooled(following, pooled, step + 1, 1.5)
            gathered.append(pooled)
            touched = following
        states.append((tables, gathered))
    (a, pa), (b, pb) = states
    for x, y in zip(pa, pb):
        for k in x:
            assert x[k].tobytes() == y[k].tobytes()
    for f in fields:
        assert_same_tables(a[f], b[f])


def test_table_replaced_by_a_load_is_picked_up(tmp_path) -> None:
    fields = [0, 1]
    tables = make_tables(fields, np.float32, optimizer=SGD(0.1))
    shard = ShardTables(tables, fields, ["linear", "embedding", "extra"])
    rng = np.random.default_rng(1)
    ids = make_ids(rng, fields, 50, 100, 0)
    fused_step(shard, ids, train=True, step=0, grads=[np.ones((50, 2, d), np.float32) for d in (1, 4, 3)])
    tables[1].save(tmp_path / "f1.table")
    expected = fused_step(shard, ids, train=False, step=1)
    tables[1] = EmbeddingTable.load(tmp_path / "f1.table", capacity=1 << 12)  # new arrays, new object
    got = fused_step(shard, ids, train=False, step=1)
    for e, g in zip(expected, got):
        assert e.tobytes() == g.tobytes()


def test_one_block_of_one_hot_fields_is_the_keys_without_a_copy() -> None:
    """Fields read as the rows of one ``[F, B]`` block (as the store reads one-hot fields) are
    keyed ids whose keys are that block's memory, with the same arrays as concatenating the fields;
    a selection of them is a view where it is a run of the fields in order, and equals the
    concatenation of the selected fields either way; a row range is the fields' row ranges."""
    block = np.random.default_rng(3).integers(1, 10**9, (4, 6))
    offsets = np.arange(7, dtype=np.int64)
    fields = [3, 5, 7, 9]
    ids = KeyedIds.of_block(fields, block)
    concatenated = KeyedIds.of(fields, [Ids(offsets, block[i].copy(), None) for i in range(4)])
    assert ids.one_hot and np.shares_memory(ids.keys, block)

    def same(a, b):
        for name in ("keys", "key_offsets", "offsets", "weighted"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and x.shape == y.shape and (x == y).all(), name
        assert a.fields == b.fields

    same(ids, concatenated)
    assert (ids[7].keys == block[2]).all() and ids[7].weights is None and len(ids) == 4 and list(ids) == fields
    run = ids.select([5, 7])
    assert np.shares_memory(run.keys, block)
    same(run, KeyedIds.of([5, 7], [ids[5], ids[7]]))
    same(ids.select([7, 3]), KeyedIds.of([7, 3], [ids[7], ids[3]]))
    same(ids.take(2, 5), KeyedIds.of(fields, [ids[f].take(2, 5) for f in fields]))
    multi = KeyedIds.of([1, 2], [Ids(np.array([0, 2, 2, 3]), np.arange(3), np.ones(3, np.float32)),
                                 Ids(np.arange(4), np.arange(3), None)])
    assert not multi.one_hot and (multi.weights == 1).all() and list(multi.weighted) == [True, False]
    assert (multi.take(1, 3)[1].offsets == [0, 0, 1]).all()


@pytest.mark.parametrize("parts", [1, 3])
def test_one_hot_sums_are_the_stored_first_gradient_plus_the_others(parts) -> None:
    """The one-hot sums per distinct row (``_sum_pieces``) have the bits of storing a row's first
    gradient and adding the later ones in order, signed zeros included (sums that start at +0.0
    would turn a row's lone -0.0 into +0.0); the same bits when the field's rows are cut into
    pieces, each summed from every id (``unpool_rows``)."""
    from des.hashtable.fused import TouchedArrays, _Sums, _sum_pieces

    inverse = np.array([0, 1, 0, 2, 1, -1, 3, 3], np.int32)  # distinct rows in first-occurrence order; -1: untrained
    size, rows = inverse.shape[0], 4
    grads = [np.full((size, 1, d), -0.0, np.float32) for d in (8, 1)]
    grads[0][1, 0, :4] = grads[1][4] = 0.0  # row 1: -0.0 then +0.0; row 0: -0.0 twice; row 2: one -0.0
    grads[0][6, 0], grads[0][7, 0] = np.float32(1e-8), np.float32(3.0)  # row 3: rounding in order
    grads[1][6], grads[1][7] = np.float32(-2.5), np.float32(2.5)  # row 3, block 1: -2.5 + 2.5 = +0.0
    sums = [np.full((rows, d), np.nan, np.float32) for d in (8, 1)]
    unused = np.zeros(size, np.int64)  # what the sums do not read: keys, rows, admission, distinct rows
    ids = TouchedArrays(unused, np.array([0, size]), np.arange(size + 1)[None], np.ones(0), np.zeros(1, np.bool_),
                        np.ones(1, np.bool_), unused, unused.astype(np.bool_), unused, np.array([rows]), inverse)
    pieces = np.array([[0, k, parts] for k in range(parts)], np.int64)
    for k in range(parts):  # one piece at a time, as threads would take them
        _sum_pieces(k, k + 1, pieces, tuple(_Sums(np.array([g.ctypes.data for g in grads]),
                                                  np.array([a.ctypes.data for a in sums]), np.array([8, 1]),
                                                  np.array([0, rows]))), tuple(ids), grads[0])
    for g, got in zip(grads, sums):
        expected = np.empty_like(got)
        seen = set()
        for b, p in enumerate(inverse):
            if p >= 0:
                expected[p] = g[b, 0] if p not in seen else expected[p] + g[b, 0]
                seen.add(p)
        assert got.tobytes() == expected.tobytes()
    assert np.signbit(sums[0][0, 0]) and not np.signbit(sums[0][1, 0]) and np.signbit(sums[1][2, 0])


@pytest.mark.parametrize("dtype,optimizer", [(np.float64, "adam-catchup"), ("bfloat16", "adam"),
                                             (np.float32, "rowwise-adagrad")])
def test_a_large_field_cut_into_pieces_gives_the_same_bytes(monkeypatch, dtype, optimizer) -> None:
    """A shard where one multi-hot field (or a weighted one) is most of the work: on 3 threads its
    rows are cut into pieces (summed, updated, caught up and read piece by piece, pooled by
    samples afterwards); every pass gives the bytes of one thread, which takes the field whole:
    ``gather_pooled`` with catch-up, ``apply_pooled``, and ``apply_then_gather``."""
    from des.hashtable.fused import pieces

    monkeypatch.setattr("des.hashtable.fused._MIN_PARALLEL", 0)  # split even this small batch
    fields, dims = [1, 2, 3], (1, 4, 3)
    rng = np.random.default_rng(3)

    def batch(step):
        out = []
        for j, f in enumerate(fields):  # field 1: 0-40 ids a sample (weighted at odd steps), the others one-hot
            counts = rng.integers(0, 40, 256) if j == 1 else np.ones(256, np.int64)
            offsets = np.zeros(257, np.int64)
            offsets[1:] = np.cumsum(counts)
            keys = (np.int64(f + 1) << 40) | rng.integers(0, 3000 if j == 1 else 20, int(offsets[-1]))
            weights = rng.uniform(0.5, 2, keys.size).astype(np.float32) if j == 1 and step % 2 else None
            out.append(Ids(offsets, keys, weights))
        return out

    batches = [batch(s) for s in range(5)]
    grads = [[rng.normal(size=(256, 3, d)) for d in dims] for _ in range(5)]
    dtype, table_dtype = (np.float32, "bfloat16") if dtype == "bfloat16" else (dtype, None)
    results = []
    for n_threads in (1, 3):
        monkeypatch.setattr(_threads, "threads", lambda n=n_threads: n)
        tables = make_tables(fields, dtype, optimizer=OPTIMIZERS[optimizer], min_count=2, capacity=16, dims=dims,
                             table_dtype=table_dtype, store_w=1)
        shard = ShardTables(tables, fields, BLOCK_NAMES)
        outs = lambda: {k: np.empty((256, 3, d), tables[1].dtype) for k, d in enumerate(dims)}  # noqa: E731
        touched, pooled = shard.touch(keyed(batches[0]), train=True, step=0), outs()
        shard.gather_pooled(touched, pooled, catch_up_to=0)
        if n_threads > 1:  # the multi-hot field is cut, the one-hot ones are not
            cut = pieces(np.diff(touched.key_offsets) * 1.0, ~touched.hot)
            assert cut.parts[1] > 1 and (cut.parts[[0, 2]] == 1).all()
        gathered = [pooled]
        for step in range(4):
            following, pooled = shard.touch(keyed(batches[step + 1]), train=True, step=step + 1), outs()
            g = {k: x.astype(tables[1].dtype) for k, x in enumerate(grads[step])}
            if step % 2:
                shard.apply_then_gather(touched, g, step, 0.9, following, pooled, step + 1, 1.1)
            else:
                shard.apply_pooled(touched, g, step)
                shard.gather_pooled(following, pooled, step + 1)
            gathered.append(pooled)
            touched = following
        results.append((tables, gathered))
    (a, pa), (b, pb) = results
    for x, y in zip(pa, pb):
        for k in x:
            assert x[k].tobytes() == y[k].tobytes()
    for f in fields:
        assert_same_tables(a[f], b[f])


def test_pool_threads_ranges_errors_and_a_second_caller(monkeypatch) -> None:
    """``_threads.run``: every range once whatever the thread count (ranges beyond the pool's
    threads run on the caller), the first error raised after all ranges are done, and a second
    thread calling while the pool is busy runs its ranges itself."""
    import threading

    for n_threads in (1, 2, 5):
        monkeypatch.setattr(_threads, "threads", lambda n=n_threads: n)
        seen = []
        _threads.run(lambda lo, hi: seen.append((lo, hi)), np.arange(10.0))
        assert sorted(seen) == _threads.split(np.arange(10.0), n_threads) and sum(b - a for a, b in seen) == 10

    monkeypatch.setattr(_threads, "threads", lambda: 2)
    done = []

    def failing(lo: int, hi: int) -> None:
        done.append(lo)
        if lo > 0:
            raise KeyError("the second range")

    with pytest.raises(KeyError, match="second range"):
        _threads.run(failing, 10)
    assert sorted(done) == [0, 5]
    entered, release = threading.Event(), threading.Event()
    inner = []

    def holding(lo: int, hi: int) -> None:
        if lo == 0:
            entered.set()
            release.wait(10)

    outer = threading.Thread(target=_threads.run, args=(holding, 10))
    outer.start()
    assert entered.wait(10)
    _threads.run(lambda lo, hi: inner.append((lo, hi, threading.current_thread().name)), 10)  # the pool is busy
    release.set()
    outer.join(10)
    assert inner == [(0, 5, "MainThread"), (5, 10, "MainThread")]


def test_errors() -> None:
    fields = [0, 1]
    tables = make_tables(fields, np.float32, optimizer=SGD(0.1))
    shard = ShardTables(tables, fields, ["linear", "embedding", "extra"])
    good = Ids(np.arange(4, dtype=np.int64), np.arange(1, 4, dtype=np.int64), None)
    bad = Ids(np.arange(4, dtype=np.int64), np.array([5, -2**63, 6], dtype=np.int64), None)
    with pytest.raises(ValueError, match="position 1 is the reserved sentinel"):
        shard.touch(keyed([good, bad]), train=True, step=0)
    assert len(tables[1]) == 0  # no partial update of the field with the bad key
    with pytest.raises(ValueError, match="offsets"):
        shard.touch(keyed([good, Ids(np.array([0, 2, 1, 3]), np.arange(3, dtype=np.int64), None)]), train=True, step=0)
    touched = shard.touch(keyed([good, good]), train=True, step=0)
    tables[0].evict(-1, 5)  # every row expires: the touched rows are stale
    with pytest.raises(ValueError, match="changed .evict, load. since the lookup"):
        shard.gather_pooled(touched, {1: np.empty((3, 2, 4), np.float32)})
    with pytest.raises(ValueError, match="blocks"):
        ShardTables({0: EmbeddingTable(0, [BlockSpec("other", 1, SGD(0.1), Initializer())], seed=1)}, [0],
                    ["linear"]).touch(keyed([good]), train=False, step=0)


def test_reserved_rows_grow_in_place_and_keep_their_values() -> None:
    a = row_array(10_000, (3,), np.float32, reserve=True)  # 8 x 120 kB: below the mapped size
    assert a.shape == (10_000, 3) and not grow_in_place(a, 10_000, 10_001)
    big = row_array(300_000, (4,), np.float64, reserve=True)  # 9.6 MB: reserved
    big[:300_000] = 1.5
    address = big.ctypes.data
    if big.shape[0] == RESERVE * 300_000:  # Linux: a reservation
        assert grow_in_place(big, 300_000, 2_000_000)
        big[300_000:2_000_000] = 2.5
        assert big.ctypes.data == address and (big[:300_000] == 1.5).all() and (big[1_999_999] == 2.5).all()
    assert not grow_in_place(big, big.shape[0], big.shape[0] + 1)
    t = EmbeddingTable(0, [BlockSpec("e", 8, Adam(0.01), Initializer("normal", 0.1))], seed=1, capacity=16)
    keys = np.arange(1, 400_001, dtype=np.int64)
    t.lookup(keys, insert=True)
    m = t.memory()
    assert m["row_capacity"] >= len(t) and m["overhead"] < 1.5
    np.testing.assert_array_equal(t.gather("e", keys[::997], t.lookup(keys[::997], insert=False)),
                                  t.initial_values("e", keys[::997]))
