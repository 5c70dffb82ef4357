"""Persia's hybrid training and Hierarchical Training as strategies (``des/strategies/persia.py``,
``des/strategies/hierarchical.py``) in the runner: a run resumed from a checkpoint ends where the
straight run ends (the updates in flight, and the groups' replicas, are made one at checkpoints),
the groups really train apart, their summaries, and what they refuse. Their exactness limits
(persia's tau = 0 is alltoall and any tau is the same on N ranks as on one; one hierarchical group
is des) are in ``tests/test_exactness.py``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from des.check import state_arrays
from des.config import TrainConfig
from des.errors import ConfigError
from tests.conftest import assert_states_equal, criteo_head, run_job, run_mpi_many

SMALL = ["--model", "deepfm", "--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "128", "--no-progress",
         "--dtype", "float64", "--checkpoint-every", "6", "--embedding-optimizer", "adam:lr=0.01",
         "--dense-optimizer", "adam:lr=0.01"]


def _common(root: Path) -> list[str]:
    """des.train on ``root/small.tsv`` (made by :func:`runs`)."""
    return ["-m", "des.train", "--data", str(root / "small.tsv"), "--cache-dir", str(root / "cache"), *SMALL]


PERSIA = ("--strategy", "persia", "--staleness", "3")
HIERARCHICAL = ("--strategy", "hierarchical", "--group-size", "1", "--sync-every", "4")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The 2-rank runs, one after another in one launch: persia straight; hierarchical straight,
    then resumed from its step-6 checkpoint."""
    root = tmp_path_factory.mktemp("related")
    criteo_head(root / "small.tsv", 2000)
    common = [*_common(root), "--max-steps", "12"]
    step6 = str(root / "hierarchical" / "checkpoints" / "step-00000006")
    run_mpi_many(2, {"persia": [*common, *PERSIA, "--output", str(root / "persia")],
                     "hierarchical": [*common, *HIERARCHICAL, "--output", str(root / "hierarchical")],
                     "hierarchical-resumed": [*common, *HIERARCHICAL, "--output", str(root / "hierarchical-resumed"),
                                              "--resume", step6]}, root / "jobs", timeout=360)
    return root


@pytest.mark.mpi
def test_persia_resumes_on_another_number_of_ranks(runs: Path) -> None:
    """tau = 3 on 2 ranks for 12 steps; its step-6 checkpoint (the updates in flight applied first)
    resumed on 1 rank to step 12: the same model, every row, slot and weight."""
    run_job(1, [*_common(runs), *PERSIA, "--output", str(runs / "persia-resumed"), "--max-steps", "12",
                "--resume", str(runs / "persia" / "checkpoints" / "step-00000006")])
    assert_states_equal(state_arrays(runs / "persia" / "checkpoints" / "step-00000012"),
                        state_arrays(runs / "persia-resumed" / "checkpoints" / "step-00000012"))
    summary = json.loads((runs / "persia" / "summary.json").read_text())
    assert summary["strategy"] == "persia" and summary["staleness"] == 3


@pytest.mark.mpi
def test_hierarchical_groups_train_apart_and_resume(runs: Path) -> None:
    """Two groups of one rank, EASGD every 4 steps, checkpoints at steps 6 and 12 (between
    reconciliations): resumed from step 6, the run ends where the straight one ends; and the
    groups' model is not des's (each group's replica stepped on its own rows)."""
    straight = state_arrays(runs / "hierarchical" / "checkpoints" / "step-00000012")
    assert_states_equal(straight, state_arrays(runs / "hierarchical-resumed" / "checkpoints" / "step-00000012"))
    summary = json.loads((runs / "hierarchical" / "summary.json").read_text())
    assert (summary["groups"], summary["group_size"], summary["group_sync"], summary["syncs"]) == (2, 1, "easgd", 3)
    assert summary["bytes_per_step_by_site"]["group_sync"] > 0
    run_job(1, [*_common(runs), "--output", str(runs / "des"), "--max-steps", "12"])
    des = state_arrays(runs / "des" / "checkpoints" / "step-00000012")
    top = [name for name in straight if name.startswith("dense.npz/") and name.endswith("__value")]
    assert top and all(straight[name].shape == des[name].shape for name in top)
    assert max(float(np.max(np.abs(straight[name] - des[name]))) for name in top) > 1e-6


def test_what_they_refuse() -> None:
    """Options the strategies cannot honour stop the job in one line, before any work."""
    from des.strategies import get_strategy

    hierarchical, persia = get_strategy("hierarchical"), get_strategy("persia")
    with pytest.raises(ConfigError, match="--group-size 3 does not divide the 4 ranks"):
        hierarchical.place(39, 4, [1] * 39, TrainConfig(strategy="hierarchical", group_size=3))
    for options, message in (({"upper": "replicated"}, "--upper replicated"), ({"plan": "exchange"}, "as partials"),
                             ({"placement": "split"}, "--placement split"), ({"sync_every": 0}, "at least 1"),
                             ({"easgd_alpha": 1.5}, "within"), ({"group_sync": "mean"}, "--group-sync")):
        with pytest.raises(ConfigError, match=message):
            hierarchical.check_options(TrainConfig(strategy="hierarchical", **options))
    with pytest.raises(ConfigError, match="--staleness must be 0 or more"):
        persia.Options(staleness=-1)
    with pytest.raises(ConfigError, match="--upper replicated"):
        persia.check_options(TrainConfig(strategy="persia", upper="replicated"))
    with pytest.raises(ConfigError, match="--staleness 'x': expected int"):
        persia.Options(staleness="x")
    with pytest.raises(ConfigError, match="--group-size 2.5: expected int"):
        hierarchical.Options(group_size=2.5)
    assert hierarchical.Options(group_size=2.0, easgd_alpha=1).group_size == 2
