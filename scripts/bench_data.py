""".venv/bin/python scripts/bench_data.py [--rows 1000000] [--batches 100] [--workdir DIR]   (from the repository root)

Prints one line per measurement, single process: wall-clock and CPU seconds, and the throughput
by each (on a shared machine the CPU figure is the steadier one):

* synth tsv      rows/s writing an N-row synthetic raw Criteo TSV (what ``synth --format tsv`` runs)
* prepare        rows/s and MB/s of ``prepare`` on that TSV (validate, transform, column store)
* synth store    rows/s writing an N-row synthetic store (one-hot, with oracle probabilities)
* synth store mh rows/s for the same with 3 multi-hot fields (0..4 ids per row)
* read 1 field   samples/s of BatchReader at batch 4096 reading 1 one-hot field (C3)
* read 39 fields samples/s reading all 39 fields of the prepared store
* read 39 mh     samples/s reading all 39 fields of the multi-hot store

Numba kernels are compiled (or loaded from cache) on a tiny warm-up run first, so the numbers
exclude compilation. Data go to a temporary directory (or ``--workdir``) removed at the end.

Expect (a 2-core machine, one process; recorded runs in ``docs/benchmarks.md``, "Data path"):
every figure far above the samples/s training consumes, so the data path is not the bottleneck;
reading one field faster than reading all 39, multi-hot slower than one-hot.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from des.data import BatchReader, prepare
from des.data.synth import default_config, synthesize_store, synthesize_tsv

RESULTS: list[dict] = []  # one row per measurement, for the docs/benchmarks.md entry
COLUMNS = [("what", "measurement", ""), ("wall", "wall s", ".2f"), ("cpu", "CPU s", ".2f"),
           ("per_wall", "per wall s", ",.0f"), ("per_cpu", "per CPU s", ",.0f"), ("unit", "unit", ""),
           ("mb_per_s", "MB/s (wall)", ",.1f")]


def timed(label: str, action, count: int, unit: str, megabytes: float | None = None):
    """Run ``action`` and print wall and CPU seconds and the throughput by both."""
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    result = action()
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    extra = f"  {megabytes / wall:7.1f} MB/s" if megabytes else ""
    print(
        f"{label:<15} {wall:7.2f} s wall {cpu:7.2f} s cpu  {count / wall:11,.0f} {unit} (wall)"
        f"  {count / cpu:11,.0f} {unit} (cpu){extra}",
        flush=True,
    )
    RESULTS.append({"what": label, "wall": wall, "cpu": cpu, "per_wall": count / wall, "per_cpu": count / cpu,
                    "unit": unit, "mb_per_s": megabytes / wall if megabytes else None})
    return result


def read_batches(store, fields, batches: int) -> int:
    reader = BatchReader(store, "train", fields, batch_size=4096, seed=0)
    reader.row_order  # the epoch permutation is computed once per epoch, not per batch
    count = 0
    for index in range(min(batches, len(reader))):
        count += reader.batch(index).size
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of synthetic data (default 1,000,000)")
    parser.add_argument("--batches", type=int, default=100, help="batches of 4096 to read per measurement")
    parser.add_argument("--workdir", help="directory for the data (default: a temporary one, removed)")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="des-bench-data-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        config = default_config(seed=0)
        multi_hot = default_config(seed=0, multi_hot_fields=("C6", "C14", "C24"), max_hot=4)
        # warm-up: compile / load every numba kernel on tiny inputs
        synthesize_tsv(workdir / "warm.tsv", 100, config)
        prepare(workdir / "warm.tsv", workdir / "warm")
        read_batches(synthesize_store(workdir / "warm_mh", 100, multi_hot), None, 1)

        rows = args.rows
        tsv = workdir / "synthetic.tsv"
        print(f"rows={rows:,}  batch=4096  workdir={workdir}")
        timed("synth tsv", lambda: synthesize_tsv(tsv, rows, config), rows, "rows/s")
        size_mb = tsv.stat().st_size / 1e6
        store = timed("prepare", lambda: prepare(tsv, workdir / "prepared"), rows, "rows/s", size_mb)
        timed("synth store", lambda: synthesize_store(workdir / "synth", rows, config), rows, "rows/s")
        mh_store = timed(
            "synth store mh", lambda: synthesize_store(workdir / "synth_mh", rows, multi_hot), rows, "rows/s"
        )
        samples = min(args.batches, len(store.split_rows("train")) // 4096) * 4096
        timed("read 1 field", lambda: read_batches(store, ["C3"], args.batches), samples, "samples/s")
        timed("read 39 fields", lambda: read_batches(store, None, args.batches), samples, "samples/s")
        timed("read 39 mh", lambda: read_batches(mh_store, None, args.batches), samples, "samples/s")
        store_mb = sum(p.stat().st_size for p in (workdir / "prepared").iterdir()) / 1e6
        print(f"input TSV {size_mb:.1f} MB; prepared store {store_mb:.1f} MB")
        print("\n" + benchlib.entry("bench_data", benchlib.environment(), sys.argv[1:], [("", COLUMNS, RESULTS)],
                                    [f"{rows:,} synthetic rows, batches of 4096, single process; input TSV "
                                     f"{size_mb:.1f} MB, prepared store {store_mb:.1f} MB."]), flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
