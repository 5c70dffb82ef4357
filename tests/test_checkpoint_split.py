"""Checkpoints of fields split by key (``des/placement.py``), in one process and without TensorFlow:
a split field is saved as one table file per share, loads whole or as the shares of any other group
size with every key's values, slots, counts and ``last_seen`` those of the field trained whole, and
export and ``des.check`` read its shares as one table."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from des.checkpoint import CheckpointError, field_table, load_checkpoint, read_manifest, save_checkpoint
from des.hashtable import FTRL, AdaGrad, Adam, BlockSpec, EmbeddingTable, Initializer, TableFormatError
from des.hashtable.table import SHARED_KEY
from des.placement import share_of
from des.strategies.base import ShardState

SPLIT = [[0, 1], [1]]  # field 0 whole on rank 0, field 1 split over ranks 0 and 1
MODEL = SimpleNamespace(num_fields=2, config=lambda: {"model": "stub", "num_fields": 2})


def new_table(field: int, unadmitted: str = "zero") -> EmbeddingTable:
    return EmbeddingTable(field, [BlockSpec("linear", 1, FTRL(0.05, l1=0.01), Initializer("zeros")),
                                  BlockSpec("embedding", 4, Adam(0.01), Initializer("normal", 0.1)),
                                  BlockSpec("aux", 2, AdaGrad(0.1), Initializer("uniform", 0.2))],
                          seed=9, dtype=np.float64, min_count=2, unadmitted=unadmitted)


def trained(field: int, shares: list[tuple[int, int]], unadmitted: str = "zero") -> list[EmbeddingTable]:
    """A table per share, each trained on its share's ids of the same batches (share (0, 1): whole)."""
    tables = [new_table(field, unadmitted) for _ in shares]
    rng = np.random.default_rng(field)
    for step in range(6):
        keys = rng.integers(-300, 300, 500)
        grads = {b.name: rng.normal(size=(keys.size, b.dim)) for b in tables[0].blocks}
        for table, (share, size) in zip(tables, shares):
            mine = share_of(keys, size) == share
            rows = table.lookup(keys[mine], insert=True, step=step)
            for name, grad in grads.items():
                table.apply_gradients(name, rows, grad[mine], step)
    for table in tables:
        table.evict(ttl=3, step=6)
    return tables


@pytest.fixture(scope="module")
def field1():
    """Field 1 trained whole, and as shares 0 and 1 of 2."""
    whole, *parts = trained(1, [(0, 1), (0, 2), (1, 2)])
    assert whole.evicted_count and len(whole) > 100 and all(len(p) for p in parts)
    return whole, parts


def by_key(table: EmbeddingTable) -> dict[str, np.ndarray]:
    """The rows' arrays by key, and the pending keys (already by key) as ``pending.*``."""
    arrays = table.to_arrays()
    order = np.argsort(arrays["keys"], kind="stable")
    by = {name: a[order] for name, a in arrays.items() if not name.startswith("pending.")}
    keys, counts = table.pending()
    return {**by, "pending.keys": keys, "pending.counts": counts}


def assert_rows(expected: EmbeddingTable, got: EmbeddingTable, share: tuple[int, int] | None = None) -> None:
    """``got`` holds exactly ``expected``'s rows and pending keys (of ``share``'s keys), bit for bit."""
    want, have = by_key(expected), by_key(got)
    if share is not None:
        mine = share_of(want["keys"], share[1]) == share[0]
        pending = share_of(want["pending.keys"], share[1]) == share[0]
        want = {name: a[pending if name.startswith("pending.") else mine] for name, a in want.items()}
    assert set(want) == set(have)
    for name in want:
        np.testing.assert_array_equal(have[name], want[name], err_msg=name)
    assert got.lookup(want["keys"], insert=False).min() >= 0  # the index finds every row


def test_shares_load_as_one_table_and_as_the_shares_of_another_group_size(tmp_path, field1) -> None:
    whole, parts = field1
    whole.save(tmp_path / "whole.table")
    paths = []
    for share, part in enumerate(parts):
        paths.append(tmp_path / f"share-{share}.table")
        part.save(paths[-1])
    merged = EmbeddingTable.load_parts([(path, None) for path in paths])
    assert_rows(whole, merged)
    assert merged.evicted_count == whole.evicted_count and merged.admitted_total == whole.admitted_total
    assert merged.last_update_step == whole.last_update_step == 5
    keys = []
    for share in range(3):  # 2 shares -> 3, and the whole table -> 3
        def mine(k, share=share):
            return share_of(k, 3) == share
        for source in ([(path, mine) for path in paths], [(tmp_path / "whole.table", mine)]):
            cut = EmbeddingTable.load_parts(source)
            assert_rows(whole, cut, (share, 3))
            assert cut.evicted_count == 0 and cut.admitted_total == cut.admitted_count  # a cut's counters
        keys.append(cut.keys())
    assert sorted(np.concatenate(keys).tolist()) == sorted(whole.keys().tolist())


