"""``des/plan_review.py``: a run reviews the plan its trials chose on its own steps and switches
where another plan measures faster; ``--plan-switch`` repeats such a run. That a switch trains what
one rank trains is a ``des.check`` case (tests/test_exactness.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from des.errors import ConfigError
from des.plan_review import MARGIN, SKIP, WINDOW, Review, Switch, parse_switches
from des.plan_trials import Trials

from tests.conftest import criteo_head, run_job


def _steps(review: Review, first: int, seconds: float, slowest=lambda x: x) -> list[tuple[int, str]]:
    """Steps after ``first`` up to the review's next decision, each ``seconds`` on this rank: its switches."""
    switched = []
    for done in range(first + 1, review.decides_at + 1):
        plan = review.after(done, seconds, slowest)
        if plan is not None:
            switched.append((done, plan))
    return switched


def test_the_runner_up_is_tried_where_the_run_measures_slower_than_its_trial_and_kept_if_faster() -> None:
    trials = Trials({"partials": 100.0, "exchange": 120.0, "fm2=exchange": 150.0}, "partials")
    review = Review("partials", 10, trials=trials)
    assert review.quiet(10 + SKIP + WINDOW - 1) and not review.quiet(10 + SKIP + WINDOW)
    # the run's own partials steps take 140 ms (the slowest rank's), more than exchange's 120 * 1.1
    assert _steps(review, 10, 0.020, slowest=lambda x: 0.140) == [(10 + SKIP + WINDOW, "exchange")]
    assert review.decides_at == 10 + SKIP + 2 * WINDOW + 1  # the switch's first step traces: left out
    assert _steps(review, 10 + SKIP + WINDOW, 0.110) == []  # 110 ms: faster than 140 by more than MARGIN
    record = review.record()
    assert record["plan"] == "exchange" and record["measured_ms_per_step"] == {"partials": 140.0, "exchange": 110.0}
    assert record["repeat"] == f"--plan partials --plan-switch '{10 + SKIP + WINDOW}:exchange'"


def test_a_runner_up_no_faster_in_the_run_is_left_and_a_fast_choice_is_kept() -> None:
    trials = Trials({"partials": 100.0, "exchange": 120.0}, "partials")
    back = Review("partials", 0, trials=trials)
    assert _steps(back, 0, 0.140) == [(SKIP + WINDOW, "exchange")]
    assert _steps(back, SKIP + WINDOW, 0.140 / (1 + MARGIN) + 0.001) == [(SKIP + 2 * WINDOW + 1, "partials")]
    assert back.plan == "partials" and len(back.switches) == 2
    kept = Review("partials", 0, trials=trials)
    assert _steps(kept, 0, 0.120 * (1 + MARGIN)) == [] and kept.switches == []  # not slower than the runner-up by MARGIN
    assert kept.record()["repeat"] == "--plan partials"


