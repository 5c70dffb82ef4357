"""Everything before a run's first step (``docs/design.md``, "The runner"): the strategy class, the
data, the step counts, the options that ``auto`` leaves to the run (early stopping, the pipeline,
``--plan``), the strategy, a resumed checkpoint, the run folder, ``config.json`` and the start-up
report. Every user error is found here, before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from typing import Any

import numpy as np

from des import plan_trials, runtime
from des.building import (build_model, build_optimizers, build_strategy, data_fingerprint, open_data, strategy_class,
                          table_options)
from des.collectives import Communicator
from des.config import MODELS, TrainConfig
from des.data.counting import admitted_keys
from des.errors import ConfigError, DesError, UsageError
from des.placement import parse_split_fields
from des.reporting import startup_report, versions
from des.run import Meter, Run, TrainingState
from des.run_folder import RunFolder
from des.schedules import Schedule
from des.sources import EpochSource, StreamSource, StreamStart
from des.tensorboard import ScalarWriter, learning_rates


def setup(config: TrainConfig, comm: Communicator, *, warmup_steps: int = 1) -> Run:
    """This rank's run, ready for its first step (collective: every rank of ``comm`` calls it).
    Every part is made once, in order, and handed to what uses it: nothing is finished later.
    Throughput leaves out the first ``warmup_steps`` steps (:class:`des.run.Meter`)."""
    if not config.plugins and config.model not in MODELS:
        raise ConfigError(f"unknown model {config.model!r} (choose one of: {', '.join(MODELS)}, or load one with --plugins)")
    cls = strategy_class(config)
    if config.stream and not cls.synchronous:
        raise UsageError(f"--stream needs a synchronous strategy, not {cls.name} (each file is tested on every "
                         "rank before it is trained on, in lock-step)")
    stream = StreamStart.open(config, comm) if config.stream else None  # lists the files, opens the first
    store = stream.store if stream else open_data(config, comm)
    if store.num_rows == 0:
        raise DesError(f"dataset {store.source} is empty")
    distinct = [store.distinct_count(f) for f in range(store.num_fields)]
    config = shared_table_numbers(split_field_numbers(config, store), store, cls)
    work = field_work_of(config, store, comm.size)
    placement = cls.place(store.num_fields, comm.size, distinct, config, work)
    train_rows, validation_rows = len(store.split_rows("train")), len(store.split_rows("validation"))
    steps = None if stream else count_steps(config, train_rows, store.display_name)
    build_optimizers(config)  # a bad optimizer spec fails before TensorFlow is started
    hosts = runtime.host_ranks(comm)  # collective
    admitted = admitted_keys(store, config.min_count_value()) if counts_admission(config, stream) else []
    refuse_what_cannot_fit(config, store.num_fields, store.num_dense, placement, distinct, hosts, admitted)
    if config.early_stop == -1:  # auto: a plain value from here on (config.json, checkpoints)
        config = dataclasses.replace(config, early_stop=config.early_stop_patience(validation_rows)
                                     if cls.synchronous else 0)
    schedules = check_validation_use(config, cls, validation_rows)
    run_folder = plan_run_folder(config, comm)
    threads = runtime.configure_threads(config.threads, config.pin_cores)
    pipeline_auto = config.pipeline == "auto"
    if pipeline_auto:  # per rank (never changes results): the overlap needs a spare core
        config = dataclasses.replace(config, pipeline="on" if threads.intra_op >= 2 else "off")
    model = build_model(config, store.num_fields, store.num_dense)
    config, planning, trials = choose_plan(config, cls, store, placement, distinct, comm, model,
                                           steps[1] if steps else 0, threads)
    check_plan_switch(config, cls, planning, model)
    strategy = build_strategy(config, comm, store.num_fields, distinct, cls=cls, placement=placement,
                              loads_tables=bool(config.resume), num_dense=store.num_dense, model=model,
                              admitted=admitted)
    source = (StreamSource(config, comm, stream, strategy) if stream else
              EpochSource(config, store, *steps, batch_order(config, store), strategy))
    manifest = resume(config, strategy, store, source) if config.resume else None
    create_run_folder(run_folder, comm)
    plan_text, plan_record = communication_plan(config, strategy, planning, trials)
    talks = comm.rank == strategy.evaluators[0]
    run = Run(config, comm, store, strategy, run_folder.work, source,
              start_step=strategy.step_count, run_folder=run_folder, schedules=schedules, meter=Meter(warmup_steps),
              tensorboard=ScalarWriter(run_folder.work, talks, learning_rates(strategy.context.optimizers)),
              planner=plan_record, training=TrainingState.from_dict(manifest.get("training_state") if manifest else None))
    attach_review(run, trials, lambda plan: build_strategy(
        dataclasses.replace(config, plan=plan), comm, store.num_fields, distinct, cls=cls, placement=placement,
        loads_tables=True, num_dense=store.num_dense, model=model, admitted=admitted))
    if manifest is not None:  # --full-checkpoint-every: the next checkpoint may be an increment of it
        from des.checkpoint import resolve_checkpoint

        run.continue_chain(resolve_checkpoint(config.resume), manifest)
    if comm.rank == 0:
        write_config_json(run)
    if run.talks:
        for line in startup_report(run, train_rows=train_rows, validation_rows=validation_rows, distinct=distinct,
                                   hosts=runtime.describe_hosts(hosts), threads=threads, pipeline_auto=pipeline_auto,
                                   plan_text=plan_text, manifest=manifest, work=work,
                                   tables=table_options(config, distinct, admitted)):
            print(line, flush=True)
    return run


#: the least a rank holds besides its tables (TensorFlow alone takes about 0.6 GB; DeepFM's default
#: command on the Criteo sample peaks at 0.86-0.96 GiB per rank with its 6-16 MB of tables)
RANK_BASE_BYTES = 1 << 29


def counts_admission(config: TrainConfig, stream: Any) -> bool:
    """Whether the tables' rows are sized from the training split's admitted keys
    (``des.data.counting.admitted_keys``: one pass over its ids at start-up): tables sized from the
    data (``--table-capacity 0``), ``--min-count`` above 1 and an epoch source (a stream's files are
    not all known). A resumed run's tables are the checkpoint's, but they grow to the same rows: the
    memory check and the start-up report predict them the same way as a fresh run's."""
    return not config.table_capacity and config.min_count_value() > 1 and stream is None


