""".venv/bin/python scripts/bench_prepare.py [--rows 2000000] [--workdir DIR]   (from the repository root)

Measures ``des.data prepare`` on generic tables against its Criteo path and against pandas, in one
run. It first writes the inputs (each by a child process): an Avazu-like CSV of ``--rows`` rows
(``des.data synth --schema avazu --format raw``: 24 columns, a ``%y%m%d%H`` hour, 21 string
categorical columns), the same rows as Parquet (written by pyarrow from that CSV), and a
synthetic raw Criteo TSV of as many rows (``des.data synth --format tsv``). Then each measurement
runs in a process of its own and prints one row of a table:

* prepare csv      ``prepare(..., schema="avazu")`` of the CSV: blocks of whole lines read ahead,
                   their pieces parsed by pyarrow side by side, validation, key scheme 2 hashing
                   by numba over the Arrow buffers (fields side by side), the store
* prepare parquet  the same rows and schema read from Parquet (runs of row groups side by side)
* prepare criteo   ``prepare`` of the Criteo TSV (the numba TSV path in pieces side by side, key scheme 1)
* pandas read_csv  ``pandas.read_csv`` of the same CSV alone (no hashing, nothing written)

Each row gives the wall seconds of the work itself (the child's imports and a tiny warm-up run
that loads the numba kernels are not counted), rows/s, MB/s of the input file as stored, and the
child's peak RSS (``ru_maxrss`` from ``os.wait4``: the whole process, imports included).
``--chunk-rows N`` sets prepare's chunk (default 262144 rows). Data go to a temporary directory (or
``--workdir``) removed at the end.

Prepare uses every core this process may use (``DES_DATA_THREADS`` sets how many); on a shared
machine the wall times move with the others' load: run it a few times and take medians.

Expect (a 2-core machine with both cores free): the CSV path near ``pandas.read_csv`` of the same
file in rows/s (which only parses: no validation, hashing or store, and holds the whole table where
``prepare`` holds a chunk or two), Parquet faster than CSV, and the Criteo path within 1-2x of the
CSV path in rows/s (its rows are 3x the bytes, its store 39 keys a row).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

from des.data.schema import load_schema

PYTHON = sys.executable


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def parquet_schema_toml(name: str = "avazu") -> str:
    """A built-in schema as TOML text with ``[format] type = "parquet"``."""
    data = load_schema(name).to_dict()
    lines = [f"name = {_toml_value(data['name'] + '-parquet')}", "[format]", 'type = "parquet"', "[label]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in data["label"].items()]
    for section in ("columns", "derived"):
        for entry in data.get(section, []):
            lines.append(f"[[{section}]]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def run_child(args: list[str]) -> tuple[dict, int]:
    """Run ``python scripts/bench_prepare.py --child ...``; its JSON line and peak RSS (bytes)."""
    process = subprocess.Popen([PYTHON, __file__, "--child", *args], stdout=subprocess.PIPE, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"child {' '.join(args)} failed with exit code {process.returncode}")
    return json.loads(output.strip().splitlines()[-1]), usage.ru_maxrss * 1024


def child(kind: str, source: str, output: str, schema: str, chunk_rows: int) -> None:
    """One measurement in this process: warm up, then time the work; print a JSON line."""
    from des.data import prepare

    if kind == "pandas":
        import pandas as pd

        start = time.perf_counter()
        rows = len(pd.read_csv(source))
    else:
        warm = Path(output).parent / f"warm-{kind}"
        small = Path(output).parent / f"small-{kind}{''.join(Path(source).suffixes)}"
        if kind != "parquet":
            with open(source, "rb") as handle, open(small, "wb") as out:
                out.writelines(line for _, line in zip(range(200), handle))
        else:
            import pyarrow.parquet as pq

            pq.write_table(pq.ParquetFile(source).read_row_group(0).slice(0, 200), small)
        prepare(small, warm, schema=schema, overwrite=True, progress=False)
        start = time.perf_counter()
        rows = prepare(source, output, schema=schema, chunk_rows=chunk_rows, overwrite=True, progress=False).num_rows
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - start}))


def write_inputs(rows: int, work: Path) -> dict[str, Path]:
    csv_path, parquet_path, tsv_path = work / "avazu.csv", work / "avazu.parquet", work / "criteo.tsv"
    subprocess.run([PYTHON, "-m", "des.data", "synth", "--schema", "avazu", "--format", "raw", "--rows", str(rows),
                    "--output", str(csv_path)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([PYTHON, "-c", (
        "import sys, pyarrow as pa, pyarrow.csv as c, pyarrow.parquet as pq\n"
        "r = c.open_csv(sys.argv[1], convert_options=c.ConvertOptions("
        "column_types={n: pa.int64() if n == 'click' else pa.string() "
        "for n in c.open_csv(sys.argv[1]).schema.names}))\n"
        "w = pq.ParquetWriter(sys.argv[2], r.schema)\n"
        "for b in r: w.write_batch(b)\n"
        "w.close()\n"), str(csv_path), str(parquet_path)], check=True)
    subprocess.run([PYTHON, "-m", "des.data", "synth", "--format", "tsv", "--rows", str(rows), "--output",
                    str(tsv_path)], check=True, stdout=subprocess.DEVNULL)
    return {"csv": csv_path, "parquet": parquet_path, "criteo": tsv_path}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of each input (default 2,000,000)")
    parser.add_argument("--chunk-rows", type=int, default=1 << 18, help="prepare's chunk (default 262144)")
    parser.add_argument("--workdir", help="where to write the data (default: a temporary directory)")
    parser.add_argument("--child", nargs=5, metavar=("KIND", "SOURCE", "OUTPUT", "SCHEMA", "CHUNK"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, source, output, schema, chunk = args.child
        child(kind, source, output, schema, int(chunk))
        return
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        inputs = write_inputs(args.rows, work)
        parquet_toml = work / "avazu-parquet.toml"
        parquet_toml.write_text(parquet_schema_toml())
        runs = [("prepare csv", "csv", inputs["csv"], "avazu"),
                ("prepare parquet", "parquet", inputs["parquet"], str(parquet_toml)),
                ("prepare criteo", "criteo", inputs["criteo"], "criteo"),
                ("pandas read_csv", "pandas", inputs["csv"], "-")]
        sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:,.1f} MB" for p in inputs.values())
        print(f"{args.rows:,} rows each; input sizes: {sizes}", flush=True)
        rows = []
        for label, kind, source, schema in runs:
            result, peak = run_child([kind, str(source), str(work / f"store-{kind}"), schema, str(args.chunk_rows)])
            seconds = result["seconds"]
            rows.append({"what": label, "seconds": seconds, "rows_s": result["rows"] / seconds,
                         "mb_s": source.stat().st_size / 1e6 / seconds, "rss": peak / 2**20})
            print(f"  {label}: {seconds:.2f} s", flush=True)
            shutil.rmtree(work / f"store-{kind}", ignore_errors=True)
        columns = [("what", "what", ""), ("seconds", "seconds", ".2f"), ("rows_s", "rows/s", ",.0f"),
                   ("mb_s", "MB/s", ".1f"), ("rss", "peak RSS MiB", ",.0f")]
        print(benchlib.entry("bench_prepare", benchlib.environment(), sys.argv[1:], [("", columns, rows)],
                             [f"{args.rows:,} rows each; input sizes: {sizes}; each measurement in a process of "
                              "its own (imports and a warm-up not timed; peak RSS of the whole process)"]))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
