""".venv/bin/python scripts/bench_placement.py [--quick] [--data sample|synth|PATH] [--synth-rows 5000000] [--ranks 4,8] [--placements mod,balanced,split,split:all] [--speed-ranks 2,4] [--batch-size 4096] [--warmup 3] [--steps 10]

Measures what splitting fields by key buys (``des.train --placement``: ``mod`` and ``balanced``
place whole fields, ``split`` splits the fewest largest fields over every rank), in one run:

* **Table memory per rank** (every N of ``--ranks``, every placement): each rank's tables built as
  ``des.train`` builds them (sized from the data's distinct ids, ``--table-capacity 0``), then
  every id of the training split looked up into them, as one epoch's lookups insert them (no
  training: memory does not depend on it): the table bytes of every rank, the largest over the
  mean, next to the placement's prediction (its start-up report's). Runs in this process.
* **Peak RSS per rank and speed** (every N of ``--speed-ranks``, every placement): DeepFM at batch
  ``--batch-size``, ``--warmup`` + ``--steps`` steps per job (``--unadmitted init``: one shared
  out-of-vocabulary row per field cannot be split), samples/s of the timed steps, peak RSS and
  table bytes per rank (``summary.json``), bytes sent per step per rank measured and as the
  planner predicted it (the plan chosen by ``--plan auto``).

Expect (a 2-core machine; recorded runs in ``docs/benchmarks.md``, "Placement"): on the shipped
sample at N = 4 whole fields by ``mod`` leave the largest rank 1.7x the mean table memory,
``balanced`` and ``split`` 1.0 (it splits none there); on Criteo-shaped data, where a few fields
hold most ids, whole fields cannot go below the largest field's share, and ``split`` stays within
1.05 of the mean at N = 4 and 8. The planner's bytes per step equal the measured ones.

``--placements`` takes ``split:FIELDS`` too (``--split-fields``: ``all`` or ``NAME+NAME``), to
measure a split that the policy would not choose (on the shipped sample at N = 2 and 4 it splits
none: whole fields balance there).

``--data``: ``sample`` (the shipped Criteo sample), ``synth`` (``--synth-rows`` rows of
Criteo-shaped synthetic data: 39 fields, Kaggle Criteo's vocabularies, Zipf ids, generated once
into ``~/.cache/des/bench-synth-<rows>-s0-v1``, as ``python -m des.data synth`` writes it) or a path
des.train reads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402


def open_store(bench: benchlib.Bench, data: str, rows: int, cache: Path):
    """The store ``--data`` names (generated or prepared once) and the path des.train is given."""
    from des.data.build import open_dataset

    if data == "sample":
        return open_dataset(str(benchlib.SAMPLE), cache_dir=str(cache)), str(benchlib.SAMPLE)
    if data == "synth":
        path = cache / f"bench-synth-{rows}-s0-v1"
        if not (path / "manifest.json").is_file():
            from des.data.synth import default_config, synthesize_store

            bench.log(f"generating {rows:,} synthetic rows into {path}")
            synthesize_store(path, rows, default_config(seed=0), overwrite=True)
        return open_dataset(str(path)), str(path)
    return open_dataset(data, cache_dir=str(cache)), data


def filled_table_bytes(store, placement: list[list[int]], rank: int, batch: int = 65536) -> tuple[int, int]:
    """Table bytes and rows of ``rank`` once every id of the training split is in its tables."""
    from des.models import get_model
    from des.options import Optimizers, TableOptions
    from des.hashtable import AdaGrad, FTRL
    from des.placement import shares, whole_fields
    from des.data.batch_reader import BatchReader
    from des.strategies.components import FieldShard

    distinct = tuple(store.distinct_count(f) for f in range(store.num_fields))
    model = get_model("deepfm")(num_fields=store.num_fields, embedding_dim=8)
    optimizers = Optimizers(sparse={"linear": FTRL(0.1), "embedding": AdaGrad(0.1)}, dense=None)
    options = TableOptions(capacity=0, min_count=1, unadmitted="init", distinct=distinct)
    mine = shares(placement, rank)
    shards = [FieldShard(fields, model.blocks(), optimizers, seed=0, dtype=np.float32, tables=options, shares=part)
              for fields, part in ((whole_fields(placement, rank), None), (sorted(mine), mine)) if fields]
    reader = BatchReader(store, "train", fields=placement[rank], batch_size=batch, shuffle=False, drop_last=False)
    for step, ids in enumerate(reader):
        for shard in shards:
            shard.touch(ids, train=True, step=step)
    held = [shard.memory() for shard in shards]
    return sum(m["table_bytes"] for m in held), sum(m["rows"] for m in held)


def predicted_bytes(store, placement: list[list[int]]) -> list[float]:
    """The start-up report's estimate of every rank's table memory (distinct ids, the row layout)."""
    from des.placement import split_groups

    groups = {f: len(r) for f, r in split_groups(placement).items()}
    distinct = [store.distinct_count(f) for f in range(store.num_fields)]
    return [sum(-(-distinct[f] // groups.get(f, 1)) for f in fields) for fields in placement]


def policy_of(token: str, names: Sequence[str]) -> tuple[str, object]:
    """A ``--placements`` item: ``mod``, ``balanced``, ``split`` or ``split:FIELDS`` (``all`` or
    ``NAME+NAME``: ``--split-fields``) -> (policy, split fields)."""
    from des.placement import parse_split_fields

    policy, _, fields = token.partition(":")
    return policy, parse_split_fields(fields.replace("+", ","), names) if fields else "auto"


def policy_flags(token: str) -> dict[str, str]:
    policy, _, fields = token.partition(":")
    return {"placement": policy, **({"split_fields": fields.replace("+", ",")} if fields else {})}


def memory_rows(bench: benchlib.Bench, store, ranks: Sequence[int], placements: Sequence[str]) -> list[dict]:
    from des.placement import place_fields, split_groups

    distinct = [store.distinct_count(f) for f in range(store.num_fields)]
    rows = []
    for n in ranks:
        for policy in placements:
            try:
                name, split = policy_of(policy, store.field_names)
                placement = place_fields(store.num_fields, n, name, distinct, split)
            except Exception as exc:  # noqa: BLE001 - a placement that cannot hold N ranks
                bench.log(f"  N={n} {policy}: {exc}")
                continue
            start = time.perf_counter()
            measured = [filled_table_bytes(store, placement, r) for r in range(n)]
            table = np.array([m[0] for m in measured], dtype=np.float64)
            ids = np.array(predicted_bytes(store, placement), dtype=np.float64)
            row = {"ranks": n, "placement": policy, "split_fields": len(split_groups(placement)),
                   "max_over_mean": table.max() / table.mean(), "predicted_max_over_mean": ids.max() / ids.mean(),
                   "max_table_mib": table.max() / 2**20, "min_table_mib": table.min() / 2**20,
                   "mean_table_mib": table.mean() / 2**20, "table_mib_per_rank": [round(float(t) / 2**20, 1) for t in table],
                   "rows_per_rank": [m[1] for m in measured]}
            bench.log(f"  N={n} {policy}: max/mean {row['max_over_mean']:.3f} (predicted "
                      f"{row['predicted_max_over_mean']:.3f}), {row['split_fields']} split, tables "
                      f"{row['table_mib_per_rank']} MiB ({time.perf_counter() - start:.0f} s)")
            rows.append(row)
    return rows


def speed_rows(bench: benchlib.Bench, data: str, ranks: Sequence[int], placements: Sequence[str], batch: int,
               warmup: int, steps: int) -> list[dict]:
    rows = []
    for n in ranks:
        flags = {"model": "deepfm", "data": data, "batch_size": batch, "unadmitted": "init"}
        # bytes per step over whole jobs (a timed job's counters restart after its warm-up), one launch
        counted = bench.train_many(n, [(f"bytes-n{n}-{policy}", {**flags, **policy_flags(policy), "epochs": 0,
                                                                 "max_steps": 3, "eval_every": 3})
                                       for policy in placements])
        for policy in placements:
            summary = bench.steady(n, f"deepfm-n{n}-{policy}", warmup, steps, **policy_flags(policy), **flags)
            if summary is None or counted.get(f"bytes-n{n}-{policy}") is None:
                continue
            planner = counted[f"bytes-n{n}-{policy}"].get("planner") or {}
            measured = counted[f"bytes-n{n}-{policy}"].get("bytes_per_step")
            predicted = planner.get("predicted_bytes_per_step")
            tables = summary.get("table_bytes_per_rank") or [0]
            rss = summary.get("peak_rss_bytes_per_rank") or [0]
            rows.append({"ranks": n, "placement": policy, "samples_per_second": summary["steady"]["samples_per_second"],
                         "plan": ",".join(f"{k}={v}" for k, v in (planner.get("plan") or {}).items()),
                         "bytes_per_step": measured, "predicted_bytes_per_step": predicted,
                         "predicted_over_measured": predicted / measured if measured and predicted else None,
                         "max_peak_rss_mib": max(rss) / 2**20, "peak_rss_mib_per_rank": [round(r / 2**20) for r in rss],
                         "table_max_over_mean": max(tables) / (sum(tables) / len(tables)) if sum(tables) else None})
    base = {r["ranks"]: r["samples_per_second"] for r in rows if r["placement"] == placements[0]}
    for r in rows:
        r["speed_vs_" + placements[0]] = r["samples_per_second"] / base[r["ranks"]] if r["ranks"] in base else None
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="sample", help="sample, synth or a path (see the docstring)")
    parser.add_argument("--synth-rows", type=int, default=5_000_000)
    parser.add_argument("--ranks", default="4,8", help="rank counts of the table-memory measurement")
    parser.add_argument("--placements", default="mod,balanced,split",
                        help="mod, balanced, split or split:FIELDS (all or NAME+NAME), comma-separated")
    parser.add_argument("--speed-ranks", default="2,4", help="rank counts of the des.train jobs (empty: none)")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--cache", default=os.environ.get("DES_CACHE_DIR", str(Path.home() / ".cache" / "des")))
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.synth_rows, args.ranks, args.speed_ranks, args.steps = 200_000, "4", "2", 3
    bench = benchlib.Bench(__file__, args)
    placements = [p for p in args.placements.split(",") if p]
    store, data = open_store(bench, args.data, args.synth_rows, Path(args.cache))
    bench.log(f"data {data}: {store.num_rows:,} rows, {store.num_fields} fields, "
              f"{sum(store.distinct_count(f) for f in range(store.num_fields)):,} distinct ids")
    memory = memory_rows(bench, store, [int(n) for n in args.ranks.split(",") if n], placements)
    speed = speed_rows(bench, data, [int(n) for n in args.speed_ranks.split(",") if n], placements, args.batch_size,
                       args.warmup, args.steps)
    tables = [
        ("Table memory per rank once every training id is in the tables", [
            ("ranks", "N", ""), ("placement", "placement", ""), ("split_fields", "fields split", ""),
            ("max_over_mean", "max/mean", ".3f"), ("predicted_max_over_mean", "predicted max/mean", ".3f"),
            ("max_table_mib", "largest rank MiB", ".1f"), ("min_table_mib", "smallest rank MiB", ".1f")], memory),
        (f"DeepFM, batch {args.batch_size}: speed, peak RSS and bytes per step", [
            ("ranks", "N", ""), ("placement", "placement", ""), ("samples_per_second", "samples/s", ",.0f"),
            (f"speed_vs_{placements[0]}", f"vs {placements[0]}", ".2f"),
            ("max_peak_rss_mib", "peak RSS MiB (largest rank)", ",.0f"),
            ("table_max_over_mean", "tables max/mean", ".2f"), ("bytes_per_step", "bytes/step", ",.0f"),
            ("predicted_over_measured", "planner predicted / measured", ".3f"), ("plan", "plan", "")], speed),
    ]
    notes = [f"Data: {data} ({store.num_rows:,} rows). Table memory: this process builds each rank's tables and "
             "looks up every id of the training split into them; predicted = the start-up report's distinct ids "
             "per rank. Speed: des.train jobs of --warmup + --steps steps, --unadmitted init, samples/s of the "
             "timed steps."]
    bench.finish(memory + speed, tables, notes)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
