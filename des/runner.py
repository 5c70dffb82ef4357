"""The one training loop, for every strategy (``docs/design.md``, "The runner").

:func:`train` = :func:`setup` (data, placement, model, strategy, resume, run folder, start-up
report) + :func:`loop` (batches, steps, validation and checkpoint cadence) + :func:`finish` (final
validation, checkpoint, test) + :func:`summarize` (``summary.json``). A strategy's serving ranks
(a parameter server) run :meth:`Strategy.serve` instead of the loop. ``python -m des.train`` and
``python -m des.evaluate`` are thin command lines over this module; strategies never import it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import platform
import resource
import shutil
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from des import runtime
from des.collectives import Communicator, describe_processes
from des.config import MODELS, TrainConfig
from des.errors import ConfigError, DesError, UsageError
from des.run_folder import RunFolder
from des.schedules import Plateau, Schedule
from des.tensorboard import ScalarWriter, learning_rates, summary_scalars


# ---------------------------------------------------------------------------------------------- building
def build_model(config: TrainConfig, num_fields: int, num_dense: int = 0):
    """The model named by ``--model`` with the hyper-parameters its constructor accepts, for data of
    ``num_fields`` fields and ``num_dense`` dense features."""
    from des.models import get_model

    cls = get_model(config.model)
    candidates = {
        "num_fields": num_fields, "embedding_dim": config.embedding_dim, "hidden": tuple(config.hidden_units()),
        "activation": config.activation, "init_scale": config.init_scale, "l2_embedding": config.l2_embedding_value(),
        "l2_dense": config.l2_dense,
    }
    accepted = inspect.signature(cls.__init__).parameters
    if num_dense:
        candidates["num_dense"] = num_dense
    model = cls(**{k: v for k, v in candidates.items() if k in accepted})
    if num_dense and not any(sub.dense_params() for sub in model.substitutions()):
        raise ConfigError(f"--model {config.model} takes no dense features, and the data has {num_dense} "
                          "(declare them as bucketized numbers in the schema, or give the model an operator "
                          "that reads them)")
    return model


def build_optimizers(config: TrainConfig):
    from des.hashtable import optimizer_from_spec
    from des.options import Optimizers

    def parse(flag: str, spec: str):
        try:
            return optimizer_from_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"--{flag} {spec!r}: {exc}") from None

    return Optimizers(
        sparse={"linear": parse("linear-optimizer", config.linear_optimizer_spec()),
                "embedding": parse("embedding-optimizer", config.embedding_optimizer_spec())},
        dense=parse("dense-optimizer", config.dense_optimizer),
    )


def strategy_class(config: TrainConfig):
    """``--strategy``'s class (after ``--plugins`` are imported), its options checked. Every rank
    fails here alike, before any communication: a :class:`UsageError` (one line from rank 0)."""
    from des.plugins import load_plugins
    from des.strategies import get_strategy

    try:
        load_plugins(config.plugins)
        cls = get_strategy(config.strategy)
        cls.check_options(config.to_dict())
    except UsageError:
        raise
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return cls


def build_strategy(config: TrainConfig, comm: Communicator, num_fields: int, distinct: list[int], *,
                   cls: Any = None, strategy: str | None = None, placement: list[list[int]] | None = None,
                   loads_tables: bool = False, num_dense: int = 0):
    """The strategy object of this rank, with its model, optimizers, placement and tables
    (``--table-capacity 0``: sized from ``distinct``, unless ``loads_tables``: a checkpoint's
    tables replace them, and two full-size sets would be held at once)."""
    from des.options import TableOptions
    from des.strategies import StrategyContext, get_strategy

    cls = cls or get_strategy(strategy or config.strategy)
    options = config.to_dict()
    if placement is None:
        placement = cls.place(num_fields, comm.size, config.placement, distinct, options)
    context = StrategyContext(
        model=build_model(config, num_fields, num_dense), comm=comm, optimizers=build_optimizers(config), placement=placement,
        seed=config.seed, dtype=np.dtype(config.dtype),
        tables=TableOptions(config.table_capacity, config.min_count_value(), config.unadmitted_mode(),
                            () if loads_tables else tuple(distinct)),
        options=options,
        compute_dtype=None if config.compute_dtype == "auto" else config.compute_dtype)
    return cls(context)


def open_data(config: TrainConfig, comm: Communicator, data: str | None = None, split=None, bad_rows: str | None = None,
              schema: Any = None):
    """Rank 0 prepares raw files into the cache (once); then every rank opens the same store: the
    one of ``--data`` (split by ``--split``), or, with ``--train-data``, the separate inputs of each
    split read as one (``des.data.inputs``; ``data`` given: that one, as ``des.evaluate`` does).
    Raw files are read with ``schema`` (default ``--schema``: criteo when empty); a prepared
    directory must have been prepared with it (:func:`des.data.schema.check_same_schema`)."""
    from des.data import ColumnStore, ConcatStore, open_dataset, open_inputs
    from des.data.schema import check_same_schema, load_schema

    separate = config.train_data and data is None
    if comm.rank == 0:
        cache_dir, bad_rows = config.cache_dir or None, bad_rows or config.bad_rows
        wanted = load_schema(schema if schema is not None else config.schema or None)
        if separate:
            store = open_inputs({"train": config.train_data, "validation": config.validation_data,
                                 "test": config.test_data}, cache_dir=cache_dir, bad_rows=bad_rows, schema=wanted)
        else:
            store = open_dataset(data or config.data, cache_dir=cache_dir,
                                 split=config.split_fractions() if split is None else split, seed=config.split_seed,
                                 bad_rows=bad_rows, schema=wanted)
        if schema is not None or config.schema:  # a schema asked for: the prepared data must be of it
            check_same_schema(store.schema, wanted, f"--data {data or config.data or config.train_data}",
                              resolved=schema is not None and not isinstance(schema, str))
        opened = store.to_json() if separate else str(store.path)
    opened = comm.bcast_json(opened if comm.rank == 0 else None, "setup")
    if comm.rank == 0:
        return store
    return ConcatStore.from_json(opened) if separate else ColumnStore.open(opened)


def data_fingerprint(store) -> str:
    """Identifies the data by content (a store's manifest: sources' sha256, split, counts; separate
    inputs: those of the training and validation inputs, in order)."""
    return store.fingerprint


# ---------------------------------------------------------------------------------------------- evaluation
def predict_split(strategy, store, split: str, batch_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Predictions and labels of a whole split in store order (on every rank of the evaluators)."""
    from des.data.batch_reader import BatchReader

    reader = BatchReader(store, split, batch_size=batch_size, seed=0, shuffle=False, drop_last=False,
                         **strategy.reader_options())
    if reader.num_rows == 0:
        return None
    parts = [strategy.predict(batch) for batch in reader]
    return np.concatenate([p for p, _ in parts]), np.concatenate([y for _, y in parts])


