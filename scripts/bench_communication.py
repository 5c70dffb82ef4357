""".venv/bin/python scripts/bench_communication.py [--quick] [--batch-sizes 512,1024,2048,4096,8192] [--ranks 2,4] [--measure SPEC] [--steps 3] [--strategies des,des-partials,des-replicated,alltoall] [--one-launch]

Shows the DES paper's Table 2 on the shipped Criteo sample: for each batch size, the unique ids
per batch (mean over the batches of epoch 0, from the data), and the bytes each rank SENDS per
training step under ``des`` (the default command: ``--plan auto``, the planner's cheapest plan),
``des-partials`` (``--plan partials``: reduce-scatter of the [B, P] partials by rows, all-gather of
their gradient, AllReduce of the top gradients), ``des-replicated`` (``--upper replicated``, the
paper's step: one ring AllReduce of the [B, P] partials) and ``alltoall`` (``--plan exchange``: the
values of the distinct ids of each row block and their gradients with Alltoallv, plus the AllReduce
of the dense gradients), both **measured** (``bytes_per_step_by_site`` of short ``des.train`` runs)
and **analytic**, and the communication-saving ratio 1 - DES partials/alltoall, at N = 2 and 4.

Expect (bytes do not depend on the machine, only on the data, the batches and the plan; the
recorded run, made on a 2-core machine, is in ``docs/benchmarks.md``, "Communication"): the
measured bytes of every plan equal the planner's prediction for the same batches exactly
('meas./pred.' 1.0000, every site, rank 0 too); partials save bytes against alltoall for LR and
FM and cost more for W&D and DeepFM, whose buffer carries 401-410 floats per sample where a Criteo
sample has at most 39 ids; ``des`` (auto) keeps LR and FM as partials and exchanges everything for
W&D and DeepFM. The planner's table per operator (logged for W&D and DeepFM) says why.

Analytic and predicted bytes come from ``des/planner.py`` (its module docstring has the formulas,
per rank, per term): des = its cheapest plan, des-partials = all partials, des-replicated = all
partials with ``upper="replicated"`` (one ring AllReduce of [B, P]), alltoall = all exchange.
Analytic values use the unique ids of all batches of epoch 0, for every batch size, rank count
and model; predicted values use the unique ids of exactly the batches the ``des.train`` runs of
``--measure`` train ("B,B:model,model:N,N;..."; default: all four models at B=4096 on 2 and 4
ranks, LR and DeepFM at the other batch sizes on 2 ranks: each run pays des.train's start-up;
``--strategies`` picks which run; ``--one-launch`` trains all the runs of one rank count in a
single mpiexec launch, same bytes, start-up paid once). The figure plots bytes/step against B (log).

The whole sample is used as training data (``--split 1,0,0``), so the unique-id statistics and
the measured batches cover all 32,852 rows and the short jobs spend no time evaluating. The split
does not change the measured bytes: ``bytes_per_step`` counts training traffic only, since
alltoall and ps send their evaluation ids, rows and predictions on separate ``eval_*`` call sites
(des: ``eval_partials``) that it leaves out.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path


import benchlib

# The paper's Table 2 (Company* dataset, 4 nodes): batch -> (uniq feats, R_lr, R_fm(2), R_dnn) in %.
PAPER_TABLE2 = {512: (147_664, 99.769, 99.376, 90.310), 1024: (257_757, 99.735, 99.285, 86.226),
                2048: (448_814, 99.696, 99.179, 81.658), 4096: (789_511, 99.654, 99.066, 77.015),
                8192: (1_389_353, 99.607, 98.939, 72.264)}


# ------------------------------------------------------------------------------------ the planner
def build_shape(model: str, fields: int, k: int = 8, hidden: Sequence[int] = (400, 400, 400)):
    """The planner's :class:`des.planner.ModelShape` of a built-in model with these sizes."""
    from des.models import get_model
    from des.planner import model_shape

    sizes = {"num_fields": fields} if model == "lr" else {"num_fields": fields, "embedding_dim": k}
    if model in ("wdl", "deepfm"):
        sizes["hidden"] = tuple(hidden)
    return model_shape(get_model(model)(**sizes))


