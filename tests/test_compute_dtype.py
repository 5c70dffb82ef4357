"""``--compute-dtype bfloat16``: the top network computes in bf16 on casts of float32 master
weights; optimizer state and checkpoints stay float32, and the model learns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import criteo_head, run_mpi
from tests.test_train import checkpoint_arrays


@pytest.mark.mpi
def test_bfloat16_top_network_trains_and_learns_on_two_ranks(tmp_path: Path) -> None:
    criteo_head(tmp_path / "small.tsv", 2000)
    proc = run_mpi(2, ["-m", "des.train", "--data", str(tmp_path / "small.tsv"), "--cache-dir", str(tmp_path / "cache"),
                       "--output", str(tmp_path / "run"), "--model", "deepfm", "--hidden", "32,16", "--batch-size", "128",
                       "--epochs", "2", "--early-stop", "0", "--compute-dtype", "bfloat16", "--no-progress"])
    assert "compute_dtype=bfloat16" in proc.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["test_auc"] > 0.65, summary["test_auc"]  # learned (a constant model scores 0.5)
    assert records[-1]["auc"] > records[0]["auc"] - 0.02 and records[-1]["train_loss"] < 0.6
    arrays = checkpoint_arrays(tmp_path / "run" / "checkpoints")
    floats = {k: v.dtype for k, v in arrays.items() if v.dtype.kind == "f"}
    assert floats and set(floats.values()) == {np.dtype(np.float32)}, floats


def test_bfloat16_needs_float32_master_weights() -> None:
    from des.config import TrainConfig
    from des.errors import ConfigError

    with pytest.raises(ConfigError, match="--compute-dtype bfloat16 needs --dtype float32"):
        TrainConfig(dtype="float64", compute_dtype="bfloat16").validate()
