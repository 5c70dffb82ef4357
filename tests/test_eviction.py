"""Bounded tables: eviction by age (``--ttl``) and by a row budget (``--max-rows-per-field``, the
least recently seen rows first), on a table, on a rank's shares, and in a run (``--evict-every``).
The N-ranks-equal-1-rank case is in ``tests/test_exactness.py``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from des.config import load_config
from des.errors import UsageError
from des.hashtable import SGD, Adam, BlockSpec, EmbeddingTable, Initializer
from des.hashtable.table import SHARED_KEY
from des.strategies.base import ShardState
from tests.conftest import criteo_head, run_here


def make(field: int = 1, **kw) -> EmbeddingTable:
    return EmbeddingTable(field=field, seed=3, dtype=np.float64, capacity=16, blocks=[
        BlockSpec("linear", 1, SGD(0.5), Initializer("uniform", 0.1)),
        BlockSpec("embedding", 4, Adam(0.01), Initializer("normal", 0.1))], **kw)


def expected_kept(last: dict[int, int], budget: int) -> set[int]:
    """The model: the ``budget`` most recently seen keys, ties to the larger key."""
    return set(sorted(last, key=lambda k: (last[k], k))[-budget:])


def test_the_budget_keeps_the_most_recently_seen_rows_ties_by_key() -> None:
    t = make()
    last: dict[int, int] = {}
    for step, keys in enumerate([[5, -3, 9, 40], [7, 2**62, -(2**62), 11], [9, 1, 2, 3], [100, 50]]):
        t.lookup(np.array(keys, dtype=np.int64), insert=True, step=step)
        last.update(dict.fromkeys(keys, step))
    assert t.evict(None, 10, max_rows=len(t)) == 0  # at the budget: nothing to do
    # 13 keys; steps 3 and 2 hold 2 + 4 of them: a budget of 7 cuts into step 1's four (ties by key)
    assert t.evict(None, 10, max_rows=7) == 6 and t.evicted_count == 6
    assert set(t.keys().tolist()) == expected_kept(last, 7) == {100, 50, 9, 1, 2, 3, 2**62}
    assert len(t) == 7 and t.evict(None, 10, max_rows=7) == 0
    # rows stay dense and findable after the compaction
    rows = t.lookup(t.keys(), insert=False)
    assert sorted(rows.tolist()) == list(range(7))


def test_ttl_then_budget_and_evicted_keys_come_back_fresh() -> None:
    rng = np.random.default_rng(7)
    t = make()
    last: dict[int, int] = {}
    for step in range(1, 31):
        keys = rng.integers(0, 400, 25)
        rows = t.lookup(keys, insert=True, step=step)
        t.apply_gradients("embedding", rows, np.ones((keys.size, 4)), step=step)
        last.update(dict.fromkeys(keys.tolist(), step))
        if step % 5 == 0:
            ttl, budget = int(rng.integers(3, 12)), int(rng.integers(20, 120))
            alive = {k: s for k, s in last.items() if step - s <= ttl}
            kept = expected_kept(alive, budget)
            assert t.evict(ttl, step, max_rows=budget) == len(last) - len(kept)
            assert set(t.keys().tolist()) == kept and len(t) <= budget  # never above the budget
            last = {k: last[k] for k in kept}
    gone = np.array(sorted(set(range(400)) - set(last)), dtype=np.int64)[:5]
    rows = t.lookup(gone, insert=True, step=31)
    np.testing.assert_array_equal(t.gather("embedding", gone, rows), t.initial_values("embedding", gone))
    assert (t.metadata(rows)["count"] == 1).all() and (t.arrays.steps[1][rows] == 0).all()


def test_the_shared_row_is_never_evicted() -> None:
    t = make(unadmitted="shared", min_count=2)
    for step in range(4):  # each id twice: admitted, a row of its own
        t.lookup(np.tile(np.arange(10 * step, 10 * step + 10, dtype=np.int64), 2), insert=True, step=step)
    shared = t.shared_row(None)
    t.arrays.meta[shared, 1] = -100  # the least recently seen row of all
    assert len(t) == 41 and t.evict(None, 4, max_rows=5) == 36
    assert SHARED_KEY in t.keys().tolist() and len(t) == 5
    assert t.evict(-1, 4) == 4 and t.keys().tolist() == [SHARED_KEY]  # every id's row expired
    rows = t.lookup(np.array([1, 2]), insert=False)
    assert (rows == t.shared_row(None)).all()
    # a key equal to SHARED_KEY in a table without a shared row is an ordinary key
    plain = make()
    plain.lookup(np.array([SHARED_KEY, 3]), insert=True, step=0)
    plain.lookup(np.array([4]), insert=True, step=1)
    assert plain.evict(None, 1, max_rows=1) == 2 and plain.keys().tolist() == [4]


def test_a_rank_evicts_each_table_by_its_budget_and_age() -> None:
    tables = {f: make(field=f) for f in (0, 1)}
    for t in tables.values():
        t.lookup(np.arange(50, dtype=np.int64), insert=True, step=0)
    state = ShardState(None, np.dtype(np.float64), 3, [[0, 1]], 2, tables, None)
    assert state.evict(0, 0, 9) == {0: 41, 1: 41}
    assert len(tables[0]) == 9 and len(tables[1]) == 9
    assert state.evict(0, 1, 0) == {0: 9, 1: 9}  # --ttl 1 at step 2: rows of step 0 expire


def test_a_budget_over_fields_split_by_key_is_refused() -> None:
    """One table's ranking of its rows by when they were last seen cannot be made by its shares apart."""
    from des.config import TrainConfig
    from des.errors import ConfigError
    from des.strategies import get_strategy

    config = TrainConfig(placement="split", split_fields="all", max_rows_per_field=10)
    with pytest.raises(ConfigError, match="--max-rows-per-field"):
        get_strategy("des").place(3, 2, [5, 5, 5], config)
    assert get_strategy("des").place(3, 2, [5, 5, 5], TrainConfig(placement="split", split_fields="all"))


@pytest.mark.parametrize(("flags", "message"), [
    (["--evict-every", "4"], "--evict-every needs --ttl or --max-rows-per-field"),
    (["--max-rows-per-field", "-1"], "--max-rows-per-field must not be negative"),
])
def test_bad_eviction_flags(flags: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_config(flags)


def test_a_run_evicts_every_k_steps_and_reports_it(tmp_path: Path) -> None:
    data = criteo_head(tmp_path / "small.tsv", 800)
    run_here(["-m", "des.train", "--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--output",
              str(tmp_path / "run"), "--model", "lr", "--batch-size", "64", "--max-steps", "6", "--no-progress",
              "--unadmitted", "init", "--max-rows-per-field", "40", "--evict-every", "2", "--ttl", "3"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evictions = [r for r in records if "evicted_rows" in r]
    assert [r["step"] for r in evictions] == [2, 4, 6]
    assert all(max(r["rows"].values()) <= 40 for r in evictions)
    assert sum(evictions[0]["evicted_rows"].values()) > 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    totals = {f: sum(r["evicted_rows"][f] for r in evictions) for f in evictions[0]["evicted_rows"]}
    assert summary["evicted_rows"] == totals
    manifest = json.loads((tmp_path / "run" / "checkpoints" / "step-00000006" / "manifest.json").read_text())
    assert manifest["evicted_rows"] == 0  # evicted at step 6 by the cadence, not again by the checkpoint
    table = EmbeddingTable.load(tmp_path / "run" / "checkpoints" / "step-00000006" / "field-020.table")
    assert len(table) <= 40
