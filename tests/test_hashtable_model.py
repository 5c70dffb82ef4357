"""Property-based test: EmbeddingTable against a Python dict model over random sequences of
insert / evaluation lookup / update / bulk insert (growth) / evict / save+load."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from des.hashtable import SGD, Adam, BlockSpec, EmbeddingTable, Initializer

UNIVERSE = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, -1, -2, -(2**63) + 1, 2**63 - 1, 0,
            (1 << 40) | 7, (2 << 40) | 7, 2**32, 2**32 + 1, -(2**32)]
LR = 0.5

batches = st.lists(st.sampled_from(UNIVERSE), min_size=0, max_size=25)


class TableModel(RuleBasedStateMachine):
    """model[key] = {"w": float, "count": int, "last": int, "adam_steps": int}; a key counted below
    ``min_count`` is pending in the table (no row, its count in the index)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="des_ht_model_")
        self.model: dict[int, dict] = {}
        self.step = 0
        self.fresh = 10**12
        self.admissions = 0  # admissions ever: the model of admitted_total

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize(min_count=st.integers(0, 3), unadmitted=st.sampled_from(["init", "zero"]),
                capacity=st.sampled_from([16, 40, 1000]))
    def setup(self, min_count: int, unadmitted: str, capacity: int) -> None:
        self.t = EmbeddingTable(field=4, seed=17, dtype=np.float64, capacity=capacity,
                                min_count=min_count, unadmitted=unadmitted, blocks=[
                                    BlockSpec("w", 1, SGD(LR), Initializer("uniform", 1.0)),
                                    BlockSpec("e", 2, Adam(0.01), Initializer("normal", 0.1))])

    def admitted(self, k: int) -> bool:
        return self.model[k]["count"] >= self.t.min_count

    def insert_keys(self, keys: list[int]) -> None:
        rows = self.t.lookup(np.array(keys, dtype=np.int64), insert=True, step=self.step)
        init = self.t.initial_values("w", np.array(keys, dtype=np.int64))[:, 0] if keys else []
        for k, w0 in zip(keys, init):
            if k not in self.model and self.t.min_count == 0:
                self.admissions += 1  # admitted on insertion
            entry = self.model.setdefault(k, {"w": w0, "count": 0, "adam_steps": 0})
            entry["count"] += 1
            if entry["count"] == self.t.min_count:
                self.admissions += 1
            entry["last"] = self.step
        by_key: dict[int, int] = {}
        for k, r in zip(keys, rows.tolist()):
            assert by_key.setdefault(k, r) == r  # duplicates share a row
        held = [r for r in by_key.values() if r >= 0]  # pending keys: -1
        assert len(set(held)) == len(held)  # distinct keys, distinct rows
        assert all((r >= 0) == self.admitted(k) for k, r in by_key.items())

    @rule(keys=batches)
    def insert(self, keys: list[int]) -> None:
        self.insert_keys(keys)

    @rule(n=st.integers(1, 300))
    def bulk_insert(self, n: int) -> None:  # forces index and row growth
        keys = list(range(self.fresh, self.fresh + n))
        self.fresh += n
        self.insert_keys(keys)

    @rule(dt=st.integers(1, 3))
    def tick(self, dt: int) -> None:
        self.step += dt

    @rule(keys=batches)
    def eval_lookup(self, keys: list[int]) -> None:
        n = len(self.t)
        rows = self.t.lookup(np.array(keys, dtype=np.int64), insert=False)
        for k, r in zip(keys, rows.tolist()):
            assert (r >= 0) == (k in self.model and self.admitted(k))
        assert len(self.t) == n

    @rule(keys=batches, seed=st.integers(0, 2**16))
    def update(self, keys: list[int], seed: int) -> None:
        karr = np.array(keys, dtype=np.int64)
        rows = self.t.lookup(karr, insert=False)
        g = np.random.default_rng(seed).normal(size=(len(keys), 1))
        self.t.apply_gradients("w", rows, g, self.step)
        self.t.apply_gradients("e", rows, np.ones((len(keys), 2)), self.step)
        sums: dict[int, float] = {}
        for k, gi in zip(keys, g[:, 0].tolist()):  # occurrence order, like the kernel
            if k in self.model and self.admitted(k):
                sums[k] = sums[k] + gi if k in sums else gi
        for k, s in sums.items():
            self.model[k]["w"] = self.model[k]["w"] - s * LR
            self.model[k]["adam_steps"] += 1

    @rule(ttl=st.integers(-1, 4))
    def evict(self, ttl: int) -> None:
        dead = [k for k, e in self.model.items() if self.step - e["last"] > ttl and self.admitted(k)]
        assert self.t.evict(ttl, self.step) == len(dead)
        for k in dead:
            del self.model[k]

    @precondition(lambda self: hasattr(self, "t"))
    @rule(capacity=st.sampled_from([None, 16, 5000]))
    def save_load(self, capacity) -> None:
        path = f"{self.dir}/t.npz"
        self.t.save(path)
        self.t = EmbeddingTable.load(path, capacity=capacity)

    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "t"):
            return
        t = self.t
        held = sorted(k for k in self.model if self.admitted(k))  # keys with rows
        pending = sorted(k for k in self.model if not self.admitted(k))
        assert len(t) == len(held) and t.pending_count == len(pending)
        assert sorted(t.keys().tolist()) == held
        got_keys, got_counts = t.pending()
        assert got_keys.tolist() == pending and got_counts.tolist() == [self.model[k]["count"] for k in pending]
        if pending:  # a pending key gathers as an absent one: its initial value, or zeros
            pk = np.array(pending, dtype=np.int64)
            prow = t.lookup(pk, insert=False)
            assert (prow == -1).all()
            expect_p = [0.0 if t.unadmitted == "zero" else self.model[k]["w"] for k in pending]
            assert t.gather("w", pk, prow)[:, 0].tolist() == expect_p
        keys = np.array(held, dtype=np.int64)
        rows = t.lookup(keys, insert=False)
        assert sorted(rows.tolist()) == list(range(len(keys)))
        meta = t.metadata(rows)
        got = t.gather("w", keys, rows)[:, 0]
        for i, k in enumerate(keys.tolist()):
            e = self.model[k]
            assert meta["count"][i] == e["count"] and meta["last_seen"][i] == e["last"]
            assert meta["admitted"][i] == self.admitted(k)
            expect = 0.0 if (t.unadmitted == "zero" and not self.admitted(k)) else e["w"]
            assert got[i] == expect, (k, got[i], expect)
            assert t.arrays.steps[1][rows[i]] == e["adam_steps"]
        assert t.admitted_count == sum(self.admitted(k) for k in self.model)
        assert t.admitted_total == self.admissions and t.admitted_total >= t.admitted_count
        m = t.memory()
        assert m["load_factor"] <= t.max_load and m["rows"] == len(held) and m["pending"] == len(pending)


TableModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
test_table_matches_dict_model = TableModel.TestCase
