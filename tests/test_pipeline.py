"""The pipelined step (``--pipeline on``): the next batch is read and looked up on a background
thread while the current step computes; the results are those of the unpipelined step, bit for
bit, including admission (``--min-count``), eviction (``--ttl``) around checkpoints and validation."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from des.hashtable import _threads, background_thread

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


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_the_background_lookup_runs_at_idle_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefetch thread and the pool threads its kernels use take only idle cores (SCHED_IDLE);
    the step's own kernel threads keep normal priority."""
    monkeypatch.setattr(_threads, "threads", lambda: 2)  # conftest pins numba to 1 thread

    def where() -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        lock = threading.Lock()

        def part(lo: int, hi: int) -> None:
            time.sleep(0.05)  # both parts run at once: one on the caller, one on a pool thread
            with lock:
                seen.append((threading.current_thread().name, os.sched_getscheduler(0)))

        _threads.run(part, 2)
        return sorted(seen)

    with ThreadPoolExecutor(1, thread_name_prefix="des-prefetch", initializer=background_thread) as pool:
        background = pool.submit(where).result()
    foreground = where()
    assert [policy for _, policy in background] == [os.SCHED_IDLE] * 2, background
    assert {name.split("_")[0] for name, _ in background} == {"des-prefetch", "des-table-idle"}
    assert [policy for _, policy in foreground] == [os.SCHED_OTHER] * 2, foreground
    assert {name.split("_")[0] for name, _ in foreground} == {"MainThread", "des-table"}
