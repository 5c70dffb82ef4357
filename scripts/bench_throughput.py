""".venv/bin/python scripts/bench_throughput.py [--quick] [--models lr,fm,wdl,deepfm] [--ranks 1,2,4] [--batch-size 4096] [--warmup 3] [--steps 10]

Shows the DES paper's Table 5 on this machine: training samples/s of LR, FM, W&D and DeepFM under
``des``, ``alltoall`` (N = 1, 2, 4) and ``ps`` (N = 2, 4: one server, N-1 asynchronous workers),
at the same global batch (default 4096), measured over a fixed number of steps after a warm-up
(the first steps trace the tf.functions and fill the tables: excluded), plus the peak RSS per rank.
Next to them the TF-only roofline for the models with a top network (W&D and DeepFM): the
replicated top network alone (DeepFM: FM combine + the MLP 400-400-400-1 behind the substituted
first layer, on the [B, 410] buffer; W&D: the same MLP on [B, 401]; forward + backward in one
tf.function) and, for reference, all of the model's dense compute on one process (local partials
of all 39 fields + top), at 2 threads (what one rank gets) and 1 thread (what each of 2 or 4 ranks
gets). LR and FM have no top network (the logit is a sum of the partials): the roofline table says
so instead of giving a number. The figure shows grouped bars (log scale) per model, the top-network
rooflines as short gray lines.

Expect (2-core machine, batch 4096): DeepFM des about 21k / 15k / 9k samples/s at N = 1 / 2 / 4
(falling with N: every des rank runs the replicated top network on the whole batch and the ranks
share 2 cores), alltoall about 21k / 21k / 19k (each rank runs B/N rows), ps about 14k at N = 2 (one
worker) and 27k at N = 4 (three asynchronous workers); W&D close to DeepFM; LR des about
120k / 100k / 100k. des at N = 1 stays below the roofline of all dense compute at 2 threads (about
36k samples/s for DeepFM), whose top-network-only part is about 50k (2 threads) / 28k (1 thread).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import benchlib

STRATEGY_RANKS = {"des": (1, 2, 4), "des-replicated": (1, 2, 4), "alltoall": (1, 2, 4), "ps": (2, 4)}


ROOFLINE_MODELS = ("wdl", "deepfm")  # the models with a top network (LR's and FM's top is a sum)
NO_TOP_NETWORK = {
    "lr": "LR: no top network (logit = sum of the 39 per-field partials + bias), so no TF-only roofline",
    "fm": "FM: no top network (logit = combine of the order-1 and order-2 partials), so no TF-only roofline",
}


def roofline_child(threads: int, batch: int, repeats: int, models: Sequence[str] = ROOFLINE_MODELS) -> dict:
    """Runs in its own process (TF threads must be set before the first op); prints JSON:
    ``{model: {"top": s, "dense": s}}`` (median seconds per forward + backward call)."""
    from des import runtime  # noqa: F401  (quiet TF)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return {name: _roofline_model(name, batch, repeats) for name in models}


def _roofline_model(name: str, batch: int, repeats: int) -> dict:
    import numpy as np
    import tensorflow as tf

    from des.models import DeepFM, WideAndDeep
    from des.substitutions.base import draw_param

    model = {"deepfm": DeepFM, "wdl": WideAndDeep}[name](num_fields=39, embedding_dim=8, hidden=(400, 400, 400))
    subs = model.substitutions()
    starts = np.concatenate([[0], np.cumsum([s.width for s in subs])]).astype(int).tolist()
    names = list(model.top_params())
    top = [tf.constant(draw_param(spec, 0, model.name, "top", n).astype(np.float32))
           for n, spec in model.top_params().items()]
    field = [tf.constant(v) for i, s in enumerate(subs) for v in s.init_field_params(0, range(39)).values()]
    rng = np.random.default_rng(0)
    buffer = tf.constant(rng.normal(0, 0.1, (batch, starts[-1])).astype(np.float32))
    labels = tf.constant((rng.random(batch) < 0.25).astype(np.float32))
    linear = tf.constant(rng.normal(0, 0.01, (batch, 39, 1)).astype(np.float32))
    emb = tf.constant(rng.normal(0, 0.01, (batch, 39, 8)).astype(np.float32))

    def logits_from(buf, params):
        outputs = [s.combine(buf[:, starts[i]:starts[i + 1]]) for i, s in enumerate(subs)]
        return model.top(dict(zip(names, params)), outputs)

    @tf.function
    def top_step(buf, y, params):
        with tf.GradientTape() as tape:
            tape.watch([buf, params])
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits_from(buf, params)))
        return tape.gradient(loss, [buf, params])

    @tf.function
    def dense_step(lin, e, y, fparams, params):
        with tf.GradientTape() as tape:
            tape.watch([lin, e, fparams, params])
            inputs = {"linear": lin, "embedding": e}
            parts, j = [], 0
            for s in subs:
                p = {}
                for pname in s.field_params():
                    p[pname] = fparams[j]
                    j += 1
                parts.append(s.local(inputs[s.block], p))
            buf = tf.concat(parts, axis=1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits_from(buf, params)))
        return tape.gradient(loss, [lin, e, fparams, params])

    result = {}
    for kind, call in (("top", lambda: top_step(buffer, labels, top)),
                       ("dense", lambda: dense_step(linear, emb, labels, field, top))):
        for _ in range(3):
            call()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            grads = call()
            _ = float(tf.reduce_sum(grads[0]))  # results are materialised
            times.append(time.perf_counter() - start)
        result[kind] = float(np.median(times))
    return result


def roofline(bench: benchlib.Bench, threads: int, batch: int, repeats: int, models: Sequence[str]) -> dict | None:
    cmd = [str(benchlib.PYTHON), __file__, "--roofline-child", str(threads), "--batch-size", str(batch),
           "--repeats", str(repeats), "--roofline-models", ",".join(models)]
    try:
        proc = bench.run_command(cmd, label=f"roofline ({threads} threads)", timeout=bench.timeout)
    except benchlib.BenchError as exc:
        bench.failures.append(str(exc))
        return None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ROOFLINE ")]
    return json.loads(lines[-1][len("ROOFLINE "):]) if lines else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lr,fm,wdl,deepfm")
    parser.add_argument("--strategies", default="des,des-replicated,alltoall,ps")
    parser.add_argument("--ranks", default="1,2,4", help="rank counts (ps uses those >= 2)")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3, help="steps (per worker for ps) not timed")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (per worker for ps)")
    parser.add_argument("--repeats", type=int, default=20, help="roofline: timed calls (median)")
    parser.add_argument("--roofline-child", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    parser.add_argument("--roofline-models", default=",".join(ROOFLINE_MODELS), help=argparse.SUPPRESS)
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.roofline_child:
        result = roofline_child(args.roofline_child, args.batch_size, args.repeats, args.roofline_models.split(","))
        print("ROOFLINE " + json.dumps(result), flush=True)
        return 0
    if args.quick:
        args.models, args.ranks, args.warmup, args.steps, args.repeats = "lr,deepfm", "1,2", 2, 3, 5
    models, strategies = args.models.split(","), args.strategies.split(",")
    ranks = [int(x) for x in args.ranks.split(",")]
    bench = benchlib.Bench(__file__, args)

    rows = []
    for model in models:
        for strategy in strategies:
            for n in ranks:
                if n not in STRATEGY_RANKS[strategy]:
                    continue
                s = bench.steady(n, f"{model}-{strategy}-n{n}", args.warmup, args.steps, model=model,
                                 batch_size=args.batch_size, **benchlib.strategy_flags(strategy))
                row = {"model": model, "strategy": strategy, "ranks": n, "batch": args.batch_size}
                if s is not None:
                    rss = s["peak_rss_bytes_per_rank"]
                    row.update({
                        "samples_per_second": s["steady"]["samples_per_second"],
                        "samples_per_second_des_train": s["samples_per_second"],
                        "timed_steps": s["steady"]["measured_steps"],
                        "ms_per_step": 1000 * args.batch_size / s["steady"]["samples_per_second"],
                        "peak_rss_mib_max": max(rss) / 2**20, "peak_rss_mib_per_rank": [round(r / 2**20) for r in rss],
                        "load_average": s["load_average"],
                        "staleness_mean": s.get("staleness_mean"),
                    })
                rows.append(row)
    for row in rows:  # speed-up over DES on one rank, and over alltoall at the same N
        for key, strategy, base_ranks in (("vs_des_n1", "des", 1), ("vs_alltoall", "alltoall", row["ranks"])):
            base = next((r for r in rows if r["model"] == row["model"] and r["strategy"] == strategy
                         and r["ranks"] == base_ranks), None)
            if base and base.get("samples_per_second") and row.get("samples_per_second"):
                row[key] = row["samples_per_second"] / base["samples_per_second"]

    roof_rows = []
    roof_models = [m for m in ROOFLINE_MODELS if m in models]
    for threads in (2, 1):
        r = roofline(bench, threads, args.batch_size, args.repeats, roof_models) if roof_models else None
        for model in roof_models:
            if r and model in r:
                title = {"wdl": "W&D", "deepfm": "DeepFM"}[model]
                roof_rows.append({"model": model, "kind": "top", "threads": threads,
                                  "what": f"{title} top network only (replicated in DES)", "ms": 1000 * r[model]["top"],
                                  "samples_per_second": args.batch_size / r[model]["top"]})
                roof_rows.append({"model": model, "kind": "dense", "threads": threads,
                                  "what": f"{title} all dense compute (39 fields' partials + top)",
                                  "ms": 1000 * r[model]["dense"], "samples_per_second": args.batch_size / r[model]["dense"]})
    roof_rows += [{"model": m, "kind": "none", "what": NO_TOP_NETWORK[m]} for m in models if m in NO_TOP_NETWORK]
    columns = [("model", "model", ""), ("strategy", "strategy", ""), ("ranks", "N", "d"),
               ("samples_per_second", "samples/s", ",.0f"), ("ms_per_step", "ms/step", ",.0f"),
               ("vs_des_n1", "vs DES N=1", ".2f"), ("vs_alltoall", "vs alltoall same N", ".2f"), ("samples_per_second_des_train", "des.train's samples/s", ",.0f"),
               ("peak_rss_mib_max", "peak RSS MiB/rank (max)", ",.0f"), ("peak_rss_mib_per_rank", "per rank", "")]
    roof_columns = [("what", "TF-only roofline", ""), ("threads", "threads", "d"), ("ms", "ms/step", ".1f"),
                    ("samples_per_second", "samples/s", ",.0f")]
    notes = [
        f"Global batch {args.batch_size}; samples/s over {args.steps} timed steps after {args.warmup} warm-up steps "
        "(ps: per worker). des/alltoall: training samples over rank 0's training wall time after the warm-up steps "
        "(validation excluded); ps: workers x batch / the first worker's time per step after warm-up (its phase "
        "timers). \"des.train's samples/s\" is the summary's own figure for the whole job, which leaves out only the "
        "first step (ps: all workers' samples / the slowest worker's time).",
        benchlib.STRATEGY_NOTE,
        "des: every rank computes the partials of its fields for the whole batch; alltoall: each rank "
        "takes B/N rows; ps: ranks 1..N-1 are asynchronous workers each taking every (N-1)-th batch, rank 0 serves "
        "all tables and dense weights (so N=2 is one worker).",
        "2 cores: each rank gets max(1, 2 // N) TF threads; N=4 puts 4 ranks (4 x ~0.6 GB of TF) on 2 cores, so "
        "ranks time-share cores and N=4 is correct but slow; nothing here can show scaling beyond 2 cores. "
        "The paper's Table 5 (4 nodes x 48 threads, 10 GbE; PS = DiFacto): LR 50,397 vs 78,205 samples/s, "
        "W&D 11,024 vs 49,837, DeepFM 10,560 vs 41,296 (PS vs DES).",
        "Roofline: the top network is what every DES rank repeats on the whole batch (DES samples/s <= it at the "
        "threads a rank has); 'all dense compute' is DES on one rank minus hash tables and pooling.",
        "Another engineer's tests may have shared the 2 cores during these runs (load average per job in results.csv).",
    ]

    def figure(plt):
        import numpy as np

        configs = [(s, n) for s in strategies for n in ranks if n in STRATEGY_RANKS[s]]
        fig, ax = plt.subplots(figsize=(max(8, 2.4 * len(models)), 4.8))
        width = 0.8 / max(len(configs), 1)
        for j, (strategy, n) in enumerate(configs):
            values = [next((r.get("samples_per_second") or 0 for r in rows
                            if r["model"] == m and r["strategy"] == strategy and r["ranks"] == n), 0) for m in models]
            ax.bar(np.arange(len(models)) + (j - (len(configs) - 1) / 2) * width, values, width,
                   label=f"{strategy} N={n}", color=f"C{list(benchlib.STRATEGY_FLAGS).index(strategy)}",
                   alpha=0.45 + 0.55 * (n / max(ranks)), edgecolor="black", linewidth=0.4)
        labelled = set()
        for r in roof_rows:
            if r["kind"] == "top" and r["model"] in models:
                x = models.index(r["model"])
                style = ":" if r["threads"] == 1 else "--"
                label = f"roofline: top network only, {r['threads']} thread(s)"
                ax.hlines(r["samples_per_second"], x - 0.45, x + 0.45, color="gray", linestyle=style, linewidth=1.2,
                          label=None if label in labelled else label)
                labelled.add(label)
        ax.set_xticks(np.arange(len(models)), models)
        ax.set_yscale("log")
        ax.set_ylabel(f"training samples/s (batch {args.batch_size})")
        ax.set_title("Throughput after warm-up, 2-core machine")
        ax.legend(fontsize=7, ncol=3)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        return fig

    bench.finish(rows + roof_rows, [("Training throughput", columns, rows), ("", roof_columns, roof_rows)], notes, figure)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