def test_parts_must_agree_and_hold_distinct_keys(tmp_path, field1) -> None:
    _, parts = field1
    parts[0].save(tmp_path / "a.table")
    parts[0].save(tmp_path / "again.table")
    with pytest.raises(TableFormatError, match=r"again.table: .*duplicated.*\(also in .*a.table\)") as info:
        EmbeddingTable.load_parts([(tmp_path / "a.table", None), (tmp_path / "again.table", None)])
    assert "\n" not in str(info.value)
    other = new_table(1)
    other.min_count = 3
    other.save(tmp_path / "other.table")
    with pytest.raises(TableFormatError, match=r"other.table: its min_count differ from those of .*a.table"):
        EmbeddingTable.load_parts([(tmp_path / "a.table", None), (tmp_path / "other.table", None)])


def test_the_shared_row_is_the_field_s_not_a_share_s(tmp_path) -> None:
    parts = trained(3, [(0, 2), (1, 2)], unadmitted="shared")
    for share, part in enumerate(parts):
        part.save(tmp_path / f"{share}.table")
    rows = [by_key(p) for p in parts]
    first = {name: a[rows[0]["keys"] == SHARED_KEY] for name, a in rows[0].items() if not name.startswith("pending.")}
    assert first["keys"].size == 1 and (rows[1]["keys"] == SHARED_KEY).sum() == 1
    for size in (1, 3):  # every share keeps share 0's shared row (a whole table: the one row)
        for share in range(size):
            table = EmbeddingTable.load_parts([(tmp_path / f"{s}.table", lambda k: share_of(k, size) == share)
                                               for s in range(2)])
            got = by_key(table)
            assert (got["keys"] == SHARED_KEY).sum() == 1
            for name, a in got.items():
                if not name.startswith("pending."):
                    np.testing.assert_array_equal(a[got["keys"] == SHARED_KEY], first[name], err_msg=name)


# ---------------------------------------------------------------------------------- whole checkpoints
class Slot:
    """A dense optimizer state (``state_dict`` / ``load_state_dict``)."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"m": self.value.copy()}

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        self.value[...] = d["m"]


class Dense:
    """``DenseParams``' face to checkpoints: one field weight ``w`` ([fields, 3]) and a top bias."""

    def __init__(self, fields: list[int], fill: bool) -> None:
        self.fields = fields
        value = np.array([[10.0 * f + c for c in range(3)] for f in fields]) if fill else np.zeros((len(fields), 3))
        self.field_params, self.top_params = {"0:stub:w": value}, {"bias": np.full(1, 0.5 if fill else 0.0)}
        self.slots = {f: Slot(value[j] * 2) for j, f in enumerate(fields)}
        self.top_states = {"bias": Slot(self.top_params["bias"] * 3)}

    def index(self, name: str, field: int) -> int | None:
        return self.fields.index(field) if field in self.fields else None

    def field_state(self, name: str, field: int) -> Slot:
        return self.slots[field]


class Rank:
    """One rank of a strategy: its communicator (a barrier of threads) and its state."""

    def __init__(self, placement: list[list[int]], rank: int, tables: dict[int, EmbeddingTable],
                 barrier: threading.Barrier | None = None) -> None:
        self.comm = SimpleNamespace(rank=rank, size=len(placement), barrier=lambda site: barrier.wait())
        fields = placement[rank]
        self._state = ShardState(MODEL, np.dtype(np.float64), 9, placement, 6, tables, Dense(fields, bool(tables)))

    def state(self) -> ShardState:
        return self._state

    def load_state(self, state: ShardState) -> None:
        pass


