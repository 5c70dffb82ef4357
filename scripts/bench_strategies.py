""".venv/bin/python scripts/bench_strategies.py [--quick] [--strategies des,alltoall,persia-1,persia-4,persia-16,hierarchical-g1,hierarchical-g2,ps] [--ranks 4] [--seeds 0,1,2] [--synth-rows 500000] [--synth-seeds 0,1,2] [--speed-ranks 2,4] [--speed-batches 4096,512] [--warmup 3] [--steps 10] [--rounds 1] [--parts quality,speed]

Shows des next to the related systems it is compared with, as strategies of the same engine on
the same data, all in one run: Persia's hybrid training (``persia-T``: alltoall's step with the
sparse updates applied T steps late) and Hierarchical Training (``hierarchical-gG``: groups of G
ranks, each training its own replica of the upper network, EASGD every 4 steps), with ``alltoall``
(synchronous, TorchRec-style) and ``ps`` (asynchronous parameter server: 1 server + N-1 workers).
The DES paper's Table 4, extended to these systems and to seeds:

* **Quality at equal samples**: DeepFM, one epoch, every strategy on ``--ranks`` ranks, test AUC
  and logloss (test rows never used to choose anything; ``--early-stop 0``):
  - the shipped Criteo sample (split 90/5/5, batch 256), mean ± std over ``--seeds``;
  - a synthetic Criteo-shaped store of ``--synth-rows`` rows (``des.data.synth``, batch 4096),
    next to the oracle (the generator's true probabilities on the same test rows), over
    ``--synth-seeds``.
* **Speed**: samples/s of the same strategies on the shipped sample at every N of
  ``--speed-ranks`` and B of ``--speed-batches``, over ``--steps`` timed steps after ``--warmup``
  (per worker for ps), each job ``--rounds`` times round-robin (the median), in this run; the
  ratio to des at the same N and B. Single jobs at B = 512 move by 10-25% between runs here: read
  the speed table from ``--rounds 3``.

Expect (a 2-core machine, about half an hour; recorded runs in ``docs/benchmarks.md``, "Related
systems"): des and alltoall equal in quality; persia below them by more as the staleness grows
(tau = 1 within noise, tau = 16 about 0.01 AUC lower), hierarchical within noise of des at one
epoch, ps the lowest. In speed persia is alltoall's step (a late update is the same work: the
asynchrony Persia buys speed with has no idle resource to fill when every rank's core is busy),
hierarchical at or above des (its upper network's AllReduce spans a group, not every rank: most
visible at B = 512), ps slowest at N = 2 (one worker) and fastest at N = 4 (three workers that
never wait), with the lowest quality.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import benchlib

DEFAULT_STRATEGIES = "des,alltoall,persia-1,persia-4,persia-16,hierarchical-g1,hierarchical-g2,ps"


def quality_runs(bench: benchlib.Bench, data: str, tag: str, strategies: Sequence[str], ranks: int,
                 seeds: Sequence[int], batch: int) -> list[dict]:
    """One epoch of DeepFM per strategy and seed; the test metrics of each job."""
    runs = []
    for strategy in strategies:
        for seed in seeds:
            s = bench.train(ranks, f"{tag}-{strategy}-s{seed}", model="deepfm", seed=seed, epochs=1, early_stop=0,
                            batch_size=batch, data=data, eval_batch_size=16384, **benchlib.strategy_flags(strategy))
            runs.append({"data": tag, "strategy": strategy, "ranks": ranks, "seed": seed,
                         **({} if s is None else {k: s.get(k) for k in (
                             "test_auc", "test_logloss", "steps", "train_samples", "staleness_mean", "job_seconds")})})
    return runs


def quality_rows(runs: Sequence[dict], tag: str, strategies: Sequence[str], oracle: dict | None) -> list[dict]:
    rows = []
    des_auc = None
    for strategy in strategies:
        sel = [r for r in runs if r["data"] == tag and r["strategy"] == strategy]
        auc, auc_sd = benchlib.mean_std([r.get("test_auc") for r in sel])
        ll, ll_sd = benchlib.mean_std([r.get("test_logloss") for r in sel])
        if strategy == "des":
            des_auc = auc
        rows.append({"data": tag, "strategy": strategy, "ranks": sel[0]["ranks"], "steps": sel[0].get("steps"),
                     "seeds": sum(r.get("test_auc") is not None for r in sel), "test_auc": auc, "test_auc_std": auc_sd,
                     "test_logloss": ll, "test_logloss_std": ll_sd, "auc": f"{auc:.4f} ± {auc_sd:.4f}",
                     "logloss": f"{ll:.4f} ± {ll_sd:.4f}", "per_seed_auc": [r.get("test_auc") for r in sel],
                     "auc_vs_des": None if des_auc is None else auc - des_auc,
                     "auc_gap_to_oracle": None if oracle is None else oracle["auc"] - auc})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default=DEFAULT_STRATEGIES)
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the quality jobs (ps: 1 server + the rest)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the Criteo sample's jobs")
    parser.add_argument("--synth-rows", type=int, default=500_000, help="rows of the synthetic store (0: skip it)")
    parser.add_argument("--synth-seeds", default="0,1,2", help="seeds of the synthetic store's jobs")
    parser.add_argument("--speed-ranks", default="2,4")
    parser.add_argument("--speed-batches", default="4096,512")
    parser.add_argument("--warmup", type=int, default=3, help="steps of a speed job not timed (per worker for ps)")
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps of a speed job at the largest batch; smaller batches run proportionally more")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every speed job this many times, round-robin, and report the median")
    parser.add_argument("--parts", default="quality,speed", help="quality, speed or both")
    parser.add_argument("--cache", default=os.environ.get("DES_CACHE_DIR", str(Path.home() / ".cache" / "des")))
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts <= {"quality", "speed"} or args.rounds < 1:
        raise SystemExit(f"--parts takes quality and/or speed and --rounds at least 1, got {args.parts!r}, {args.rounds}")
    if args.quick:
        args.strategies, args.seeds, args.synth_rows = "des,persia-4,hierarchical-g1,ps", "0", 0
        args.speed_ranks, args.speed_batches, args.steps, args.ranks = "2", "512", 3, 2
    strategies = args.strategies.split(",")
    for name in strategies:
        benchlib.strategy_flags(name)  # an unknown name stops here, before any job
    seeds = [int(s) for s in args.seeds.split(",")]
    bench = benchlib.Bench(__file__, args)

    # ------------------------------------------------------------------ quality
    runs, rows, oracle = [], [], None
    if "quality" in parts:
        runs = quality_runs(bench, str(benchlib.SAMPLE), "criteo", strategies, args.ranks, seeds, 256)
        rows = quality_rows(runs, "criteo", strategies, None)
    if "quality" in parts and args.synth_rows:
        from bench_synthetic import synthetic_store

        store = synthetic_store(bench, args.synth_rows, 0, 1.0, 1.0, Path(args.cache))
        oracle = json.loads((store / "manifest.json").read_text())["synthetic"]["oracle"]
        synth_seeds = [int(s) for s in args.synth_seeds.split(",")]
        runs += quality_runs(bench, str(store), "synthetic", strategies, args.ranks, synth_seeds, 4096)
        rows += quality_rows(runs, "synthetic", strategies, oracle)

    # ------------------------------------------------------------------ speed
    batches = sorted((int(b) for b in args.speed_batches.split(",")), reverse=True)
    configs = [(strategy, n, batch) for n in [int(x) for x in args.speed_ranks.split(",")] for batch in batches
               for strategy in strategies] if "speed" in parts else []
    measured: dict[tuple, list[float]] = {c: [] for c in configs}
    for round_ in range(args.rounds):  # round-robin: a drift in the machine's load hits every job alike
        for strategy, n, batch in configs:
            tag = f"speed-{strategy}-n{n}-b{batch}" + (f"-r{round_}" if args.rounds > 1 else "")
            s = bench.steady(n, tag, args.warmup, args.steps * batches[0] // batch, model="deepfm", batch_size=batch,
                             **benchlib.strategy_flags(strategy))
            if s is not None:
                measured[(strategy, n, batch)].append(s["steady"]["samples_per_second"])
    speed = []
    for (strategy, n, batch), values in measured.items():
        values = sorted(values)
        speed.append({"strategy": strategy, "ranks": n, "batch": batch, "rounds": len(values),
                      "samples_per_second": statistics.median(values) if values else None,
                      "spread": f"{values[0]:,.0f}-{values[-1]:,.0f}" if values else None})
    for row in speed:
        base = next((r["samples_per_second"] for r in speed if r["strategy"] == "des" and r["ranks"] == row["ranks"]
                     and r["batch"] == row["batch"]), None)
        row["vs_des"] = row["samples_per_second"] / base if row["samples_per_second"] and base else None

    quality_columns = [("strategy", "strategy", ""), ("ranks", "N", "d"), ("steps", "steps", "d"),
                       ("seeds", "seeds", "d"), ("auc", "test AUC (mean ± std)", ""),
                       ("auc_vs_des", "AUC - des", "+.4f"), ("logloss", "test logloss (mean ± std)", "")]
    tables = [("Quality: the shipped Criteo sample", quality_columns, [r for r in rows if r["data"] == "criteo"])] \
        if rows else []
    if oracle is not None:
        synthetic = [r for r in rows if r["data"] == "synthetic"]
        oracle_row = {"strategy": "oracle (true probabilities)", "auc": f"{oracle['auc']:.4f}",
                      "logloss": f"{oracle['logloss']:.4f}"}
        tables.append(("Quality: the synthetic store", quality_columns + [
            ("auc_gap_to_oracle", "gap to oracle", ".4f")], [oracle_row, *synthetic]))
    if speed:
        tables.append((f"Speed (samples/s, the median of {args.rounds} job(s) each, this run)", [
            ("strategy", "strategy", ""), ("ranks", "N", "d"), ("batch", "batch", "d"),
            ("samples_per_second", "samples/s", ",.0f"), ("spread", "min-max", ""), ("vs_des", "vs des", ".2f")],
            speed))
    notes = [
        benchlib.STRATEGY_NOTE,
        f"Quality: DeepFM with des.train's defaults, one epoch (equal samples for every strategy), --early-stop 0; "
        f"every strategy on {args.ranks} ranks (ps: 1 server + {args.ranks - 1} asynchronous workers, worker w "
        f"trains batches w, w+{args.ranks - 1}, ...). Criteo sample: 29,582 train / 1,694 test rows (split 90/5/5, "
        f"split seed 0), batch 256, seeds {args.seeds} (initial values and batch order), mean ± sample std."
        + (f" Synthetic: {args.synth_rows:,} Criteo-shaped rows (des.data.synth, data seed 0, split 90/5/5), batch "
           f"4096, seeds {args.synth_seeds}; the oracle is the generator's true probabilities on the same test rows."
           if oracle is not None else ""),
        "persia-T applies every step's sparse update T steps after it was computed (its staleness bound held at "
        "every step: deterministic, the same on any N); hierarchical-gG: N/G groups, each its own replica of the "
        "layers above the substituted ones (trained on its B/K rows), reconciled by EASGD every 4 steps (alpha "
        "0.9/K); tables and first-layer field slices one copy trained with every group's rows. Validations and "
        "checkpoints make them one model first (their design docs: docs/design.md, Strategies).",
        f"Speed: the shipped sample, --warmup {args.warmup} untimed steps then {args.steps} timed steps at batch "
        f"{batches[0]} (proportionally more at smaller batches); every job run {args.rounds} time(s), round-robin, "
        "the median shown with the min-max; ratios to des (its median) in the same N and B. "
        "All ranks share 2 cores: at N = 4 every rank gets half a core.",
    ]

    def figure(plt):
        import numpy as np

        fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
        for k, tag in enumerate(("criteo", "synthetic")):
            sel = [r for r in rows if r["data"] == tag]
            if not sel:
                axes[k].set_visible(False)
                continue
            axes[k].errorbar(np.arange(len(sel)), [r["test_auc"] for r in sel], yerr=[r["test_auc_std"] for r in sel],
                             fmt="o", capsize=4)
            if tag == "synthetic" and oracle is not None:
                axes[k].axhline(oracle["auc"], color="black", linestyle="--", label=f"oracle {oracle['auc']:.4f}")
                axes[k].legend()
            axes[k].set_xticks(np.arange(len(sel)), [r["strategy"] for r in sel], rotation=30)
            axes[k].set_ylabel("test AUC")
            axes[k].set_title(f"{tag}: DeepFM, one epoch, N = {args.ranks}")
            axes[k].grid(True, alpha=0.3)
        return fig

    bench.finish(rows + speed, tables, notes, figure, extra={"runs": runs, "speed": speed})
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