def test_plan_switch_is_parsed_once_and_followed_on_resume() -> None:
    assert parse_switches("40:exchange; 81:fm2=exchange,first_fc=partials") == [
        Switch(40, "exchange"), Switch(81, "fm2=exchange,first_fc=partials")]
    for bad in ("exchange", "0:exchange", "x:exchange", "5:", "8:exchange;8:partials", "4:auto", "4:measure"):
        with pytest.raises(ConfigError, match="--plan-switch"):
            parse_switches(bad)
    from des.config import load_config

    with pytest.raises(ConfigError, match="--plan-switch needs the plan it starts from"):
        load_config(["--plan-switch", "4:exchange"])  # --plan auto: not a plan a run can be repeated from
    with pytest.raises(ConfigError, match="is not STEP:PLAN"):
        load_config(["--plan", "partials", "--plan-switch", "exchange"])
    with pytest.raises(ConfigError, match="--exchange-by rows has nothing to move with --plan partials"):
        load_config(["--plan", "partials", "--exchange-by", "rows"])
    assert load_config(["--plan", "partials", "--exchange-by", "rows", "--plan-switch", "4:exchange"]).exchange_by == "rows"
    with pytest.raises(ConfigError, match="--exchange-by ids has nothing to move with --plan linear=partials"):
        load_config(["--plan", "linear=partials,fm2=partials", "--exchange-by", "ids"])  # every operator named partials
    assert load_config(["--plan", "fm2=exchange", "--exchange-by", "rows"]).exchange_by == "rows"
    review = Review("partials", 0, scripted=parse_switches("2:partials;4:exchange;8:partials"))
    assert review.after(2, 1.0, None) is None and review.switches == []  # already that plan: nothing to do
    assert review.quiet(3) and not review.quiet(4) and review.after(4, 1.0, None) == "exchange"
    resumed = Review("partials", 6, scripted=parse_switches("4:exchange;8:partials"))
    assert resumed.resumed(6) == "exchange" and resumed.resumed(6) is None  # a run resumed after step 6
    resumed.took(0.5)
    assert resumed.after(8, 1.0, None) == "partials"
    resumed.took(0.25)
    assert [(s["step"], s["plan"], s["seconds"]) for s in resumed.record()["switches"]] == [
        (6, "exchange", 0.5), (8, "partials", 0.25)]
    assert resumed.record()["repeat"] == "--plan partials --plan-switch '4:exchange;8:partials'"
    assert Review("partials", 9, scripted=parse_switches("4:exchange;8:partials")).resumed(9) is None


@pytest.mark.mpi
def test_a_reviewed_run_on_two_ranks_and_a_plan_switch_that_cannot_be(tmp_path: Path) -> None:
    data = criteo_head(tmp_path / "head.tsv", 1500)
    flags = ["-m", "des.train", "--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--model", "deepfm",
             "--hidden", "16,8", "--embedding-dim", "4", "--batch-size", "128", "--epochs", "0",
             "--max-steps", str(SKIP + 2 * WINDOW + 4), "--plan", "measure", "--no-progress"]
    out = run_job(2, [*flags, "--output", str(tmp_path / "run")]).stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    review, trials = summary["planner"]["review"], summary["planner"]["trials"]
    assert trials["chosen"] in review["measured_ms_per_step"] and not review["scripted"]
    assert [s["step"] for s in review["switches"]] in ([], [SKIP + WINDOW], [SKIP + WINDOW, SKIP + 2 * WINDOW + 1])
    assert ("switched to --plan" in out) == bool(review["switches"])
    assert not (tmp_path / "run" / ".plan-switch").exists()
    refused = run_job(1, [*flags[:-3], "--plan", "partials", "--plan-switch", "3:exchange", "--output",
                          str(tmp_path / "one")], check=False)
    assert refused.returncode != 0 and "--plan-switch: with one rank a run has one plan" in refused.stderr
    assert not (tmp_path / "one").exists()  # refused in set-up: nothing written
    # a run resumed after its switch step starts with the plan of that step
    scripted = [*flags[:-5], "--plan", "partials", "--plan-switch", "2:exchange", "--no-progress"]
    run_job(2, [*scripted, "--max-steps", "3", "--checkpoint-every", "3", "--output", str(tmp_path / "a")])
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    by_plan = summary["planner"]["review"]["bytes_per_step_by_plan"]  # each plan's own bytes, not their mean
    assert [(p["plan"], p["steps"]) for p in by_plan] == [("partials", [0, 2]), ("exchange", [2, 3])]
    assert by_plan[0]["bytes_per_step"] != by_plan[1]["bytes_per_step"]
    assert sum(p["bytes_per_step"] * (p["steps"][1] - p["steps"][0]) for p in by_plan) == pytest.approx(
        3 * summary["bytes_per_step"])
    out = run_job(2, [*scripted, "--max-steps", "4", "--resume", str(tmp_path / "a"), "--output",
                      str(tmp_path / "b")]).stdout
    review = json.loads((tmp_path / "b" / "summary.json").read_text())["planner"]["review"]
    assert "step 3: switched to --plan exchange" in out and review["plan"] == "exchange"
    assert review["repeat"] == "--plan partials --plan-switch '2:exchange'"
    assert [(p["plan"], p["steps"]) for p in review["bytes_per_step_by_plan"]] == [("exchange", [3, 4])]
