""".venv/bin/python scripts/bench_stream.py [--quick] [--files 20] [--rows-per-file 5000] [--churn 0.3] [--model deepfm] [--batch-size 256] [--evict-every 10] [--ttl 40] [--max-rows 2000]

Continuous training on two streams of ordered files, one rank, each run with and without bounded
tables (``des.train --stream``; progressive validation: each file is judged before it is trained on):

* **criteo-7**: the shipped Criteo sample cut into 7 ordered parts (its rows in file order);
* **drift-20**: ``--files`` files of ``--rows-per-file`` Criteo-shaped synthetic rows
  (``des.data synth --format tsv``, labels from a known FM) in which a share ``--churn`` of every
  categorical value is replaced by a value of that file only (ids that come, are seen in one file
  and go: a vocabulary that churns).

For each stream three jobs: unbounded (``--ttl`` far beyond the run: eviction runs, evicts nothing
and reports the table sizes), an age limit (``--ttl`` steps) and a row budget
(``--max-rows-per-field``), all evicting every ``--evict-every`` steps. Printed per file: the
progressive AUC and the rows held by all tables at the file's end.

Expect (a 2-core machine; a few minutes; recorded runs in ``docs/benchmarks.md``, "Continuous
training"): on drift-20 the unbounded tables grow with every file (about 30 % new ids a file at
the default churn) while the age limit and the budget hold them flat, at a progressive AUC within
0.01 of the unbounded run's; on criteo-7 the progressive AUC rises over the first files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402


def criteo_parts(folder: Path, parts: int) -> Path:
    """The shipped sample cut into ``parts`` ordered files ``part-00.tsv`` ..."""
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(benchlib.SAMPLE, "rt") as fh:
        lines = fh.readlines()
    for k, chunk in enumerate(np.array_split(np.arange(len(lines)), parts)):
        (folder / f"part-{k:02d}.tsv").write_text("".join(lines[i] for i in chunk))
    return folder


def drifting_stream(bench: benchlib.Bench, folder: Path, files: int, rows: int, churn: float, seed: int = 0) -> Path:
    """``files`` files of synthetic Criteo rows, a share ``churn`` of each file's categorical values
    replaced by values of that file only."""
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder.parent / "drift-source.tsv"
    bench.run_command([str(benchlib.PYTHON), "-m", "des.data", "synth", "--rows", str(files * rows), "--output",
                       str(raw), "--format", "tsv", "--seed", str(seed)], label="synth")
    rng = np.random.default_rng(seed)
    lines = raw.read_text().splitlines()
    for k in range(files):
        out = []
        for line in lines[k * rows:(k + 1) * rows]:
            cols = line.split("\t")
            for c in range(14, len(cols)):  # label, 13 integers, then 26 categorical hex values
                if cols[c] and rng.random() < churn:
                    cols[c] = f"{rng.integers(1 << 32):08x}"  # a fresh id: seen in this file only
            out.append("\t".join(cols))
        (folder / f"file-{k:02d}.tsv").write_text("\n".join(out) + "\n")
    raw.unlink()
    return folder


def run_stream(bench: benchlib.Bench, tag: str, stream: Path, args: argparse.Namespace, **bound) -> dict:
    flags = {"model": args.model, "stream": str(stream), "batch_size": args.batch_size,
             "evict_every": args.evict_every, "checkpoint_every": 0, **bound}
    summary = bench.train(1, tag, **flags)
    if summary is None:
        return {}
    records = [json.loads(line) for line in (bench.jobs / tag / "metrics.jsonl").read_text().splitlines()]
    files = [r for r in records if "progressive_auc" in r]
    sizes = [(r["step"], sum(r["rows"].values())) for r in records if "rows" in r and "evicted_rows" in r]
    per_file = []
    for i, f in enumerate(files):
        end = files[i + 1]["step"] if i + 1 < len(files) else summary["steps"]
        held = [rows for step, rows in sizes if step <= end]
        per_file.append({"file": f["file"], "progressive_auc": f["progressive_auc"], "rows_held": held[-1] if held
                         else None})
    return {"summary": summary, "per_file": per_file}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rows-per-file", type=int, default=5000)
    parser.add_argument("--churn", type=float, default=0.3)
    parser.add_argument("--model", default="deepfm")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--evict-every", type=int, default=10)
    parser.add_argument("--ttl", type=int, default=40, help="the age limit, steps")
    parser.add_argument("--max-rows", type=int, default=2000, help="the row budget per field")
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.rows_per_file = 5, 2000
    bench = benchlib.Bench(__file__, args)
    streams = {"criteo-7": criteo_parts(bench.folder / "criteo-7", 7),
               f"drift-{args.files}": drifting_stream(bench, bench.folder / f"drift-{args.files}", args.files,
                                                      args.rows_per_file, args.churn)}
    bounds = {"unbounded": {"ttl": 1 << 30}, f"ttl {args.ttl}": {"ttl": args.ttl},
              f"budget {args.max_rows}": {"max_rows_per_field": args.max_rows}}
    results = {(s, b): run_stream(bench, f"{s}-{b.split()[0]}", path, args, **flags)
               for s, path in streams.items() for b, flags in bounds.items()}
    rows, tables, means_notes = [], [], []
    for s in streams:
        per_bound = {b: results[(s, b)].get("per_file", []) for b in bounds}
        for i in range(max(len(v) for v in per_bound.values())):
            row = {"stream": s, "file": i}
            for b, files in per_bound.items():
                if i < len(files):
                    row[f"auc {b}"] = files[i]["progressive_auc"]
                    row[f"rows {b}"] = files[i]["rows_held"]
            rows.append(row)
        columns = [("file", "file", "")] + [(f"auc {b}", f"progressive AUC, {b}", ".4f") for b in bounds] + \
                  [(f"rows {b}", f"rows held, {b}", ",") for b in bounds]
        tables.append((f"{s}: per file, judged before training on it", columns, [r for r in rows if r["stream"] == s]))
        means = {b: (results[(s, b)].get("summary") or {}).get("progressive_auc_mean") for b in bounds}
        means_notes.append(f"{s}: progressive AUC mean (files after the first, by rows) " + ", ".join(
            f"{b} {m:.4f}" if m is not None else f"{b} n/a" for b, m in means.items()) + ".")
        bench.log(means_notes[-1])
    notes = [f"One rank, {args.model}, batch {args.batch_size}, evicting every {args.evict_every} steps; rows held = "
             "rows of all tables at the last eviction of the file (the unbounded run's TTL evicts nothing). "
             f"drift-{args.files}: {args.files} x {args.rows_per_file:,} synthetic rows, churn {args.churn}.",
             *means_notes]
    bench.finish(rows, tables, notes)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