def dense_params(shape) -> int:
    """D: the dense parameters alltoall replicates (top network + every operator's field weights)."""
    return shape.top_params + sum(op.field_params for op in shape.operators)


def saving(des: float, alltoall: float) -> float:
    return 1.0 - des / alltoall if alltoall else math.nan


def predictions(shape, batch: int, ranks: int, unique, fields: int) -> dict:
    """des (data-parallel), des-replicated and alltoall as the planner's pure plans: the
    :class:`des.planner.PlanCost` of each (bytes per rank, per term and per Communicator site)."""
    from des.placement import place_fields
    from des.planner import EXCHANGE, PARTIALS, best_plan, plan_cost

    placement = place_fields(fields, ranks, "mod")  # des.train's default --placement
    return {"des": best_plan(shape, batch, placement, unique),  # --plan auto, the default
            "des_partials": plan_cost(shape, PARTIALS, batch, placement, unique),
            "des_replicated": plan_cost(shape, PARTIALS, batch, placement, unique, upper="replicated"),
            "alltoall": plan_cost(shape, EXCHANGE, batch, placement, unique)}


def measured_check(summary: dict, cost) -> dict:
    """Measured over predicted: rank 0, the mean over ranks, and the worst Communicator site."""
    measured_sites = summary["bytes_per_step_by_site"]
    predicted_sites = {site: sum(v) / len(v) for site, v in cost.sites().items()}
    worst = 0.0  # over every site either side names (a site the planner does not predict counts as 0)
    for site in set(measured_sites) | set(predicted_sites):
        measured, predicted = measured_sites.get(site, 0.0), predicted_sites.get(site, 0.0)
        worst = max(worst, abs(measured / predicted - 1.0) if predicted else (math.inf if measured else 0.0))
    return {"rank0": summary["bytes_per_step_per_rank"][0] / cost.per_rank()[0] if cost.per_rank()[0] else math.nan,
            "mean": summary["bytes_per_step"] / cost.mean if cost.mean else math.nan, "worst_site": worst}