def save_on(placement: list[list[int]], tables: list[dict[int, EmbeddingTable]], root) -> object:
    """A checkpoint saved by one thread per rank, each holding ``tables[rank]``."""
    barrier = threading.Barrier(len(placement), timeout=60)
    ranks = [Rank(placement, r, tables[r], barrier) for r in range(len(placement))]
    with ThreadPoolExecutor(len(ranks)) as pool:
        done = [pool.submit(save_checkpoint, rank, root, epoch=0, next_batch=6, config={}) for rank in ranks]
        return [d.result() for d in done][0]


def load_on(placement: list[list[int]], path) -> list[dict[int, EmbeddingTable]]:
    """Every rank's tables and dense state after loading ``path`` with ``placement``."""
    ranks = [Rank(placement, r, {f: new_table(f) for f in placement[r]}) for r in range(len(placement))]
    for rank in ranks:
        load_checkpoint(rank, path)
    return ranks


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, field1):
    whole1, (share0, share1) = field1
    (field0,) = trained(0, [(0, 1)])
    root = tmp_path_factory.mktemp("split")
    split = save_on(SPLIT, [{0: field0, 1: share0}, {1: share1}], root / "split")
    whole = save_on([[0, 1]], [{0: field0, 1: whole1}], root / "whole")
    return SimpleNamespace(split=split, whole=whole, field0=field0, field1=whole1)


def test_a_split_field_is_saved_in_shares_and_its_dense_slices_once(checkpoints) -> None:
    _, manifest = read_manifest(checkpoints.split)
    assert sorted(manifest["files"]) == ["dense.npz", "field-000.dense.npz", "field-000.table", "field-001.dense.npz",
                                         "field-001.share-0-of-2.table", "field-001.share-1-of-2.table"]
    assert manifest["placement"] == SPLIT


@pytest.mark.parametrize("placement", [[[0, 1]], [[1], [0, 1], [1]], SPLIT], ids=["whole", "3 shares", "2 shares"])
def test_any_placement_loads_a_split_checkpoint(checkpoints, placement) -> None:
    for rank, fields in zip(load_on(placement, checkpoints.split), placement):
        state = rank.state()
        for field in fields:
            group = [r for r, held in enumerate(placement) if field in held]
            share = (group.index(rank.comm.rank), len(group)) if len(group) > 1 else None
            assert_rows(checkpoints.field1 if field else checkpoints.field0, state.tables[field], share)
            j = state.dense.fields.index(field)
            np.testing.assert_array_equal(state.dense.field_params["0:stub:w"][j], 10.0 * field + np.arange(3))
            np.testing.assert_array_equal(state.dense.slots[field].value, 2 * (10.0 * field + np.arange(3)))
        assert state.dense.top_params["bias"][0] == 0.5 and state.dense.top_states["bias"].value[0] == 1.5


def test_a_whole_checkpoint_loads_in_shares(checkpoints) -> None:
    for rank in load_on([[1], [0, 1], [1]], checkpoints.whole):
        assert_rows(checkpoints.field1, rank.state().tables[1], (rank.comm.rank, 3))


def test_a_corrupt_or_missing_share_is_one_error(checkpoints, tmp_path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(checkpoints.split, copy)
    part = copy / "field-001.share-1-of-2.table"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    for placement in ([[0, 1]], [[1], [0, 1], [1]]):
        with pytest.raises(CheckpointError, match=r"field-001.share-1-of-2.table is corrupt \(sha256") as info:
            load_on(placement, copy)
        assert "\n" not in str(info.value)
    folder, manifest = read_manifest(checkpoints.split)
    del manifest["files"]["field-001.share-0-of-2.table"]
    with pytest.raises(CheckpointError, match="inconsistent set of field 1's tables: field-001.share-1-of-2.table$"):
        field_table(folder, manifest, 1)


def test_export_and_check_read_a_split_field_as_one_table(checkpoints) -> None:
    from des.check import state_arrays
    from des.serving.state import read_field_table

    split, whole = read_manifest(checkpoints.split), read_manifest(checkpoints.whole)
    blocks = ["linear", "embedding", "aux"]
    a, b = read_field_table(*split, 1, blocks), read_field_table(*whole, 1, blocks)
    order_a, order_b = np.argsort(a["keys"]), np.argsort(b["keys"])
    np.testing.assert_array_equal(a["keys"][order_a], b["keys"][order_b])
    for name in blocks:
        np.testing.assert_array_equal(a["values"][name][order_a], b["values"][name][order_b])
    got, expected = state_arrays(checkpoints.split), state_arrays(checkpoints.whole)
    assert sorted(got) == sorted(expected) and "field-001.table/block.1.slot.m" in got
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