def refuse_what_cannot_fit(config: TrainConfig, num_fields: int, num_dense: int, placement: list[list[int]],
                           distinct: list[int], hosts: dict[str, tuple[list[int], int]],
                           admitted: list[int] | tuple[int, ...] = ()) -> None:
    """Stop before any table is made, with one line on every rank alike, when the tables predicted
    for a host's ranks (``placement.predicted_table_bytes``: the run's row layout, table dtype and
    optimizers at the data's distinct ids, as the start-up report prints them), plus
    :data:`RANK_BASE_BYTES` a rank, exceed the host's physical memory (``runtime.host_ranks``):
    such a run would be killed for memory mid-epoch."""
    from des.building import layout_table
    from des.placement import predicted_table_bytes

    layout = layout_table(config, num_fields, num_dense)
    predicted = predicted_table_bytes(placement, distinct, layout, table_options(config, distinct, admitted))
    for host, (ranks, memory) in hosts.items():
        need = sum(predicted[r] for r in ranks)
        if need + RANK_BASE_BYTES * len(ranks) > memory:
            ids = sum(int(d) for d in distinct)
            raise ConfigError(
                f"the tables of rank(s) {','.join(map(str, ranks))} on host {host} are predicted at "
                f"{need / 2**30:.1f} GiB ({sum(predicted) / max(ids, 1):.0f} B per id of the data's {ids:,} distinct ids; "
                f"+ {RANK_BASE_BYTES / 2**30:.1f} GiB a rank besides; "
                f"{layout.table_dtype} rows, optimizers {config.linear_optimizer_spec()} and "
                f"{config.embedding_optimizer_spec()}), more than its {memory / 2**30:.1f} GiB of memory: use "
                "--table-dtype bfloat16 with row-wise optimizers (docs/training.md) or more hosts")


def shared_table_numbers(config: TrainConfig, store: Any, cls: Any) -> TrainConfig:
    """``--shared-tables`` (``auto``: the data's schema's ``table`` declarations) -> field numbers
    (config.json says which); a strategy that moves rows by field refuses them."""
    from des.data.schema import Schema
    from des.placement import format_shared_tables, parse_shared_tables

    text = config.shared_tables
    if text == "auto":
        schema = Schema.from_dict(store.schema) if store.schema is not None else None
        names = schema.field_names if schema is not None else ()
        text = ",".join(f"{field}:{owner}" for owner, fields in (schema.shared_tables if schema else {}).items()
                        for field in fields if field in names and owner in names)
    shared = parse_shared_tables(text, store.field_names)
    if shared and not getattr(cls, "shares_tables", False):
        raise ConfigError(f"--strategy {cls.name} keeps one table per field, and fields share tables "
                          f"({format_shared_tables(shared)}): use --strategy des, or --shared-tables none")
    return dataclasses.replace(config, shared_tables=format_shared_tables(shared))


