"""``--plan measure`` (and ``auto`` on long runs): the candidate plans timed on this machine as
throwaway strategies, the fastest chosen by the slowest rank's time, the same on every rank,
cached per host; the run's own state and byte counts untouched by the trials."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from des import plan_trials

from tests.conftest import criteo_head, run_job


class _Ranks:
    """Stands in for a Communicator of 3 ranks whose every rank measured ``times[plan][rank]``."""

    def __init__(self, times: dict[str, list[float]]) -> None:
        self.times, self.asked = times, []

    def allgather(self, block: np.ndarray, site: str) -> np.ndarray:
        plan = self.asked[-1]
        return np.array([[t] for t in self.times[plan]])


def test_the_slowest_rank_decides_and_ties_keep_the_earlier_candidate() -> None:
    ranks = _Ranks({"exchange": [0.010, 0.030, 0.011], "partials": [0.020, 0.021, 0.022]})

    def train_one(plan: str) -> float:
        ranks.asked.append(plan)
        return 0.0

    trials = plan_trials.measure(["exchange", "partials"], train_one, ranks)
    assert trials.chosen == "partials"  # exchange's slowest rank (30 ms) is slower than partials' (22 ms)
    assert trials.ms_per_step == pytest.approx({"exchange": 30.0, "partials": 22.0})
    tie = _Ranks({"exchange": [0.02] * 3, "partials": [0.02] * 3})
    tie_train = lambda plan: tie.asked.append(plan) or 0.0  # noqa: E731
    assert plan_trials.measure(["exchange", "partials"], tie_train, tie).chosen == "exchange"
    assert plan_trials.candidates("fm2=exchange") == ["fm2=exchange", "partials", "exchange"]
    assert plan_trials.candidates("partials") == ["partials", "exchange"]


def test_each_plan_keeps_its_fastest_round() -> None:
    """The first plan timed pays what all plans share the first time (numba compiling the table
    kernels): it is timed again after the others, and its fastest round counts."""
    first_round = {"exchange": [0.600, 0.610, 0.605], "partials": [0.100, 0.100, 0.101]}
    later = {"exchange": [0.080, 0.081, 0.079], "partials": [0.099, 0.100, 0.100]}

    class Rounds(_Ranks):
        def allgather(self, block: np.ndarray, site: str) -> np.ndarray:
            times = first_round if len(self.asked) <= 2 else later
            return np.array([[t] for t in times[self.asked[-1]]])

    ranks = Rounds({})
    trials = plan_trials.measure(["exchange", "partials"], lambda plan: ranks.asked.append(plan) or 0.0, ranks)
    assert ranks.asked == ["exchange", "partials"] * plan_trials.ROUNDS
    assert trials.chosen == "exchange" and trials.ms_per_step == pytest.approx({"exchange": 81.0, "partials": 100.0})
    once = Rounds({})  # one round: the shared first-time cost decides
    assert plan_trials.measure(["exchange", "partials"], lambda p: once.asked.append(p) or 0.0, once, rounds=1
                               ).chosen == "partials"


def test_the_cache_is_kept_where_prepared_data_is(tmp_path: Path, monkeypatch) -> None:
    """``--cache-dir``, else ``$DES_CACHE_DIR``, else ``~/.cache/des``: one default for both caches."""
    from types import SimpleNamespace

    monkeypatch.setenv("DES_CACHE_DIR", str(tmp_path / "env"))
    assert plan_trials._cache_path(SimpleNamespace(cache_dir="")) == tmp_path / "env" / plan_trials.CACHE_FILE
    given = SimpleNamespace(cache_dir=str(tmp_path / "given"))
    assert plan_trials._cache_path(given) == tmp_path / "given" / plan_trials.CACHE_FILE


@pytest.mark.mpi
def test_measured_plans_on_two_ranks_and_the_cache(tmp_path: Path) -> None:
    data = criteo_head(tmp_path / "head.tsv", 1500)
    flags = ["-m", "des.train", "--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--model", "deepfm",
             "--hidden", "16,8", "--embedding-dim", "4", "--batch-size", "128", "--epochs", "0", "--max-steps", "4",
             "--plan", "measure", "--no-progress"]
    runs = []
    for name in ("first", "again"):
        run_job(2, [*flags, "--output", str(tmp_path / name)])
        runs.append(json.loads((tmp_path / name / "summary.json").read_text()))
    first, again = (r["planner"]["trials"] for r in runs)
    assert {"exchange", "partials"} <= set(first["ms_per_step"])
    assert first["chosen"] == min(first["ms_per_step"], key=first["ms_per_step"].get) and not first["cached"]
    assert again["cached"] and again["chosen"] == first["chosen"]
    config = json.loads((tmp_path / "first" / "config.json").read_text())
    assert json.dumps(config).count(f'"plan": "{first["chosen"]}"') == 1  # config.json says what ran
    # the trials' collectives are not the run's: measured bytes per step stay the predicted ones
    for summary in runs:
        assert summary["bytes_per_step"] == pytest.approx(summary["planner"]["predicted_bytes_per_step"], rel=1e-9)
    assert len(json.loads((tmp_path / "cache" / plan_trials.CACHE_FILE).read_text())) == 1
