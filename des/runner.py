"""The one training loop, for every strategy (``docs/design.md``, "The runner").

:func:`train` = :func:`des.startup.setup` (data, placement, model, strategy, resume, run folder,
start-up report) + :func:`loop` (batches, steps, validation and checkpoint cadence) +
:func:`finish` (final validation, checkpoint, test) + :func:`des.reporting.summarize`
(``summary.json``). A strategy's serving ranks (a parameter server) run :meth:`Strategy.serve`
instead of the loop. What the loop does between steps (a batch, the rates, a validation, a
checkpoint) is :class:`des.run.Run`'s; where batches come from (epochs over a store, or a stream of
files) is its source's (:mod:`des.sources`). ``python -m des.train`` is a thin command line over this
module; strategies never import it.
"""

from __future__ import annotations

import math
import time
from typing import Any

from des.collectives import Communicator
from des.config import TrainConfig
from des.errors import DesError
from des.predictions import evaluate_split
from des.reporting import progress_bar, summarize
from des.run import Run
from des.startup import setup


def train(config: TrainConfig, comm: Communicator, *, warmup_steps: int = 1) -> dict[str, Any]:
    """Train as ``config`` says on this rank (collective: every rank of ``comm`` calls it).
    Throughput and the phase timers leave out the first ``warmup_steps`` steps of this run (the
    first one traces and compiles; the benchmarks leave out more)."""
    run = setup(config, comm, warmup_steps=warmup_steps)
    results: dict[str, Any] = {}
    if run.strategy.role == "serve":
        run.strategy.serve()
    else:
        loop(run)
        results = finish(run)
        run.strategy.close()
    return summarize(run, comm.bcast_json(results, "summary", root=run.strategy.evaluators[0]))


def loop(run: Run) -> None:
    """Train this rank's batches from the strategy's step to the run's end, segment by segment of
    the run's source (a stream tests each segment before training it), with eviction, validation
    and checkpoints on their cadence (steps counted in global batches, the same on every rank)."""
    strategy, source = run.strategy, run.source
    planned = source.planned_steps(strategy.step_count) if not run.training.stopped else 0
    progress = progress_bar(run.talks and run.config.progress,
                            None if planned is None else strategy.step_count + planned, strategy.step_count)
    run.review_plan(strategy.step_count, progress=progress)  # a resumed run's --plan-switch
    with source.running():  # a stream: SIGTERM/SIGINT stop it after the current step
        for segment in source.segments(strategy.step_count) if not run.training.stopped else ():
            if segment.test is not None:  # progressive validation: test on rows before training on them
                run.progressive(segment, progress)
            if not train_segment(run, segment, progress):
                break
    run.strategy.end_training()  # (a plan switch may have replaced the strategy)
    if progress is not None:
        progress.close()


def train_segment(run: Run, segment, progress) -> bool:
    """Train the steps of one segment, the next batch prefetched within it (``--pipeline on``);
    False when the run stops (early stopping, a stream asked to stop)."""
    config = run.config
    following = None  # the next batch, prefetched
    for i, at in enumerate(segment):
        strategy = run.strategy  # (a plan switch replaces it between steps)
        start = time.perf_counter()  # a step's time includes reading its batch (or waiting for the prefetch)
        batch = following.batch() if following is not None else run.batch(at)
        done = at.step + 1  # global batches trained so far
        validates = strategy.synchronous and run.source.validates(at)
        closes = segment.closes if i + 1 == len(segment) else None  # the stream file this step ends
        exports = (bool(config.export_every) and done % config.export_every == 0) or (
            bool(config.export_every_files) and closes is not None and (closes + 1) % config.export_every_files == 0)
        # an export is made from the checkpoint of its step (so it is what des.evaluate of that gives)
        saves = exports or (bool(config.checkpoint_every) and done % config.checkpoint_every == 0)
        # --evict-every: between steps, never inside one (a prefetched lookup's rows would move)
        evicts = bool(config.evict_every) and done % config.evict_every == 0
        following = None
        switches = run.review is not None and run.review.quiet(at.step)  # may end in a plan switch
        if config.pipeline == "on" and i + 1 < len(segment) and not (validates or saves or evicts or switches):
            # nothing between this step and the next reads, saves or evicts the tables: overlap them
            following = strategy.prefetch(lambda after=segment[i + 1]: run.batch(after), segment[i + 1].step)
        run.set_rates(at.step)
        loss = strategy.train_step(batch)
        if not math.isfinite(loss) and (not strategy.synchronous or run.comm.rank == strategy.evaluators[0]):
            # a synchronous step gives every rank the same loss: one says it (one line); the others
            # wait in their next collective until that ends the job
            raise DesError(f"step {done}: the training loss is {loss}: training diverged (lower the learning rates; "
                           "an optimizer with epsilon 0 divides 0 by 0 on a zero gradient)")
        seconds = time.perf_counter() - start
        run.meter.record(loss, batch.global_size, seconds, strategy.timer)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{loss:.4f}", sps=f"{run.meter.samples_per_second:,.0f}")
        if evicts:  # before validating and saving: they see the tables the next step trains
            run.evict()
        if config.ttl_files and closes is not None:
            evict_after_file(run, segment)
        if validates:
            run.validate(done, at.part, progress)
        if saves:
            run.save()
        if exports:
            run.export(progress)
        run.review_plan(done, seconds, progress)  # its step times; at its steps, a switch
        if run.training.stopped:  # --early-stop: validation stopped improving
            run.say(f"early stop at step {done}: no better validation {config.monitor} since step "
                    f"{run.training.best_step}")
            return False
        if run.source.stopping():  # a stream asked to stop (a signal): the final checkpoint follows
            run.say(f"stopping at step {done}: asked to by a signal")
            return False
    return True


def evict_after_file(run: Run, segment) -> None:
    """``--ttl-files N``: at a stream file's end, the rows none of the last N files used go (an age
    in files: steps since the first step of the oldest of them)."""
    oldest = run.source.first_step(segment.closes - run.config.ttl_files + 1)
    if oldest is not None:
        run.evict(ttl=run.strategy.step_count - oldest, about={"file": segment.label.get("file")})


def finish(run: Run) -> dict[str, Any]:
    """After the last step: validation (if the loop ran none), the final checkpoint, the test split."""
    strategy, config = run.strategy, run.config
    evaluating = run.comm.rank in strategy.evaluators
    if run.source.validation and not run.validations and run.meter.steps and evaluating:
        run.validate(run.total_steps, (run.total_steps - 1) // run.source.steps_per_epoch)
    if run.training.best_checkpoint:  # --early-stop: the best model is the result
        run.restore_best()
    elif strategy.checkpoints and run.saved_step != strategy.step_count:
        run.save()
    if (config.export_every or config.export_every_files) and run.checkpoint and (
            not run.exports or run.exports[-1]["step"] != run.saved_step):
        run.export()  # the run's result (the best one after an early stop) becomes the highest version
    run.catch_up()
    test = evaluate_split(strategy, run.store, "test", config.eval_batch_size) if evaluating else None
    return {"validation": run.last_validation, "test": test,
            "checkpoint": str(run.checkpoint) if run.checkpoint else None}
