"""Early stopping with the best checkpoint, learning-rate schedules, and their bad inputs.

One training that overfits fast (large embedding rate) stops ``--early-stop`` validations after
its best one; the summary, the test split and ``des.evaluate`` use the best checkpoint; a run
resumed from a mid-run checkpoint on another rank count keeps the early-stopping and plateau state
and the fields' shared rows (``--unadmitted shared``): it logs the same validations and stops at
the same step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from des.config import load_config
from des.errors import UsageError
from des.schedules import Plateau, parse_schedule
from tests.conftest import criteo_head, run_here, run_job

FLAGS = ["--model", "deepfm", "--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "64", "--dtype", "float64",
         "--eval-batch-size", "1024", "--no-progress", "--table-capacity", "256", "--epochs", "20",
         "--eval-every", "5", "--early-stop", "2", "--checkpoint-every", "10", "--embedding-optimizer", "adam:lr=0.05",
         "--dense-optimizer", "adam:lr=0.01", "--sparse-schedule", "cosine:warmup=3,end=0.2",
         "--dense-schedule", "plateau:factor=0.5,patience=1", "--unadmitted", "shared", "--min-count", "2"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("early-stop")
    criteo_head(root / "small.tsv", 2000)
    return root


def train(work: Path, ranks: int, output: str, *flags: str, check: bool = True):
    return run_job(ranks, ["-m", "des.train", "--data", str(work / "small.tsv"), "--cache-dir", str(work / "cache"),
                           "--output", str(work / output), *FLAGS, *flags], check=check)


def records(work: Path, output: str) -> list[dict]:
    return [json.loads(line) for line in (work / output / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(work: Path) -> list[dict]:
    train(work, 1, "straight")
    return records(work, "straight")


def test_stops_at_the_best_step_and_restores_it(work: Path, straight: list[dict]) -> None:
    best = max(straight, key=lambda r: r["auc"])
    last = straight[-1]
    assert last["stop"] and last["step"] == best["step"] + 2 * 5  # two validations without improvement
    assert all(r["best_step"] == best["step"] for r in straight if r["step"] >= best["step"])
    summary = json.loads((work / "straight" / "summary.json").read_text())
    assert summary["stopped_early"] and summary["best_step"] == best["step"]
    assert summary["validation_auc"] == best["auc"]
    assert summary["checkpoint"].endswith(f"best/step-{best['step']:08d}")
    # des.evaluate on the run folder evaluates the best model: its validation AUC is the logged one
    proc = run_here(["-m", "des.evaluate", "--checkpoint", str(work / "straight"), "--data",
                     summary_data(work), "--split", "validation"])
    auc = float(proc.stdout.split("auc ")[1].split()[0])
    assert math.isclose(auc, best["auc"], abs_tol=1e-6)
    assert any("lr_scale_dense" in r for r in straight)  # the plateau schedule reduced the dense rate


def summary_data(work: Path) -> str:
    return json.loads((work / "straight" / "config.json").read_text())["data"]


def test_resume_on_two_ranks_keeps_the_early_stopping_state(work: Path, straight: list[dict]) -> None:
    resume_at = 10 * ((straight[-1]["step"] - 1) // 10)  # the last periodic checkpoint before the stop
    assert resume_at > straight[0]["step"]
    train(work, 2, "resumed", "--resume", str(work / "straight" / "checkpoints" / f"step-{resume_at:08d}"))
    resumed = records(work, "resumed")
    after = [r for r in straight if r["step"] > resume_at]
    assert [r["step"] for r in resumed] == [r["step"] for r in after]
    for a, b in zip(after, resumed):  # same schedules and plateau state: the same validations (float64)
        assert math.isclose(a["auc"], b["auc"], rel_tol=1e-9) and a["best_step"] == b["best_step"], (a, b)
    assert resumed[-1]["stop"]
    summary = json.loads((work / "resumed" / "summary.json").read_text())
    assert summary["best_step"] == straight[-1]["best_step"]


def test_schedule_factors_are_a_function_of_the_step() -> None:
    cosine = parse_schedule("cosine:warmup=4,end=0.1", "sparse-schedule")
    assert [cosine.factor(s, 14) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert math.isclose(cosine.factor(13, 14), 0.1) and 0.1 < cosine.factor(8, 14) < 1.0
    linear = parse_schedule("linear:end=0", "dense-schedule")
    assert linear.factor(0, 11) == 1.0 and math.isclose(linear.factor(5, 11), 0.5) and linear.factor(10, 11) == 0.0
    assert parse_schedule("warmup:steps=2", "x").factor(0, 100) == 0.5
    plateau, state = parse_schedule("plateau:factor=0.5,patience=2,min=0.2", "x"), Plateau()
    reduced = [state.update(plateau, improved) for improved in (False, False, True, False, False, False)]
    assert reduced == [False, True, False, False, True, False] and state.scale == 0.25
    assert [state.update(plateau, False) for _ in range(3)] == [True, False, False] and state.scale == 0.2  # min


@pytest.mark.parametrize("flags, message", [
    (["--sparse-schedule", "cosine:end=-0.5"], "--sparse-schedule 'cosine:end=-0.5': end must be a finite number >= 0"),
    (["--dense-schedule", "plateau:factor=2"], "factor must be in (0, 1]"),
    (["--dense-schedule", "step:every=3"], "unknown schedule 'step'"),
    (["--monitor", "accuracy"], "--monitor"),
    (["--early-stop", "-2"], "--early-stop must be -1 (auto), 0 (off) or a patience >= 1, got -2"),
])
def test_bad_schedules_and_monitors_are_one_line(flags: list[str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        load_config(flags)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_early_stop_without_validation_rows_fails_before_training(work: Path) -> None:
    proc = train(work, 1, "no-validation", "--split", "1,0,0", check=False)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == ["des.train: error: --early-stop 2 needs validation rows, and the data has none (give --split "
                      "a validation fraction)"], proc.stderr
    assert not (work / "no-validation").exists()
