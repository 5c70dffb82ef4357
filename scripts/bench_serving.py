""".venv/bin/python scripts/bench_serving.py [--checkpoint RUN] [--model deepfm] [--requests 200]

Serving numbers of an exported model (``python -m des.export``): export time, SavedModel size next
to the checkpoint's size, latency of one request (median and p99 over ``--requests`` calls of
``serving_default`` with one row) and throughput on batches of 1024 rows (median of 20 calls), all
on rows of the shipped Criteo sample. Without ``--checkpoint`` it first trains ``--model`` with the
default sizes (DeepFM: embedding 8, hidden 400,400,400) for one epoch on the shipped sample, on one
rank. The SavedModel is loaded with plain ``tf.saved_model.load``; TF uses this machine's cores.

Expect (a 2-core machine; recorded runs in ``docs/benchmarks.md``, "Serving"): the SavedModel
well under half the checkpoint (no optimizer slots), one request in milliseconds, batches of 1024
at thousands of rows/s; other jobs on the machine cut the throughput several-fold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def requests(rows: int) -> dict:
    """The first ``rows`` rows of the shipped sample as a ``serving_default`` request."""
    import gzip

    import tensorflow as tf

    with gzip.open(REPO / "datasets" / "criteo_sample.txt.gz", "rt") as fh:
        lines = [next(fh).rstrip("\n").split("\t") for _ in range(rows)]
    out = {f"I{i + 1}": tf.constant([int(r[1 + i]) if r[1 + i] else -(2**63) for r in lines], tf.int64)
           for i in range(13)}
    out.update({f"C{i + 1}": tf.constant([r[14 + i] for r in lines]) for i in range(26)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--checkpoint", default="", help="run or checkpoint folder (default: train one)")
    parser.add_argument("--model", default="deepfm")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_serving-"))
    checkpoint = args.checkpoint
    if not checkpoint:
        checkpoint = str(work / "run")
        subprocess.run([sys.executable, "-m", "des.train", "--model", args.model, "--epochs", "1", "--no-progress",
                        "--output", checkpoint], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    from des.checkpoint import resolve_checkpoint
    from des.export import export

    info = export(checkpoint, work / "savedmodel")
    checkpoint_bytes = folder_bytes(resolve_checkpoint(checkpoint))

    import tensorflow as tf

    serve = tf.saved_model.load(str(work / "savedmodel")).signatures["serving_default"]
    batch = requests(1024)
    one = {k: v[:1] for k, v in batch.items()}
    for _ in range(5):  # warm-up
        serve(**one)
        serve(**batch)
    latencies = []
    for _ in range(args.requests):
        start = time.perf_counter()
        serve(**one)["probability"].numpy()
        latencies.append(time.perf_counter() - start)
    batch_seconds = []
    for _ in range(20):
        start = time.perf_counter()
        serve(**batch)["probability"].numpy()
        batch_seconds.append(time.perf_counter() - start)
    latencies.sort()
    print(f"model {info['model']['model']}, {info['rows']:,} rows, step {info['step']}")
    print(f"export: {info['seconds']:.1f} s")
    print(f"size: SavedModel {info['bytes'] / 2**20:.1f} MiB, checkpoint {checkpoint_bytes / 2**20:.1f} MiB "
          f"({info['bytes'] / checkpoint_bytes:.2f}x)")
    print(f"1 request: median {1000 * statistics.median(latencies):.2f} ms, "
          f"p99 {1000 * latencies[int(0.99 * (len(latencies) - 1))]:.2f} ms")
    print(f"batches of 1024: {1024 / statistics.median(batch_seconds):,.0f} rows/s "
          f"({1000 * statistics.median(batch_seconds):.1f} ms per batch)")
    print(f"files kept in {work}")
    import benchlib

    row = {"model": info["model"]["model"], "rows": info["rows"], "export_s": info["seconds"],
           "savedmodel_mib": info["bytes"] / 2**20, "checkpoint_mib": checkpoint_bytes / 2**20,
           "median_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
           "rows_per_s": 1024 / statistics.median(batch_seconds)}
    columns = [("model", "model", ""), ("rows", "table rows", ",d"), ("export_s", "export s", ".1f"),
               ("savedmodel_mib", "SavedModel MiB", ".1f"), ("checkpoint_mib", "checkpoint MiB", ".1f"),
               ("median_ms", "1 request median ms", ".2f"), ("p99_ms", "p99 ms", ".2f"),
               ("rows_per_s", "batches of 1024: rows/s", ",.0f")]
    print("\n" + benchlib.entry("bench_serving", benchlib.environment(), sys.argv[1:], [("", columns, [row])],
                                [f"{args.requests} one-row requests; 20 batches of 1024 rows; load average "
                                 f"{os.getloadavg()[0]:.2f}."]))


if __name__ == "__main__":
    main()
