"""The pipelined step (``--pipeline on``): the next batch is read and looked up on a background
thread while the current step computes; the results are those of the unpipelined step, bit for
bit, including admission (``--min-count``), eviction (``--ttl``) around checkpoints and validation."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from des.hashtable import _threads

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
def test_the_background_lookup_runs_at_idle_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    request: pytest.FixtureRequest) -> None:
    """A strategy's prefetch thread and the pool threads its kernels use take only idle cores
    (SCHED_IDLE); the step's own kernel threads keep normal priority; from then on the GIL
    changes hands within 0.2 ms, not the interpreter's default 5 ms."""
    from mpi4py import MPI

    from des.collectives import Communicator
    from des.data import prepare
    from des.data.batch_reader import BatchReader
    from des.hashtable import FTRL, AdaGrad, Adam
    from des.models import get_model
    from des.options import Optimizers
    from des.placement import place_fields
    from des.strategies.des import DES

    monkeypatch.setattr(_threads, "threads", lambda: 2)  # conftest pins numba to 1 thread
    request.addfinalizer(lambda previous=sys.getswitchinterval(): sys.setswitchinterval(previous))
    sys.setswitchinterval(0.005)  # the interpreter's default

    def where() -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        lock = threading.Lock()

        def part(lo: int, hi: int) -> None:
            time.sleep(0.05)  # both parts run at once: one on the caller, one on a pool thread
            with lock:
                seen.append((threading.current_thread().name, os.sched_getscheduler(0)))

        _threads.run(part, 2)
        return sorted(seen)

    store = prepare(criteo_head(tmp_path / "head.tsv", 300), tmp_path / "store", split=(0.9, 0.1, 0.0), seed=1)
    model = get_model("fm")(num_fields=store.num_fields, embedding_dim=4)
    optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": AdaGrad(0.1)}, dense=Adam(0.01))
    engine = DES.build(model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1), optimizers)
    batch = next(iter(BatchReader(store, "train", batch_size=64, seed=0, **engine.reader_options())))
    background: list[tuple[str, int]] = []
    engine.prefetch(lambda: (background.extend(where()), batch)[1], step=0)
    engine.pipeline.overlap_next()  # what the step calls once it has gathered its values
    engine.pipeline.await_next()
    prepared = engine.pipeline.prepared  # (step, the work the background thread prepared)
    engine.close()
    foreground = where()
    assert engine.overlapped_steps == 1 and prepared is not None and prepared[1].batch is batch
    assert [policy for _, policy in background] == [os.SCHED_IDLE] * 2, background
    assert {name.split("_")[0] for name, _ in background} == {"des-background", "des-table-idle"}
    assert [policy for _, policy in foreground] == [os.SCHED_OTHER] * 2, foreground
    assert {name.split("_")[0] for name, _ in foreground} == {"MainThread", "des-table"}
    assert sys.getswitchinterval() == pytest.approx(_threads.BACKGROUND_SWITCH_INTERVAL)


def _deepfm_engine(tmp_path: Path, rows: int, batches: int, embedding_optimizer, store_w: int = 0, **options):
    """A one-rank float64 DeepFM engine on the first ``rows`` Criteo rows, and its first training batches
    (``store_w``: the order-1 FTRL rows store w, as a sparse rate schedule needs; ``options``: the
    strategy's, e.g. ``plan``)."""
    from mpi4py import MPI

    from des.collectives import Communicator
    from des.data import prepare
    from des.data.batch_reader import BatchReader
    from des.hashtable import FTRL, Adam
    from des.models import get_model
    from des.options import Optimizers
    from des.placement import place_fields
    from des.strategies.des import DES

    tmp_path.mkdir(parents=True, exist_ok=True)
    store = prepare(criteo_head(tmp_path / "head.tsv", rows), tmp_path / "store", split=(0.9, 0.1, 0.0), seed=1)
    model = get_model("deepfm")(num_fields=store.num_fields, embedding_dim=4, hidden=(16, 8))
    optimizers = Optimizers(sparse={"linear": FTRL(0.1, store_w=store_w), "embedding": embedding_optimizer},
                            dense=Adam(0.01))
    engine = DES.build(model, Communicator(MPI.COMM_SELF), place_fields(store.num_fields, 1), optimizers,
                       dtype=np.float64, **options)
    reader = BatchReader(store, "train", batch_size=64, seed=0, fields=list(range(store.num_fields)))
    return engine, list(reader)[:batches]


def test_validations_and_checkpoints_do_not_change_what_is_trained(tmp_path: Path) -> None:
    """Adam with ``catchup`` defers an idle row's zero-gradient steps; a validation or checkpoint
    catches every row up (``Run.catch_up``). A training step catches its rows up before its forward
    reads them, so the parameters after 6 steps are the same bytes whether or not everything was
    caught up after step 3 (before, the forward read rows without their skipped steps)."""
    from des.hashtable import Adam

    trained = []
    for flush_after in (None, 3):
        engine, batches = _deepfm_engine(tmp_path / str(flush_after), 600, 6, Adam(0.01, catchup=1))
        for i, batch in enumerate(batches):
            if i == flush_after:
                for table in engine.shard.tables.values():
                    table.catch_up(engine.step_count)
            engine.train_step(batch)
        for table in engine.shard.tables.values():
            table.catch_up(engine.step_count)
        trained.append([d.tobytes() for t in engine.shard.tables.values() for d in t.arrays.blocks]
                       + [v.tobytes() for v in engine.dense.top_params.values()])
    assert trained[0] == trained[1]


@pytest.mark.parametrize("plan", ["partials", "exchange"])
def test_a_pipelined_step_finishes_its_updates_later(tmp_path: Path, plan: str) -> None:
    """With the next batch prefetched, a step hands its dense optimizer step to the idle-priority
    background thread (the next step waits for it before TF reads the weights, ``Pipeline.dense_done``)
    and leaves its sparse update to the next step, which runs it in one pass with its gather
    (``ShardTables.apply_then_gather``): the same bytes as updating both in the step, with each
    step's own schedule factors although the next step's are set before the updates run, and
    nothing pending once the state is read. With every operator exchanged per distinct id the
    sparse update runs on the owner's synthetic batch of distinct ids, in the next step's gather
    pass as well."""
    from des.hashtable import Adam

    trained, pending = [], []
    for pipelined in (False, True):
        engine, batches = _deepfm_engine(tmp_path / f"{plan}-{pipelined}", 400, 4, Adam(0.01, catchup=1), store_w=1,
                                         plan=plan)
        apply, rates = engine.dense.apply, engine.dense.rates

        def late(*args, apply=apply):  # in the background, after the next step's factor is set
            if threading.current_thread().name.startswith("des-background"):
                time.sleep(0.05)
            apply(*args)

        engine.dense.apply = late
        for i, batch in enumerate(batches):
            rates.dense, rates.sparse = 1.0 / (1 + i), 2.0 / (2 + i)  # schedules: set before each step
            if pipelined and i + 1 < len(batches):
                engine.prefetch(lambda after=batches[i + 1]: after, engine.step_count + 1)
            engine.train_step(batch)
            pending.append(engine.pipeline.pending)
        state = engine.state()
        assert engine.pipeline.pending == (False, False)
        for table in state.tables.values():
            table.catch_up(engine.step_count)
        trained.append([v.tobytes() for v in (*state.dense.field_params.values(), *state.dense.top_params.values())]
                       + [d.tobytes() for t in state.tables.values() for d in t.arrays.blocks])
        engine.close()
    assert trained[0] == trained[1]
    # the last step has no next batch
    assert pending == [(False, False)] * 4 + [(True, True)] * 3 + [(False, False)]
