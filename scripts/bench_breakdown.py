""".venv/bin/python scripts/bench_breakdown.py [--quick] [--models deepfm,lr,wdl] [--ranks 1,2] [--deepfm-ranks 1,2,4] [--batch-size 4096] [--warmup 3] [--steps 8]

Shows the DES paper's Figure 7 on this machine: milliseconds per training step, split into phases,
for DeepFM (at N = 1, 2, 4) and LR and W&D (at N = 1, 2) under ``des``, ``alltoall`` and ``ps``
(ps needs N >= 2: rank 0 serves, the others are asynchronous workers). Phases come from the
engine's timers (``ms_per_phase`` of summary.json, rank 0 / the first worker):

* des:      lookup, partials, allreduce, top, local_backward, update
* alltoall: lookup (= the id/row Alltoallv exchange and the owners' lookups), top, allreduce
            (dense gradients), update (row gradients sent back + optimizers)
* ps:       lookup (= pulls of rows and dense weights), top, update (= pushes)

Each configuration is one job of ``--warmup + --steps`` steps whose phase timers restart after the
warm-up steps (``benchlib.train_with_timer_restart``), so the table shows steps warmup+1 ..
warmup+steps only: the first steps trace the tf.functions and would otherwise dominate. "Communication" = allreduce (+ the alltoall lookup/update exchanges
include their table work; ps pulls/pushes include waiting for the server). Figure: stacked bars.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import benchlib

PHASES = ("lookup", "partials", "allreduce", "top", "local_backward", "update")
COMMUNICATION = {"des": ("allreduce",), "alltoall": ("lookup", "allreduce", "update"), "ps": ("lookup", "update")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="deepfm,lr,wdl")
    parser.add_argument("--strategies", default="des,alltoall,ps")
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
                                 model=model, strategy=strategy, batch_size=args.batch_size)
                row = {"model": model, "strategy": strategy, "ranks": n, "batch": args.batch_size}
                if s is not None:
                    phases = s["steady"]["ms_per_phase"]
                    row.update({p: phases.get(p) for p in PHASES})
                    row["total_ms"] = sum(phases.values())
                    row["communication_ms"] = sum(phases.get(p, 0.0) for p in COMMUNICATION[strategy])
                    row["step_ms_wall"] = 1000 * args.batch_size / s["steady"]["samples_per_second"] * (
                        n - 1 if strategy == "ps" else 1)
                    row["load_average"] = s["load_average"]
                rows.append(row)
    columns = [("model", "model", ""), ("strategy", "strategy", ""), ("ranks", "N", "d")]
    columns += [(p, p, ".1f") for p in PHASES]
    columns += [("total_ms", "total ms/step", ".1f"), ("communication_ms", "comm.-bearing ms", ".1f")]
    notes = [
        f"Batch {args.batch_size}; ms per step of steps {args.warmup + 1}..{args.warmup + args.steps} of one job "
        f"(timers restarted after {args.warmup} warm-up steps), rank 0's timers (ps: the first worker's, per step of "
        "that worker; N=2: one worker; N=4: three workers share 2 cores with the server).",
        "'comm.-bearing' sums the phases that contain network traffic: des allreduce; alltoall lookup + allreduce + "
        "update (these also hold the owners' table work and the unpooling); ps pulls (lookup) + pushes (update), "
        "which also wait for the busy server. On one machine 'communication' is shared-memory copying plus waiting "
        "for the slowest rank: with ranks time-sharing 2 cores, allreduce time is mostly waiting.",
        "des at N ranks: each rank does lookup/partials/local_backward/update for 1/N of the fields but the top "
        "network for the whole batch (replicated), so 'top' does not shrink with N; alltoall at N: each rank does the "
        "whole model on B/N rows. The paper's Figure 7 (4 nodes x 48 threads, 10 GbE, DiFacto as the mesh/PS "
        "baseline) splits only computation vs communication.",
    ]

    def figure(plt):
        import numpy as np

        fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(rows)), 5))
        labels = [f"{r['model']}\n{r['strategy']}\nN={r['ranks']}" for r in rows]
        bottom = np.zeros(len(rows))
        for i, phase in enumerate(PHASES):
            values = np.array([max(r.get(phase) or 0.0, 0.0) for r in rows])
            if values.any():
                ax.bar(np.arange(len(rows)), values, 0.7, bottom=bottom, label=phase, color=f"C{i}")
                bottom += values
        ax.set_xticks(np.arange(len(rows)), labels, fontsize=7)
        ax.set_ylabel(f"ms per step (batch {args.batch_size})")
        ax.set_title("Per-step time by phase after warm-up (2-core machine)")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        return fig

    bench.finish(rows, [("ms per training step by phase", columns, rows)], notes, figure)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
