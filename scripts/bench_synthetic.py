""".venv/bin/python scripts/bench_synthetic.py [--quick] [--rows 2000000] [--vocab-scale 1.0] [--zipf-scale 1.0] [--ranks 2] [--ps-ranks 4] [--batch-size 4096] [--epochs 1] [--strategies des,alltoall,ps]

Shows des at a larger scale than the shipped sample: DeepFM trained for one epoch on synthetic
Criteo-shaped data (``des.data.synth``: 39 fields with the Kaggle Criteo vocabularies, up to 10M
ids per field, Zipf-distributed, labels from a known FM), under ``des`` and ``alltoall`` on
``--ranks`` ranks and ``ps`` on ``--ps-ranks`` ranks (default 4 = 1 server + 3 asynchronous
workers, so staleness is real), with the test AUC and logloss in one table with the oracle's (a row
``oracle``: the generator's true probabilities on the same test rows), training samples/s over the
whole epoch, bytes sent per step per rank, ps staleness, peak RSS and table rows per rank.

Expect (a 2-core machine, minutes per strategy; recorded runs in ``docs/benchmarks.md``,
"Synthetic data"): des and alltoall within 0.001 AUC, every strategy far below the oracle row (one
epoch sees most of the distinct ids only a few times); ps with 3 asynchronous workers at or below
des (stale dense weights).

``--train-flags`` adds des.train options to every job (``name=value``, ';'-separated: optimizer
specs hold commas), e.g. the compact rows ``table_dtype=bfloat16;embedding_optimizer=rowwise_adagrad:lr=0.01``.

A larger run, over ten million distinct ids (tables of several GiB per rank):

    .venv/bin/python scripts/bench_synthetic.py --rows 4000000 --zipf-scale 0.5

``--zipf-scale`` multiplies every field's Zipf exponent (1.0 = the Criteo-like defaults, 1.05 for
the big fields): 0.5 flattens the distributions so many more ids occur (at 2M rows: 2.4M distinct
ids at 1.0, roughly 8-9M at 0.5); ``--vocab-scale`` scales every vocabulary. The data are
generated once, in this process through ``des.data.synth`` (``default_config`` with the exponents
scaled, then ``synthesize_store``), into ``~/.cache/des/bench-synth-<rows>-s<seed>-v<vocab
scale>[-z<zipf scale>]`` and reused; with the default exponents the data
are the same as ``python -m des.data synth --rows R --seed S --vocab-scale V``. The figure shows
test AUC vs the oracle, samples/s and bytes/step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import benchlib


def synth_config(seed: int, vocab_scale: float, zipf_scale: float):
    """The generator's Criteo-like configuration with every vocabulary scaled by ``vocab_scale`` and
    every Zipf exponent multiplied by ``zipf_scale`` (smaller = flatter = more distinct ids)."""
    from des.data.synth import default_config

    if zipf_scale <= 0:
        raise ValueError(f"--zipf-scale must be positive, not {zipf_scale}")
    return default_config(seed=seed, vocab_scale=vocab_scale, zipf_scale=zipf_scale)


def store_name(rows: int, seed: int, vocab_scale: float, zipf_scale: float) -> str:
    return f"bench-synth-{rows}-s{seed}-v{vocab_scale:g}" + ("" if zipf_scale == 1.0 else f"-z{zipf_scale:g}")


def synthetic_store(bench: benchlib.Bench, rows: int, seed: int, vocab_scale: float, zipf_scale: float,
                    cache: Path) -> Path:
    path = cache / store_name(rows, seed, vocab_scale, zipf_scale)
    if not (path / "manifest.json").is_file():
        import time

        from des.data.synth import synthesize_store

        cache.mkdir(parents=True, exist_ok=True)
        bench.log(f"generating {rows:,} synthetic rows (vocab scale {vocab_scale:g}, Zipf scale {zipf_scale:g}) "
                  f"into {path}")
        start = time.perf_counter()
        try:
            synthesize_store(path, rows, synth_config(seed, vocab_scale, zipf_scale), overwrite=True)
        except Exception as exc:  # noqa: BLE001 - reported as a failed run
            raise benchlib.BenchError(f"synth: {type(exc).__name__}: {exc}") from exc
        bench.log(f"  generated in {time.perf_counter() - start:.0f} s")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--vocab-scale", type=float, default=1.0, help="scales every field's vocabulary")
    parser.add_argument("--zipf-scale", type=float, default=1.0,
                        help="multiplies every field's Zipf exponent (< 1: flatter, more distinct ids)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--model", default="deepfm")
    parser.add_argument("--strategies", default="des,alltoall,ps")
    parser.add_argument("--ranks", type=int, default=2, help="ranks for des and alltoall")
    parser.add_argument("--ps-ranks", type=int, default=4, help="ranks for ps: 1 server + the rest workers")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=0, help="cap the steps per job (0: whole epochs)")
    parser.add_argument("--train-flags", default="", help="more des.train options for every job, ';'-separated "
                        "name=value (e.g. 'table_dtype=bfloat16;embedding_optimizer=rowwise_adagrad:lr=0.01')")
    parser.add_argument("--cache", default=os.environ.get("DES_CACHE_DIR", str(Path.home() / ".cache" / "des")))
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows = 200_000
    bench = benchlib.Bench(__file__, args)
    try:
        data = synthetic_store(bench, args.rows, args.data_seed, args.vocab_scale, args.zipf_scale, Path(args.cache))
    except benchlib.BenchError as exc:
        bench.failures.append(str(exc))
        bench.finish([], [], [f"data generation failed: {exc}"])
        return 1
    manifest = json.loads((data / "manifest.json").read_text())
    oracle = manifest["synthetic"]["oracle"]
    distinct = sum(int(f.get("distinct", 0) or 0) for f in manifest["fields"]) if isinstance(
        manifest["fields"][0], dict) else None
    split_rows = " / ".join(f"{name} {manifest['split']['rows'][name]:,}" for name in ("train", "validation", "test"))
    rows = []
    for strategy in args.strategies.split(","):
        ranks = args.ps_ranks if strategy == "ps" else args.ranks
        flags = dict(model=args.model, **benchlib.strategy_flags(strategy), batch_size=args.batch_size, epochs=args.epochs, data=str(data),
                     eval_batch_size=16384)
        if args.max_steps:
            flags["max_steps"] = args.max_steps
        flags.update(item.split("=", 1) for item in filter(None, args.train_flags.split(";")))
        s = bench.train(ranks, f"{args.model}-{strategy}-n{ranks}", **flags)
        row = {"kind": "strategy", "model": args.model, "strategy": strategy, "ranks": ranks, "batch": args.batch_size,
               "oracle_auc": oracle["auc"], "oracle_logloss": oracle["logloss"]}
        if s is not None:
            row.update({k: s.get(k) for k in ("steps", "train_samples", "test_auc", "test_logloss", "samples_per_second",
                                              "bytes_per_step", "staleness_mean", "job_seconds", "load_average")})
            row["auc_gap"] = (oracle["auc"] - s["test_auc"]
                              if s.get("test_auc") is not None and oracle["auc"] is not None else None)
            row["peak_rss_mib_max"] = max(s["peak_rss_bytes_per_rank"]) / 2**20
            row["peak_rss_mib_per_rank"] = [round(r / 2**20) for r in s["peak_rss_bytes_per_rank"]]
            row["table_rows_per_rank"] = s.get("table_rows_per_rank")
            row["bytes_by_site"] = s.get("bytes_per_step_by_site")
        rows.append(row)
    oracle_row = {"kind": "oracle", "model": "FM (generator)", "strategy": "oracle (true probabilities)",
                  "test_auc": oracle["auc"], "test_logloss": oracle["logloss"], "auc_gap": 0.0,
                  "oracle_auc": oracle["auc"], "oracle_logloss": oracle["logloss"]}
    table_rows = [oracle_row] + rows
    columns = [("strategy", "strategy", ""), ("ranks", "N", "d"), ("steps", "steps", "d"),
               ("test_auc", "test AUC", ".4f"), ("auc_gap", "gap to oracle", ".4f"),
               ("test_logloss", "test logloss", ".4f"), ("samples_per_second", "samples/s", ",.0f"),
               ("bytes_per_step", "bytes sent/step/rank", ",.0f"), ("staleness_mean", "ps staleness", ".2f"),
               ("peak_rss_mib_per_rank", "peak RSS MiB per rank", ""), ("table_rows_per_rank", "table rows per rank", ""),
               ("job_seconds", "job s", ",.0f")]
    workers = args.ps_ranks - 1
    notes = [
        benchlib.STRATEGY_NOTE,
        f"Synthetic Criteo-shaped data: {args.rows:,} rows (split {split_rows}), vocabulary scale {args.vocab_scale:g} "
        f"(1.0 = the Kaggle Criteo distinct counts, up to 10.1M per field), Zipf exponents x {args.zipf_scale:g} "
        f"(1.0 = the generator's Criteo-like defaults), data seed {args.data_seed}; labels from a known FM (latent "
        f"dim {manifest['synthetic']['config'].get('latent_dim')}); the oracle row uses the true probabilities on the "
        f"same {oracle['rows']:,} test rows.",
        f"{args.model}, batch {args.batch_size}, {args.epochs} epoch(s), des.train defaults otherwise; des/alltoall on "
        f"{args.ranks} ranks, ps on {args.ps_ranks} = 1 server + {workers} asynchronous worker(s) (worker w trains "
        f"batches w, w+{workers}, ...; 'ps staleness' = mean dense pushes applied between a worker's pull and its "
        "push). samples/s is des.train's own figure: all training steps of the job but the first (tracing); ps: all "
        "workers' samples over the slowest worker's time. bytes/step count training traffic only: evaluation goes "
        "to eval_* call sites. Table rows per rank: des/alltoall hold each field's ids on its owner; ps holds all "
        "tables on the server (rank 0).",
        "Paper: Criteo 45M rows on 4 nodes; this is 2 cores and one epoch over a few million rows, so ids are seen "
        "a few times at most and the gap to the oracle is large for every strategy; what matters is that the "
        "three strategies see the same data and that des/alltoall agree.",
    ]
    if distinct:
        notes.append(f"Distinct ids in the data (all splits): {distinct:,}.")

    def figure(plt):
        done = [r for r in rows if r.get("test_auc") is not None]
        if not done:
            return None
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        names = [r["strategy"] for r in done]
        axes[0].bar(names, [r["test_auc"] for r in done], color="C0")
        axes[0].axhline(oracle["auc"], color="black", linestyle="--", label=f"oracle {oracle['auc']:.4f}")
        low = min([r["test_auc"] for r in done] + [oracle["auc"]])
        axes[0].set_ylim(low - 0.02, oracle["auc"] + 0.01)
        axes[0].set_ylabel("test AUC")
        axes[0].legend()
        axes[1].bar(names, [r["samples_per_second"] for r in done], color="C1")
        axes[1].set_ylabel("training samples/s")
        axes[2].bar(names, [r["bytes_per_step"] for r in done], color="C2")
        axes[2].set_yscale("log")
        axes[2].set_ylabel("bytes sent per step per rank")
        for ax in axes:
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(f"{args.model}, {args.rows:,} synthetic rows, N={args.ranks} (ps {args.ps_ranks}), "
                     f"batch {args.batch_size}")
        return fig

    bench.finish(table_rows, [("Synthetic Criteo-shaped data: test AUC and logloss vs the oracle", columns, table_rows)],
                 notes, figure, extra={"distinct_ids": distinct, "oracle": oracle})
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
