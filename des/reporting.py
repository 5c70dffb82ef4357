"""What a run tells: the start-up report, the progress bar and the line of each validation,
``summary.json`` and its closing lines (``docs/design.md``, "The runner").

Everything here is said by the first evaluating rank (``Run.talks``); :func:`summarize` alone is
collective.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import textwrap
from typing import Any

import numpy as np

from des.collectives import describe_processes
from des.config import TrainConfig
from des.tensorboard import summary_scalars


# ---------------------------------------------------------------------------------------------- start-up
def startup_report(run: Any, *, train_rows: int, validation_rows: int, distinct: list[int], hosts: str, threads: Any,
                   pipeline_auto: bool, plan_text: str | None, manifest: dict[str, Any] | None,
                   work: list[float] | None = None, tables: Any = None) -> list[str]:
    """The lines a run starts with: what trains on what, where the ranks run, the resolved options,
    the placement with its table memory, the run folder. ``tables``: the tables' options sized from
    the data, which the memory is predicted with (default the strategy's own; a resumed run's tables
    are not sized at start, they grow to the data's keys as they train)."""
    config, strategy, store = run.config, run.strategy, run.store
    data, steps = run.source.describe(train_rows, validation_rows)
    lines = [
        f"des.train: {strategy.model.name} with strategy {strategy.name} on {data}, {run.comm.size} rank(s), batch "
        f"{config.batch_size}, {steps}, dtype {config.dtype}",
        hosts,
        threads.describe(),
        f"  pipeline {config.pipeline}" + (f" (auto: {threads.intra_op} thread(s) per rank)" if pipeline_auto else ""),
        f"  strategy {strategy.name}: {strategy.describe()}",
    ]
    if plan_text is not None:
        lines.append(textwrap.indent(plan_text, "  "))
    lines += [
        f"  optimizers: linear {config.linear_optimizer_spec()}; embedding {config.embedding_optimizer_spec()}; "
        f"dense {config.dense_optimizer}",
        f"  admission: --min-count {config.min_count_value()} --unadmitted {config.unadmitted_mode()}; "
        f"l2 on looked-up rows {config.l2_embedding_value():g}",
        describe_config(config),
    ]
    if manifest is not None:
        where = f"file {manifest['stream']['name']}" if manifest.get("stream") else f"epoch {manifest['epoch']}"
        lines.append(f"  resumed from {config.resume} at step {strategy.step_count} ({where}, batch "
                     f"{manifest['next_batch']}), written by {manifest['ranks']} rank(s)")
    lines.append(describe_placement(strategy.placement, distinct, store.field_names, _empty_table(strategy),
                                    tables or strategy.context.tables, work))
    if store.num_dense:
        lines.append(f"  dense features: {store.num_dense} ({', '.join(store.dense_names)}), read by every rank for "
                     "its rows; their weights replicated with the top network")
    lines.append(f"  run folder: {run.run_folder.path}"
                 + (" (replaced when this run finishes)" if run.run_folder.overwrite else ""))
    if describe_processes():  # which pid is which rank, for the launcher's "PID ... killed"
        lines.append(describe_processes())
    return lines


def describe_config(config: TrainConfig) -> str:
    """The effective config, every option, wrapped (also saved in ``config.json``)."""
    items = " ".join(f"{k}={v}" for k, v in config.to_dict().items())
    return textwrap.fill(items, width=110, initial_indent="  config: ", subsequent_indent="          ",
                         break_long_words=False, break_on_hyphens=False)


def describe_placement(placement: list[list[int]], distinct: list[int], names, layout=None, tables=None,
                       work: list[float] | None = None) -> str:
    """Fields (a share of a split field as ``name/G``), distinct ids and (given one of the tables, and
    the tables' options) predicted table memory of every rank, and the largest rank's over the mean;
    given each field's work per step (``des.placement.field_work``), each rank's share of it."""
    from des.placement import predicted_table_bytes, split_groups

    groups = {f: len(ranks) for f, ranks in split_groups(placement).items()}
    lines = []
    predicted = [] if layout is None else predicted_table_bytes(placement, distinct, layout, tables)
    loads = [sum(work[f] / groups.get(f, 1) for f in fields) for fields in placement] if work else []
    for r, fields in enumerate(placement):
        ids = sum(-(-distinct[f] // groups.get(f, 1)) for f in fields)
        memory = "" if layout is None else f", tables ~{predicted[r] / 2**20:7.1f} MiB"
        share = f", {loads[r] / sum(loads):5.1%} of the work" if loads else ""
        held = ",".join(names[f] + (f"/{groups[f]}" if f in groups else "") for f in fields)
        lines.append(f"  rank {r}: {len(fields):2d} fields, {ids:9d} distinct ids{memory}{share}  {held}")
    if len(predicted) > 1 and sum(predicted):
        lines.append(f"  table memory: largest rank {max(predicted) / (sum(predicted) / len(predicted)):.2f}x the mean"
                     + (f"; work per step (ids, distinct ids, rows of a batch): largest rank "
                        f"{max(loads) / (sum(loads) / len(loads)):.2f}x the mean" if loads else "")
                     + (f"; {len(groups)} field(s) split by key over the ranks" if groups else ""))
    return "\n".join(lines)


def _empty_table(strategy):
    """An empty table of the model's row layout (every field's table has the same): it sizes them all."""
    import dataclasses

    from des.strategies.components import FieldShard

    tables = strategy.context.tables
    tables = tables and dataclasses.replace(tables, shared=())  # one field alone: its own table
    return FieldShard([0], strategy.model.blocks(), strategy.context.optimizers, seed=0, dtype=strategy.dtype,
                      tables=tables).tables[0]


def versions() -> dict[str, str]:
    """The versions ``config.json`` records."""
    import mpi4py
    import numba
    import numpy
    import tensorflow

    return {"numpy": numpy.__version__, "numba": numba.__version__, "tensorflow": tensorflow.__version__,
            "mpi4py": mpi4py.__version__}


# ---------------------------------------------------------------------------------------------- progress
def progress_bar(enabled: bool, total: int, initial: int):
    """A tqdm bar on stderr, or None: disabled, or nobody sees a terminal."""
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


def format_record(record: dict[str, Any]) -> str:
    """A validation's line: the step, the mean training loss since the last one, the validation
    metrics (when there are validation rows) and the throughput."""
    text = f"step {record['step']:6d}  train loss {record['train_loss']:.4f}"
    if "auc" in record:
        auc = "n/a" if record["auc"] is None else f"{record['auc']:.4f}"
        text += f"  val auc {auc}  val logloss {record['logloss']:.4f}"
    return text + f"  {record['samples_per_second']:,.0f} samples/s"


def format_progressive(record: dict[str, Any]) -> str:
    """A progressive validation's line: the rows about to be trained on, by the model before them."""
    auc = "n/a" if record["progressive_auc"] is None else f"{record['progressive_auc']:.4f}"
    rows = f"{record['rows']} rows" + (f" from batch {record['batch']}" if "batch" in record else "")
    return (f"step {record['step']:6d}  file {record['file']} ({rows}): progressive auc {auc}  "
            f"logloss {record['progressive_logloss']:.4f}")


def progressive_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's progressive validations for ``summary.json``, and their means weighted by rows
    over the files after the first (the first is tested by a model that has seen nothing)."""
    if not records:
        return {}
    later = [r for r in records if r["index"] > 0 and r["progressive_auc"] is not None]
    rows = sum(r["rows"] for r in later)
    mean = (lambda key: sum(r[key] * r["rows"] for r in later) / rows) if rows else (lambda key: None)
    return {"progressive": records, "progressive_auc_mean": mean("progressive_auc"),
            "progressive_logloss_mean": mean("progressive_logloss")}


# ---------------------------------------------------------------------------------------------- the summary
def summarize(run: Any, results: dict[str, Any]) -> dict[str, Any]:
    """``summary.json`` (collective: :func:`summary_record`), its TensorBoard scalars, then the run
    folder finished (an ``--overwrite`` run replaces the old one) and the closing lines said."""
    comm = run.comm
    summary = summary_record(run, results)
    if comm.rank == 0:
        (run.folder / "summary.json").write_text(json.dumps(summary, indent=1))
    run.tensorboard.scalars(summary["steps"], summary_scalars(summary))
    run.tensorboard.close()
    comm.barrier("summary")
    if comm.rank == 0:  # after success: an --overwrite run replaces the old one; the lock is released
        run.run_folder.finish()
    run.say(format_summary(summary))
    return summary


def summary_record(run: Any, results: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``summary.json`` (collective): throughput over the ranks that count samples,
    bytes per step per traffic site (mean over ranks), phases of the first training rank, memory
    per rank."""
    from des.data.schema import describe_schema

    strategy, comm, meter = run.strategy, run.comm, run.meter
    counts = comm.allgather(np.array([meter.timed_samples, meter.seconds, meter.samples, meter.steps,
                                      float(strategy.counts_samples)]), "summary")
    counting = counts[counts[:, 4] > 0]
    steps_this_run = int(counting[:, 3].sum())
    sent_per_step = comm.allgather(bytes_sent(strategy, comm), "summary") / max(steps_this_run, 1)  # [rank, site]
    per_site = dict(zip(strategy.traffic_sites, sent_per_step.mean(axis=0)))
    memory = strategy.memory()
    per_rank = comm.allgather(np.array([peak_rss_bytes(), memory["rows"], memory["table_bytes"]], np.int64), "summary")
    validation, test = results.get("validation"), results.get("test")
    return {
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
        "planner": run.planner if run.review is None else {**(run.planner or {}), "review": _review_record(run, comm)},
        "buffer_floats_per_sample": getattr(strategy, "buffer_width", None),
        "ms_per_phase": comm.bcast_json(strategy.timer.ms_per_step(), "summary", root=strategy.evaluators[0]),
        "ms_per_phase_by_rank": phases_by_rank(strategy, comm),
        # the last steps' collectives: each rank's median ms a call waiting for the last rank to enter it
        "ms_waiting_by_rank": comm.waiting_ms(list(strategy.traffic_sites)),
        "overlapped_steps": strategy.overlapped_steps,  # --pipeline: steps that looked up the next batch meanwhile
        "peak_rss_bytes_per_rank": per_rank[:, 0].tolist(),
        "table_rows_per_rank": per_rank[:, 1].tolist(),
        "table_bytes_per_rank": per_rank[:, 2].tolist(),
        "evicted_rows": run.evicted,  # this run's, by field (--ttl, --max-rows-per-field)
        **strategy.summary(),
        "checkpoint": str(run.run_folder.public(results["checkpoint"])) if results.get("checkpoint") else None,
        "best_step": run.training.best_step if run.config.early_stop else None,
        "stopped_early": run.training.stopped,
        "run_folder": str(run.run_folder.path),
        **progressive_summary(run.training.progressive),
        "exports": run.exports,
    }


def phases_by_rank(strategy, comm) -> dict[str, list[float]]:
    """Every rank's ms per step of each phase any rank timed (collective): a rank that waits in a
    collective for a slower one shows it in that collective's phase, so the ranks side by side say
    where a step's time is imbalance."""
    names = list(strategy.phases)
    mine = strategy.timer.ms_per_step()
    table = comm.allgather(np.array([mine.get(name, 0.0) for name in names], dtype=np.float64), "summary")
    return {name: [round(float(v), 3) for v in table[:, i]] for i, name in enumerate(names) if table[:, i].any()}


def _review_record(run: Any, comm: Any) -> dict[str, Any]:
    """``planner.review`` of ``summary.json``: the review's record and, for each plan the run ran
    (in order, a plan's steps without a switch in them), its global steps and the bytes a rank sent
    per step of them (mean over the ranks), as ``bytes_per_step`` gives them for the whole run
    (collective: every rank switched at the same steps)."""
    review = run.review
    segments = review.segments(run.start_step, run.strategy.step_count,
                               float(bytes_sent(run.strategy, comm).sum()))
    sent = comm.allgather(np.array([s[3] for s in segments], dtype=np.float64), "summary").mean(axis=0)
    by_plan = [{"plan": plan, "steps": [lo, hi], "bytes_per_step": float(total / (hi - lo))}
               for (plan, lo, hi, _), total in zip(segments, sent) if hi > lo]
    return {**review.record(), "bytes_per_step_by_plan": by_plan}


def bytes_sent(strategy, comm) -> np.ndarray:
    """Bytes this rank sent per traffic site: a site's own calls and the element counts an
    Alltoallv sends first (the communicator's ``site:counts``)."""
    stats = comm.stats_dict()
    return np.array([sum(stats.get(name, {}).get("bytes_sent", 0) for name in (site, site + ":counts"))
                     for site in strategy.traffic_sites], dtype=np.float64)


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def format_summary(s: dict[str, Any]) -> str:
    """The closing lines: test metrics, throughput, traffic, memory, phases, where the summary is."""
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
    if "progressive" in s:
        text += (f"\n  progressive validation: {len(s['progressive'])} record(s), mean AUC "
                 f"{num(s['progressive_auc_mean'], '.4f')} over the files after the first")
    if "staleness_mean" in s:
        text += f"\n  staleness of dense pushes: mean {s['staleness_mean']:.2f}, max {s['staleness_max']}"
    return text
