"""Save/load round trips (other capacities, continued training) and corrupt-file errors."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

from des.hashtable import (FTRL, AdaGrad, Adam, BlockSpec, EmbeddingTable, Initializer,
                           TableFormatError)
from des.hashtable.format import payload_digest, write_table_file


def trained_table(capacity: int = 64, store_w: int = 0, dtype=np.float32) -> EmbeddingTable:
    """The order-1 FTRL block holds z and n only (w computed when read) unless ``store_w``."""
    t = EmbeddingTable(field=5, seed=9, capacity=capacity, min_count=2, unadmitted="zero", dtype=dtype, blocks=[
        BlockSpec("linear", 1, FTRL(0.05, l1=0.01, store_w=store_w), Initializer("zeros")),
        BlockSpec("embedding", 4, Adam(0.01), Initializer("normal", 0.1)),
        BlockSpec("aux", 2, AdaGrad(0.1), Initializer("uniform", 0.2))])
    rng = np.random.default_rng(0)
    for step in range(5):
        keys = rng.integers(1, 400, 600)
        rows = t.lookup(keys, insert=True, step=step)
        for b in t.blocks:
            t.apply_gradients(b.name, rows, rng.normal(size=(keys.size, b.dim)).astype(dtype), step)
    t.evict(ttl=2, step=5)
    return t


def assert_same(a: EmbeddingTable, b: EmbeddingTable) -> None:
    assert len(a) == len(b) and a.evicted_count == b.evicted_count
    assert a.admitted_total == b.admitted_total
    for x, y in zip(a.pending(), b.pending()):  # the keys counted below min_count, and their counts
        np.testing.assert_array_equal(x, y)
    keys = a.keys()
    np.testing.assert_array_equal(keys, b.keys())  # row order is kept
    ra, rb = a.lookup(keys, insert=False), b.lookup(keys, insert=False)
    np.testing.assert_array_equal(ra, rb)
    for name in ("count", "last_seen", "admitted"):
        np.testing.assert_array_equal(a.metadata(ra)[name], b.metadata(rb)[name])
    for i, spec in enumerate(a.blocks):
        np.testing.assert_array_equal(a.arrays.blocks[i][:len(a)], b.arrays.blocks[i][:len(b)])
        if a.arrays.steps[i].size:
            np.testing.assert_array_equal(a.arrays.steps[i][:len(a)], b.arrays.steps[i][:len(b)])
        np.testing.assert_array_equal(a.gather(spec.name, keys, ra), b.gather(spec.name, keys, rb))


@pytest.mark.parametrize("capacity", [None, 16, 1 << 14])
def test_round_trip_and_continued_training(tmp_path, capacity) -> None:
    t = trained_table()
    path = tmp_path / "field5.table"
    t.save(path)
    assert os.listdir(tmp_path) == ["field5.table"]  # no temporary left behind
    u = EmbeddingTable.load(path, capacity=capacity)
    assert u.blocks == t.blocks and u.seed == t.seed and u.field == t.field
    assert u.min_count == 2 and u.unadmitted == "zero" and u.dtype == t.dtype
    if capacity == 1 << 14:
        assert u.capacity == capacity
    assert_same(t, u)
    rng = np.random.default_rng(1)
    for step in range(5, 8):  # both continue identically, incl. new keys and growth
        keys = rng.integers(1, 2000, 900)
        for x in (t, u):
            rows = x.lookup(keys, insert=True, step=step)
            for b in x.blocks:
                g = np.random.default_rng(step).normal(size=(keys.size, b.dim)).astype(np.float32)
                x.apply_gradients(b.name, rows, g, step)
    assert_same(t, u)
    t.save(path)  # overwriting works
    assert_same(t, EmbeddingTable.load(path))


def continue_training(tables, steps=range(5, 8)) -> None:
    rng = np.random.default_rng(1)
    for step in steps:  # the same keys and gradients into each, new keys too
        keys = rng.integers(1, 2000, 900)
        for x in tables:
            rows = x.lookup(keys, insert=True, step=step)
            for b in x.blocks:
                g = np.random.default_rng(step).normal(size=(keys.size, b.dim)).astype(x.dtype)
                x.apply_gradients(b.name, rows, g, step)


def assert_same_values(a: EmbeddingTable, b: EmbeddingTable) -> None:
    """The same keys, values as read (bit for bit) and slots, whatever each stores of the values."""
    keys = a.keys()
    np.testing.assert_array_equal(keys, b.keys())
    ra, rb = a.lookup(keys, insert=False), b.lookup(keys, insert=False)
    for i, spec in enumerate(a.blocks):
        assert a.gather(spec.name, keys, ra).tobytes() == b.gather(spec.name, keys, rb).tobytes()
        for x, y in zip(spec.columns(a.arrays.blocks[i][:len(a)])[1], b.blocks[i].columns(b.arrays.blocks[i][:len(b)])[1]):
            assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ftrl_rows_hold_z_and_n_and_files_holding_w_still_load(tmp_path, dtype) -> None:
    """FTRL on a zeros-initialized block stores z and n only (4 B less per float32 id): it trains and
    reads the same bits as w stored; a file holds z and n; a file of an earlier version (w stored,
    its FTRL without store_w) loads as it was, or converted to either form, and trains on alike."""
    stored, computed = trained_table(store_w=1, dtype=dtype), trained_table(dtype=dtype)
    assert [b.computed for b in computed.blocks] == [True, False, False] and computed.arrays.blocks[0].shape[1] == 2
    assert stored.payload_bytes_per_row() - computed.payload_bytes_per_row() == dtype().itemsize
    assert_same_values(stored, computed)
    computed.save(tmp_path / "new.table")
    with np.load(tmp_path / "new.table") as f:
        assert "block.0.values" not in f.files and {"block.0.slot.z", "block.0.slot.n"} <= set(f.files)
    stored.save(tmp_path / "old.table")  # as an earlier version wrote it: FTRL without store_w
    with np.load(tmp_path / "old.table") as f:
        arrays = {k: f[k] for k in f.files if k != "header"}
        header = json.loads(f["header"].tobytes())
    del header["blocks"][0]["optimizer"]["store_w"]
    write_table_file(tmp_path / "old.table", header, arrays)
    old = EmbeddingTable.load(tmp_path / "old.table")
    assert old.blocks == stored.blocks and not old.blocks[0].computed
    assert_same(stored, old)
    as_new = EmbeddingTable.load(tmp_path / "old.table", computed=[True, False, False])
    as_old = EmbeddingTable.load(tmp_path / "new.table", computed=[False, False, False])
    assert as_new.blocks == computed.blocks and as_old.blocks == stored.blocks
    assert_same(computed, as_new)
    assert_same(stored, as_old)  # w computed from z and n on load: the bits the update stored
    tables = [stored, computed, old, as_new, as_old, EmbeddingTable.load(tmp_path / "new.table")]
    continue_training(tables)
    for t in tables[1:]:
        assert_same_values(stored, t)


def test_admitted_total_is_saved_and_files_without_it_still_load(tmp_path) -> None:
    t = trained_table()
    assert t.evicted_count > 0 and t.admitted_total > t.admitted_count > 0  # some were evicted
    path = tmp_path / "t.table"
    t.save(path)
    assert EmbeddingTable.load(path).admitted_total == t.admitted_total
    old = tmp_path / "old.table"  # as written before admitted_total existed: the header lacks it
    _rewrite(path, old, header_edit=lambda h: h.pop("admitted_total"))
    u = EmbeddingTable.load(old)
    assert u.admitted_total == u.admitted_count == t.admitted_count  # the best lower bound
    np.testing.assert_array_equal(u.keys(), t.keys())


def test_empty_table_round_trip(tmp_path) -> None:
    t = EmbeddingTable(field=0, seed=1, dtype=np.float64,
                       blocks=[BlockSpec("e", 2, Adam(0.1), Initializer("normal", 1.0))])
    t.save(tmp_path / "e")
    u = EmbeddingTable.load(tmp_path / "e")
    assert len(u) == 0 and u.dtype == np.float64


def _rewrite(src, dst, *, header_edit=None, array_edit=None, fix_digest=False) -> None:
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays["header"].tobytes())
    if header_edit:
        header_edit(header)
    if array_edit:
        array_edit(arrays)
    if fix_digest:
        header["sha256"] = payload_digest({k: v for k, v in arrays.items() if k != "header"})
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    with open(dst, "wb") as f:
        np.savez(f, **arrays)


def test_corrupt_files_raise_table_format_error(tmp_path) -> None:
    t = trained_table()
    good = tmp_path / "good"
    t.save(good)
    data = good.read_bytes()

    def expect(path, pattern: str) -> None:
        with pytest.raises(TableFormatError, match=pattern) as info:
            EmbeddingTable.load(path)
        msg = str(info.value)
        assert str(path) in msg and "\n" not in msg
        assert isinstance(info.value, ValueError)

    trunc = tmp_path / "truncated"
    trunc.write_bytes(data[: len(data) // 2])
    expect(trunc, "corrupt or truncated")

    # flip one byte inside the payload of the biggest array: zip's CRC-32 catches it
    with zipfile.ZipFile(good) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    offset = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.file_size // 2
    flipped = bytearray(data)
    flipped[offset] ^= 0x10
    (tmp_path / "flipped").write_bytes(bytes(flipped))
    expect(tmp_path / "flipped", "checksum")

    # a consistent zip whose payload no longer matches the header's sha256
    def bump(arrays):
        arrays["block.1.values"] = arrays["block.1.values"] + np.float32(1)
    _rewrite(good, tmp_path / "sha", array_edit=bump)
    expect(tmp_path / "sha", "checksum error: payload sha256")

    _rewrite(good, tmp_path / "v2", header_edit=lambda h: h.update(version=2))
    expect(tmp_path / "v2", "unsupported format version 2")

    _rewrite(good, tmp_path / "fmt", header_edit=lambda h: h.update(format="other"))
    expect(tmp_path / "fmt", "not a des.hashtable file")

    _rewrite(good, tmp_path / "rows", header_edit=lambda h: h.update(n_rows=h["n_rows"] + 1))
    expect(tmp_path / "rows", "inconsistent")

    def drop_block(h):
        h["blocks"] = h["blocks"][:2]
    _rewrite(good, tmp_path / "blocks", header_edit=drop_block)
    expect(tmp_path / "blocks", "inconsistent")

    def dup_key(arrays):
        arrays["keys"] = arrays["keys"].copy()
        arrays["keys"][1] = arrays["keys"][0]

    _rewrite(good, tmp_path / "dup", array_edit=dup_key)
    expect(tmp_path / "dup", "checksum")  # caught by the digest first
    _rewrite(good, tmp_path / "dup2", array_edit=dup_key, fix_digest=True)
    expect(tmp_path / "dup2", "inconsistent.*duplicated")

    def wrong_dtype(arrays):
        arrays["count"] = arrays["count"].astype(np.int64)
    _rewrite(good, tmp_path / "dtype", array_edit=wrong_dtype, fix_digest=True)
    expect(tmp_path / "dtype", "header says")  # the header's array table no longer matches

    (tmp_path / "garbage").write_bytes(b"not a zip at all" * 10)
    expect(tmp_path / "garbage", "corrupt or truncated")

    with pytest.raises(FileNotFoundError):
        EmbeddingTable.load(tmp_path / "missing")


def test_a_table_without_counters_round_trips_and_converts(tmp_path) -> None:
    """The compact layout saves no count or last_seen and loads bit for bit; a file with counters
    loads without them (the same rows, values and slots) and back with them (every row admitted);
    a table without counters refuses what needs them (eviction, incremental saves, min_count > 1)."""
    blocks = [BlockSpec("linear", 1, FTRL(0.05, l1=0.01), Initializer("zeros")),
              BlockSpec("embedding", 4, Adam(0.01), Initializer("normal", 0.1))]
    tables = [EmbeddingTable(field=5, seed=9, capacity=32, blocks=blocks, counters=c) for c in (True, False)]
    rng = np.random.default_rng(1)
    for step in range(4):
        keys = rng.integers(1, 900, 500)
        grads = [rng.normal(size=(keys.size, b.dim)).astype(np.float32) for b in blocks]
        for t in tables:
            rows = t.lookup(keys, insert=True, step=step)
            for b, g in zip(blocks, grads):
                t.apply_gradients(b.name, rows, g, step)
    counted, compact = tables
    compact.save(tmp_path / "compact.npz")
    counted.save(tmp_path / "counted.npz")
    loaded = EmbeddingTable.load(tmp_path / "compact.npz")
    assert not loaded.counters and set(loaded.to_arrays()) == set(compact.to_arrays())
    assert "count" not in loaded.to_arrays()
    converted = EmbeddingTable.load(tmp_path / "counted.npz", counters=False)
    back = EmbeddingTable.load(tmp_path / "compact.npz", counters=True)
    for t in (loaded, converted, back):
        assert all(a.tobytes() == b.tobytes() for name, a in compact.to_arrays().items()
                   for other, b in t.to_arrays().items() if name == other)
    meta = back.metadata(np.arange(len(back)))
    assert meta["admitted"].all() and (meta["count"] == 1).all() and (meta["last_seen"] == 3).all()
    with pytest.raises(ValueError, match="no last-seen steps to evict by"):
        compact.evict(ttl=1, step=4)
    with pytest.raises(ValueError, match="no incremental save"):
        compact.save(tmp_path / "inc.npz", since=2)
    with pytest.raises(ValueError, match="min_count 2 needs counters"):
        EmbeddingTable(field=5, seed=9, blocks=blocks, min_count=2, counters=False)
    assert compact.evict(ttl=None, step=4) == 0 and compact.delete(compact.keys()[:10]) == 10


def test_pending_keys_are_saved_whole_and_old_files_load_their_unadmitted_rows_as_pending(tmp_path) -> None:
    """A key counted below min_count has no row, only its count (pending): every save holds the
    pending keys, an incremental one too (they have no last-seen step), and loading or upserting
    restores them; a file of an earlier version, whose unadmitted keys are rows, loads them as
    pending keys with their counts, the table that training would hold now."""
    from des.hashtable.format import read_table_file, write_table_file

    t = trained_table()
    t.lookup(np.arange(1000, 1010), insert=True, step=5)  # seen once: pending
    keys, counts = t.pending()
    assert t.pending_count == keys.shape[0] == 10 and (counts == 1).all()
    assert (t.lookup(keys, insert=False) == -1).all() and t.admitted_count == len(t)
    t.save(tmp_path / "full.table")
    t.lookup(keys[:3], insert=True, step=6)  # admitted now: rows of their own, counted 2
    assert t.pending_count == keys.shape[0] - 3 and (t.lookup(keys[:3], insert=False) >= 0).all()
    t.save(tmp_path / "inc.table", since=6)
    _, increment = read_table_file(tmp_path / "inc.table")
    assert increment["keys"].shape[0] == 3 and increment["pending.keys"].shape[0] == t.pending_count
    u = EmbeddingTable.load(tmp_path / "full.table")
    u.upsert(EmbeddingTable.load(tmp_path / "inc.table").to_arrays())
    u.admitted_total = t.admitted_total
    assert_same(t, u)
    # an earlier version's file: every key a row, those counted once unadmitted
    old = EmbeddingTable(field=5, seed=9, capacity=64, min_count=1, blocks=t.blocks)
    old.lookup(np.array([7, 8, 8, 9, 9, 9]), insert=True, step=0)
    old.save(tmp_path / "old.table")
    header, arrays = read_table_file(tmp_path / "old.table")
    write_table_file(tmp_path / "old.table", {**header, "min_count": 3}, arrays)
    v = EmbeddingTable.load(tmp_path / "old.table")
    assert v.keys().tolist() == [9] and [a.tolist() for a in v.pending()] == [[7, 8], [1, 2]]
    v.lookup(np.array([8]), insert=True, step=1)  # its third occurrence: admitted
    assert sorted(v.keys().tolist()) == [8, 9] and v.metadata(v.lookup(np.array([8]), insert=False))["count"] == [3]
    with pytest.raises(ValueError, match=r"pending counts must be in \[1, 3\)"):
        v.set_pending(np.array([5]), np.array([3]))