def split_field_numbers(config: TrainConfig, store: Any) -> TrainConfig:
    """``--split-fields`` given by names -> field numbers (config.json says which)."""
    if config.split_fields in ("auto", "all"):
        return config
    numbers = parse_split_fields(config.split_fields, store.field_names)
    return dataclasses.replace(config, split_fields=",".join(map(str, numbers)))


def count_steps(config: TrainConfig, train_rows: int, data_name: str) -> tuple[int, int]:
    """Steps per epoch and in the whole run (``--epochs``, at most ``--max-steps``)."""
    batch = config.batch_size
    steps_per_epoch = train_rows // batch if config.drop_last else -(-train_rows // batch)
    if steps_per_epoch == 0:
        raise ConfigError(f"--batch-size {batch} is larger than the {train_rows} training rows of {data_name}")
    total_steps = config.epochs * steps_per_epoch if config.epochs else config.max_steps
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    return steps_per_epoch, total_steps


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


def batch_order(config: TrainConfig, store: Any) -> dict[str, Any]:
    """What fixes the order of the batches: a checkpoint's position only means the same batch in a
    run with the same data, batch size, seed and drop-last (and, with ``--train-data``, the same
    training and validation inputs)."""
    order = {"data_fingerprint": data_fingerprint(store), "batch_size": config.batch_size, "seed": config.seed,
             "drop_last": config.drop_last}
    if config.train_data:  # a resume with other training or validation files names them
        order["inputs"] = store.input_names()
    return order


def resume(config: TrainConfig, strategy: Any, store: Any, source: Any) -> dict[str, Any]:
    """Load ``--resume``'s checkpoint into ``strategy`` (collective) and continue the source at its
    position; returns its manifest."""
    from des.checkpoint import check_schema, load_checkpoint, read_manifest

    check_schema(read_manifest(config.resume), store.schema)
    manifest = load_checkpoint(strategy, config.resume, data_order=source.data_order)
    source.resume(config.resume, manifest, strategy.step_count)
    return manifest


def field_work_of(config: TrainConfig, store: Any, ranks: int) -> list[float] | None:
    """Each field's work per step for the ``balanced`` placement of several ranks
    (``des.placement.field_work``), counted on the first batch of the training order: the same
    batch, so the same placement, on every rank. None where nothing uses it."""
    if ranks == 1 or config.placement != "balanced":
        return None
    from des.data import BatchReader
    from des.placement import field_work

    reader = BatchReader(store, "train", batch_size=config.batch_size, seed=config.seed, epoch=0, drop_last=False)
    return field_work(reader.batch(0), store.num_fields) if len(reader) else None


def resolve_plan(config: TrainConfig, cls: Any, store: Any, placement: list[list[int]], model: Any,
                 id_bytes: int | None = None) -> tuple[TrainConfig, Any]:
    """``--plan auto`` -> the planner's cheapest plan for this data, batch size and placement
    (``des/planner.py``: distinct ids counted on the first 4 batches of the training order, the
    same on every rank), written into the config (``config.json`` says what ran), and
    ``--exchange-by auto`` -> the way of fewer bytes (``planner.exchange_way``). ``id_bytes``:
    what an exchanged id costs in bytes (:func:`plan_id_bytes`; None: ``planner.ID_BYTES``).
    Returns the config and the :class:`~des.planner.Planning` (None on one rank or for a strategy
    the planner does not model)."""
    ranks = len(placement)
    if cls.communication_plan is None or ranks == 1:
        if config.plan in ("auto", "measure"):  # one rank: nothing travels, every plan is the same step
            config = dataclasses.replace(config, plan="partials")
        if config.exchange_by == "auto":
            config = dataclasses.replace(config, exchange_by="ids")
        return config, None
    from des import planner

    unique = planner.estimate_unique_ids(store, config.batch_size, ranks, seed=config.seed, drop_last=config.drop_last)
    planning = planner.Planning(planner.model_shape(model), config.batch_size, placement, unique,
                                np.dtype(config.dtype).itemsize, planner.ID_BYTES if id_bytes is None else id_bytes,
                                config.exchange_by)
    config = dataclasses.replace(config, exchange_by=planning.exchange_by)
    if config.plan in ("auto", "measure") and getattr(cls, "fixed_plan", None) is None:
        best = "partials" if config.upper == "replicated" else planner.format_plan(planning.best.plan)
        config = dataclasses.replace(config, plan=best)
    return config, planning


