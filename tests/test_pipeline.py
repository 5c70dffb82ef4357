"""The pipelined step (``--pipeline on``): the next batch is read and looked up on a background
thread while the current step computes; the results are those of the unpipelined step, bit for
bit, including admission (``--min-count``), eviction (``--ttl``) around checkpoints and validation."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import criteo_head, run_job
from tests.test_train import assert_checkpoints_equal

FLAGS = ["--model", "deepfm", "--hidden", "16,8", "--embedding-dim", "4", "--dtype", "float64", "--batch-size", "256",
         "--max-steps", "12", "--eval-every", "5", "--checkpoint-every", "4", "--min-count", "2", "--ttl", "3",
         "--table-capacity", "256", "--no-progress"]


def test_pipelined_and_unpipelined_runs_are_identical(tmp_path: Path) -> None:
    criteo_head(tmp_path / "small.tsv", 2000)
    for mode in ("on", "off"):
        run_job(1, ["-m", "des.train", "--data", str(tmp_path / "small.tsv"), "--cache-dir", str(tmp_path / "cache"),
                    "--output", str(tmp_path / mode), "--pipeline", mode, *FLAGS])
    summaries = {mode: json.loads((tmp_path / mode / "summary.json").read_text()) for mode in ("on", "off")}
    # steps 4, 5, 8, 10 are followed by a checkpoint or a validation, and 12 is the last: not overlapped
    assert summaries["on"]["overlapped_steps"] == 7 and summaries["off"]["overlapped_steps"] == 0
    assert_checkpoints_equal(tmp_path / "on" / "checkpoints", tmp_path / "off" / "checkpoints", rtol=0.0)
    for step in ("step-00000004", "step-00000008"):
        assert_checkpoints_equal(tmp_path / "on" / "checkpoints" / step, tmp_path / "off" / "checkpoints" / step, rtol=0.0)
    for key in ("validation_auc", "validation_logloss", "test_auc", "test_logloss"):
        assert summaries["on"][key] == summaries["off"][key], key
