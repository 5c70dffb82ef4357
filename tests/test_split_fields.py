"""Fields split by key over ranks (``des/placement.py``): the placement policy, the shares, and a
resume that moves a run from whole fields to split ones and back (N-vs-1 exactness of split
fields under every plan is in ``tests/test_exactness.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from des.check import state_arrays
from des.data.batch import FieldBatch
from des.errors import ConfigError, PlacementError
from des.placement import keep_share, parse_split_fields, place_fields, share_of, split_groups, whole_fields
from tests.conftest import assert_states_equal, criteo_head, run_job


def test_split_balances_what_whole_fields_cannot() -> None:
    """One field with most of the ids: whole fields leave its owner with it all; split, every rank
    holds a share and the largest rank is within the policy's target of the mean."""
    distinct = [1_000_000, 50_000, 40_000, 30_000, 20_000, 10_000]
    for ranks in (2, 4, 8):
        placement = place_fields(len(distinct), ranks, "split", distinct)
        groups = split_groups(placement)
        assert 0 in groups and groups[0] == list(range(ranks))
        load = [sum(distinct[f] / (ranks if f in groups else 1) for f in fields) for fields in placement]
        assert max(load) / np.mean(load) <= 1.05
        assert sorted({f for fields in placement for f in fields}) == list(range(len(distinct)))
    whole = place_fields(len(distinct), 4, "balanced", distinct)
    assert max(sum(distinct[f] for f in fields) for fields in whole) == distinct[0]


def test_more_ranks_than_fields_split_them() -> None:
    placement = place_fields(3, 6, "split", [100, 50, 10])
    assert all(placement[r] == [0, 1, 2] for r in range(6)) and whole_fields(placement, 5) == []
    with pytest.raises(PlacementError, match="--placement split"):
        place_fields(3, 6, "balanced", [100, 50, 10])
    assert place_fields(3, 1, "split", [100, 50, 10]) == [[0, 1, 2]]  # one rank: nothing to split


def test_split_fields_by_name_or_number() -> None:
    assert parse_split_fields("C1,3", ["I1", "I2", "C1", "C2"]) == [2, 3]
    assert place_fields(4, 2, "split", [1, 1, 1, 1], [2, 3]) == [[0, 2, 3], [1, 2, 3]]
    with pytest.raises(ConfigError, match="not a field"):
        parse_split_fields("C9", ["I1", "C1"])
    with pytest.raises(ConfigError, match="needs --placement split"):
        place_fields(4, 2, "balanced", [1, 1, 1, 1], [2])


def test_shares_cover_every_id_once_and_keep_the_rows_weights() -> None:
    keys = np.arange(1, 20_001, dtype=np.int64) * 7919
    counts = np.bincount(share_of(keys, 3), minlength=3)
    assert counts.sum() == keys.size and counts.min() > 0.95 * keys.size / 3  # even, whatever the keys
    # a multi-valued field with mean pooling: every share keeps the 1/n of the row's full count
    ids = FieldBatch(np.array([0, 3, 3, 5]), keys[:5], np.array([1 / 3] * 3 + [0.5] * 2, np.float32))
    parts = [keep_share(ids, s, 3) for s in range(3)]
    assert sorted(np.concatenate([p.keys for p in parts]).tolist()) == sorted(keys[:5].tolist())
    assert sum(np.diff(p.offsets) for p in parts).tolist() == [3, 0, 2]
    for p in parts:
        assert np.all(p.weights == np.where(np.isin(p.keys, keys[:3]), np.float32(1 / 3), np.float32(0.5)))


SMALL = ["--model", "deepfm", "--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "128", "--no-progress",
         "--dtype", "float64", "--unadmitted", "init", "--checkpoint-every", "4", "--ttl", "4",
         "--embedding-optimizer", "adam:lr=0.01"]


@pytest.mark.mpi
def test_resume_from_whole_fields_onto_split_ones_and_back(tmp_path: Path) -> None:
    """12 steps straight on one rank; from its step-4 checkpoint on 3 ranks with fields split by key
    to step 8; from that checkpoint on 2 ranks with whole fields to step 12: the same checkpoints at
    steps 8 and 12 (every table row, field slice and top weight to 1e-9)."""
    data = criteo_head(tmp_path / "small.tsv", 2000)
    common = ["-m", "des.train", "--data", str(data), "--cache-dir", str(tmp_path / "cache"), *SMALL]
    run_job(1, [*common, "--output", str(tmp_path / "straight"), "--max-steps", "12"])
    straight = tmp_path / "straight" / "checkpoints"
    run_job(3, [*common, "--output", str(tmp_path / "split"), "--max-steps", "8", "--placement", "split",
                "--split-fields", "C1,C3,C4,C12,C16,C21,C24,I2", "--resume", str(straight / "step-00000004")])
    split = tmp_path / "split" / "checkpoints" / "step-00000008"
    assert len(list(split.glob("field-*.share-*-of-3.table"))) == 3 * 8
    run_job(2, [*common, "--output", str(tmp_path / "whole"), "--max-steps", "12", "--placement", "balanced",
                "--resume", str(split)])
    for step, folder in ((8, split), (12, tmp_path / "whole" / "checkpoints" / "step-00000012")):
        assert_states_equal(state_arrays(straight / f"step-{step:08d}"), state_arrays(folder))


def test_what_split_fields_refuse() -> None:
    """A shared out-of-vocabulary row per field cannot be split over ranks, and the parameter server
    places whole fields on its servers: both refused in one line, before any work."""
    from types import SimpleNamespace

    from des.hashtable import AdaGrad, FTRL
    from des.models import get_model
    from des.options import Optimizers, TableOptions
    from des.config import TrainConfig
    from des.strategies import get_strategy

    model = get_model("fm")(num_fields=3, embedding_dim=4)
    optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": AdaGrad(0.1)}, dense=None)
    two_ranks = SimpleNamespace(rank=0, size=2)  # refused before it is used for anything else
    with pytest.raises(ConfigError, match="--unadmitted shared"):
        get_strategy("des").build(model, two_ranks, [[0, 1, 2], [0, 2]], optimizers,
                                  tables=TableOptions(unadmitted="shared"))
    with pytest.raises(ConfigError, match="parameter server places whole fields"):
        get_strategy("ps").place(3, 3, [5, 5, 5], TrainConfig(strategy="ps", placement="split"))
