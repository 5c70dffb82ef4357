""".venv/bin/python scripts/bench_scaling.py [--quick] [--model deepfm] [--ranks 1,2,4,8] [--threads 1] [--strategies des,alltoall] [--plans auto] [--plan-ranks 8] [--data criteo,multihot,synth] [--strong-data ...] [--weak-data ...] [--scaling strong,weak] [--batch-size 4096,32768] [--rows-per-rank 4096] [--warmup 3] [--steps 10] [--rounds 1] [--pin-one-rank] [--time-limit 0] [--out DIR]

How training throughput scales with the number of ranks N at a fixed number of threads per rank:
samples/s, speed-up over N = 1 of the same strategy and efficiency (speed-up / N) for every data
set (``--data``) and kind of scaling (``--scaling``), against the dense roofline run as N copies at
once, with the phases of a step at the largest N.

* **Ranks and threads**: N from ``--ranks``; every rank gets ``--threads T`` TF intra-op and numba
  threads (des.train ``--threads``), so a job uses N x T cores (more than the machine has: ranks
  share cores, and the table says so).
* **Scaling**: ``strong`` = the global batch fixed at each of ``--batch-size`` (every N trains the
  same batch, B/N rows per rank in the upper network); ``weak`` = ``--rows-per-rank`` rows per rank,
  a global batch of that times N. A batch larger than a data set's training split is skipped with
  the reason printed and noted (the Criteo sample has 29,566 training rows of 32,852: no global
  batch of 32,768 fits even with every row in training; ``synth`` and ``multihot`` are there for
  such batches).
* **Strategies** (``--strategies``): ``des`` (the default command), ``alltoall``, ``persia``
  (``--staleness 1``), ``hierarchical`` (``--group-size 2``; N = 1: one group of one rank, des's
  step; odd N > 1 skipped), or any name of ``benchlib.STRATEGY_FLAGS``. ``--plans auto,partials,
  exchange`` measures des under every plan (at the N of ``--plan-ranks``, default all), so the
  planner's choice (``auto``; the table's "plan" column is what it chose, from summary.json) can be
  compared with the fastest plan; des with ``exchange`` is alltoall's step (``AllToAll`` is DES
  with the exchange plan fixed), so where alltoall is measured it is not measured twice.
* **Data** (``--data``): ``criteo`` = the shipped sample; ``multihot`` = bench_throughput's
  multi-hot store (40,000 rows, every categorical field 0-50 ids, vocabularies x20); ``synth`` =
  ``--synth-rows`` (default 600,000) Criteo-shaped synthetic rows (``des.data.synth``'s default
  configuration, bench_synthetic's store), enough that the timed steps of a weak-scaling job at
  N = 8 do not repeat rows (the Criteo sample's and multihot's jobs wrap their epochs: rows
  repeat). Generated into ``--cache`` on first use. ``--strong-data`` and ``--weak-data`` give each
  kind of scaling its own data sets (default: ``--data``).
* **One rank's cores** (``--pin-one-rank``): the N = 1 jobs run on ``--threads`` cores
  (``taskset``, else ``--pin-cores on``): without it one rank's background threads (the next
  batch's lookup, the tables' pools) use the machine's idle cores, which no rank of a full machine
  has. The rounds take different cores, spread over the machine (``one_rank_cores``), so that no
  one pair of cores sets the base.
* **A fresh machine** (``--first-use``; default on, off with ``--quick``): before the first round
  the N = 1 launch runs once, untimed. The first job on a freshly started host (a virtual
  machine) writes into memory no job has used before and runs slower: on the 16-core Xeon the
  multi-hot one-rank job ran at 0.58-0.67x the same job's later runs, its lookup (the tables'
  inserts) 2.5x as long (docs/benchmarks.md, "The first job on a fresh host"). Round 1's N = 1
  launch would otherwise pay it and lower the base of every ratio.
* **Timing**: each job runs ``--warmup`` + ``--steps`` steps and reports des.train's own samples/s
  of the steps after the warm-up ones (``benchlib.Bench.steady``). The jobs of one N run in one
  ``mpiexec`` launch per round (``Bench.steady_many``: TensorFlow's start-up is paid once; each run
  builds its own tables, tf.functions and communicator). ``--rounds R`` repeats every job, round-
  robin over N (N = 1 and the largest N first, then the others); a row gives the median samples/s
  (of an even count, the mean of the middle two), the median job's plan and phases, and the
  min-max over the rounds. Take an odd number of rounds. ``--time-limit S`` (seconds for the
  whole run, results written included) leaves out each launch that the previous round's same
  launch says would end too late, and stops a running one in time (its finished runs count): rows
  then have fewer rounds (the table says how many, the notes which launches were left out).
* **Roofline** (``--roofline``, default on for W&D, DeepFM, DCN-v2 and DLRM): bench_throughput's
  dense roofline (the model as a plain TF program on dense inputs, forward, backward and Adam) at
  ``--threads`` per process: one copy alone at every per-rank batch, then N copies at once at the
  per-rank batch of N (weak: ``--rows-per-rank``, strong: B/N), their samples/s summed: the
  throughput N data-parallel copies of the dense part reach on this machine, contention included.
* **Copies** (``--copies``, default on): the machine's ceiling for N ranks. des's one-rank job at a
  panel's per-rank batch of N (weak: ``--rows-per-rank``, run alone first; strong: B/N) runs as N
  copies at once for each N > 1, each copy on ``--threads`` cores of its own (``taskset``, where the
  machine has N x T cores), ``--copies-steps`` timed steps so that the copies' timed windows
  overlap; their samples/s summed is what N ranks would reach with nothing to communicate and no
  work to share, and a rank's share of the machine's caches, memory and clocks as it is under load.
  Rows give des's samples/s over it.

Outputs: a table per data set and scaling kind (N, global batch, strategy, the plan des chose,
samples/s median and min-max, rounds, speed-up, efficiency, vs the planner's choice, ms/step, the
roofline of N copies and the fraction of it reached), the roofline table, the ms per step per
phase at the largest N, ``results.json`` / ``results.csv`` and ``table.md`` (benchlib's entry for
``docs/benchmarks.md``), and ``figure.png`` (samples/s vs N, one panel per table, with the ideal
line N x des at N = 1 and the roofline) where matplotlib imports (checked before measuring; else a
note). ``--out DIR`` puts every output in DIR itself (the jobs' run folders go to a temporary
folder): on a machine whose results come back as a few files, give it that folder. Without a venv
(``.venv/bin/mpiexec`` missing) the jobs run under ``mpiexec`` from PATH with this interpreter.

Expect (a 2-core machine): nothing about scaling beyond N = 2 (N = 2 with one thread each already
takes both cores; N = 4 time-shares them), efficiencies well under 1 and the roofline of 2 copies
below twice one copy's; on Criteo des = alltoall (the planner exchanges every operator), on
multi-hot data des ahead of alltoall. A 16-core machine with ``--threads 2`` is where N = 1-8 means
something; the recorded runs are in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_synthetic
import bench_throughput as throughput
import benchlib

#: seconds kept for writing the results when ``--time-limit`` stops the rounds
RESERVE_SECONDS = 15.0
#: --strategies names that stand for a benchlib.STRATEGY_FLAGS name (hierarchical: see strategy_at)
PLAIN_NAMES = {"persia": "persia-1"}


def strategy_at(name: str, ranks: int) -> tuple[dict[str, str] | None, str]:
    """des.train flags of ``--strategies`` name at ``ranks`` ranks, or None and why it is not run."""
    if name == "hierarchical":
        if ranks == 1:
            return benchlib.strategy_flags("hierarchical-g1"), ""
        if ranks % 2:
            return None, f"hierarchical at N={ranks}: --group-size 2 does not divide {ranks} ranks"
        return benchlib.strategy_flags("hierarchical-g2"), ""
    return benchlib.strategy_flags(PLAIN_NAMES.get(name, name)), ""


@dataclass(frozen=True)
class Panel:
    """One table: a data set and a kind of scaling at one batch (strong: global; weak: per rank)."""

    data: str
    scaling: str
    batch: int

    def global_batch(self, ranks: int) -> int:
        return self.batch if self.scaling == "strong" else self.batch * ranks

    def per_rank(self, ranks: int) -> int:
        """Rows per rank in the upper network (the roofline copies' batch)."""
        return self.global_batch(ranks) // ranks

    @property
    def title(self) -> str:
        return (f"{self.data}, strong scaling, global batch {self.batch}" if self.scaling == "strong"
                else f"{self.data}, weak scaling, {self.batch} rows per rank")


@dataclass(frozen=True)
class Job:
    """One measured configuration (the same for every panel that needs it)."""

    data: str
    ranks: int
    batch: int
    strategy: str  # the label of the job: a --strategies name, or des-<plan>

    @property
    def tag(self) -> str:
        return f"{self.data}-{self.strategy}-n{self.ranks}-b{self.batch}"


def labels(strategies: Sequence[str], plans: Sequence[str]) -> list[str]:
    """Row labels: each strategy, des once per plan (``des`` = ``--plan auto``, else ``des-<plan>``)."""
    out = []
    for name in strategies:
        if name == "des":
            out += ["des" if plan == "auto" else f"des-{plan}" for plan in plans]
        else:
            out.append(name)
    return out


def job_flags(label: str, ranks: int) -> tuple[dict[str, str] | None, str]:
    """:func:`strategy_at` of a row label: ``des-<plan>`` is des with ``--plan <plan>``."""
    if label.startswith("des-") and label not in benchlib.STRATEGY_FLAGS:
        return {**benchlib.strategy_flags("des"), "plan": label[len("des-"):]}, ""
    return strategy_at(label, ranks)


def fixed_plan(label: str) -> bool:
    """A des row with a plan fixed by hand (``des-partials``), measured only at ``--plan-ranks``;
    ``des`` (auto) and ``des-measure`` (the plans timed on the machine) run at every N."""
    return label.startswith("des-") and label != "des-measure"


def job_label(label: str, measured: Sequence[str]) -> str:
    """The job that measures ``label``: des with the exchange plan is alltoall's step."""
    return "alltoall" if label == "des-exchange" and "alltoall" in measured else label


def one_rank_cores(threads: int, rounds: int, cores: int | None = None) -> Callable[[int], str] | None:
    """``--pin-one-rank``'s cores for round ``r``'s N = 1 launch (``taskset -c``): ``threads``
    consecutive cores, the rounds spread over the machine (round ``r`` on the ``r·G//rounds``-th of
    its ``G`` groups of ``threads`` cores), not always its first cores: one host ran the same
    one-rank job 1.18-1.26x as fast on cores 8,9 or 14,15 as on cores 0,1 in later calls
    (docs/benchmarks.md, "Embedding size 8 and 32"; others did not, and a fresh host's first job
    is slower wherever it runs: ``--first-use``). None where ``taskset`` is missing or the machine
    has fewer than ``threads`` cores (then des.train ``--pin-cores on``)."""
    if cores is None:
        cores = os.cpu_count() or 1
    groups = cores // max(threads, 1)
    if groups < 1 or shutil.which("taskset") is None:
        return None

    def of_round(round_: int) -> str:
        group = round_ * groups // max(rounds, 1) % groups
        return ",".join(str(c) for c in range(group * threads, (group + 1) * threads))

    return of_round


def plan_name(plan: Mapping[str, str] | None) -> str:
    """summary.json's ``plan`` (operator -> partials/exchange) in a few words."""
    if not plan:
        return "-"
    modes = set(plan.values())
    return modes.pop() if len(modes) == 1 else ", ".join(f"{op} {mode}" for op, mode in plan.items())


# ---------------------------------------------------------------------------------------- data
def prepare_data(bench: benchlib.Bench, names: Sequence[str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per data name: ``path`` (None: des.train's default, the shipped sample), ``train_rows`` and a
    ``note``; multihot and synth are generated on first use."""
    from des.data import open_dataset

    out = {}
    for name in names:
        if name == "synth":
            path = str(bench_synthetic.synthetic_store(bench, args.synth_rows, 0, 1.0, 1.0, Path(args.cache)))
        else:
            path = benchlib.dataset(bench, name, args.cache)
        store = open_dataset(path or benchlib.SAMPLE)  # the sample: prepared into des's cache, as a job would
        train = len(store.split_rows("train"))
        what = {"criteo": "the shipped Criteo sample (one id per field)",
                "multihot": "bench_throughput's multi-hot store ({rows:,} rows of des.data.synth, every categorical "
                            "field 0-{max_hot} ids, vocabularies x{vocab_scale:g})".format(**benchlib.MULTIHOT),
                "synth": f"{args.synth_rows:,} Criteo-shaped synthetic rows (des.data.synth's default configuration, "
                         "seed 0: Criteo's 39 fields and vocabularies, Zipf ids)"}.get(name, path)
        out[name] = {"path": path, "train_rows": train, "rows": store.num_rows,
                     "note": f"{name} = {what}: {store.num_rows:,} rows, {train:,} in the training split"}
        bench.log(out[name]["note"])
    return out


# ---------------------------------------------------------------------------------------- roofline
def roofline(bench: benchlib.Bench, args: argparse.Namespace, ranks: Sequence[int], panels: Sequence[Panel],
             deadline: float) -> list[dict[str, Any]]:
    """The dense roofline at ``--threads``: one copy alone at every per-rank batch, then for each
    N > 1 N copies at once at the per-rank batches of N; a row per (copies, batch)."""
    per_n = {n: sorted({p.per_rank(n) for p in panels}) for n in ranks}
    alone_batches = sorted({b for bs in per_n.values() for b in bs})
    launches = [(1, alone_batches)] + [(n, per_n[n]) for n in ranks if n > 1]
    rows: list[dict[str, Any]] = []
    alone: dict[int, float] = {}
    for copies, batches in launches:
        label = f"roofline, {copies} cop{'y' if copies == 1 else 'ies'} at once"
        remaining = deadline - bench.elapsed()
        if remaining <= 0:
            bench.failures.append(f"{label}: not run (--time-limit)")
            break
        cmd = throughput.roofline_command(args.threads, batches, args.roofline_repeats, [args.model])
        try:
            outs = bench.run_together([cmd] * copies, label=label, timeout=min(bench.timeout, remaining))
            results = [throughput.roofline_result(out) for out in outs]
        except (benchlib.BenchError, ValueError) as exc:
            failure = str(exc) if isinstance(exc, benchlib.BenchError) else f"{label}: {exc}"
            bench.failures.append(failure)
            bench.log(f"FAILED {failure}")
            continue
        for b in batches:
            each = [b / r[str(b)][args.model]["plain"] for r in results]
            if copies == 1:
                alone[b] = each[0]
            row = {"kind": "roofline", "copies": copies, "threads": args.threads, "per_copy_batch": b,
                   "samples_per_second": sum(each), "per_copy": sum(each) / copies,
                   "per_copy_samples_per_second": [round(x) for x in each]}
            if b in alone:
                row["vs_copies_alone"] = row["samples_per_second"] / (copies * alone[b])
            rows.append(row)
            bench.log(f"  {label}, per-copy batch {b}: {row['samples_per_second']:,.0f} samples/s in all")
    return rows


def roofline_of(roof: Sequence[Mapping[str, Any]], copies: int, batch: int) -> float | None:
    return next((r["samples_per_second"] for r in roof if (r["copies"], r["per_copy_batch"]) == (copies, batch)), None)


# ---------------------------------------------------------------------------------------- copies
def copies(bench: benchlib.Bench, args: argparse.Namespace, ranks: Sequence[int], panels: Sequence[Panel],
           data: Mapping[str, Mapping[str, Any]], deadline: float) -> list[dict[str, Any]]:
    """Per panel, des's one-rank job at the panel's per-rank batch of N as N copies at once, for
    each N > 1 (each copy pinned to ``--threads`` cores of its own where there are enough and
    ``taskset`` exists); for a weak panel its one-rank job alone first. A row per (data, per-copy
    batch, copies) with the copies' samples/s summed: a strong panel's N copies at ``B/N`` each are
    a weak panel's at ``B/N`` rows per rank, measured once."""
    cores, threads = os.cpu_count() or 1, args.threads
    rows: list[dict[str, Any]] = []
    for panel in sorted(panels, key=lambda p: p.scaling == "strong"):  # weak first: its N = 1 alone
        alone = None
        for n in [*([1] if panel.scaling == "weak" else []), *(n for n in ranks if n > 1)]:
            batch = panel.per_rank(n)
            if panel.global_batch(n) > data[panel.data]["train_rows"] or copies_of(rows, panel.data, batch, n) is not None:
                continue  # no des job to compare with (skipped), or measured for another panel
            label = f"{panel.data}: des N=1 at batch {batch}, {n} cop{'y' if n == 1 else 'ies'} at once"
            remaining = deadline - bench.elapsed()
            if remaining <= 0:
                bench.failures.append(f"{label}: not run (--time-limit)")
                return rows
            flags = benchlib.steady_flags(1, args.warmup, args.copies_steps, {
                "model": args.model, "batch_size": batch, "threads": threads, "xla": args.xla,
                **benchlib.strategy_flags("des"), **({"data": data[panel.data]["path"]} if data[panel.data]["path"] else {})})
            pinned = n * threads <= cores and shutil.which("taskset") is not None
            outputs = [bench.jobs / f"copies-{panel.data}-b{batch}-n{n}-c{i}" for i in range(n)]
            cmds = [(["taskset", "-c", f"{i * threads}-{(i + 1) * threads - 1}"] if pinned else [])
                    + [str(benchlib.MPIEXEC), "-n", "1", str(benchlib.PYTHON), benchlib.__file__,
                       "--restart-timers-after", str(args.warmup), *benchlib.train_flags(out, flags)]
                    for i, out in enumerate(outputs)]
            try:
                bench.run_together(cmds, label=label, timeout=min(bench.timeout, remaining))
                each = [float(json.loads((out / "summary.json").read_text())["samples_per_second"]) for out in outputs]
            except (benchlib.BenchError, OSError, ValueError) as exc:
                bench.failures.append(f"{label}: {exc}")
                bench.log(f"FAILED {label}: {exc}")
                continue
            finally:
                for out in outputs:
                    shutil.rmtree(out / "checkpoints", ignore_errors=True)
            alone = sum(each) if n == 1 else alone
            row = {"kind": "copies", "data": panel.data, "copies": n, "per_copy_batch": batch,
                   "pinned": pinned, "samples_per_second": sum(each), "per_copy": sum(each) / n,
                   "per_copy_samples_per_second": [round(x) for x in each]}
            if alone and panel.scaling == "weak":
                row["vs_copies_alone"] = row["samples_per_second"] / (n * alone)
            rows.append(row)
            bench.log(f"  {label}: {row['samples_per_second']:,.0f} samples/s in all")
    return rows


def copies_of(ceiling: Sequence[Mapping[str, Any]], data: str, batch: int, n: int) -> float | None:
    """The samples/s of ``n`` copies at once of des's one-rank job at ``batch`` each, if measured."""
    return next((r["samples_per_second"] for r in ceiling
                 if (r["data"], r["per_copy_batch"], r["copies"]) == (data, batch, n)), None)


# ---------------------------------------------------------------------------------------- rows
def scaling_rows(panel: Panel, ranks: Sequence[int], row_labels: Sequence[str], measured: Sequence[str],
                 runs: Mapping[Job, list[dict]], roof: Sequence[Mapping[str, Any]], model: str,
                 plan_ranks: Sequence[int], ceiling: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """A panel's rows: per N and label the median job (bench_throughput's row), the plan des
    chose, speed-up over N = 1 of the same label (des-<plan> without its own N = 1 row: over des
    at N = 1), efficiency, samples/s relative to the planner's choice at the same N, the
    roofline of N copies and des's one-rank job at the per-rank batch as N copies at once."""
    rows = []
    for n in ranks:
        for label in row_labels:
            job = Job(panel.data, n, panel.global_batch(n), job_label(label, measured))
            if job not in runs or (fixed_plan(label) and n not in plan_ranks):
                continue
            row = throughput.throughput_row(model, label, n, job.batch, runs[job])
            for key in ("peak_rss_mib_max", "peak_rss_mib_per_rank"):  # the launch's peak so far, not the run's
                row.pop(key, None)
            median = throughput.median_job(runs[job], lambda r: r["steady"]["samples_per_second"]) if runs[job] else {}
            row.update({"kind": "scaling", "data": panel.data, "scaling": panel.scaling, "panel": panel.title,
                        "per_rank_batch": panel.per_rank(n), "rounds": len(runs[job]), "job": job.tag,
                        "plan": plan_name(median.get("plan")), "roofline": roofline_of(roof, n, panel.per_rank(n)),
                        "copies": copies_of(ceiling, panel.data, panel.per_rank(n), n)})
            rows.append(row)
    for row in rows:
        same = {r["strategy"]: r for r in rows if r["ranks"] == row["ranks"]}
        base = next((r for r in rows if r["ranks"] == 1 and r["strategy"] == row["strategy"]), None)
        if base is None and row["strategy"].startswith("des-"):
            base = next((r for r in rows if r["ranks"] == 1 and r["strategy"] == "des"), None)
            row["speedup_over"] = "des N=1"
        rate = row.get("samples_per_second")
        if rate and base and base.get("samples_per_second"):
            row["speedup"] = rate / base["samples_per_second"]
            row["efficiency"] = row["speedup"] / row["ranks"]
        if rate and row["strategy"].startswith("des-") and same.get("des", {}).get("samples_per_second"):
            row["vs_planner"] = rate / same["des"]["samples_per_second"]
        if rate and row["roofline"]:
            row["of_roofline"] = rate / row["roofline"]
        if rate and row["copies"]:
            row["of_copies"] = rate / row["copies"]
    return rows


def phase_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows at the largest measured N with their ms per step per phase as columns (a job once:
    des-exchange where it is alltoall's)."""
    done = [r for r in rows if r.get("ms_per_phase") and not (
        r["strategy"] == "des-exchange" and "-alltoall-" in r["job"])]
    if not done:
        return [], []
    top = max(r["ranks"] for r in done)
    out, phases = [], []
    for r in done:
        if r["ranks"] == top:
            phases += [p for p in r["ms_per_phase"] if p not in phases]
            out.append({"strategy": r["strategy"], "ranks": top, "batch": r["batch"], **r["ms_per_phase"],
                        "total": sum(r["ms_per_phase"].values())})
    return out, phases


# ---------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepfm")
    parser.add_argument("--ranks", default="1,2,4,8", help="rank counts N")
    parser.add_argument("--threads", type=int, default=1, help="TF and numba threads per rank (des.train --threads)")
    parser.add_argument("--xla", choices=("on", "off"), default="off",
                        help="des.train --xla of every job (des-bf16's: off, which --compute-dtype bfloat16 needs)")
    parser.add_argument("--strategies", default="des,alltoall",
                        help="des, alltoall, persia (--staleness 1), hierarchical (--group-size 2), or names of "
                             "benchlib.STRATEGY_FLAGS")
    parser.add_argument("--plans", default="auto", help="des's --plan values to measure, e.g. auto,partials,exchange")
    parser.add_argument("--plan-ranks", default="", help="the N at which des's plans other than auto and measure run (default: all)")
    parser.add_argument("--data", default="criteo,multihot,synth", help="criteo, multihot and/or synth")
    parser.add_argument("--strong-data", default="", help="the data of strong scaling (default: --data)")
    parser.add_argument("--weak-data", default="", help="the data of weak scaling (default: --data)")
    parser.add_argument("--synth-rows", type=int, default=600_000, help="rows of --data synth")
    parser.add_argument("--cache", default=benchlib.CACHE, help="where multihot and synth are generated")
    parser.add_argument("--scaling", default="strong,weak", help="strong and/or weak")
    parser.add_argument("--batch-size", default="4096,32768", help="strong scaling: global batch size(s)")
    parser.add_argument("--rows-per-rank", type=int, default=4096, help="weak scaling: global batch = this x N")
    parser.add_argument("--warmup", type=int, default=3, help="steps per job not timed")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per job")
    parser.add_argument("--rounds", type=int, default=1, help="every job this many times, round-robin over N")
    parser.add_argument("--time-limit", type=float, default=0,
                        help="seconds for the whole run (0: none): no launch is started that would end later")
    parser.add_argument("--roofline", action=argparse.BooleanOptionalAction, default=True,
                        help="the dense roofline alone and as N copies at once")
    parser.add_argument("--roofline-repeats", type=int, default=10, help="timed roofline calls per batch")
    parser.add_argument("--first-use", action=argparse.BooleanOptionalAction, default=None,
                        help="before the first round, the N = 1 launch once, untimed: a fresh machine's first job runs "
                             "slower (default: on, off with --quick)")
    parser.add_argument("--pin-one-rank", action="store_true",
                        help="N = 1 jobs with --pin-cores on: one rank on --threads cores, as each rank of N has")
    parser.add_argument("--copies", action=argparse.BooleanOptionalAction, default=True,
                        help="des's one-rank job at the per-rank batch as N copies at once, each on cores of its own "
                             "(the ceiling)")
    parser.add_argument("--copies-steps", type=int, default=50, help="timed steps of each copy (their windows overlap)")
    benchlib.add_common_arguments(parser, out_is_run_folder=True)
    args = parser.parse_args(argv)
    if args.first_use is None:
        args.first_use = not args.quick
    if args.quick:
        args.ranks, args.warmup, args.steps, args.roofline_repeats, args.copies_steps = "1,2", 2, 3, 3, 6
        args.batch_size, args.rows_per_rank, args.synth_rows = "1024", 512, min(args.synth_rows, 60_000)
    ranks = benchlib.positive_ints(args.ranks, "ranks")
    batches = throughput.batch_sizes(args.batch_size)
    plan_ranks = benchlib.positive_ints(args.plan_ranks, "plan-ranks") if args.plan_ranks else ranks
    strategies, plans = args.strategies.split(","), args.plans.split(",")
    kinds = args.scaling.split(",")
    data_of = {kind: (getattr(args, f"{kind}_data", "") or args.data).split(",") for kind in kinds}
    data_names = list(dict.fromkeys(name for kind in kinds for name in data_of.get(kind, [])))
    for name in strategies:
        if name not in ("hierarchical", *PLAIN_NAMES):
            benchlib.strategy_flags(name)  # refuses an unknown name before anything runs
    if "des" not in strategies and plans != ["auto"]:
        raise SystemExit("--plans needs des in --strategies")
    bad = ([d for d in data_names if d not in ("criteo", "multihot", "synth")]
           + [k for k in kinds if k not in ("strong", "weak")] + [p for p in plans if p not in ("auto", "measure", "partials", "exchange")])
    if bad or min(args.threads, args.warmup + 1, args.steps, args.rounds, args.rows_per_rank) < 1:
        raise SystemExit(f"bad arguments: {', '.join(bad) or 'threads, steps, rounds and rows per rank must be >= 1'}")
    row_labels = labels(strategies, plans)
    measured = [job_label(label, strategies) for label in row_labels]

    bench = benchlib.Bench(__file__, args)
    deadline = args.time_limit - RESERVE_SECONDS if args.time_limit else math.inf
    data = prepare_data(bench, data_names, args)

    # the panels and their jobs (a job shared by panels is run once: e.g. weak N=1 = strong at that batch)
    panels = [Panel(d, "strong", b) for d in data_of.get("strong", []) for b in batches]
    panels += [Panel(d, "weak", args.rows_per_rank) for d in data_of.get("weak", [])]
    skipped: list[str] = []
    jobs: dict[int, list[Job]] = {n: [] for n in ranks}
    flags_of: dict[Job, dict[str, Any]] = {}
    base_cores = one_rank_cores(args.threads, args.rounds) if args.pin_one_rank else None
    base_rounds: list[str] = []  # the cores of each round's N = 1 launch
    for panel in panels:
        for n in ranks:
            batch, info = panel.global_batch(n), data[panel.data]
            if batch > info["train_rows"]:
                skipped.append(f"{panel.title}, N={n}: global batch {batch:,} > the {info['train_rows']:,} training "
                               f"rows of {panel.data}")
                continue
            for label, job_name in zip(row_labels, measured):
                if fixed_plan(label) and n not in plan_ranks:
                    continue
                job = Job(panel.data, n, batch, job_name)
                if job in flags_of:
                    continue
                strategy, why = job_flags(job_name, n)
                if strategy is None:
                    if why not in skipped:
                        skipped.append(why)
                    continue
                xla = "off" if strategy.get("compute_dtype") == "bfloat16" else args.xla  # des.train refuses both
                flags_of[job] = {"model": args.model, "batch_size": batch, "threads": args.threads, "xla": xla,
                                 **strategy, **({"data": info["path"]} if info["path"] else {}),
                                 **({"pin_cores": "on"} if n == 1 and args.pin_one_rank and not base_cores else {})}
                jobs[n].append(job)
    for reason in skipped:
        bench.log(f"skipped: {reason}")
    bench.log(f"{sum(map(len, jobs.values()))} jobs per round, one launch per N: "
              + ", ".join(f"N={n}: {len(jobs[n])}" for n in ranks) + f"; {args.rounds} round(s)")

    runs: dict[Job, list[dict]] = {job: [] for job in flags_of}
    launch_seconds: dict[int, float] = {}
    cut: list[str] = []  # the launches --time-limit left out
    roof: list[dict[str, Any]] = []
    ceiling: list[dict[str, Any]] = []
    order = sorted(ranks, key=lambda n: (n != 1, n != max(ranks), n))  # N=1 and the largest N first

    def pinned_to(n: int, round_: int) -> str | None:
        """The cores of round ``round_``'s launch of N = ``n`` (``--pin-one-rank``: N = 1 only)."""
        return base_cores(round_) if n == 1 and base_cores else None

    if args.first_use and jobs[order[0]]:  # untimed: the machine's first use of its memory (module docstring)
        pinned = pinned_to(order[0], 0)
        bench.log(f"first use: the N={order[0]} launch once, untimed")
        bench.steady_many(order[0], [(f"{job.tag}-first-use", flags_of[job]) for job in jobs[order[0]]], args.warmup,
                          args.steps, timeout=min(bench.timeout * len(jobs[order[0]]), max(deadline - bench.elapsed(), 1)),
                          prefix=("taskset", "-c", pinned) if pinned else ())
    for round_ in range(args.rounds):
        for n in order:
            remaining = deadline - bench.elapsed()
            if not jobs[n]:
                continue
            if remaining <= 0 or launch_seconds.get(n, 0.0) > remaining:  # its last launch says it would not fit
                cut.append(f"round {round_ + 1} N={n}")
                bench.log(f"--time-limit: round {round_ + 1}'s launch of N={n} left out ({bench.elapsed():.0f} s elapsed)")
                continue
            start = bench.elapsed()
            pinned = pinned_to(n, round_)
            found = bench.steady_many(n, [(f"{job.tag}-r{round_}", flags_of[job]) for job in jobs[n]], args.warmup,
                                      args.steps, timeout=min(bench.timeout * len(jobs[n]), remaining),
                                      prefix=("taskset", "-c", pinned) if pinned else ())
            if pinned:
                base_rounds.append(pinned)
            launch_seconds[n] = bench.elapsed() - start
            for job in jobs[n]:
                summary = found[f"{job.tag}-r{round_}"]
                if summary is not None:
                    runs[job].append(summary)
        if round_ == 0 and args.roofline and args.model in throughput.ROOFLINE_MODELS:
            roof = roofline(bench, args, ranks, panels, deadline)  # after the first round: the jobs come first
        if round_ == 0 and args.copies:
            ceiling = copies(bench, args, ranks, panels, data, deadline)
    stopped = f"--time-limit {args.time_limit:g} s left out the launches of {', '.join(cut)}" if cut else ""

    rows: list[dict[str, Any]] = []
    tables: list[tuple[str, list, list]] = []
    columns = [("ranks", "N", "d"), ("batch", "global batch", ",d"), ("strategy", "strategy", ""),
               ("plan", "plan", ""), ("samples_per_second", "samples/s", ",.0f"), ("spread", "min-max", ""),
               ("rounds", "rounds", "d"), ("speedup", "speed-up", ".2f"), ("efficiency", "efficiency", ".2f"),
               ("vs_planner", "vs des (auto) same N", ".2f"), ("ms_per_step", "ms/step", ",.1f"),
               ("roofline", "roofline, N copies, samples/s", ",.0f"), ("of_roofline", "of roofline", ".2f"),
               ("copies", "des N=1 as N copies at once, samples/s", ",.0f"), ("of_copies", "of N copies", ".2f")]
    for panel in panels:
        panel_rows = scaling_rows(panel, ranks, row_labels, measured, runs, roof, args.model, plan_ranks, ceiling)
        rows += panel_rows
        if panel_rows:
            tables.append((panel.title, columns, panel_rows))
            top, phases = phase_rows(panel_rows)
            if top:
                tables.append((f"{panel.title}: ms per step per phase at N={top[0]['ranks']} (the median job's, rank 0)",
                               [("strategy", "strategy", ""), ("batch", "global batch", ",d")]
                               + [(p, p, ".1f") for p in phases] + [("total", "total", ".1f")], top))
    if roof:
        tables.append(("Dense roofline: plain TF " + throughput.TITLES.get(args.model, args.model)
                       + f" on dense inputs, {args.threads} thread(s) per copy",
                       [("copies", "copies at once", "d"), ("per_copy_batch", "batch per copy", ",d"),
                        ("samples_per_second", "samples/s (all copies)", ",.0f"),
                        ("per_copy", "per copy", ",.0f"), ("vs_copies_alone", "vs copies x one alone", ".2f")], roof))
    if ceiling:
        tables.append((f"des's one-rank job as N copies at once (at each panel's per-rank batch), {args.threads} thread(s) per copy",
                       [("data", "data", ""), ("copies", "copies at once", "d"), ("per_copy_batch", "batch per copy", ",d"),
                        ("pinned", "each on cores of its own", ""), ("samples_per_second", "samples/s (all copies)", ",.0f"),
                        ("per_copy", "per copy", ",.0f"), ("vs_copies_alone", "vs copies x one alone", ".2f")], ceiling))

    cores = os.cpu_count() or 1
    crowded = [n for n in ranks if n * args.threads > cores]
    notes = [info["note"] + "." for info in data.values()]
    notes += [
        f"{args.model}; {args.threads} thread(s) per rank (des.train --threads), so N ranks use N x {args.threads} of "
        f"the machine's {cores} cores" + (f"; N = {', '.join(map(str, crowded))} use more: their ranks share cores"
                                          if crowded else "") + "."
        + (f" The N = 1 jobs run on {args.threads} core(s) of their own (--pin-one-rank: "
           + (f"taskset, round by round on cores {' / '.join(base_rounds)})." if base_rounds
              else "des.train --pin-cores on).") if args.pin_one_rank else "")
        + (f" Before the first round the N = {order[0]} launch ran once, untimed (--first-use: a fresh machine's first "
           "job runs slower)." if args.first_use else ""),
        f"Each job: {args.warmup} warm-up steps, then {args.steps} timed steps; samples/s = des.train's own meter "
        "restarted after the warm-up (training samples over rank 0's training wall time of the timed steps; the job "
        "validates once, after its last step). The jobs of one N run in one mpiexec launch per round "
        "(benchlib's steady_many: TensorFlow's start-up paid once; each run has its own tables, tf.functions and "
        "communicator; the order of the runs in a launch is the same in every round; no peak memory: a run's "
        f"would be its launch's so far). {args.rounds} round(s) round-robin over N (N = 1 and the largest "
        "first); a row is the median samples/s (of an even count, the mean of the middle two) with the median job's "
        "plan and phases (the lower middle one), min-max over the rounds it has." + (f" {stopped}." if stopped else ""),
        ("Strong scaling: the global batch is fixed, so ideal samples/s grow N-fold as each rank's share shrinks. "
         if "strong" in kinds else "")
        + (f"Weak scaling: {args.rows_per_rank} rows per rank, global batch {args.rows_per_rank} x N, ideal samples/s "
           "grow N-fold at a constant step time. " if "weak" in kinds else "")
        + "Speed-up = samples/s over the same strategy's at N = 1 (des-<plan> rows "
        "without an N = 1 row of their own: over des at N = 1); efficiency = speed-up / N; 'vs des (auto) same N' = "
        "a plan's samples/s over the planner's choice at the same N (above 1: the planner missed a faster plan).",
        benchlib.STRATEGY_NOTE,
        "persia = persia-1 (--staleness 1); hierarchical = hierarchical-g2 (--group-size 2; at N = 1 one group of one "
        "rank: des's step); des-<plan> = des with --plan <plan>" + (
            "; des-exchange is alltoall's job (the same step: alltoall is des with the exchange plan fixed)"
            if "des-exchange" in row_labels and "alltoall" in strategies else "") + ".",
    ]
    if roof:
        notes.append(f"Roofline: bench_throughput's dense roofline of {args.model} (plain TF on dense inputs "
                     "[B, 39, 8] and [B, 39, 1]: the upper network, FM and the first layer as matmuls, forward, "
                     f"backward and Adam; no tables), {args.threads} thread(s) per copy, samples/s over "
                     f"{args.roofline_repeats} calls after 3 untimed ones, measured once, after the jobs' first round; 'N copies' "
                     "= N processes at once, each at the per-rank batch of N, their samples/s summed: what N "
                     "data-parallel copies of the dense part reach here, the machine's contention included. It models "
                     "the Criteo sample's shape (39 fields of 8 floats), which multi-hot data pool to as well.")
    elif args.roofline:
        notes.append(f"No roofline: bench_throughput's dense roofline has no {args.model} (it has "
                     f"{', '.join(throughput.ROOFLINE_MODELS)}).")
    if ceiling:
        notes.append(f"Copies: des's one-rank job at each panel's per-rank batch of N (weak: {args.rows_per_rank}, alone "
                     f"first; strong: B/N) as N copies at once, each {args.warmup} + {args.copies_steps} steps (longer than a job, so the copies' "
                     "timed windows overlap) on cores of its own (taskset) where the machine has N x threads cores; "
                     "their samples/s summed is the ceiling for N ranks on this machine: no communication, no shared "
                     "work, each copy slowed only by the others' use of caches, memory and clocks. 'of N copies' = "
                     "des's samples/s over it.")
    repeating = []
    for panel in panels:
        mine = [r for r in rows if r["panel"] == panel.title]
        for r in mine:
            r["passes"] = (args.warmup + args.steps) * r["batch"] / data[r["data"]]["train_rows"]
        wrapped = sorted({r["ranks"] for r in mine if r["passes"] > 1})
        if wrapped:
            repeating.append(f"{panel.title} at N = {', '.join(map(str, wrapped))} (up to "
                             f"{max(r['passes'] for r in mine):.1f} passes)")
    if repeating:
        notes.append("Rows repeat within a job (its warm-up and timed steps pass over the training split more than "
                     "once, so its tables hold the ids seen before): " + "; ".join(repeating) + ".")
    if skipped:
        notes.append("Not measured: " + "; ".join(skipped) + ".")
    notes.append("Other processes on the machine move every figure (load average per job in results.json).")

    def figure(plt):
        shown = [p for p in panels if any(r["panel"] == p.title and r.get("samples_per_second") for r in rows)]
        if not shown:
            return None
        cols = min(3, len(shown))
        fig, axes = plt.subplots(-(-len(shown) // cols), cols, figsize=(5 * cols, 4 * -(-len(shown) // cols)),
                                 squeeze=False)
        for i_ax, (ax, panel) in enumerate(zip(axes.flat, shown)):
            mine = [r for r in rows if r["panel"] == panel.title and r.get("samples_per_second")]
            for i, label in enumerate(row_labels):
                if job_label(label, measured) != label and job_label(label, measured) in row_labels:
                    continue  # des-exchange: alltoall's line
                points = sorted((r["ranks"], r["samples_per_second"]) for r in mine if r["strategy"] == label)
                if points:
                    ax.plot(*zip(*points), marker="o", color=f"C{i}", label=label)
            base = next((r["samples_per_second"] for r in mine if r["ranks"] == 1 and r["strategy"] == row_labels[0]), None)
            if base:
                ax.plot(ranks, [base * n for n in ranks], color="gray", linestyle="--", label=f"ideal ({row_labels[0]})")
            roof_points = sorted((r["ranks"], r["roofline"]) for r in mine if r.get("roofline"))
            if roof_points:
                ax.plot(*zip(*dict(roof_points).items()), color="black", linestyle=":", label="roofline, N copies")
            copy_points = sorted((r["ranks"], r["copies"]) for r in mine if r.get("copies"))
            if copy_points:
                ax.plot(*zip(*dict(copy_points).items()), color="black", marker="s", linestyle="-.",
                        label="des N=1, N copies at once")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ranks, [str(n) for n in ranks])
            ax.set_xlabel("ranks N")
            if i_ax % cols == 0:
                ax.set_ylabel("training samples/s")
            ax.set_title(panel.title, fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(shown):]:
            ax.set_visible(False)
        fig.suptitle(f"{args.model}, {args.threads} thread(s) per rank, {cores} cores")
        fig.tight_layout()
        return fig

    job_list = [{"job": job.tag, "data": job.data, "ranks": job.ranks, "batch": job.batch, "strategy": job.strategy,
                 "samples_per_second_rounds": [round(s["steady"]["samples_per_second"]) for s in runs[job]],
                 "plans": [plan_name(s.get("plan")) for s in runs[job]],
                 "ms_per_phase_rounds": [s["steady"]["ms_per_phase"] for s in runs[job]],
                 # every rank's phases: a rank waiting in a collective for a slower one shows it there
                 "ms_per_phase_by_rank_rounds": [s["steady"].get("ms_per_phase_by_rank", {}) for s in runs[job]],
                 # each rank's median ms a call waiting for the last rank to enter it, per collective site
                 "ms_waiting_by_rank_rounds": [s["steady"].get("ms_waiting_by_rank", {}) for s in runs[job]],
                 "load_average_rounds": [s.get("load_average") for s in runs[job]]} for job in flags_of]
    bench.finish(rows + roof + ceiling, tables, notes, figure,
                 extra={"skipped": skipped, "stopped": stopped, "data": data, "jobs": job_list,
                        "launch_seconds": launch_seconds})
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
