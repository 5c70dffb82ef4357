"""A training run on this rank, and what the loop (:mod:`des.runner`) does with it between steps:
the batch of a step, the schedules' rates, validation with early stopping and plateau schedules,
checkpoints and the best one. :class:`Meter` counts the run's steps, samples and throughput;
:class:`TrainingState` is what a checkpoint keeps of the run besides the parameters.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from des.collectives import Communicator
from des.config import TrainConfig
from des.errors import DesError
from des.metrics import evaluate_split
from des.reporting import format_record
from des.run_folder import RunFolder
from des.schedules import Plateau, Schedule


class Meter:
    """Steps, samples and mean loss of this run on this rank. Throughput, and the strategy's phase
    timers, leave out the run's first ``warmup`` steps (at least one: the first compiles the numba
    kernels on a fresh install and traces the TF functions; a benchmark's warm-up also fills the
    tables)."""

    def __init__(self, warmup: int = 1) -> None:
        self.warmup = max(1, warmup)
        self.steps = self.samples = self.timed_samples = 0
        self.seconds = self.loss_sum = 0.0
        self.loss_count = 0
        self.losses: list[float] = []

    def record(self, loss: float, samples: int, seconds: float, timer) -> None:
        self.steps += 1
        self.losses.append(loss)
        self.samples += samples
        if self.steps == self.warmup:
            timer.reset()
        elif self.steps > self.warmup:
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
    validations: int = 0  # validations run so far (with or without validation rows)
    checkpoint: Path | None = None
    saved_step: int = -1
    run_folder: RunFolder | None = None
    tensorboard: Any = None  # des.tensorboard.ScalarWriter: the metrics records and the summary as TB scalars
    training: TrainingState = field(default_factory=TrainingState)
    schedules: dict[str, Schedule] = field(default_factory=dict)
    planner: dict[str, Any] | None = None  # communication_plan()'s record for summary.json
    exports: list[dict[str, Any]] = field(default_factory=list)  # --export-every: the versions written
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
        result = evaluate_split(self.strategy, self.store, "validation", self.config.eval_batch_size)
        if self.strategy.synchronous:  # every rank takes the same early-stopping decision
            result = self.comm.bcast_json(result, "validation", root=self.strategy.evaluators[0])
        self.validations += 1
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
            (progress.write if progress is not None else self.say)(format_record(record))

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
        if self.comm.rank == 0 and self.config.keep_checkpoints:
            prune_checkpoints(root, self.config.keep_checkpoints)
        return path

    def export(self, progress=None) -> None:
        """Version ``step`` of ``--export-dir`` from the checkpoint just saved (or restored) at
        ``step``, written by rank 0 from its files; the other ranks wait for its record (collective)."""
        if self.comm.rank == 0:
            from des.export import export_version

            root = Path(self.config.export_dir).resolve()
            try:
                record = export_version(self.checkpoint, root, self.saved_step, self.config.keep_exports)
            except OSError as exc:  # a full disk, say: one line, not a traceback
                raise DesError(f"--export-dir {root}: exporting step {self.saved_step} failed: {exc}") from None
        record = self.comm.bcast_json(record if self.comm.rank == 0 else None, "checkpoint")
        self.exports.append({k: record[k] for k in ("version", "step", "path")})
        removed = f", removed {', '.join(map(str, record['removed']))}" if record["removed"] else ""
        (progress.write if progress is not None else self.say)(
            f"exported version {record['version']} to {record['path']}: {record['bytes'] / 2**20:.1f} MiB in "
            f"{record['seconds']:.1f} s{removed}")

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


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` step checkpoints directly under ``root`` (by step; what
    ``latest`` names is always among them, ``best/`` is not looked at); returns those deleted. A
    deletion that fails halfway leaves a folder whose manifest may be gone: it is never taken for
    a checkpoint, and the next pruning retries it."""
    steps = sorted((p for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]))
    latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else ""
    old = [p for p in steps[: max(len(steps) - keep, 0)] if p.name != latest]
    for folder in old:
        (folder / "manifest.json").unlink(missing_ok=True)  # first: never a half-deleted "checkpoint"
        shutil.rmtree(folder, ignore_errors=True)
    return old
