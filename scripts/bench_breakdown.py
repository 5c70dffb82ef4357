""".venv/bin/python scripts/bench_breakdown.py [--quick] [--models deepfm,lr,wdl] [--ranks 1,2] [--deepfm-ranks 1,2,4] [--batch-size 4096] [--warmup 3] [--steps 8]

Shows the DES paper's Figure 7 on this machine: milliseconds per training step, split into the
categories lookup, partial compute, communication, top network (forward + backward), backward and
updates, for DeepFM (at N = 1, 2, 4) and LR and W&D (at N = 1, 2) under ``des``, ``alltoall`` and
``ps`` (ps needs N >= 2: rank 0 serves, the others are asynchronous workers).

Expect (a 2-core machine, batch 4096, after warm-up; recorded runs in ``docs/benchmarks.md``,
"Step breakdown"): DeepFM's step mostly in the top network, LR's several times shorter;
communication 0 at N = 1 for des and, up to a local copy, for alltoall; at N >= 2 it is mostly
waiting for the other ranks (ps: for the server), not copying; at N = 4 four ranks share 2 cores,
so the step grows.

Phases come from the engines' timers (``ms_per_phase`` of summary.json, rank 0 / the first ps
worker), each phase either communication or local work (each strategy's ``phases`` declare the category):

* des:      lookup, partials, allreduce (communication), top (top network fwd + bwd),
            local_backward (backward through the partials), update (incl. unpooling the gradients)
* alltoall: (= des --plan exchange) lookup (the owners' lookups, distinct ids per row block, gathers,
            pooling), exchange_values (Alltoallv of the distinct ids' values), top (the whole model on
            B/N rows, one tf.function: every operator's reference and the top network), allreduce
            (dense gradients), sparse_backward (per-id gradient sums), exchange_gradients (Alltoallv
            of the row gradients), update (sparse and dense optimizers)
* ps:       lookup (unique ids, pooling), pull (row and weight requests and answers, incl. waiting
            for the server), forward_backward (whole model, "top network"), sparse_backward, push;
            no update on a worker: the server applies it, shown as "ps server busy" (server 0's
            ``server_ms_per_phase`` per worker step: lookups, optimizers, dense pulls/pushes).

Each configuration is one job of ``--warmup + --steps`` steps whose phase timers restart after the
warm-up steps (``benchlib.train_with_warmup``), so the table shows steps warmup+1 ..
warmup+steps only: the first steps trace the tf.functions and would otherwise dominate.
Figure: stacked bars of the categories.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

import benchlib

from des.strategies.base import CATEGORIES  # noqa: E402  (no TensorFlow)

CATEGORY_TITLES = {"lookup": "lookup", "partials": "partial compute", "communication": "communication",
                   "top": "top network fwd+bwd", "backward": "backward", "update": "update"}


def category_of(strategy: str) -> dict[str, str]:
    """Phase -> category of the paper's Figure 7, as the strategy (a benchmark's name or a
    ``--strategy``) declares it (``Strategy.phases``; its timer refuses any other phase)."""
    from des.strategies import get_strategy  # loads TensorFlow: only when a table is made

    return dict(get_strategy(benchlib.STRATEGY_FLAGS.get(strategy, {"strategy": strategy})["strategy"]).phases)


def server_phases() -> tuple[str, ...]:
    from des.strategies import get_strategy

    return tuple(get_strategy("ps").server_phases)


def categorize(strategy: str, phases: Mapping[str, float]) -> dict[str, float]:
    """ms per category (all of :data:`CATEGORIES`, 0 when absent) plus ``other`` for phases the
    mapping does not know (there should be none)."""
    out = {c: 0.0 for c in CATEGORIES}
    out["other"] = 0.0
    for phase, ms in phases.items():
        out[category_of(strategy).get(phase, "other")] += ms
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="deepfm,lr,wdl")
    parser.add_argument("--strategies", default="des,des-replicated,alltoall,ps")
    parser.add_argument("--ranks", default="1,2", help="rank counts for LR and W&D")
    parser.add_argument("--deepfm-ranks", default="1,2,4", help="rank counts for DeepFM")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.deepfm_ranks, args.ranks, args.warmup, args.steps = "deepfm", "1,2", "1,2", 2, 3
    models, strategies = args.models.split(","), args.strategies.split(",")
    bench = benchlib.Bench(__file__, args)

    rows = []
    for model in models:
        ranks = [int(x) for x in (args.deepfm_ranks if model == "deepfm" else args.ranks).split(",")]
        for strategy in strategies:
            for n in ranks:
                if strategy == "ps" and n < 2:
                    continue
                s = bench.steady(n, f"{model}-{strategy}-n{n}", args.warmup, args.steps,
                                 model=model, batch_size=args.batch_size, **benchlib.strategy_flags(strategy))
                row = {"model": model, "strategy": strategy, "ranks": n, "batch": args.batch_size}
                if s is not None:
                    phases = s["steady"]["ms_per_phase"]
                    row.update(categorize(strategy, phases))
                    for category in set(CATEGORIES) - set(category_of(strategy).values()):
                        row[category] = None  # "-": not a phase of this strategy (ps: the server updates)
                    row["phases"] = phases
                    row["engine_phases"] = " ".join(f"{p} {ms:.1f}" for p, ms in phases.items())
                    row["total_ms"] = sum(phases.values())
                    row["communication_share"] = row["communication"] / row["total_ms"] if row["total_ms"] else None
                    if strategy == "ps" and s.get("server_ms_per_phase"):
                        server = s["server_ms_per_phase"]
                        row["server_phases"] = server
                        row["server_busy_ms"] = sum(server.get(p, 0.0) for p in server_phases())
                    row["step_ms_wall"] = 1000 * args.batch_size / s["steady"]["samples_per_second"] * (
                        n - 1 if strategy == "ps" else 1)
                    row["load_average"] = s["load_average"]
                rows.append(row)
    columns = [("model", "model", ""), ("strategy", "strategy", ""), ("ranks", "N", "d")]
    columns += [(c, CATEGORY_TITLES[c], ".1f") for c in CATEGORIES]
    if any(r.get("other") for r in rows):
        columns.append(("other", "other (unmapped)", ".1f"))
    columns += [("total_ms", "total ms/step", ".1f"), ("communication_share", "comm. share", ".0%"),
                ("server_busy_ms", "ps server busy ms", ".1f")]
    phase_columns = [("model", "model", ""), ("strategy", "strategy", ""), ("ranks", "N", "d"),
                     ("engine_phases", "engine phases (ms/step)", "")]
    notes = [
        benchlib.STRATEGY_NOTE,
        f"Batch {args.batch_size}; ms per step of steps {args.warmup + 1}..{args.warmup + args.steps} of one job "
        f"(timers restarted after {args.warmup} warm-up steps), rank 0's timers (ps: the first worker's, per step of "
        "that worker; N=2: one worker; N=4: three workers share 2 cores with the server).",
        "Categories from the engines' phases (second table): communication = des allreduce, reduce_scatter, "
        "allgather, exchange_values, exchange_gradients (alltoall: the same step with every operator exchanged); "
        "ps pull + push. Every other phase is local work. 'top network fwd+bwd' is "
        "des's replicated top network (forward and backward) and, for alltoall/ps, the whole model's forward and "
        "backward on the local rows (one tf.function: it includes the first layer that des computes as partials); "
        "'backward' = des local_backward, alltoall/ps per-id gradient sums (des does its unpooling in 'update'). "
        "des on ONE rank runs partials, top and local backward as one TF call (phase fused_step), counted as 'top' "
        "(its partial compute and backward are inside it).",
        "On one machine 'communication' is shared-memory copying plus waiting for the slowest rank (ps: for the "
        "server): with ranks time-sharing 2 cores, most of it is waiting. 'ps server busy' = server 0's lookups, "
        "optimizers and dense-weight traffic per worker step over the whole job (warm-up included, idle time not).",
        "des at N ranks: each rank does lookup/partials/local_backward/update for 1/N of the fields and the top "
        "network for B/N rows (des-replicated: for the whole batch, so 'top' does not shrink with N); alltoall at N: "
        "each rank does the "
        "whole model on B/N rows. The paper's Figure 7 (4 nodes x 48 threads, 10 GbE, DiFacto as the mesh/PS "
        "baseline) splits only computation vs communication.",
    ]

    def figure(plt):
        import numpy as np

        fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(rows)), 5))
        labels = [f"{r['model']}\n{r['strategy']}\nN={r['ranks']}" for r in rows]
        bottom = np.zeros(len(rows))
        for i, category in enumerate((*CATEGORIES, "other")):
            values = np.array([max(r.get(category) or 0.0, 0.0) for r in rows])
            if values.any():
                ax.bar(np.arange(len(rows)), values, 0.7, bottom=bottom,
                       label=CATEGORY_TITLES.get(category, category), color=f"C{i}",
                       hatch="//" if category == "communication" else None)
                bottom += values
        ax.set_xticks(np.arange(len(rows)), labels, fontsize=7)
        ax.set_ylabel(f"ms per step (batch {args.batch_size})")
        ax.set_title("Per-step time by category after warm-up (2-core machine)")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        return fig

    bench.finish(rows, [("ms per training step by category", columns, rows),
                        ("the engines' own phases", phase_columns, rows)], notes, figure)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
