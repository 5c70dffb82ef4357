""".venv/bin/python scripts/bench_communication.py [--quick] [--batch-sizes 512,1024,2048,4096,8192] [--ranks 2,4] [--measure SPEC] [--steps 3]

Shows the DES paper's Table 2 on the shipped Criteo sample: for each batch size, the unique ids
per batch (mean over the batches of epoch 0, from the data), and the bytes each rank SENDS per
training step under ``des`` (default ``--upper data-parallel``: reduce-scatter of the [B, P]
partials by rows, all-gather of their gradient, AllReduce of the top gradients), ``des-replicated``
(``--upper replicated``, the paper's step: one ring AllReduce of the [B, P] partials) and ``alltoall`` (ids,
rows and row gradients of remote unique ids with Alltoallv, plus the AllReduce of the dense
gradients), both **measured** (``bytes_per_step_by_site`` of short ``des.train`` runs) and
**analytic**, and the communication-saving ratio 1 - DES/alltoall, at N = 2 and 4 ranks.

Expect (bytes do not depend on the machine; measured on the 2-core machine): measured DES bytes
equal the analytic formulas exactly (replicated 2(N-1)/N·4·B·P; data-parallel the same for the
partials plus about 1.3 MB for the top gradients of W&D/DeepFM) and the alltoall rank-0 check is 1.000; about 5.2k / 8.9k / 14.9k /
24.7k / 40.6k unique ids per batch for B = 512 / 1024 / 2048 / 4096 / 8192 (10 falling to 5 per
sample); at N = 2 DES saves 83-92% vs alltoall for LR (92% at B = 512 falling to 83% at B = 8192),
about 70% for FM (72% at B = 4096), and is NEGATIVE (alltoall cheaper) for W&D/DeepFM from
B = 2048 on (DeepFM about -180% at B = 4096), because a Criteo sample has at most 39 ids while the
DES buffer carries 401-410 floats per sample; N = 4 shows the same pattern with smaller savings.

Analytic, per rank and step (8-byte keys, 4-byte floats):

* DES (data-parallel, rank 0): 2 (B - B//N) * 4 * P + 2 (N-1)/N * 4 * (1 + |θ_top|)
* DES (replicated):   2 (N-1)/N * 4 * B * P,  P = 1 (LR), 1+(k+1) (FM), 1+H1 (W&D), 1+(k+1)+H1 (DeepFM)
* alltoall:  U_r * (8 + 4 w)  [ids out, rows back]  +  U_r * 4 w  [row gradients]
             + 2 (N-1)/N * 4 * (1 + D)  [dense gradients and the loss, ring AllReduce]
  where U_r = (N-1)/N * (unique ids in a B/N-row shard, mean from the data) is the remote share,
  w the floats per table row (1 for LR, 1+k otherwise) and D the replicated dense parameters.

Analytic values are given for every batch size, rank count and model; ``des.train`` runs measure
the grid of ``--measure`` ("B,B:model,model:N,N;..."; default: all four models at B=4096 on 2 and 4
ranks, LR and DeepFM at the other batch sizes on 2 ranks: each run costs 15-35 s of start-up here).
A rank-0 check column divides the measured bytes by what rank 0 must send for exactly these
batches (counted from the data with the field placement, incl. the small count messages): 1.000
means the Communicator's counters match the data. The figure plots bytes/step against B (log).

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

import numpy as np

import benchlib

KEY_BYTES, FLOAT_BYTES = 8, 4
# The paper's Table 2 (Company* dataset, 4 nodes): batch -> (uniq feats, R_lr, R_fm(2), R_dnn) in %.
PAPER_TABLE2 = {512: (147_664, 99.769, 99.376, 90.310), 1024: (257_757, 99.735, 99.285, 86.226),
                2048: (448_814, 99.696, 99.179, 81.658), 4096: (789_511, 99.654, 99.066, 77.015),
                8192: (1_389_353, 99.607, 98.939, 72.264)}


# ------------------------------------------------------------------------------------ model sizes
def buffer_width(model: str, k: int = 8, h1: int = 400) -> int:
    """P: floats per sample in the DES step buffer."""
    return {"lr": 1, "fm": 1 + (k + 1), "wdl": 1 + h1, "deepfm": 1 + (k + 1) + h1}[model]


def row_width(model: str, k: int = 8) -> int:
    """w: floats per table row that alltoall moves (the linear weight, plus the k-vector)."""
    return 1 if model == "lr" else 1 + k


def dense_params(model: str, fields: int = 39, k: int = 8, hidden: Sequence[int] = (400, 400, 400)) -> int:
    """D: dense parameters alltoall replicates and AllReduces (output bias; for W&D/DeepFM the
    first FC kernel F*k*H1, its bias and the upper layers down to one unit)."""
    if model in ("lr", "fm"):
        return 1
    sizes = list(hidden) + [1]
    tower = hidden[0] + sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
    return 1 + fields * k * hidden[0] + tower


# ------------------------------------------------------------------------------------ formulas
def des_bytes(ranks: int, batch: int, width: int) -> float:
    """--upper replicated: ring AllReduce of the [B, P] float32 buffer, 2 (N-1)/N * 4 * B * P bytes
    sent per rank."""
    return 2.0 * (ranks - 1) / ranks * FLOAT_BYTES * batch * width


def top_params(model: str, fields: int = 39, k: int = 8, hidden: Sequence[int] = (400, 400, 400)) -> int:
    """|θ_top|: the weights above the substituted layers (all dense weights but the first FC kernel)."""
    return dense_params(model, fields, k, hidden) - (fields * k * hidden[0] if model in ("wdl", "deepfm") else 0)


def des_data_parallel_bytes(ranks: int, batch: int, width: int, top: int) -> float:
    """Rank 0, --upper data-parallel: the reduce-scatter of [B, P] by rows and the all-gather of its
    gradient (each sends all blocks but rank 0's own, B - B//N rows), plus the ring AllReduce of the
    top gradients and the loss: 2 (B - B//N) * 4 * P + 2 (N-1)/N * 4 * (1 + |θ_top|)."""
    own = batch // ranks  # rank 0's block: rows 0 .. B//N
    return 2.0 * (batch - own) * FLOAT_BYTES * width + 2.0 * (ranks - 1) / ranks * FLOAT_BYTES * (1 + top)


def sparse_exchange_bytes(remote_unique: float, width: int) -> float:
    """Ids (8 B) and rows (4w B) of the remote unique ids, and their row gradients (4w B)."""
    return remote_unique * (KEY_BYTES + FLOAT_BYTES * width) + remote_unique * FLOAT_BYTES * width


def alltoall_bytes(ranks: int, remote_unique: float, width: int, dense: int) -> float:
    """The sparse exchange plus the ring AllReduce of the dense gradients and the loss (1 + D floats)."""
    return sparse_exchange_bytes(remote_unique, width) + 2.0 * (ranks - 1) / ranks * FLOAT_BYTES * (1 + dense)


def saving(des: float, alltoall: float) -> float:
    return 1.0 - des / alltoall if alltoall else math.nan


# ------------------------------------------------------------------------------------ data
def id_statistics(store, batch_size: int, ranks: Sequence[int], first: int) -> dict:
    """Unique ids per global batch and per B/N-row shard, the remote share, and what rank 0 sends
    in exactly the first ``first`` batches (keys it requests, rows it serves), under ``mod``."""
    from des.data import BatchReader
    from des.placement import place_fields

    reader = BatchReader(store, "train", batch_size=batch_size, seed=0, epoch=0)
    fields = list(range(store.num_fields))
    owner = {n: np.empty(len(fields), np.int64) for n in ranks}
    for n in ranks:
        for r, owned in enumerate(place_fields(len(fields), n, "mod")):
            owner[n][owned] = r
    global_unique, shard_unique, remote_unique = [], {n: [] for n in ranks}, {n: [] for n in ranks}
    rank0 = {n: {"keys": 0, "rows_served": 0} for n in ranks}
    for index in range(len(reader)):
        batch = reader.batch(index)
        global_unique.append(sum(np.unique(batch.fields[f].keys).size for f in fields))
        for n in ranks:
            per = np.zeros((n, len(fields)), np.int64)  # unique ids of field f in rank r's shard
            for r in range(n):
                shard = batch.take(r * batch.size // n, (r + 1) * batch.size // n)
                per[r] = [np.unique(shard.fields[f].keys).size for f in fields]
            remote = np.array([per[r][owner[n] != r].sum() for r in range(n)])
            shard_unique[n].append(per.sum(axis=1).mean())
            remote_unique[n].append(remote.mean())
            if index < first:
                rank0[n]["keys"] += int(remote[0])
                rank0[n]["rows_served"] += int(sum(per[r][owner[n] == 0].sum() for r in range(1, n)))
    return {
        "batches": len(reader),
        "global_unique": float(np.mean(global_unique)),
        "global_unique_first": float(np.mean(global_unique[:first])),
        "shard_unique": {n: float(np.mean(v)) for n, v in shard_unique.items()},
        "remote_unique": {n: float(np.mean(v)) for n, v in remote_unique.items()},
        "rank0": {n: {k: v / min(first, len(reader)) for k, v in d.items()} for n, d in rank0.items()},
    }


def rank0_alltoall_bytes(ranks: int, fields: int, keys: float, rows_served: float, width: int, dense: int) -> float:
    """What rank 0 sends per step under alltoall, count messages included (see the engine)."""
    counts = (ranks - 1) * KEY_BYTES  # one per Alltoallv: the per-destination element counts
    field_counts = (ranks - 1) * fields * KEY_BYTES + counts  # per-field id counts, sent first
    return (field_counts + KEY_BYTES * keys + counts              # embedding_keys (+ :counts)
            + FLOAT_BYTES * width * rows_served + counts           # embedding_rows
            + FLOAT_BYTES * width * keys + counts                  # embedding_gradients
            + 2.0 * (ranks - 1) / ranks * FLOAT_BYTES * (1 + dense))  # dense_gradients


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
    hidden = [int(x) for x in args.hidden.split(",")]
    k = args.embedding_dim
    bench = benchlib.Bench(__file__, args)

    from des.data import open_dataset

    split = [float(x) for x in args.split.split(",")]
    store = open_dataset(args.data, split=split, seed=0)  # the store des.train --split makes
    fields = store.num_fields
    rows, id_rows = [], []
    for batch in batch_sizes:
        stats = id_statistics(store, batch, ranks, args.steps)
        paper = PAPER_TABLE2.get(batch)
        id_rows.append({"batch": batch, "batches": stats["batches"], "unique_ids": stats["global_unique"],
                        "unique_per_sample": stats["global_unique"] / batch,
                        **{f"shard_unique_n{n}": stats["shard_unique"][n] for n in ranks},
                        "paper_unique": paper[0] if paper else None})
        bench.log(f"B={batch}: {stats['global_unique']:,.0f} unique ids per batch")
        for n in ranks:
            for model in models:
                p, w, d = buffer_width(model, k, hidden[0]), row_width(model, k), dense_params(model, fields, k, hidden)
                remote = (n - 1) / n * stats["shard_unique"][n]
                row = {
                    "batch": batch, "ranks": n, "model": model, "P": p, "row_width": w, "dense_params": d,
                    "unique_ids": stats["global_unique"], "shard_unique": stats["shard_unique"][n],
                    "remote_unique_formula": remote, "remote_unique_data": stats["remote_unique"][n],
                    "des_analytic": des_data_parallel_bytes(n, batch, p, top_params(model, fields, k, hidden)),
                    "des_replicated_analytic": des_bytes(n, batch, p),
                    "alltoall_analytic": alltoall_bytes(n, remote, w, d),
                    "alltoall_rank0_expected": rank0_alltoall_bytes(n, fields, stats["rank0"][n]["keys"],
                                                                    stats["rank0"][n]["rows_served"], w, d),
                }
                row["saving_analytic"] = saving(row["des_analytic"], row["alltoall_analytic"])
                # The paper's R counts the sparse exchange only (no dense-gradient AllReduce).
                row["alltoall_sparse_analytic"] = sparse_exchange_bytes(remote, w)
                row["saving_sparse_analytic"] = saving(row["des_analytic"], row["alltoall_sparse_analytic"])
                if paper:
                    row["paper_saving"] = {"lr": paper[1], "fm": paper[2], "wdl": paper[3]}.get(model)
                if (batch, model, n) in measure:
                    common = dict(model=model, batch_size=batch, epochs=1, max_steps=args.steps, data=args.data,
                                  split=args.split, embedding_dim=k, hidden=args.hidden)
                    for strategy in ("des", "des-replicated", "alltoall"):
                        s = bench.train(n, f"{model}-{strategy}-n{n}-b{batch}", **benchlib.strategy_flags(strategy),
                                        **common)
                        if s is not None:
                            key = strategy.replace("-", "_")
                            row[f"{key}_measured"] = s["bytes_per_step_per_rank"][0]  # rank 0's
                            row[f"{key}_by_site"] = s["bytes_per_step_by_site"]
                            row[f"{key}_steps"] = s["steps"]
                    if "des_measured" in row and "alltoall_measured" in row:
                        row["saving_measured"] = saving(row["des_measured"], row["alltoall_measured"])
                    for key in ("des", "des_replicated"):
                        if f"{key}_measured" in row:
                            row[f"{key}_check"] = row[f"{key}_measured"] / row[f"{key}_analytic"]
                    if "alltoall_measured" in row:
                        row["alltoall_check"] = row["alltoall_measured"] / row["alltoall_rank0_expected"]
                for key in ("saving_analytic", "saving_measured", "saving_sparse_analytic"):
                    if key in row:
                        row[key + "_pct"] = 100.0 * row[key]
                rows.append(row)

    id_columns = [("batch", "B", "d"), ("batches", "batches/epoch", "d"), ("unique_ids", "unique ids/batch", ",.0f"),
                  ("unique_per_sample", "per sample", ".1f")]
    id_columns += [(f"shard_unique_n{n}", f"per B/{n} shard", ",.0f") for n in ranks]
    id_columns += [("paper_unique", "paper uniq_feats", ",d")]
    columns = [("ranks", "N", "d"), ("batch", "B", "d"), ("model", "model", ""), ("P", "P", "d"),
               ("des_measured", "DES meas. B/step", ",.0f"), ("des_analytic", "DES analytic", ",.0f"),
               ("des_replicated_measured", "DES repl. meas.", ",.0f"),
               ("des_replicated_analytic", "DES repl. analytic", ",.0f"),
               ("alltoall_measured", "a2a meas. B/step", ",.0f"), ("alltoall_analytic", "a2a analytic", ",.0f"),
               ("saving_measured_pct", "saving meas. %", ".1f"), ("saving_analytic_pct", "saving analytic %", ".1f"),
               ("saving_sparse_analytic_pct", "saving sparse-only %", ".1f"), ("paper_saving", "paper R %", ".1f"), ("alltoall_check", "a2a rank-0 check", ".3f"),
               ("des_check", "DES check", ".3f"), ("des_replicated_check", "DES repl. check", ".3f")]
    rows.sort(key=lambda r: (r["ranks"], r["batch"], models.index(r["model"])))
    notes = [
        benchlib.STRATEGY_NOTE + " Savings compare des (data-parallel) with alltoall.",
        "Bytes are what one rank SENDS per training step (rank 0's counters), averaged over the first "
        f"{args.steps} steps of epoch 0 (seed 0), with split {args.split} of the shipped sample "
        f"({len(store.split_rows('train')):,} training rows; evaluation traffic goes to eval_* sites, not counted); analytic = the formulas of the module docstring with the "
        "unique-id counts of the data (mean over all batches of epoch 0, so they can differ from the measured "
        "first steps by a few %). 'a2a rank-0 check' = measured / exact rank-0 bytes for the same batches.",
        f"DES: P = 1 / {buffer_width('fm', k)} / {buffer_width('wdl', k, hidden[0])} / "
        f"{buffer_width('deepfm', k, hidden[0])} floats per sample (LR / FM / W&D / DeepFM; k={k}, H1={hidden[0]}). "
        f"alltoall: w = 1 (LR) or {1 + k} floats per row; dense params D = 1 (LR, FM) or "
        f"{dense_params('wdl', fields, k, hidden):,} (W&D, DeepFM: first FC {fields}x{k}x{hidden[0]} + upper layers).",
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
                for strategy, style, marker in (("des", "-", "o"), ("des_replicated", ":", "^"), ("alltoall", "--", "s")):
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
                        ("Bytes sent per step per rank, and the saving 1 - DES/alltoall", columns, rows)],
                 notes, figure, extra={"unique_ids": id_rows})
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
