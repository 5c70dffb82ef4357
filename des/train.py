"""Train a CTR model with Distributed Equivalent Substitution.

    mpirun -n 4 .venv/bin/python -m des.train --model deepfm      # 4 ranks
    .venv/bin/python -m des.train --model lr                      # 1 rank

With no other flag it trains on the shipped Criteo sample (prepared into a cache on first use),
validates after each epoch, tests at the end and leaves a run folder with ``config.json``,
``metrics.jsonl``, ``summary.json`` and ``checkpoints/``. ``--help`` lists every option.

The loop, on every rank, in lock-step: same global batch, own fields, one AllReduce per step.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os

import numpy as np
import platform
import resource
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from des import runtime  # noqa: F401  (quiets TensorFlow before it is imported)
from des.collectives import Communicator, describe_processes, run_main
from des.config import MODELS, TrainConfig, load_config
from des.errors import ConfigError, DesError
from des.run_folder import RunFolder


def build_model(config: TrainConfig, num_fields: int):
    """The model named by ``--model`` with the hyper-parameters its constructor accepts."""
    from des.models import get_model
    from des.plugins import load_plugins

    load_plugins(config.plugins)
    cls = get_model(config.model)
    candidates = {
        "num_fields": num_fields,
        "embedding_dim": config.embedding_dim,
        "hidden": tuple(config.hidden_units()),
        "activation": config.activation,
        "init_scale": config.init_scale,
        "l2_embedding": config.l2_embedding,
        "l2_dense": config.l2_dense,
    }
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in candidates.items() if k in accepted})


def build_optimizers(config: TrainConfig):
    from des.options import Optimizers
    from des.hashtable import optimizer_from_spec

    def parse(flag: str, spec: str):
        try:
            return optimizer_from_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"--{flag} {spec!r}: {exc}") from None

    return Optimizers(
        sparse={
            "linear": parse("linear-optimizer", config.linear_optimizer_spec()),
            "embedding": parse("embedding-optimizer", config.embedding_optimizer),
        },
        dense=parse("dense-optimizer", config.dense_optimizer),
    )


def open_data(config: TrainConfig, comm: Communicator):
    """Rank 0 prepares a raw file into the cache (once); then every rank opens the same store."""
    from des.data import ColumnStore, open_dataset

    if comm.rank == 0:
        store = open_dataset(config.data, cache_dir=config.cache_dir or None, split=config.split_fractions(),
                             seed=config.split_seed, bad_rows=config.bad_rows)
        path = str(store.path)
    path = comm.bcast_json(path if comm.rank == 0 else None, "setup")
    return store if comm.rank == 0 else ColumnStore.open(path)


def plan_run_folder(config: TrainConfig, comm: Communicator) -> RunFolder:
    """The run folder, checked (writable, not in use, no other run in it) but not created yet: a
    run that fails during setup (a bad checkpoint, say) leaves nothing behind."""
    if comm.rank == 0:
        plan = RunFolder.plan(config.output, model=config.model, resume=config.resume,
                              overwrite=config.overwrite).to_json()
    return RunFolder.from_json(comm.bcast_json(plan if comm.rank == 0 else None, "setup"))


def create_run_folder(run: RunFolder, comm: Communicator) -> None:
    # Every rank first finishes its set-up (a rank that fails to load its fields aborts the job
    # here, before rank 0 has created anything). Rank 0 then holds the folder's lock until exit.
    comm.barrier("setup")
    if comm.rank == 0:
        run.create()
    comm.barrier("setup")


def finish_run_folder(run: RunFolder, comm: Communicator) -> None:
    """After success: an ``--overwrite`` run replaces the old one; the lock is released."""
    comm.barrier("summary")
    if comm.rank == 0:
        run.finish()


def write_run_config(folder: Path, comm: Communicator, config: TrainConfig, placement: list[list[int]],
                     model, store) -> None:
    """``config.json``: the effective config, N, the placement, the model and the versions."""
    if comm.rank == 0:
        (folder / "config.json").write_text(json.dumps({
            "config": config.to_dict(), "ranks": comm.size, "placement": placement,
            "model": model.describe(), "data": str(store.path), "data_fingerprint": data_fingerprint(store),
            "versions": _versions(), "python": platform.python_version(),
        }, indent=1))


def data_fingerprint(store) -> str:
    """Identifies a prepared dataset by content (its manifest: sources' sha256, split, counts)."""
    return hashlib.sha256(json.dumps(store.manifest, sort_keys=True).encode()).hexdigest()[:16]


def describe_config(config: TrainConfig) -> str:
    """The effective config, every option, wrapped (also saved in ``config.json``)."""
    items = " ".join(f"{k}={v}" for k, v in config.to_dict().items())
    return textwrap.fill(items, width=110, initial_indent="  config: ", subsequent_indent="          ",
                         break_long_words=False, break_on_hyphens=False)


def describe_placement(placement: list[list[int]], distinct: list[int], names, layout=None) -> str:
    """Fields, distinct ids and (given one of the tables) estimated table memory of every rank."""
    lines = []
    for r, fields in enumerate(placement):
        # Every field's table has the same row layout, so one table can size all of them.
        memory = "" if layout is None else \
            f", tables ~{sum(layout.estimated_bytes(distinct[f]) for f in fields) / 2**20:7.1f} MiB"
        lines.append(f"  rank {r}: {len(fields):2d} fields, {sum(distinct[f] for f in fields):9d} distinct ids{memory}  "
                     f"{','.join(names[f] for f in fields)}")
    return "\n".join(lines)


def predict_split(engine, store, split: str, batch_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Predictions and labels of a whole split in store order (identical on every rank)."""
    from des.data.batch_reader import BatchReader

    reader = BatchReader(store, split, batch_size=batch_size, seed=0, shuffle=False, drop_last=False,
                         **engine.reader_options())
    if reader.num_rows == 0:
        return None
    predictions, labels = [], []
    for batch in reader:
        p, y = engine.predict_with_labels(batch)
        predictions.append(p)
        labels.append(y)
    return np.concatenate(predictions), np.concatenate(labels)


def evaluate(engine, store, split: str, batch_size: int) -> dict[str, Any] | None:
    """Exact AUC and logloss over a whole split."""
    from des.metrics import auc_or_none, logloss

    result = predict_split(engine, store, split, batch_size)
    if result is None:
        return None
    p, y = result
    # One class (a small split): AUC n/a (null in summary.json), warned once by rank 0 (with
    # --strategy ps only the first worker evaluates).
    reporter = engine.comm.rank == 0 or getattr(engine, "worker_index", None) == 0
    auc = auc_or_none(y, p, f"the {split} split", warn=reporter)
    return {"auc": auc, "logloss": logloss(y, p), "rows": int(y.size)}


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class Log:
    """Rank 0 talks; the others stay quiet."""

    def __init__(self, comm: Communicator, folder: Path) -> None:
        self.active = comm.rank == 0
        self.metrics_path = folder / "metrics.jsonl"

    def say(self, text: str) -> None:
        if self.active:
            print(text, flush=True)

    def metrics(self, record: dict[str, Any]) -> None:
        if self.active:
            with open(self.metrics_path, "a") as fh:
                fh.write(json.dumps(record) + "\n")


def train(config: TrainConfig, comm: Communicator) -> dict[str, Any]:

    from des.data.batch_reader import BatchReader
    from des.placement import place_fields

    # Everything a user can get wrong is checked before TensorFlow is loaded (seconds per rank).
    if not config.plugins and config.model not in MODELS:
        raise ConfigError(f"unknown model {config.model!r} (choose one of: {', '.join(MODELS)}, or load one with --plugins)")
    store = open_data(config, comm)
    if store.num_rows == 0:
        raise DesError(f"dataset {store.path} is empty")
    distinct = [store.distinct_count(f) for f in range(store.num_fields)]
    placement = place_fields(store.num_fields, comm.size, config.placement, distinct)
    train_rows = len(store.split_rows("train"))
    steps_per_epoch = train_rows // config.batch_size if config.drop_last else -(-train_rows // config.batch_size)
    if steps_per_epoch == 0:
        raise ConfigError(f"--batch-size {config.batch_size} is larger than the {train_rows} training rows of {store.path}")
    optimizers = build_optimizers(config)
    run = plan_run_folder(config, comm)
    folder = run.work  # where this job writes (a staging sibling with --overwrite)
    runtime.configure_threads()
    if config.strategy == "ps":
        return train_parameter_server(config, comm, store, build_model(config, store.num_fields), optimizers,
                                      steps_per_epoch, run, distinct)
    from des.checkpoint import load_checkpoint, save_checkpoint
    from des.options import TableOptions
    from des.strategies import engine_class

    model = build_model(config, store.num_fields)
    engine = engine_class(config.strategy)(
        model, comm, placement, optimizers, seed=config.seed, dtype=np.dtype(config.dtype),
        tables=TableOptions(config.table_capacity, config.min_count, config.unadmitted),
    )
    log = Log(comm, folder)
    # What fixes the order of the batches: a checkpoint's (epoch, next batch) only means the same
    # position in a run with the same data, batch size, seed and drop-last.
    data_order = {"data_fingerprint": data_fingerprint(store), "batch_size": config.batch_size,
                  "seed": config.seed, "drop_last": config.drop_last}

    start_epoch, start_batch = 0, 0
    if config.resume:
        manifest = load_checkpoint(engine, config.resume, data_order=data_order)
        start_epoch, start_batch = manifest["epoch"], manifest["next_batch"]
    create_run_folder(run, comm)
    write_run_config(folder, comm, config, placement, model, store)
    log.say(f"des.train: {model.name} with strategy {config.strategy} on {store.path.name} ({store.num_rows} rows, {train_rows} train), "
            f"{comm.size} rank(s), batch {config.batch_size}, {config.epochs} epoch(s), dtype {config.dtype}, "
            f"buffer {engine.buffer_width} floats/sample")
    log.say(f"  optimizers: linear {config.linear_optimizer_spec()}; embedding {config.embedding_optimizer}; "
            f"dense {config.dense_optimizer}")
    log.say(describe_config(config))
    if config.resume:
        log.say(f"  resumed from {config.resume} at step {engine.step_count} (epoch {start_epoch}, batch {start_batch}), "
                f"written by {manifest['ranks']} rank(s)")
    log.say(describe_placement(placement, distinct, store.field_names, next(iter(engine.tables.values()), None)))
    log.say(f"  run folder: {run.path}" + (" (replaced when this run finishes)" if run.overwrite else ""))
    if describe_processes():  # which pid is which rank, for the launcher's "PID ... killed"
        log.say(describe_processes())

    # Absolute step to stop at (a resumed run continues towards the same end).
    total_steps = config.epochs * steps_per_epoch if config.epochs else config.max_steps
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    progress = _progress(comm.rank == 0 and config.progress, total_steps, engine.step_count)
    # Throughput and ms per phase leave out this run's first step: it compiles the numba kernels
    # (on a fresh install) and traces the TF functions, which takes seconds, not milliseconds.
    train_seconds, samples, timed_samples, loss_sum, loss_count, steps_run = 0.0, 0, 0, 0.0, 0, 0
    last_validation: dict[str, Any] | None = None
    checkpoints = folder / "checkpoints"
    saved_step = -1

    def validate(epoch: int) -> None:
        nonlocal last_validation, loss_sum, loss_count
        result = evaluate(engine, store, "validation", config.eval_batch_size)
        record = {"step": engine.step_count, "epoch": epoch, "samples": samples,
                  "train_loss": loss_sum / max(loss_count, 1),
                  "samples_per_second": timed_samples / max(train_seconds, 1e-9)}
        if result:
            record.update({"auc": result["auc"], "logloss": result["logloss"]})
            last_validation = result
        log.metrics(record)
        if progress is not None:
            progress.write(_format_record(record))
        else:
            log.say(_format_record(record))
        loss_sum, loss_count = 0.0, 0

    epoch, next_batch = start_epoch, start_batch
    while engine.step_count < total_steps:
        reader = BatchReader(store, "train", batch_size=config.batch_size, seed=config.seed, epoch=epoch,
                             drop_last=config.drop_last, start_batch=next_batch, **engine.reader_options())
        for batch in reader:
            start = time.perf_counter()
            loss = engine.train_step(batch)
            steps_run += 1
            samples += batch.global_size
            if steps_run == 1:
                engine.timer.reset()
            else:
                train_seconds += time.perf_counter() - start
                timed_samples += batch.global_size
            loss_sum, loss_count = loss_sum + loss, loss_count + 1
            next_batch = batch.index + 1
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss:.4f}", sps=f"{timed_samples / max(train_seconds, 1e-9):,.0f}")
            if config.eval_every and engine.step_count % config.eval_every == 0:
                validate(epoch)
            if config.checkpoint_every and engine.step_count % config.checkpoint_every == 0:
                final = save_checkpoint(engine, checkpoints, epoch=epoch, next_batch=next_batch,
                                        config=config.to_dict(), ttl=config.ttl, data_order=data_order)
                saved_step = engine.step_count
            if engine.step_count >= total_steps:
                break
        if next_batch >= len(reader):  # the epoch is complete
            if not config.eval_every:
                validate(epoch)
            epoch, next_batch = epoch + 1, 0
    if last_validation is None and loss_count:
        validate(epoch)
    if progress is not None:
        progress.close()

    if saved_step != engine.step_count:  # the periodic save may have just written this very step
        final = save_checkpoint(engine, checkpoints, epoch=epoch, next_batch=next_batch, config=config.to_dict(),
                                ttl=config.ttl, data_order=data_order)
    test = evaluate(engine, store, "test", config.eval_batch_size)
    # Bytes this rank sent per training step: DES's partials, or all-to-all's ids, rows, row
    # gradients and dense gradients (evaluation, setup and checkpoint traffic excluded).
    per_site = {site: st["bytes_sent"] / max(steps_run, 1) for site, st in comm.stats_dict().items()
                if site.startswith(("forward_partials", "dense_gradients", "embedding_"))}
    allreduce_sites = ("forward_partials", "dense_gradients")
    memory = engine.memory()
    per_rank = comm.allgather(np.array([peak_rss_bytes(), memory["rows"], memory["table_bytes"]], dtype=np.int64),
                              "summary")
    summary = {
        "model": model.name,
        "strategy": config.strategy,
        "ranks": comm.size,
        "steps": engine.step_count,
        "steps_this_run": steps_run,
        "train_samples": samples,
        "validation_auc": last_validation["auc"] if last_validation else None,
        "validation_logloss": last_validation["logloss"] if last_validation else None,
        "test_auc": test["auc"] if test else None,
        "test_logloss": test["logloss"] if test else None,
        "test_rows": test["rows"] if test else 0,
        "samples_per_second": timed_samples / max(train_seconds, 1e-9),
        "allreduce_bytes_per_step": sum(v for k, v in per_site.items() if k in allreduce_sites),
        "bytes_per_step": sum(per_site.values()),
        "bytes_per_step_by_site": per_site,
        "buffer_floats_per_sample": engine.buffer_width,
        "ms_per_phase": engine.timer.ms_per_step(),
        "peak_rss_bytes_per_rank": per_rank[:, 0].tolist(),
        "table_rows_per_rank": per_rank[:, 1].tolist(),
        "table_bytes_per_rank": per_rank[:, 2].tolist(),
        "checkpoint": str(run.public(final)),
        "run_folder": str(run.path),
    }
    if comm.rank == 0:
        (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    finish_run_folder(run, comm)
    log.say(_format_summary(summary))
    return summary


def train_parameter_server(config: TrainConfig, comm: Communicator, store, model, optimizers,
                           steps_per_epoch: int, run: RunFolder, distinct: list[int]) -> dict[str, Any]:
    """``--strategy ps``: the asynchronous baseline (see :mod:`des.strategies.ps`)."""
    from des.strategies.ps import ps_placement, run_parameter_server

    folder = run.work
    log = Log(comm, folder)
    total_steps = config.epochs * steps_per_epoch if config.epochs else config.max_steps
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    placement = ps_placement(store.num_fields, comm.size, config.ps_servers)  # servers own fields, workers none
    create_run_folder(run, comm)
    write_run_config(folder, comm, config, placement, model, store)
    log.say(f"des.train: {model.name} with strategy ps on {store.path.name}, {comm.size} rank(s) "
            f"({config.ps_servers} server(s), {comm.size - config.ps_servers} asynchronous worker(s)), "
            f"batch {config.batch_size}, {total_steps} batches, dtype {config.dtype}")
    log.say(describe_config(config))
    log.say(describe_placement(placement, distinct, store.field_names))
    log.say(f"  run folder: {run.path}")
    result = run_parameter_server(config, comm, store, model, optimizers, steps_per_epoch, total_steps, log)
    validation, test = result.pop("validation"), result.pop("test")
    summary = {
        "model": model.name, "strategy": "ps", "ranks": comm.size, **result, "steps_this_run": result["steps"],
        "validation_auc": validation["auc"] if validation else None,
        "validation_logloss": validation["logloss"] if validation else None,
        "test_auc": test["auc"] if test else None, "test_logloss": test["logloss"] if test else None,
        "test_rows": test["rows"] if test else 0, "allreduce_bytes_per_step": 0,
        "peak_rss_bytes_per_rank": comm.allgather(np.array([peak_rss_bytes()], np.int64), "summary")[:, 0].tolist(),
        "checkpoint": None, "run_folder": str(run.path),
    }
    log.metrics({"step": summary["steps"], "samples": summary["train_samples"],
                 "samples_per_second": summary["samples_per_second"],
                 **({"auc": validation["auc"], "logloss": validation["logloss"]} if validation else {})})
    if comm.rank == 0:
        (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    finish_run_folder(run, comm)
    log.say(_format_summary(summary) + f"\n  staleness of dense pushes: mean {summary['staleness_mean']:.2f}, "
            f"max {summary['staleness_max']}")
    return summary


def _progress(enabled: bool, total: int, initial: int):
    if not enabled or not user_sees_a_terminal():
        return None  # in a log file the evaluation lines and the summary say enough
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr, leave=True)


def user_sees_a_terminal() -> bool:
    """Is this process's stderr shown on a terminal? Under ``mpirun`` a rank's stderr is a pipe to
    the launcher, which copies it to *its* stderr: then that one decides (Linux ``/proc``)."""
    if sys.stderr.isatty():
        return True
    import psutil

    try:
        ancestors = psutil.Process().parents()
        for i, process in enumerate(ancestors):
            name = process.name()
            if name == "hydra_pmi_proxy" and i + 1 < len(ancestors):  # MPICH: proxy, then launcher
                launcher = ancestors[i + 1]
            elif name.startswith(("mpiexec", "mpirun", "prterun", "orterun")):
                launcher = process
            else:
                continue
            return os.readlink(f"/proc/{launcher.pid}/fd/2").startswith(("/dev/pts/", "/dev/tty"))
    except (OSError, psutil.Error):
        pass
    return False


def _format_record(record: dict[str, Any]) -> str:
    text = f"step {record['step']:6d}  train loss {record['train_loss']:.4f}"
    if "auc" in record:
        auc = "n/a" if record["auc"] is None else f"{record['auc']:.4f}"
        text += f"  val auc {auc}  val logloss {record['logloss']:.4f}"
    return text + f"  {record['samples_per_second']:,.0f} samples/s"


def _format_summary(s: dict[str, Any]) -> str:
    def num(value: Any, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    phases = "  ".join(f"{k} {v:.1f}" for k, v in s["ms_per_phase"].items())
    return (
        f"done: {s['model']} on {s['ranks']} rank(s), {s['steps']} steps, {s['train_samples']} samples this run\n"
        f"  test AUC {num(s['test_auc'], '.4f')}  test logloss {num(s['test_logloss'], '.4f')}  "
        f"({s['test_rows']} rows)\n"
        f"  {s['samples_per_second']:,.0f} samples/s, {s['bytes_per_step']:,.0f} bytes sent/step/rank, "
        f"peak RSS {max(s['peak_rss_bytes_per_rank']) / 2**20:,.0f} MiB/rank\n"
        f"  ms/step: {phases}\n"
        f"  summary: {s['run_folder']}/summary.json"
    )


def _versions() -> dict[str, str]:
    import mpi4py
    import numba
    import numpy
    import tensorflow

    return {"numpy": numpy.__version__, "numba": numba.__version__, "tensorflow": tensorflow.__version__,
            "mpi4py": mpi4py.__version__}


def main(argv: list[str] | None = None) -> int:
    config = load_config(argv)
    comm = Communicator()
    train(config, comm)
    return 0


if __name__ == "__main__":
    run_main(main, "des.train")