def plan_id_bytes(comm: Communicator, threads: Any) -> int:
    """What the planner counts per exchanged id (``des.planner.id_bytes_for``): the value for
    ranks with cores of their own only where every rank of the job has them (collective: every
    rank takes the same plan)."""
    from des import planner

    own = planner.id_bytes_for(threads.intra_op, threads.local_ranks, threads.usable or threads.cores)
    return int(comm.allreduce_scalar(own, "plan_id_bytes", "min"))


def choose_plan(config: TrainConfig, cls: Any, store: Any, placement: list[list[int]], distinct: list[int],
                comm: Communicator, model: Any, total_steps: int, threads: Any
                ) -> tuple[TrainConfig, Any, plan_trials.Trials | None]:
    """``--plan`` resolved (:func:`resolve_plan`, with ``threads``' :func:`plan_id_bytes`), then,
    on a long run with ``auto`` or with ``measure``, the candidates timed on this machine
    (:func:`measure_plans`). Returns the config, the planning and the trials (None: not measured)."""
    measures = plan_trials.wanted(config, comm.size, total_steps) and not config.stream
    plans = cls.communication_plan is not None and len(placement) > 1
    id_bytes = plan_id_bytes(comm, threads) if plans else None
    config, planning = resolve_plan(config, cls, store, placement, model, id_bytes)
    if not measures or planning is None or getattr(cls, "fixed_plan", None) is not None \
            or config.upper == "replicated":
        return config, planning, None
    trials = measure_plans(config, cls, store, placement, distinct, comm, model)
    return dataclasses.replace(config, plan=trials.chosen), planning, trials


def measure_plans(config: TrainConfig, cls: Any, store: Any, placement: list[list[int]], distinct: list[int],
                  comm: Communicator, model: Any) -> plan_trials.Trials:
    """``--plan auto`` on a long run (or ``--plan measure``): the cost model's plan and the pure ones
    timed on this machine as throwaway strategies on the first training batches, the fastest
    chosen (``des/plan_trials.py``; cached per host)."""
    from des.data import BatchReader

    key = plan_trials.cache_key(config, comm.size, data_fingerprint(store), placement)

    def train_one(plan: str) -> float:
        def build() -> Any:  # tables grow from empty: the run's own are built after
            return build_strategy(dataclasses.replace(config, plan=plan), comm, store.num_fields, distinct, cls=cls,
                                  placement=placement, loads_tables=True, num_dense=store.num_dense, model=model)

        def batches(strategy: Any) -> Any:
            reader = BatchReader(store, "train", batch_size=config.batch_size, seed=config.seed, epoch=0,
                                 drop_last=True, **strategy.reader_options())
            return lambda i: reader.batch(i % max(len(reader), 1))

        return plan_trials.trial_step_seconds(build, batches, overlap=config.pipeline == "on")

    # the trials' traffic is not the run's: the summary's bytes per step count the run's steps only
    kept, comm.stats = comm.stats, type(comm.stats)(comm.stats.default_factory)
    try:
        return plan_trials.choose(config, comm, key, config.plan, train_one)
    finally:
        comm.stats = kept


def check_plan_switch(config: TrainConfig, cls: Any, planning: Any, model: Any) -> None:
    """``--plan-switch`` where a run has plans to switch between (a DES strategy the planner
    models, on several ranks, the data-parallel upper network, an epoch source), each plan valid
    for the model: checked in set-up, not at its step."""
    if not config.plan_switch:
        return
    from des import planner
    from des.plan_review import parse_switches

    why = ("--stream" if config.stream else "--upper replicated" if config.upper == "replicated" else
           f"--strategy {cls.name}" if cls.communication_plan is None or getattr(cls, "fixed_plan", None) is not None
           else "one rank" if planning is None else None)
    if why is not None:
        raise ConfigError(f"--plan-switch: with {why} a run has one plan (nothing to switch)")
    for switch in parse_switches(config.plan_switch):
        try:
            planner.parse_plan(switch.plan, planner.model_shape(model))
        except ValueError as exc:
            raise ConfigError(f"--plan-switch: {exc}") from None