def evaluate(strategy, store, split: str, batch_size: int) -> dict[str, Any] | None:
    """Exact AUC and logloss over a whole split; AUC ``None`` (n/a, ``null`` in JSON) with one
    warning from the first evaluating rank when the split has one class."""
    from des.metrics import auc_or_none, logloss

    result = predict_split(strategy, store, split, batch_size)
    if result is None:
        return None
    p, y = result
    auc = auc_or_none(y, p, f"the {split} split", warn=strategy.comm.rank == strategy.evaluators[0])
    return {"auc": auc, "logloss": logloss(y, p), "rows": int(y.size)}


# ---------------------------------------------------------------------------------------------- the run
class Meter:
    """Steps, samples and mean loss of this run on this rank; throughput leaves out the run's first
    step (it compiles the numba kernels on a fresh install and traces the TF functions: seconds)."""

    def __init__(self) -> None:
        self.steps = self.samples = self.timed_samples = 0
        self.seconds = self.loss_sum = 0.0
        self.loss_count = 0
        self.losses: list[float] = []

    def record(self, loss: float, samples: int, seconds: float, timer) -> None:
        self.steps += 1
        self.losses.append(loss)
        self.samples += samples
        if self.steps == 1:
            timer.reset()
        else:
            self.seconds += seconds
            self.timed_samples += samples
        self.loss_sum, self.loss_count = self.loss_sum + loss, self.loss_count + 1

    @property
    def samples_per_second(self) -> float:
        return self.timed_samples / max(self.seconds, 1e-9)

    def take_mean_loss(self) -> float:
        mean = self.loss_sum / max(self.loss_count, 1)
        self.loss_sum, self.loss_count = 0.0, 0
        return mean


