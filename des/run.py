"""A training run on this rank, and what the loop (:mod:`des.runner`) does with it between steps:
the batch of a step (from its source, :mod:`des.sources`), the schedules' rates, validation with
early stopping and plateau schedules, a stream's progressive validation, checkpoints and the best
one. :class:`Meter` counts the run's steps, samples and throughput; :class:`TrainingState` is what
a checkpoint keeps of the run besides the parameters.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from des.collectives import Communicator
from des.config import TrainConfig
from des.errors import DesError
from des.metrics import auc_or_none, logloss
from des.predictions import evaluate_split
from des.reporting import format_progressive, format_record
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

    def leave_out_next(self) -> None:
        """Leave the next step out of the throughput, and restart the phase timers after it (a new
        strategy's first step traces: ``des.plan_review.switch``)."""
        self.warmup = max(self.warmup, self.steps + 1)

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
    stopped, each plateau schedule's state and a stream's progressive validations so far. Saved in
    every checkpoint's manifest."""

    best: float | None = None
    best_step: int = -1
    best_validation: dict[str, Any] | None = None
    best_checkpoint: str | None = None
    bad: int = 0
    stopped: bool = False
    plateau: dict[str, Plateau] = field(default_factory=lambda: {"sparse": Plateau(), "dense": Plateau()})
    progressive: list[dict[str, Any]] = field(default_factory=list)

    def improves(self, value: float, monitor: str) -> bool:
        return self.best is None or (value > self.best if monitor == "auc" else value < self.best)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in ("best", "best_step", "best_validation", "best_checkpoint", "bad",
                                                 "stopped", "progressive")},
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
    source: Any  # des.sources.EpochSource or StreamSource: the steps' batches and positions
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
    review: Any = None  # des.plan_review.Review: when the run switches its plan (None: never)
    rebuild: Any = None  # plan -> this rank's strategy built with it, tables to be loaded (a plan switch)
    evicted: dict[str, int] = field(default_factory=dict)  # rows evicted this run, by field name (summary.json)
    exports: list[dict[str, Any]] = field(default_factory=list)  # --export-every: the versions written
    # --full-checkpoint-every: the checkpoint the next one may be an increment of (its folder, step and
    # depth in its chain), and the catch-ups every row took since (its loading replays them)
    chain: tuple[Path, int, int] | None = None
    catch_ups: list[tuple[int, float]] = field(default_factory=list)

    @property
    def talks(self) -> bool:
        """The first evaluating rank prints and writes ``metrics.jsonl`` (rank 0 when it trains)."""
        return self.comm.rank == self.strategy.evaluators[0]

    def say(self, text: str) -> None:
        if self.talks:
            print(text, flush=True)

    @property
    def total_steps(self) -> int:
        """The steps the run ends at (a stream without --max-steps: 0, none known)."""
        return self.source.total_steps

    def batch(self, at):
        """The batch of position ``at`` (this rank's part of it), from the run's source."""
        return self.source.batch(at)

    def set_rates(self, step: int) -> None:
        """The schedules' factors of global step ``step`` (the same on every rank) for the optimizers."""
        rates = self.strategy.context.optimizers.rates
        for group, schedule in self.schedules.items():
            setattr(rates, group, schedule.factor(step, self.total_steps, self.training.plateau[group].scale))

    def review_plan(self, done: int, seconds: float | None = None, progress=None) -> None:
        """The plan review (``des/plan_review.py``) after ``done`` global steps, the last of which
        took ``seconds`` on this rank (collective), or, without ``seconds``, before a resumed run's
        first step (the plan ``--plan-switch`` gives it); switches where it says so."""
        if self.review is None:
            return
        from des.plan_review import switch

        if seconds is None:
            plan = self.review.resumed(done)
        else:
            plan = self.review.after(done, seconds,
                                     lambda x: float(np.max(self.comm.allgather(np.array([x]), "setup"))))
        if plan is not None:
            from des.reporting import bytes_sent

            self.review.sent_before_switch(float(bytes_sent(self.strategy, self.comm).sum()))
            start = time.perf_counter()
            switch(self, plan)
            self.review.took(time.perf_counter() - start)
            if self.talks:
                (progress.write if progress is not None else print)(self.review.line(done))

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
                record.update(self.observe(step, result))
        self.publish(record, format_record(record), progress)

    def progressive(self, segment, progress=None) -> None:
        """Progressive validation ("test, then train"): the current model's AUC and logloss on the
        rows of ``segment`` before it trains on them, on the evaluating ranks; one line of
        ``metrics.jsonl``, and kept in the training state (the summary's mean, resumes)."""
        self.catch_up()
        predicted = segment.test()
        record = None
        if self.talks and predicted is not None:
            p, y = predicted
            auc = auc_or_none(y, p, f"stream file {segment.label['file']}")
            record = {**segment.label, "step": self.strategy.step_count, "progressive_auc": auc,
                      "progressive_logloss": logloss(y, p), "rows": int(y.size)}
        record = self.comm.bcast_json(record, "validation", root=self.strategy.evaluators[0])
        if record is not None:
            self.training.progressive.append(record)
            self.publish(record, format_progressive(record), progress)

    def publish(self, record: dict[str, Any], line: str, progress=None) -> None:
        """A record in ``metrics.jsonl`` and TensorBoard, and its line (by the talking rank)."""
        if self.talks:
            with open(self.folder / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
            self.tensorboard.scalars(record["step"], {k: v for k, v in record.items() if k not in ("index", "batch")})
            (progress.write if progress is not None else self.say)(line)

    @property
    def evicts(self) -> bool:
        """Does this run evict rows (``--ttl``, ``--max-rows-per-field``)?"""
        return bool(self.config.ttl or self.config.max_rows_per_field)

    def evict(self, ttl: int | None = None, about: dict[str, Any] | None = None) -> int:
        """Evict rows on every rank at this step (collective; docs/design.md, section 4): every
        ``--evict-every`` steps, or before each checkpoint without it, or (``ttl``: an age in steps
        instead of ``--ttl``) after a stream's file with ``--ttl-files``. One ``metrics.jsonl``
        record of the rows evicted and left, by field (with ``about``); returns the rows evicted."""
        state = self.strategy.state()  # settles a pipelined step's deferred updates: rows are about to move
        evicted = state.evict(self.comm.rank, self.config.ttl if ttl is None else ttl, self.config.max_rows_per_field)
        names = self.store.field_names
        counts = np.zeros((len(names), 2), np.int64)
        for f, n in evicted.items():
            counts[f] = n, len(state.tables[f])
        counts = self.comm.allgather(counts, "eviction").sum(axis=0)  # a split field's shares add up
        for f, name in enumerate(names):
            self.evicted[name] = self.evicted.get(name, 0) + int(counts[f, 0])
        if self.talks:
            record = {"step": state.step, **(about or {}), "evicted_rows": dict(zip(names, counts[:, 0].tolist())),
                      "rows": dict(zip(names, counts[:, 1].tolist()))}
            with open(self.folder / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
        return int(counts[:, 0].sum())

    def catch_up(self) -> None:
        """Rows of a lazily caught-up optimizer (``adam:catchup=1``) take their deferred steps, so
        that evaluation and checkpoints see every row at the current step. (An asynchronous
        strategy's tables live on its servers: there rows catch up when next touched only.)"""
        if self.strategy.role == "train" and self.strategy.synchronous:
            step, rate = self.strategy.step_count, self.strategy.context.optimizers.rates.sparse
            for table in self.strategy.state().tables.values():
                table.catch_up(step, rate)
            if self.chain is not None and (not self.catch_ups or self.catch_ups[-1] != (step, rate)):
                self.catch_ups.append((step, float(rate)))  # (a repeat moves nothing)

    def observe(self, step: int, result: dict[str, Any]) -> dict[str, Any]:
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
                state.best_checkpoint = str(self.save(best=True))
            out.update({"best_step": state.best_step, "stop": state.stopped})
        return out

    def save(self, best: bool = False) -> Path:
        """A checkpoint (collective) of the run after its steps so far, in ``checkpoints/``, or with
        ``best`` in ``checkpoints/best/`` (only the newest best is kept)."""
        from des.checkpoint import save_checkpoint

        root = self.folder / "checkpoints" / ("best" if best else "")
        # without --evict-every, eviction runs at each checkpoint, on every rank alike: part of the saved state
        evicted = self.evict() if self.evicts and not best and not self.config.evict_every else 0
        self.catch_up()
        epoch, next_batch, stream = self.source.position(self.strategy.step_count)
        chained = self.config.full_checkpoint_every > 1 and not best  # best/ holds one full checkpoint
        increment = self.increment(root) if chained else None
        path = save_checkpoint(self.strategy, root, epoch=epoch, next_batch=next_batch, config=self.config.to_dict(),
                               evicted_rows=evicted, data_order=self.source.data_order,
                               training_state=self.training.to_dict(), schema=self.store.schema, stream=stream,
                               increment=increment, chained=chained)
        if best:
            if self.comm.rank == 0:
                for old in root.glob("step-*"):
                    if old != path:
                        shutil.rmtree(old, ignore_errors=True)
            return path
        self.checkpoint, self.saved_step = path, self.strategy.step_count
        if chained:
            self.chain, self.catch_ups = (path, self.saved_step, 0 if increment is None else increment.depth), []
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
                record = export_version(self.checkpoint, root, self.saved_step, self.config.keep_exports,
                                        self.config.export_dtype)
            except OSError as exc:  # a full disk, say: one line, not a traceback
                raise DesError(f"--export-dir {root}: exporting step {self.saved_step} failed: {exc}") from None
        record = self.comm.bcast_json(record if self.comm.rank == 0 else None, "checkpoint")
        self.exports.append({k: record[k] for k in ("version", "step", "path")})
        removed = f", removed {', '.join(map(str, record['removed']))}" if record["removed"] else ""
        (progress.write if progress is not None else self.say)(
            f"exported version {record['version']} to {record['path']}: {record['bytes'] / 2**20:.1f} MiB in "
            f"{record['seconds']:.1f} s{removed}")

    def increment(self, root: Path):
        """The :class:`des.checkpoint.Increment` the next checkpoint in ``root`` is (None: full): on
        the run's previous checkpoint in ``root`` unless the chain holds ``--full-checkpoint-every``
        checkpoints already (the same answer on every rank)."""
        from des.checkpoint import Increment

        if self.chain is None:
            return None
        base, step, depth = self.chain
        if depth + 1 >= self.config.full_checkpoint_every or step >= self.strategy.step_count \
                or base.parent.resolve() != root.resolve():
            return None
        return Increment(base=base, since=step, depth=depth + 1, catch_ups=tuple(self.catch_ups))

    def continue_chain(self, folder: Path, manifest: dict[str, Any]) -> None:
        """After a resume from ``folder`` (its manifest): the run's next checkpoint may be an
        increment of it (if in this run's ``checkpoints/``); the tables track evictions from now."""
        if self.config.full_checkpoint_every <= 1:
            return
        for table in self.strategy.state().tables.values():
            table.track_evictions()
        self.chain, self.catch_ups = (Path(folder), int(manifest["step"]), int(manifest.get("depth", 0))), []

    def restore_best(self) -> None:
        """Load the best checkpoint (collective) and make it the run's result: ``checkpoints/latest``
        points at it, so ``des.evaluate RUN_FOLDER`` evaluates the best model."""
        from des.checkpoint import load_checkpoint

        best = Path(self.training.best_checkpoint)
        if self.strategy.step_count != self.training.best_step:
            load_checkpoint(self.strategy, best)
            self.chain = None  # the tables were replaced: no increment of the run's last checkpoint
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
    """Delete all but the newest ``keep`` full step checkpoints directly under ``root`` (by step)
    with their increments (``--full-checkpoint-every``: every link of a kept chain stays); what
    ``latest`` names and its chain always stay, ``best/`` is not looked at. Returns those deleted,
    newest first: an increment goes before its base, so a pruning that fails halfway never leaves
    an increment without its base, and a folder whose manifest is gone is never taken for a
    checkpoint (the next pruning retries it)."""
    steps = sorted((p for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]))
    bases = {p.name: _base_of(p) for p in steps}

    def chain(name: str) -> list[str]:  # the links from ``name`` back to its full checkpoint
        links = [name]
        while bases.get(links[-1]) in bases and len(links) <= len(bases):
            links.append(bases[links[-1]])
        return links

    fulls = [p.name for p in steps if bases[p.name] is None]
    kept_fulls = set(fulls[max(len(fulls) - keep, 0):])
    latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else ""
    kept = set(chain(latest)) if latest in bases else set()
    kept.update(name for name in bases if chain(name)[-1] in kept_fulls)
    old = [p for p in reversed(steps) if p.name not in kept]
    for folder in old:
        (folder / "manifest.json").unlink(missing_ok=True)  # first: never a half-deleted "checkpoint"
        shutil.rmtree(folder, ignore_errors=True)
    return old


def _base_of(folder: Path) -> str | None:
    """The base an incremental checkpoint names (None: a full one, or no readable manifest)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("kind") != "incremental":
        return None
    return manifest["base"] if isinstance(manifest.get("base"), str) else ""  # "": an increment of nothing known