# ------------------------------------------------------------------------------------ main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="512,1024,2048,4096,8192")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--models", default="lr,fm,wdl,deepfm")
    parser.add_argument("--steps", type=int, default=3, help="training steps per measured run (default 3)")
    parser.add_argument("--embedding-dim", type=int, default=8)
    parser.add_argument("--hidden", default="400,400,400")
    parser.add_argument("--data", default=str(benchlib.SAMPLE))
    parser.add_argument("--split", default="1,0,0", help="train,validation,test fractions (see the docstring)")
    parser.add_argument("--strategies", default="des,des-partials,des-replicated,alltoall",
                        help="strategies of the measured runs (default des,des-partials,des-replicated,alltoall)")
    parser.add_argument("--one-launch", action="store_true",
                        help="all measured runs of a rank count in one mpiexec launch (start-up paid once)")
    parser.add_argument("--measure", default="4096:lr,fm,wdl,deepfm:2,4;512,1024,2048,8192:lr,deepfm:2",
                        help="B,..:model,..:N,.. groups separated by ';' to measure with des.train ('' = none)")
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.ranks, args.models, args.steps = "512,4096", "2", "lr,deepfm", 2
        args.measure = "512,4096:lr,deepfm:2"
    measure = set()
    for group in filter(None, args.measure.split(";")):
        bs, ms, ns = group.split(":")
        measure |= {(int(b), m, int(n)) for b in bs.split(",") for m in ms.split(",") for n in ns.split(",")}
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    ranks = [int(x) for x in args.ranks.split(",")]
    models = args.models.split(",")
    strategies = args.strategies.split(",")
    hidden = [int(x) for x in args.hidden.split(",")]
    k = args.embedding_dim
    bench = benchlib.Bench(__file__, args)

    from des.data import BatchReader, open_dataset
    from des.placement import place_fields
    from des.planner import estimate_unique_ids
    from des.planner import report as planner_report

    split = [float(x) for x in args.split.split(",")]
    store = open_dataset(args.data, split=split, seed=0)  # the store des.train --split makes
    fields = store.num_fields
    rows, id_rows = [], []
    runs: dict[int, list] = {n: [] for n in ranks}  # (tag, strategy, row, predicted, flags) per rank count
    for batch in batch_sizes:
        epoch = len(BatchReader(store, "train", batch_size=batch))
        # U_{q,f}: over all batches of epoch 0 (the analytic columns) and over the measured steps
        # (the planner's prediction for exactly the batches the des.train runs send)
        whole = {n: estimate_unique_ids(store, batch, n, batches=epoch) for n in [1, *ranks]}
        first = {n: estimate_unique_ids(store, batch, n, batches=args.steps) for n in ranks}
        global_unique = float(whole[1].per_block.sum())
        paper = PAPER_TABLE2.get(batch)
        id_rows.append({"batch": batch, "batches": epoch, "unique_ids": global_unique,
                        "unique_per_sample": global_unique / batch,
                        **{f"shard_unique_n{n}": float(whole[n].per_block.sum()) / n for n in ranks},
                        "paper_unique": paper[0] if paper else None})
        bench.log(f"B={batch}: {global_unique:,.0f} unique ids per batch")
        for n in ranks:
            for model in models:
                shape = build_shape(model, fields, k, hidden)
                analytic = predictions(shape, batch, n, whole[n], fields)
                predicted = predictions(shape, batch, n, first[n], fields)
                row = {
                    "batch": batch, "ranks": n, "model": model, "P": shape.buffer_width,
                    "row_width": sum(shape.blocks.values()), "dense_params": dense_params(shape),
                    "unique_ids": global_unique, "shard_unique": float(whole[n].per_block.sum()) / n,
                    **{f"{key}_analytic": cost.mean for key, cost in analytic.items()},
                    **{f"{key}_predicted": cost.mean for key, cost in predicted.items()},
                    **{f"{key}_predicted_rank0": cost.per_rank()[0] for key, cost in predicted.items()},
                    "alltoall_sparse_analytic": sum(analytic["alltoall"].term_mean(t) for t in
                                                    ("rows", "row_gradients")),
                }
                row["saving_analytic"] = saving(row["des_partials_analytic"], row["alltoall_analytic"])
                # The paper's R counts the sparse exchange only (no dense-gradient AllReduce).
                row["saving_sparse_analytic"] = saving(row["des_partials_analytic"], row["alltoall_sparse_analytic"])
                if paper:
                    row["paper_saving"] = {"lr": paper[1], "fm": paper[2], "wdl": paper[3]}.get(model)
                if model in ("wdl", "deepfm"):  # the planner's start-up table, per operator
                    bench.log(planner_report(shape, batch, place_fields(fields, n, "mod"), whole[n],
                                             title=f"{model}, {Path(args.data).name}"))
                if (batch, model, n) in measure:
                    common = dict(model=model, batch_size=batch, epochs=1, max_steps=args.steps, data=args.data,
                                  split=args.split, embedding_dim=k, hidden=args.hidden)
                    for strategy in strategies:
                        runs[n].append((f"{model}-{strategy}-n{n}-b{batch}", strategy, row, predicted,
                                        {**benchlib.strategy_flags(strategy), **common}))
                rows.append(row)

    # the des.train runs: one launch each, or (--one-launch) all runs of a rank count in one launch
    for n, group in runs.items():
        if args.one_launch:
            summaries = bench.train_many(n, [(tag, flags) for tag, _, _, _, flags in group])
        else:
            summaries = {tag: bench.train(n, tag, **flags) for tag, _, _, _, flags in group}
        for tag, strategy, row, predicted, _ in group:
            s = summaries.get(tag)
            if s is None:
                continue
            key = strategy.replace("-", "_")
            row[f"{key}_measured"] = s["bytes_per_step"]  # mean over ranks
            row[f"{key}_measured_rank0"] = s["bytes_per_step_per_rank"][0]
            row[f"{key}_by_site"] = s["bytes_per_step_by_site"]
            row[f"{key}_steps"] = s["steps"]
            check = measured_check(s, predicted[key])
            row[f"{key}_check"], row[f"{key}_check_rank0"] = check["mean"], check["rank0"]
            row[f"{key}_worst_site_pct"] = 100.0 * check["worst_site"]
    for row in rows:
        if "des_partials_measured" in row and "alltoall_measured" in row:
            row["saving_measured"] = saving(row["des_partials_measured"], row["alltoall_measured"])
        for key in ("saving_analytic", "saving_measured", "saving_sparse_analytic"):
            if key in row:
                row[key + "_pct"] = 100.0 * row[key]

    id_columns = [("batch", "B", "d"), ("batches", "batches/epoch", "d"), ("unique_ids", "unique ids/batch", ",.0f"),
                  ("unique_per_sample", "per sample", ".1f")]
    id_columns += [(f"shard_unique_n{n}", f"per B/{n} shard", ",.0f") for n in ranks]
    id_columns += [("paper_unique", "paper uniq_feats", ",d")]
    columns = [("ranks", "N", "d"), ("batch", "B", "d"), ("model", "model", ""), ("P", "P", "d"),
               ("des_partials_measured", "DES partials meas. B/step", ",.0f"),
               ("des_partials_analytic", "DES partials analytic", ",.0f"),
               ("des_measured", "DES auto meas.", ",.0f"), ("des_analytic", "DES auto analytic", ",.0f"),
               ("des_replicated_measured", "DES repl. meas.", ",.0f"),
               ("des_replicated_analytic", "DES repl. analytic", ",.0f"),
               ("alltoall_measured", "a2a meas. B/step", ",.0f"), ("alltoall_analytic", "a2a analytic", ",.0f"),
               ("saving_measured_pct", "saving meas. %", ".1f"), ("saving_analytic_pct", "saving analytic %", ".1f"),
               ("saving_sparse_analytic_pct", "saving sparse-only %", ".1f"), ("paper_saving", "paper R %", ".1f")]
    check_columns = [("ranks", "N", "d"), ("batch", "B", "d"), ("model", "model", "")]
    for key, title in (("des", "DES auto"), ("des_partials", "DES partials"), ("des_replicated", "DES repl."),
                       ("alltoall", "a2a")):
        if key.replace("_", "-") in strategies:
            check_columns += [(f"{key}_predicted", f"{title} predicted", ",.0f"), (f"{key}_measured", f"{title} measured", ",.0f"),
                              (f"{key}_check", "meas./pred.", ".4f"), (f"{key}_check_rank0", "rank 0", ".4f"),
                              (f"{key}_worst_site_pct", "worst site %", ".2f")]
    rows.sort(key=lambda r: (r["ranks"], r["batch"], models.index(r["model"])))
    measured_rows = [r for r in rows if any(f"{key}_measured" in r for key in
                                            ("des", "des_partials", "des_replicated", "alltoall"))]
    shapes = {m: build_shape(m, fields, k, hidden) for m in models}
    notes = [
        benchlib.STRATEGY_NOTE + " Savings compare des-partials (data-parallel) with alltoall, as the paper's R.",
        "Bytes are what a rank SENDS per training step, mean over the ranks (summary.json's bytes_per_step), "
        f"over the first {args.steps} steps of epoch 0 (seed 0), with split {args.split} of the data "
        f"({len(store.split_rows('train')):,} training rows; evaluation traffic goes to eval_* sites, not counted). "
        "analytic = des/planner.py's plans (cheapest = des, all partials = des-partials, all exchange = alltoall) "
        "with the unique ids "
        "of all batches of epoch 0; predicted = the same with the unique ids of the measured batches (the first "
        f"{args.steps}): 'meas./pred.' should be 1.0000 (mean over ranks), 'rank 0' the same for rank 0 alone, "
        "'worst site %' the largest deviation of one Communicator site.",
        "DES: P = " + " / ".join(f"{shapes[m].buffer_width} ({m})" for m in models) + f" floats per sample (k={k}, "
        f"H1={hidden[0]}); alltoall: the pooled values of each block a model reads ({1 + k} floats per row with an "
        "order-1 and a k-wide block), plus the AllReduce of the dense parameters: "
        + ", ".join(f"{dense_params(shapes[m]):,} ({m})" for m in models) + ".",
        "'saving sparse-only' is the paper's definition of R: DES bytes vs the id/row/gradient exchange alone "
        "(alltoall without its dense-gradient AllReduce).",
        "Paper Table 2 is on Tencent's Company* data (about 950 unique feature values per sample, 147k-1.4M unique "
        "ids per batch, 4 nodes) and counts only the sparse weights (R_dnn includes the first-layer weights looked "
        "up by key); the shipped Criteo sample has 39 one-hot fields and only 32,852 rows, so a batch has at most "
        "39 ids per sample and few distinct ones, and our alltoall also AllReduces the replicated dense layers "
        "(1.8 MB/step at N=2 for W&D/DeepFM, whatever B). The DES buffer grows with B (401-410 floats per sample "
        "with H1=400) while a 39-field sample brings few new ids, so for W&D/DeepFM DES sends MORE than alltoall "
        "(negative saving) at " + "; ".join(
            f"N={n}: B >= {min(bs)}" for n in ranks
            if (bs := [r["batch"] for r in rows if r["ranks"] == n and r["model"] in ("wdl", "deepfm")
                       and r["saving_analytic"] < 0])) + " (analytic); for LR and FM it always sends less.",
        "Shared memory: bytes are counted with the bandwidth-optimal formulas (ring AllReduce 2(N-1)/N*S), "
        "not what MPICH's shared-memory transport physically copies.",
    ]

    def figure(plt):
        fig, axes = plt.subplots(1, len(ranks), figsize=(6 * len(ranks), 4.5), squeeze=False)
        colors = dict(zip(["lr", "fm", "wdl", "deepfm"], ["C0", "C1", "C2", "C3"]))
        for ax, n in zip(axes[0], ranks):
            for model in models:
                sel = [r for r in rows if r["ranks"] == n and r["model"] == model]
                xs = [r["batch"] for r in sel]
                for strategy, style, marker in (("des", "-", "o"), ("des_partials", "-.", "v"), ("des_replicated", ":", "^"),
                                                ("alltoall", "--", "s")):
                    ax.plot(xs, [r[f"{strategy}_analytic"] for r in sel], style, color=colors.get(model),
                            label=f"{model} {strategy} (analytic)")
                    meas = [(r["batch"], r[f"{strategy}_measured"]) for r in sel if f"{strategy}_measured" in r]
                    if meas:
                        ax.plot(*zip(*meas), marker, color=colors.get(model), fillstyle="none")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("global batch size B")
            ax.set_ylabel("bytes sent per step per rank")
            ax.set_title(f"N = {n} ranks (lines analytic, markers measured)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7, ncol=2)
        return fig

    bench.finish(rows, [("Unique ids per batch (train split, epoch 0)", id_columns, id_rows),
                        ("Bytes sent per step per rank, and the saving 1 - DES/alltoall", columns, rows),
                        ("The planner's prediction vs the Communicator's measured bytes (same batches)",
                         check_columns, measured_rows)],
                 notes, figure, extra={"unique_ids": id_rows})
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