def attach_review(run: Run, trials: plan_trials.Trials | None, rebuild: Any) -> None:
    """The run's plan review (``des/plan_review.py``): its ``--plan-switch``, or the review of the
    plan its trials chose; ``rebuild(plan)`` builds this rank's strategy with another plan."""
    from des.plan_review import Review

    config, strategy = run.config, run.strategy
    run.review = Review.of(config, trials, strategy.step_count, run.source.planned_steps(strategy.step_count) or 0)
    if run.review is not None:
        run.rebuild = rebuild


def communication_plan(config: TrainConfig, strategy: Any, planning: Any, trials: plan_trials.Trials | None
                       ) -> tuple[str | None, dict[str, Any] | None]:
    """The planner's view of this run (``des/planner.py``), for a strategy whose traffic it models,
    on several ranks (``planning``: :func:`resolve_plan`'s): the start-up table (per operator,
    predicted bytes/step/rank as partials and as an exchange, which is cheaper and why, and the
    measured times where plans were timed) and what ``summary.json`` records next to the measured
    bytes. ``(None, None)`` where there is no such view."""
    if strategy.communication_plan is None or planning is None:
        return None, None
    from des import planner

    held = getattr(strategy, "plan", None)  # a DES strategy's stages.Plan
    plan = dict(held.operators) if held is not None else strategy.communication_plan
    upper = held.upper if held is not None else "data-parallel"
    exchange_by = planning.exchange_by
    cost, best = planning.cost(plan, upper=upper), planning.best
    record = {"plan": cost.plan, "upper": upper, "exchange_by": exchange_by, "predicted_bytes_per_step": cost.mean,
              "predicted_sites": {site: float(np.mean(v)) for site, v in cost.sites().items()},
              "cheapest_plan": best.plan, "cheapest_bytes_per_step": best.mean, "batches_sampled": planning.unique.batches,
              "bytes_per_exchanged_id": planning.id_bytes}
    text = planning.report()
    text += (f"\n  this run: --plan {planner.format_plan(cost.plan)}"
             + (f" (upper {upper})" if upper != "data-parallel" else "")
             + (" --exchange-by rows" if exchange_by == "rows" else "")
             + f", predicted {cost.mean:,.0f} bytes/step/rank (summary.json: planner)")
    if trials is not None:  # the measured times next to the predicted bytes
        text, record = "\n".join([text, *trials.lines()]), {**record, "trials": trials.record()}
    return text, record


def plan_run_folder(config: TrainConfig, comm: Communicator) -> RunFolder:
    """The run folder, checked (writable, not in use, no other run in it) but not created yet: a
    run that fails during set-up (a bad checkpoint, say) leaves nothing behind. ``--export-dir``
    is checked alike."""
    if comm.rank == 0:
        folder = RunFolder.plan(config.output, model=config.model, resume=config.resume, overwrite=config.overwrite)
        if config.export_every or config.export_every_files:
            from des.export import check_export_dir

            exports = check_export_dir(config.export_dir)
            if folder.overwrite and exports.is_relative_to(folder.path):  # the job writes the new run elsewhere
                raise ConfigError(f"--export-dir {exports} is inside the run folder that --overwrite replaces; "
                                  "choose another")
        plan = folder.to_json()
    return RunFolder.from_json(comm.bcast_json(plan if comm.rank == 0 else None, "setup"))


def create_run_folder(folder: RunFolder, comm: Communicator) -> None:
    # Every rank first finishes its set-up (a rank that fails to load its fields aborts the job
    # here, before rank 0 has created anything). Rank 0 then holds the folder's lock until exit.
    comm.barrier("setup")
    if comm.rank == 0:
        folder.create()
    comm.barrier("setup")


def write_config_json(run: Run) -> None:
    """``config.json``: the effective config, the ranks, the placement, the model, the data and the
    versions (rank 0)."""
    strategy, store = run.strategy, run.store
    (run.folder / "config.json").write_text(json.dumps({
        "config": run.config.to_dict(), "ranks": run.comm.size, "placement": strategy.placement,
        "model": strategy.model.describe(), "data": run.config.stream or store.source,
        "data_fingerprint": data_fingerprint(store),
        "versions": versions(), "python": platform.python_version(),
    }, indent=1))