@dataclass
class TrainingState:
    """What a resume needs besides the parameters and the position: the best validation so far
    (``--monitor``), validations since it, the best checkpoint (``--early-stop``), whether the run
    stopped, and each plateau schedule's state. Saved in every checkpoint's manifest."""

    best: float | None = None
    best_step: int = -1
    best_validation: dict[str, Any] | None = None
    best_checkpoint: str | None = None
    bad: int = 0
    stopped: bool = False
    plateau: dict[str, Plateau] = field(default_factory=lambda: {"sparse": Plateau(), "dense": Plateau()})

    def improves(self, value: float, monitor: str) -> bool:
        return self.best is None or (value > self.best if monitor == "auc" else value < self.best)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in ("best", "best_step", "best_validation", "best_checkpoint", "bad",
                                                 "stopped")},
                "plateau": {k: vars(v) for k, v in self.plateau.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "TrainingState":
        d = dict(d or {})  # a checkpoint without one (older format): a fresh state
        plateau = {k: Plateau(**v) for k, v in d.pop("plateau", {}).items()}
        return cls(**d, **({"plateau": plateau} if plateau else {}))


@dataclass
class Run:
    config: TrainConfig
    comm: Communicator
    store: Any
    strategy: Any
    folder: Path  # where this job writes (the run folder, or its staging sibling with --overwrite)
    steps_per_epoch: int
    total_steps: int
    data_order: dict[str, Any]
    start_step: int = 0
    meter: Meter = field(default_factory=Meter)
    last_validation: dict[str, Any] | None = None
    checkpoint: Path | None = None
    saved_step: int = -1
    run_folder: RunFolder | None = None
    tensorboard: Any = None  # des.tensorboard.ScalarWriter: the metrics records and the summary as TB scalars
    training: TrainingState = field(default_factory=TrainingState)
    schedules: dict[str, Schedule] = field(default_factory=dict)
    planner: dict[str, Any] | None = None  # communication_plan()'s record for summary.json
    _reader: Any = None

    @property
    def talks(self) -> bool:
        """The first evaluating rank prints and writes ``metrics.jsonl`` (rank 0 when it trains)."""
        return self.comm.rank == self.strategy.evaluators[0]

    def say(self, text: str) -> None:
        if self.talks:
            print(text, flush=True)

    def batch(self, epoch: int, index: int):
        """Global batch ``index`` of ``epoch`` (this rank's part of it): a pure function of (data,
        seed, epoch, index), so a resumed or asynchronous run sees the same batches."""
        from des.data.batch_reader import BatchReader

        if self._reader is None or self._reader.epoch != epoch:
            self._reader = BatchReader(self.store, "train", batch_size=self.config.batch_size, seed=self.config.seed,
                                       epoch=epoch, drop_last=self.config.drop_last,
                                       **self.strategy.reader_options())
        return self._reader.batch(index)

    def set_rates(self, step: int) -> None:
        """The schedules' factors of global step ``step`` (the same on every rank) for the optimizers."""
        rates = self.strategy.context.optimizers.rates
        for group, schedule in self.schedules.items():
            setattr(rates, group, schedule.factor(step, self.total_steps, self.training.plateau[group].scale))

    def validate(self, step: int, epoch: int, progress=None) -> None:
        """Validation AUC/logloss on the evaluating ranks; one line of ``metrics.jsonl``; then early
        stopping and plateau schedules (collective on a synchronous strategy)."""
        self.catch_up()
        result = evaluate(self.strategy, self.store, "validation", self.config.eval_batch_size)
        if self.strategy.synchronous:  # every rank takes the same early-stopping decision
            result = self.comm.bcast_json(result, "validation", root=self.strategy.evaluators[0])
        record = {"step": step, "epoch": epoch, "samples": self.meter.samples, "train_loss": self.meter.take_mean_loss(),
                  "samples_per_second": self.meter.samples_per_second}
        if result:
            record.update({"auc": result["auc"], "logloss": result["logloss"]})
            self.last_validation = result
            if self.strategy.synchronous:
                record.update(self.observe(step, epoch, result))
        if self.talks:
            with open(self.folder / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
            self.tensorboard.scalars(step, record)
            (progress.write if progress is not None else self.say)(_format_record(record))

    def catch_up(self) -> None:
        """Rows of a lazily caught-up optimizer (``adam:catchup=1``) take their deferred steps, so
        that evaluation and checkpoints see every row at the current step. (An asynchronous
        strategy's tables live on its servers: there rows catch up when next touched only.)"""
        if self.strategy.role == "train" and self.strategy.synchronous:
            for table in self.strategy.state().tables.values():
                table.catch_up(self.strategy.step_count, self.strategy.context.optimizers.rates.sparse)

    def observe(self, step: int, epoch: int, result: dict[str, Any]) -> dict[str, Any]:
        """Track the best validation, keep its checkpoint (``--early-stop``), count validations
        without improvement, reduce plateau schedules; returns the entries for the metrics record."""
        state, config = self.training, self.config
        improved = state.improves(result[config.monitor], config.monitor)
        if improved:
            state.best, state.best_step, state.best_validation, state.bad = result[config.monitor], step, result, 0
        else:
            state.bad += 1
        out: dict[str, Any] = {}
        for group, schedule in self.schedules.items():
            if state.plateau[group].update(schedule, improved):
                out[f"lr_scale_{group}"] = state.plateau[group].scale
        if config.early_stop:
            state.stopped = state.bad >= config.early_stop
            if improved:
                state.best_checkpoint = str(self.save(epoch, step - epoch * self.steps_per_epoch, best=True))
            out.update({"best_step": state.best_step, "stop": state.stopped})
        return out

    def save(self, epoch: int, next_batch: int, best: bool = False) -> Path:
        """A checkpoint (collective) in ``checkpoints/``, or with ``best`` in ``checkpoints/best/``
        (only the newest best is kept)."""
        from des.checkpoint import save_checkpoint

        root = self.folder / "checkpoints" / ("best" if best else "")
        self.catch_up()
        path = save_checkpoint(self.strategy, root, epoch=epoch, next_batch=next_batch, config=self.config.to_dict(),
                               ttl=0 if best else self.config.ttl, data_order=self.data_order,
                               training_state=self.training.to_dict(), schema=self.store.schema)
        if best:
            if self.comm.rank == 0:
                for old in root.glob("step-*"):
                    if old != path:
                        shutil.rmtree(old, ignore_errors=True)
            return path
        self.checkpoint, self.saved_step = path, self.strategy.step_count
        return path

    def restore_best(self) -> None:
        """Load the best checkpoint (collective) and make it the run's result: ``checkpoints/latest``
        points at it, so ``des.evaluate RUN_FOLDER`` evaluates the best model."""
        from des.checkpoint import load_checkpoint

        best = Path(self.training.best_checkpoint)
        if self.strategy.step_count != self.training.best_step:
            load_checkpoint(self.strategy, best)
        self.last_validation = self.training.best_validation
        if self.comm.rank == 0:
            root = self.folder / "checkpoints"
            root.mkdir(parents=True, exist_ok=True)
            target = os.path.relpath(best, root)
            tmp = root / "latest.tmp"
            tmp.write_text(target + "\n")
            os.replace(tmp, root / "latest")
        self.checkpoint, self.saved_step = best, self.strategy.step_count
        self.comm.barrier("checkpoint")


def train(config: TrainConfig, comm: Communicator) -> dict[str, Any]:
    """Train as ``config`` says on this rank (collective: every rank of ``comm`` calls it)."""
    run = setup(config, comm)
    results: dict[str, Any] = {}
    if run.strategy.role == "serve":
        run.strategy.serve()
    else:
        loop(run)
        results = finish(run)
        run.strategy.close()
    return summarize(run, comm.bcast_json(results, "summary", root=run.strategy.evaluators[0]))


def loop(run: Run) -> None:
    """Train this rank's batches from the strategy's step to the run's end, with validation and
    checkpoints on their cadence (steps counted in global batches, the same on every rank)."""
    strategy, config = run.strategy, run.config
    mine = strategy.steps(strategy.step_count, run.total_steps) if not run.training.stopped else range(0)
    progress = _progress(run.talks and config.progress, strategy.step_count + len(mine), strategy.step_count)
    following = None  # the next batch, prefetched (--pipeline on)
    for i, step in enumerate(mine):
        epoch, index = divmod(step, run.steps_per_epoch)
        start = time.perf_counter()  # a step's time includes reading its batch (or waiting for the prefetch)
        batch = following.batch() if following is not None else run.batch(epoch, index)
        done = step + 1  # global batches trained so far
        validates = strategy.synchronous and (done % config.eval_every == 0 if config.eval_every
                                              else index + 1 == run.steps_per_epoch)
        saves = bool(config.checkpoint_every) and done % config.checkpoint_every == 0
        following = None
        if config.pipeline == "on" and i + 1 < len(mine) and not (validates or saves):
            # nothing between this step and the next reads or saves the tables: overlap them
            following = strategy.prefetch(lambda after=mine[i + 1]: run.batch(*divmod(after, run.steps_per_epoch)),
                                          mine[i + 1])
        run.set_rates(step)
        loss = strategy.train_step(batch)
        if not math.isfinite(loss) and (not strategy.synchronous or run.comm.rank == strategy.evaluators[0]):
            # a synchronous step gives every rank the same loss: one says it (one line); the others
            # wait in their next collective until that ends the job
            raise DesError(f"step {done}: the training loss is {loss}: training diverged (lower the learning rates; "
                           "an optimizer with epsilon 0 divides 0 by 0 on a zero gradient)")
        run.meter.record(loss, batch.global_size, time.perf_counter() - start, strategy.timer)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{loss:.4f}", sps=f"{run.meter.samples_per_second:,.0f}")
        if validates:
            run.validate(done, epoch, progress)
        if saves:
            run.save(epoch, index + 1)
        if run.training.stopped:  # --early-stop: validation stopped improving
            run.say(f"early stop at step {done}: no better validation {config.monitor} since step "
                    f"{run.training.best_step}")
            break
    strategy.end_training()
    if progress is not None:
        progress.close()


def finish(run: Run) -> dict[str, Any]:
    """After the last step: validation (if the loop did none), the final checkpoint, the test split."""
    strategy, config = run.strategy, run.config
    evaluating = run.comm.rank in strategy.evaluators
    if run.last_validation is None and run.meter.steps and evaluating:
        epoch = (run.total_steps - 1) // run.steps_per_epoch
        run.validate(run.total_steps, epoch)
    if run.training.best_checkpoint:  # --early-stop: the best model is the result
        run.restore_best()
    elif strategy.checkpoints and run.saved_step != strategy.step_count:
        epoch, index = divmod(strategy.step_count - 1, run.steps_per_epoch)
        run.save(epoch, index + 1)
    run.catch_up()
    test = evaluate(strategy, run.store, "test", config.eval_batch_size) if evaluating else None
    return {"validation": run.last_validation, "test": test,
            "checkpoint": str(run.checkpoint) if run.checkpoint else None}


def resolve_plan(config: TrainConfig, cls: Any, store: Any, placement: list[list[int]]) -> tuple[TrainConfig, Any]:
    """``--plan auto`` -> the planner's cheapest plan for this data, batch size and placement
    (``des/planner.py``: distinct ids counted on the first 4 batches of the training order, the
    same on every rank), written into the config (``config.json`` says what ran). Returns the
    config and the id statistics (None on one rank or for a strategy the planner does not model)."""
    ranks = len(placement)
    if cls.communication_plan is None or ranks == 1:
        if config.plan == "auto":  # one rank: nothing travels, every plan is the same step
            config = dataclasses.replace(config, plan="partials")
        return config, None
    from des import planner

    unique = planner.estimate_unique_ids(store, config.batch_size, ranks, seed=config.seed, drop_last=config.drop_last)
    if config.plan == "auto" and getattr(cls, "fixed_plan", None) is None:
        if config.upper == "replicated":
            best = "partials"
        else:
            shape = planner.model_shape(build_model(config, store.num_fields, store.num_dense))
            best = planner.format_plan(planner.best_plan(shape, config.batch_size, placement, unique,
                                                         np.dtype(config.dtype).itemsize).plan)
        config = dataclasses.replace(config, plan=best)
    return config, unique


def communication_plan(config: TrainConfig, strategy: Any, store: Any, ranks: int, unique: Any = None
                       ) -> tuple[str, dict[str, Any]] | None:
    """The planner's view of this run (``des/planner.py``), for a strategy whose traffic it models,
    on several ranks: the start-up table (per operator, predicted bytes/step/rank as partials and
    as an exchange, which is cheaper and why) and what ``summary.json`` records next to the
    measured bytes (``unique``: :func:`resolve_plan`'s id statistics)."""
    if strategy.communication_plan is None or ranks == 1 or unique is None:
        return None
    from des import planner

    shape = planner.model_shape(strategy.model)
    plan = getattr(strategy, "plan", strategy.communication_plan)
    size = np.dtype(config.dtype).itemsize
    upper = getattr(strategy, "upper", "data-parallel")
    cost = planner.plan_cost(shape, plan, config.batch_size, strategy.placement, unique, size, upper=upper)
    best = planner.best_plan(shape, config.batch_size, strategy.placement, unique, size)
    record = {"plan": cost.plan, "upper": upper, "predicted_bytes_per_step": cost.mean,
              "predicted_sites": {site: float(np.mean(v)) for site, v in cost.sites().items()},
              "cheapest_plan": best.plan, "cheapest_bytes_per_step": best.mean, "batches_sampled": unique.batches}
    text = planner.report(shape, config.batch_size, strategy.placement, unique, size)
    text += (f"\n  this run: --plan {planner.format_plan(cost.plan)}"
             + (f" (upper {upper})" if upper != "data-parallel" else "")
             + f", predicted {cost.mean:,.0f} bytes/step/rank (summary.json: planner)")
    return text, record


def summarize(run: Run, results: dict[str, Any]) -> dict[str, Any]:
    """``summary.json`` (collective): throughput over the ranks that count samples, bytes per step
    per traffic site (mean over ranks), phases of the first training rank, memory per rank."""
    from des.data.schema import describe_schema

    strategy, comm, meter = run.strategy, run.comm, run.meter
    counts = comm.allgather(np.array([meter.timed_samples, meter.seconds, meter.samples, meter.steps,
                                      float(strategy.counts_samples)]), "summary")
    counting = counts[counts[:, 4] > 0]
    steps_this_run = int(counting[:, 3].sum())
    stats = comm.stats_dict()
    # a site's own calls and the element counts an Alltoallv sends first (the communicator's "site:counts")
    sent = np.array([sum(stats.get(name, {}).get("bytes_sent", 0) for name in (site, site + ":counts"))
                     for site in strategy.traffic_sites], dtype=np.float64)
    sent_per_step = comm.allgather(sent, "summary") / max(steps_this_run, 1)  # [rank, site]
    per_site = dict(zip(strategy.traffic_sites, sent_per_step.mean(axis=0)))
    memory = strategy.memory()
    per_rank = comm.allgather(np.array([peak_rss_bytes(), memory["rows"], memory["table_bytes"]], np.int64), "summary")
    validation, test = results.get("validation"), results.get("test")
    summary = {
        "model": strategy.model.name,
        "strategy": strategy.name,
        "ranks": comm.size,
        "schema": describe_schema(run.store.schema),
        "fields": run.store.num_fields,
        "dense_features": run.store.num_dense,
        "steps": run.start_step + steps_this_run,
        "steps_this_run": steps_this_run,
        "train_samples": int(counting[:, 2].sum()),
        "validation_auc": validation["auc"] if validation else None,
        "validation_logloss": validation["logloss"] if validation else None,
        "test_auc": test["auc"] if test else None,
        "test_logloss": test["logloss"] if test else None,
        "test_rows": test["rows"] if test else 0,
        "samples_per_second": float(counting[:, 0].sum() / max(counting[:, 1].max(initial=0.0), 1e-9)),
        "allreduce_bytes_per_step": float(sum(per_site[s] for s in strategy.allreduce_sites)),
        "bytes_per_step": float(sum(per_site.values())),
        "bytes_per_step_by_site": {k: float(v) for k, v in per_site.items()},
        "bytes_per_step_per_rank": sent_per_step.sum(axis=1).tolist(),
        "planner": run.planner,
        "buffer_floats_per_sample": getattr(strategy, "buffer_width", None),
        "ms_per_phase": comm.bcast_json(strategy.timer.ms_per_step(), "summary", root=strategy.evaluators[0]),
        "overlapped_steps": strategy.overlapped_steps,  # --pipeline: steps that looked up the next batch meanwhile
        "peak_rss_bytes_per_rank": per_rank[:, 0].tolist(),
        "table_rows_per_rank": per_rank[:, 1].tolist(),
        "table_bytes_per_rank": per_rank[:, 2].tolist(),
        **strategy.summary(),
        "checkpoint": str(run.run_folder.public(results["checkpoint"])) if results.get("checkpoint") else None,
        "best_step": run.training.best_step if run.config.early_stop else None,
        "stopped_early": run.training.stopped,
        "run_folder": str(run.run_folder.path),
    }
    if comm.rank == 0:
        (run.folder / "summary.json").write_text(json.dumps(summary, indent=1))
    run.tensorboard.scalars(summary["steps"], summary_scalars(summary))
    run.tensorboard.close()
    comm.barrier("summary")
    if comm.rank == 0:  # after success: an --overwrite run replaces the old one; the lock is released
        run.run_folder.finish()
    run.say(_format_summary(summary))
    return summary


# ---------------------------------------------------------------------------------------------- set-up
def setup(config: TrainConfig, comm: Communicator) -> Run:
    """Everything before the first step; every user error is found here, before anything is written."""
    from des.checkpoint import check_schema, load_checkpoint, read_manifest

    if not config.plugins and config.model not in MODELS:
        raise ConfigError(f"unknown model {config.model!r} (choose one of: {', '.join(MODELS)}, or load one with --plugins)")
    cls = strategy_class(config)
    store = open_data(config, comm)
    if store.num_rows == 0:
        raise DesError(f"dataset {store.source} is empty")
    distinct = [store.distinct_count(f) for f in range(store.num_fields)]
    placement = cls.place(store.num_fields, comm.size, config.placement, distinct, config.to_dict())
    train_rows = len(store.split_rows("train"))
    steps_per_epoch = train_rows // config.batch_size if config.drop_last else -(-train_rows // config.batch_size)
    if steps_per_epoch == 0:
        raise ConfigError(f"--batch-size {config.batch_size} is larger than the {train_rows} training rows of "
                          f"{store.display_name}")
    total_steps = config.epochs * steps_per_epoch if config.epochs else config.max_steps
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    build_optimizers(config)  # a bad optimizer spec fails before TensorFlow is started
    validation_rows = len(store.split_rows("validation"))
    if config.early_stop == -1:  # auto: a plain value from here on (config.json, checkpoints)
        auto = config.early_stop_patience(validation_rows) if cls.synchronous else 0
        config = dataclasses.replace(config, early_stop=auto)
    schedules = check_validation_use(config, cls, validation_rows)
    run_folder = plan_run_folder(config, comm)
    folder = run_folder.work
    threads = runtime.configure_threads(config.threads)
    pipeline_chosen = config.pipeline
    if config.pipeline == "auto":  # per rank (never changes results): the overlap needs a spare core
        config = dataclasses.replace(config, pipeline="on" if threads.intra_op >= 2 else "off")
    config, unique = resolve_plan(config, cls, store, placement)
    strategy = build_strategy(config, comm, store.num_fields, distinct, cls=cls, placement=placement,
                              loads_tables=bool(config.resume), num_dense=store.num_dense)
    # What fixes the order of the batches: a checkpoint's position only means the same batch in a
    # run with the same data, batch size, seed and drop-last.
    data_order = {"data_fingerprint": data_fingerprint(store), "batch_size": config.batch_size,
                  "seed": config.seed, "drop_last": config.drop_last}
    if config.train_data:  # a resume with other training or validation files names them
        data_order["inputs"] = store.input_names()
    manifest = None
    if config.resume:
        check_schema(read_manifest(config.resume), store.schema)
        manifest = load_checkpoint(strategy, config.resume, data_order=data_order)
        if strategy.step_count != manifest["epoch"] * steps_per_epoch + manifest["next_batch"]:
            raise ConfigError(f"checkpoint {config.resume}: step {strategy.step_count} is not epoch "
                              f"{manifest['epoch']} batch {manifest['next_batch']} of {steps_per_epoch} per epoch")
    create_run_folder(run_folder, comm)
    run = Run(config, comm, store, strategy, folder, steps_per_epoch, total_steps, data_order,
              start_step=strategy.step_count, run_folder=run_folder, schedules=schedules,
              training=TrainingState.from_dict(manifest.get("training_state") if manifest else None))
    run.tensorboard = ScalarWriter(folder, run.talks, learning_rates(strategy.context.optimizers))
    hosts = runtime.describe_hosts(comm)  # collective
    if comm.rank == 0:
        (folder / "config.json").write_text(json.dumps({
            "config": config.to_dict(), "ranks": comm.size, "placement": strategy.placement,
            "model": strategy.model.describe(), "data": store.source, "data_fingerprint": data_fingerprint(store),
            "versions": _versions(), "python": platform.python_version(),
        }, indent=1))
    run.say(f"des.train: {strategy.model.name} with strategy {strategy.name} on {store.display_name} "
            f"({store.num_rows} rows, {train_rows} train, {validation_rows} validation), {comm.size} rank(s), batch "
            f"{config.batch_size}, {total_steps} steps ({config.epochs} epoch(s) of {steps_per_epoch}), dtype {config.dtype}")
    run.say(hosts)
    run.say(threads.describe())
    run.say(f"  pipeline {config.pipeline}" + (f" (auto: {threads.intra_op} thread(s) per rank)"
                                              if pipeline_chosen == "auto" else ""))
    run.say(f"  strategy {strategy.name}: {strategy.describe()}")
    plan = communication_plan(config, strategy, store, comm.size, unique)
    if plan is not None:
        run.say(textwrap.indent(plan[0], "  "))
        run.planner = plan[1]
    run.say(f"  optimizers: linear {config.linear_optimizer_spec()}; embedding {config.embedding_optimizer_spec()}; "
            f"dense {config.dense_optimizer}")
    run.say(f"  admission: --min-count {config.min_count_value()} --unadmitted {config.unadmitted_mode()}; "
            f"l2 on looked-up rows {config.l2_embedding_value():g}")
    run.say(describe_config(config))
    if manifest is not None:
        run.say(f"  resumed from {config.resume} at step {strategy.step_count} (epoch {manifest['epoch']}, batch "
                f"{manifest['next_batch']}), written by {manifest['ranks']} rank(s)")
    if run.talks:
        print(describe_placement(strategy.placement, distinct, store.field_names, _empty_table(strategy),
                                 strategy.context.tables), flush=True)
    if store.num_dense:
        run.say(f"  dense features: {store.num_dense} ({', '.join(store.dense_names)}), read by every rank for its "
                "rows; their weights replicated with the top network")
    run.say(f"  run folder: {run_folder.path}" + (" (replaced when this run finishes)" if run_folder.overwrite else ""))
    if describe_processes():  # which pid is which rank, for the launcher's "PID ... killed"
        run.say(describe_processes())
    return run


def check_validation_use(config: TrainConfig, cls: Any, validation_rows: int) -> dict[str, Schedule]:
    """The non-constant schedules; ``--early-stop`` and plateau schedules need validation rows and a
    synchronous strategy (an asynchronous one validates once, at the end)."""
    schedules = {group: s for group, s in config.schedules().items() if s.kind != "constant"}
    users = config.validation_users()
    config.check_validation_rows(validation_rows)
    if (users or schedules) and not cls.synchronous:
        what = users[0] if users else f"--{next(iter(schedules))}-schedule"
        raise ConfigError(f"{what} is not supported with --strategy {cls.name} (asynchronous: servers apply pushes "
                          "on arrival and validation runs once, at the end)")
    return schedules


def _empty_table(strategy):
    """An empty table of the model's row layout (every field's table has the same): it sizes them all."""
    from des.strategies.components import FieldShard

    return FieldShard([0], strategy.model.blocks(), strategy.context.optimizers, seed=0, dtype=strategy.dtype,
                      tables=strategy.context.tables).tables[0]


def plan_run_folder(config: TrainConfig, comm: Communicator) -> RunFolder:
    """The run folder, checked (writable, not in use, no other run in it) but not created yet: a
    run that fails during set-up (a bad checkpoint, say) leaves nothing behind."""
    if comm.rank == 0:
        plan = RunFolder.plan(config.output, model=config.model, resume=config.resume,
                              overwrite=config.overwrite).to_json()
    return RunFolder.from_json(comm.bcast_json(plan if comm.rank == 0 else None, "setup"))


def create_run_folder(folder: RunFolder, comm: Communicator) -> None:
    # Every rank first finishes its set-up (a rank that fails to load its fields aborts the job
    # here, before rank 0 has created anything). Rank 0 then holds the folder's lock until exit.
    comm.barrier("setup")
    if comm.rank == 0:
        folder.create()
    comm.barrier("setup")


# ---------------------------------------------------------------------------------------------- reporting
def describe_config(config: TrainConfig) -> str:
    """The effective config, every option, wrapped (also saved in ``config.json``)."""
    items = " ".join(f"{k}={v}" for k, v in config.to_dict().items())
    return textwrap.fill(items, width=110, initial_indent="  config: ", subsequent_indent="          ",
                         break_long_words=False, break_on_hyphens=False)


def describe_placement(placement: list[list[int]], distinct: list[int], names, layout=None, tables=None) -> str:
    """Fields, distinct ids and (given one of the tables, and the tables' options) estimated table
    memory of every rank."""
    lines = []

    def estimate(f: int) -> int:
        # Every field's table has the same row layout, so one table can size all of them.
        capacity, rows = (None, None) if tables is None else tables.initial_size(f)
        return layout.estimated_bytes(distinct[f], capacity, rows)

    for r, fields in enumerate(placement):
        memory = "" if layout is None else f", tables ~{sum(estimate(f) for f in fields) / 2**20:7.1f} MiB"
        lines.append(f"  rank {r}: {len(fields):2d} fields, {sum(distinct[f] for f in fields):9d} distinct ids{memory}  "
                     f"{','.join(names[f] for f in fields)}")
    return "\n".join(lines)


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


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
    text = (
        f"done: {s['model']} on {s['ranks']} rank(s), {s['steps']} steps, {s['train_samples']} samples this run\n"
        f"  test AUC {num(s['test_auc'], '.4f')}  test logloss {num(s['test_logloss'], '.4f')}  "
        f"({s['test_rows']} rows)\n"
        f"  {s['samples_per_second']:,.0f} samples/s, {s['bytes_per_step']:,.0f} bytes sent/step/rank, "
        f"peak RSS {max(s['peak_rss_bytes_per_rank']) / 2**20:,.0f} MiB/rank\n"
        f"  ms/step: {phases}\n"
        f"  summary: {s['run_folder']}/summary.json"
    )
    if "staleness_mean" in s:
        text += f"\n  staleness of dense pushes: mean {s['staleness_mean']:.2f}, max {s['staleness_max']}"
    return text


def _versions() -> dict[str, str]:
    import mpi4py
    import numba
    import numpy
    import tensorflow

    return {"numpy": numpy.__version__, "numba": numba.__version__, "tensorflow": tensorflow.__version__,
            "mpi4py": mpi4py.__version__}
