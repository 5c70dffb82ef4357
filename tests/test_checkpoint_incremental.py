"""Incremental checkpoints (``--full-checkpoint-every``): an increment holds the rows looked up and
the keys evicted since its base, loading replays the chain (on any rank count and placement) to
the bits full checkpoints hold, a bad link is one error, and pruning keeps whole chains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_states_equal, criteo_head, run_job

# W&D: Adam catchup=1 embeddings (the catch-ups a chain replays, under a changing sparse rate),
# validations between checkpoints, evictions between checkpoints, ids pending admission (--min-count
# 2: their counts in every increment).
FLAGS = ["--model", "wdl", "--dtype", "float64", "--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "256",
         "--eval-batch-size", "1024", "--no-progress", "--table-capacity", "256", "--unadmitted", "init",
         "--min-count", "2",
         "--checkpoint-every", "2", "--full-checkpoint-every", "3", "--ttl", "3", "--evict-every", "3",
         "--eval-every", "3", "--sparse-schedule", "warmup:steps=20", "--keep-checkpoints", "0", "--max-steps", "12"]


def step(run: Path, n: int) -> Path:
    return run / "checkpoints" / f"step-{n:08d}"


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("incremental")
    criteo_head(root / "small.tsv", 2000)
    data = ["--data", str(root / "small.tsv"), "--cache-dir", str(root / "cache")]
    run_job(1, ["-m", "des.train", *data, "--output", str(root / "straight"), *FLAGS])
    # the run continued from its incremental step 6 on 2 ranks, fields split by key, in its own folder
    shutil.copytree(root / "straight", root / "resumed", ignore=shutil.ignore_patterns(".lock"))
    run_job(2, ["-m", "des.train", *data, "--output", str(root / "resumed"), *FLAGS, "--placement", "split",
                "--split-fields", "all", "--resume", str(step(root / "resumed", 6))])
    return root


@pytest.mark.mpi
def test_a_resume_from_an_increment_on_other_ranks_ends_where_the_straight_run_ends(work: Path) -> None:
    from des.check import state_arrays

    straight, resumed = work / "straight", work / "resumed"
    kinds = {n: (manifest(step(straight, n))["kind"], manifest(step(straight, n)).get("base")) for n in range(2, 13, 2)}
    assert kinds == {2: ("full", None), 4: ("incremental", "step-00000002"), 6: ("incremental", "step-00000004"),
                     8: ("full", None), 10: ("incremental", "step-00000008"), 12: ("incremental", "step-00000010")}
    # the resumed run goes on with the chain it resumed: 6 was its second increment, so 8 is full
    assert [manifest(step(resumed, n))["kind"] for n in (8, 10, 12)] == ["full", "incremental", "incremental"]
    assert manifest(step(resumed, 12))["ranks"] == 2
    assert any(".share-1-of-2.evicted.npy" in file for file in manifest(step(resumed, 12))["files"])  # split fields
    assert_states_equal(state_arrays(step(straight, 12)), state_arrays(step(resumed, 12)))


@pytest.mark.mpi
def test_an_increment_holds_the_rows_looked_up_and_deletes_the_keys_evicted_since_its_base(work: Path) -> None:
    from des.checkpoint import field_table, read_manifest
    from des.hashtable import EmbeddingTable

    base, inc = read_manifest(step(work / "straight", 4)), read_manifest(step(work / "straight", 6))
    changed = total = evicted = 0
    for field in range(inc[1]["num_fields"]):
        before, after = field_table(*base, field), field_table(*inc, field)
        rows = EmbeddingTable.load(inc[0] / f"field-{field:03d}.table")
        seen = after.to_arrays()["last_seen"] >= 4  # looked up in training since step 4 (inserted ones too)
        assert len(rows) == int(seen.sum()), field
        np.testing.assert_array_equal(np.sort(rows.keys()), np.sort(after.keys()[seen]))
        gone = np.load(inc[0] / f"field-{field:03d}.evicted.npy")  # --evict-every 3, --ttl 3: at step 6
        assert np.isin(gone, before.keys()).all() and not np.isin(gone, after.keys()).any()
        changed, total, evicted = changed + len(rows), total + len(after), evicted + gone.size
    assert 0 < changed < total and evicted > 0


def test_the_table_api_of_a_chain(tmp_path: Path) -> None:
    """upsert, delete, rows since a step and evicted keys on one table: base + increment == table."""
    from des.hashtable import BlockSpec, EmbeddingTable
    from des.hashtable.init import Initializer
    from des.hashtable.optimizers import Adam

    table = EmbeddingTable(3, [BlockSpec("e", 2, Adam(0.01), Initializer("zeros"))], seed=1, dtype=np.float64)
    rng = np.random.default_rng(0)
    def train(s: int, keys: np.ndarray) -> None:  # a lookup, and new values and slots for its rows
        rows = table.lookup(keys, insert=True, step=s)
        table.arrays.blocks[0][rows] += rng.normal(size=(rows.size, 6))
        table.arrays.steps[0][rows] = s + 1

    for s in range(4):
        train(s, rng.integers(0, 50, 30))
    table.save(tmp_path / "base.table")
    assert table.track_evictions() is None  # tracking starts here
    table.evict(2, 4)  # unseen since step 1
    for s in range(4, 6):
        train(s, rng.integers(40, 90, 30))
    gone = table.track_evictions()
    table.save(tmp_path / "inc.table", since=4)
    replayed, rows = EmbeddingTable.load(tmp_path / "base.table"), EmbeddingTable.load(tmp_path / "inc.table")
    assert gone.size and 0 < len(rows) < len(table)
    assert replayed.delete(gone) == gone.size and replayed.delete(gone) == 0
    new = np.count_nonzero(~np.isin(rows.keys(), replayed.keys()))
    assert replayed.upsert(rows.to_arrays()) == new > 0
    order_a, order_b = np.argsort(replayed.keys()), np.argsort(table.keys())
    for name, value in table.to_arrays().items():
        np.testing.assert_array_equal(replayed.to_arrays()[name][order_a], value[order_b], err_msg=name)


@pytest.mark.mpi
def test_a_chain_with_a_missing_or_corrupt_link_is_refused_in_one_line(work: Path, tmp_path: Path) -> None:
    from des.check import state_arrays
    from des.checkpoint import CheckpointError

    runs = shutil.copytree(work / "straight" / "checkpoints", tmp_path / "checkpoints")
    table = runs / "step-00000004" / "field-007.table"
    table.write_bytes(table.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(CheckpointError, match=r"step-00000004/field-007.table is corrupt") as err:
        state_arrays(runs / "step-00000006")
    assert "\n" not in str(err.value)
    shutil.rmtree(runs / "step-00000004")
    with pytest.raises(CheckpointError, match="is an increment of step-00000004, which is missing") as err:
        state_arrays(runs / "step-00000006")
    assert "\n" not in str(err.value)
    state_arrays(runs / "step-00000008")  # a full checkpoint needs no earlier link


def test_pruning_keeps_whole_chains(tmp_path: Path) -> None:
    from des.run import prune_checkpoints

    # full at 2, 8, 14; increments on the previous step between them; latest at 12
    for n in range(2, 19, 2):
        folder = tmp_path / f"step-{n:08d}"
        folder.mkdir()
        full = n in (2, 8, 14)
        (folder / "manifest.json").write_text(json.dumps({"kind": "full"} if full else
                                                         {"kind": "incremental", "base": f"step-{n - 2:08d}"}))
    (tmp_path / "latest").write_text("step-00000012\n")
    deleted = prune_checkpoints(tmp_path, 1)
    assert [p.name for p in deleted] == ["step-00000006", "step-00000004", "step-00000002"]  # an increment first
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [f"step-{n:08d}" for n in range(8, 19, 2)]
    (tmp_path / "latest").write_text("step-00000018\n")
    assert [p.name for p in prune_checkpoints(tmp_path, 1)] == ["step-00000012", "step-00000010", "step-00000008"]
