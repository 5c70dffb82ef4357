""".venv/bin/python scripts/bench_prepare.py [--rows 2000000] [--workdir DIR]   (from the repository root)

Measures ``des.data prepare`` on generic tables against its Criteo path and against pandas, in one
run. It first writes the inputs (each by a child process): an Avazu-like CSV of ``--rows`` rows
(``des.data synth --schema avazu --format raw``: 24 columns, a ``%y%m%d%H`` hour, 21 string
categorical columns), the same rows as Parquet (written by pyarrow from that CSV), and a
synthetic raw Criteo TSV of as many rows (``des.data synth --format tsv``). Then each measurement
runs in a process of its own and prints one row of a table:

* prepare csv      ``prepare(..., schema="avazu")`` of the CSV: blocks of whole lines read ahead,
                   their pieces (plain: ASCII, unquoted) split by numba side by side with their
                   categorical text keyed in the same pass (``des/data/tokenizer.py``; any other
                   piece parsed by pyarrow and keyed over its Arrow buffers), validation, the store
* prepare parquet  the same rows and schema read from Parquet (runs of row groups side by side)
* prepare criteo   ``prepare`` of the Criteo TSV (the numba TSV path in pieces side by side, key scheme 1)
* pandas read_csv  ``pandas.read_csv`` of the same CSV alone (no hashing, nothing written)

``--rounds R`` (default 3) runs the four measurements R times in turn. Each row gives every round's
wall seconds of the work itself (the child's imports and a tiny warm-up run that loads the numba
kernels are not counted), their median, rows/s and MB/s of the input file as stored at the median,
rows/s over pandas's, and the child's peak RSS (``ru_maxrss`` from ``os.wait4``: the whole process,
imports included). A store is removed once its measurement is over, so the next one writes into
memory the system has handed out before: in a virtual machine whose memory has never been touched
since boot, the first store written there can take longer (on the 2-core VM, a new 368 MB file took
0.8 s to write where the same file written again after one was deleted took 0.07 s), so round 1 of
a fresh machine may stand apart.

``--chunk-rows N`` sets prepare's chunk (default 262144 rows). Data go to a temporary directory
(inside ``--workdir`` where given, created if missing) removed at the end, with ``--workdir`` if the
run created it: a second run into the same ``--workdir`` starts clean.

Prepare uses every core this process may use (``DES_DATA_THREADS`` sets how many); on a shared
machine the wall times move with the others' load, which the rounds' medians smooth.

**On ranks** (``--ranks 1,8``): ``des.data prepare`` on every rank of a job (``des/data/ranks.py``)
against one process. The inputs are an Avazu-like CSV and a Criteo TSV of ``--rows`` rows (``--kinds``
picks), each written as ``--parts`` pieces by child processes side by side (seeds 0, 1, ...) and
joined. For each kind and each rank count, ``mpiexec -n R`` (the venv's, else the first on PATH;
Open MPI is told to allow root, oversubscription and no binding) runs the
preparation after a warm-up on a few rows, timed on rank 0 between two barriers; each rank gives
its peak RSS. Before them the first job runs once, untimed (``--first-use``, default on: a
fresh virtual machine's first job writes into memory never used before and runs slower). A row:
the seconds, rows/s, the ratio to the first rank count's rows/s, the threads
of each rank (``DES_DATA_THREADS`` when set, else its share of the cores), the largest and mean
peak RSS of a rank, and whether the store is the first rank count's, file for file (sha256 of
every file). Then one rank again under ``taskset`` on as many cores as each rank of the largest
count has (``--one-rank-cores``; a column gives every row's ratio to it). Needs numpy, pandas, pyarrow, numba and mpi4py (no TensorFlow); the stores go to
the temporary directory (``--workdir``: where it goes; a tmpfs such as /dev/shm keeps the disk out of it).

What to look for (``--ranks 1,8 --rows 20000000`` on 16 cores): the stores identical, and the
ratio of 8 ranks to one; one rank has every core for its threads where 8 have two each, so
``DES_DATA_THREADS=2`` in the environment compares ranks at the same threads per rank. Even so, one
rank alone keeps about 2.6 cores busy (its main thread appends while two threads parse and key);
under ``taskset -c 0,1`` it has the two cores each of 8 ranks has. On the 16-core Xeon (2026-11-30)
8 ranks took 2.2-2.5 s for 20M CSV rows, 4.3-4.7x one rank on two cores (10.5-10.8 s), and 4.5-4.6
s for 20M Criteo rows, 5.2x (23.8 s); every rank hashes a run of a large file's 64 MiB blocks.

Expect (a 2-core machine with both cores free): the CSV path at 0.6-1.05x ``pandas.read_csv``'s
rows/s, as pandas' own time moves (the 2-core VM, medians of 3 rounds: 0.66x on 2026-12-01, 1.03x
on 2026-12-02). pandas 3 parses this all-integer
file at about 3.4M rows/s there and only parses: no validation, hashing or store, and it holds the
whole table where ``prepare`` holds a chunk or two. Expect Parquet at about the CSV path's speed,
and the Criteo path near 1M rows/s (its rows are 3x the bytes, its store 39 keys a row). With 16 cores (2026-11-30): CSV about 1.9-2.2M rows/s (its main
thread's appends bound it), Parquet 3.8-4.2M, Criteo 1.7-1.85M, pandas 0.5-0.65M there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # des, where it is not installed

import benchlib  # noqa: E402

from des.data.schema import load_schema  # noqa: E402

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent


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


def ranks_child(kind: str, source: str, output: str, schema: str, chunk_rows: int) -> None:
    """One job's measurement (every rank runs this): warm up on a few rows, time the preparation
    between barriers; rank 0 prints a JSON line (seconds, rows, each rank's peak RSS in bytes)."""
    import resource

    import numpy as np
    from mpi4py import MPI

    from des.data import prepare
    from des.data.parallel import threads

    comm = MPI.COMM_WORLD
    job = comm if comm.Get_size() > 1 else None
    warm = Path(output).parent / f"warm-{kind}-{comm.Get_size()}"
    small = Path(output).parent / f"small-{kind}{''.join(Path(source).suffixes)}"
    prepare(small, warm, schema=schema, overwrite=True, progress=False, comm=job)
    comm.Barrier()
    start = time.perf_counter()
    rows = prepare(source, output, schema=schema, chunk_rows=chunk_rows, overwrite=True, progress=False,
                   comm=job).num_rows
    comm.Barrier()
    seconds = time.perf_counter() - start
    peaks = np.zeros(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=np.int64), peaks)
    if comm.Get_rank() == 0:
        print(json.dumps({"rows": rows, "seconds": seconds, "rss": peaks.tolist(), "threads": threads()}), flush=True)


def launcher() -> tuple[list[str], dict[str, str]]:
    """``mpiexec`` (``benchlib.launcher``: the venv's, else on PATH), its flags and environment:
    Open MPI's to run as root, oversubscribed and unbound (each rank then takes its share of the
    cores)."""
    found = str(benchlib.MPIEXEC)
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
    except OSError:
        raise SystemExit(f"bench_prepare: cannot run {found}") from None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if "Open MPI" in version or "OpenRTE" in version or "PRRTE" in version:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
                   PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
        return [found, "--bind-to", "none"], env
    return [found], env


def write_joined(kind: str, rows: int, parts: int, path: Path) -> None:
    """``rows`` rows of ``kind`` (``csv``: Avazu-like; ``criteo``: TSV) at ``path``, written as
    ``parts`` pieces by child processes side by side (seed = the piece's number), then joined
    (a CSV's header once)."""
    counts = [rows // parts + (k < rows % parts) for k in range(parts)]
    pieces = [path.parent / f"{path.name}.part{k}" for k in range(parts)]
    what = ["--schema", "avazu", "--format", "raw"] if kind == "csv" else ["--format", "tsv"]
    children = [subprocess.Popen([PYTHON, "-m", "des.data", "synth", *what, "--rows", str(n), "--seed", str(k),
                                  "--output", str(piece)], stdout=subprocess.DEVNULL, env=launcher()[1])
                for k, (n, piece) in enumerate(zip(counts, pieces)) if n]
    if any(child.wait() for child in children):
        raise SystemExit(f"bench_prepare: writing the {kind} input failed")
    with open(path, "wb") as out:
        for k, piece in enumerate(p for p in pieces if p.exists()):
            with open(piece, "rb") as handle:
                if k and kind == "csv":
                    handle.readline()
                shutil.copyfileobj(handle, out, 1 << 24)
            piece.unlink()
    with open(path, "rb") as handle, open(path.parent / f"small-{kind}{''.join(path.suffixes)}", "wb") as small:
        small.writelines(line for _, line in zip(range(200), handle))


def store_digests(store: Path) -> dict[str, str]:
    from des.data.blocks import file_sha256

    return {p.name: file_sha256(p) for p in sorted(store.iterdir())}


def one_rank_cores(requested: int | None, ranks: Sequence[int]) -> int:
    """The cores the pinned one-rank job gets: ``requested``, else this process's usable cores over
    the largest rank count (what each of its ranks has); 0 where there is no ``taskset`` or the job
    would have every core anyway."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = requested if requested is not None else usable // max(ranks)
    return cores if 0 < cores < usable and shutil.which("taskset") else 0


def ranks_job(kind: str, count: int, cores: int, source: Path, output: Path, schema: str, chunk_rows: int
              ) -> dict[str, Any]:
    """One ``mpiexec -n count`` job of ``--ranks-child`` (under ``taskset`` on the first ``cores``
    cores when ``cores``): its JSON line."""
    command, env = launcher()
    pinned = ["taskset", "-c", f"0-{cores - 1}"] if cores else []
    process = subprocess.run([*pinned, *command, "-n", str(count), PYTHON, __file__, "--ranks-child", kind,
                              str(source), str(output), schema, str(chunk_rows)], stdout=subprocess.PIPE, text=True,
                             env=env)
    if process.returncode:
        raise SystemExit(f"bench_prepare: {count} ranks on {kind} failed with exit code {process.returncode}")
    return json.loads(process.stdout.strip().splitlines()[-1])


def on_ranks(args: argparse.Namespace, work: Path) -> None:
    """The ``--ranks`` measurement (module docstring)."""
    ranks = [int(r) for r in args.ranks.split(",")]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    pinned = one_rank_cores(args.one_rank_cores, ranks)
    jobs = [(count, 0) for count in ranks] + ([(1, pinned)] if pinned else [])
    inputs = {"csv": (work / "avazu.csv", "avazu"), "criteo": (work / "criteo.tsv", "criteo")}
    start = time.perf_counter()
    for kind in kinds:
        write_joined(kind, args.rows, args.parts, inputs[kind][0])
    sizes = ", ".join(f"{inputs[k][0].name} {inputs[k][0].stat().st_size / 1e6:,.1f} MB" for k in kinds)
    print(f"{args.rows:,} rows each; input sizes: {sizes} (written in {time.perf_counter() - start:.0f} s)", flush=True)
    if args.first_use:  # untimed: a fresh machine's first job writes into memory never used before (module doc)
        output = work / "store-first-use"
        ranks_job(kinds[0], jobs[0][0], jobs[0][1], inputs[kinds[0]][0], output, inputs[kinds[0]][1], args.chunk_rows)
        for store in (output, work / f"warm-{kinds[0]}-{jobs[0][0]}"):
            shutil.rmtree(store, ignore_errors=True)
        print(f"  first use: {kinds[0]} on {jobs[0][0]} rank(s) once, untimed", flush=True)
    table = []
    for kind in kinds:
        source, schema = inputs[kind]
        first: dict[str, Any] = {}
        for count, cores in jobs:
            output = work / f"store-{kind}-{count}"
            result = ranks_job(kind, count, cores, source, output, schema, args.chunk_rows)
            digests = store_digests(output)
            for store in (output, work / f"warm-{kind}-{count}"):
                shutil.rmtree(store, ignore_errors=True)
            rows_s = result["rows"] / result["seconds"]
            first = first or {"rows_s": rows_s, "digests": digests}
            rss = [x / 2**20 for x in result["rss"]]
            where = f"{count} (on {_cores(cores)})" if cores else str(count)
            table.append({"what": f"prepare {kind}", "ranks": where, "threads": result["threads"],
                          "seconds": result["seconds"], "rows_s": rows_s, "ratio": rows_s / first["rows_s"],
                          "rss_max": max(rss), "rss_mean": sum(rss) / len(rss),
                          "same": "yes" if digests == first["digests"] else "NO"})
            print(f"  {kind} on {where} rank(s): {result['seconds']:.2f} s, {rows_s:,.0f} rows/s, "
                  f"x{rows_s / first['rows_s']:.2f}, store {'identical' if digests == first['digests'] else 'DIFFERS'}",
                  flush=True)
        if pinned:
            base = table[-1]["rows_s"]
            for row in table[-len(jobs):]:
                row["pinned_ratio"] = row["rows_s"] / base
    print_ranks_entry(args, ranks, pinned, sizes, table)


def _cores(count: int) -> str:
    return f"{count} core{'s' if count > 1 else ''}"


def print_ranks_entry(args: argparse.Namespace, ranks: Sequence[int], pinned: int, sizes: str,
                      table: Sequence[dict[str, Any]]) -> None:
    columns = [("what", "what", ""), ("ranks", "ranks", ""), ("threads", "threads/rank", "d"),
               ("seconds", "seconds", ".2f"), ("rows_s", "rows/s", ",.0f"), ("ratio", f"x {ranks[0]} rank(s)", ".2f")]
    columns += [("pinned_ratio", f"x 1 rank on {_cores(pinned)}", ".2f")] if pinned else []
    columns += [("rss_max", "peak RSS MiB (largest rank)", ",.0f"), ("rss_mean", "(mean)", ",.0f"),
                ("same", "store identical", "")]
    notes = [f"{args.rows:,} rows each; input sizes: {sizes}; each rank count one mpiexec job, timed on rank 0 "
             "between barriers after a warm-up (imports not timed); peak RSS of each rank's whole process; "
             "identical: every file's sha256 equal to the first rank count's store"]
    if pinned:
        notes.append(f"1 (on {_cores(pinned)}): one rank under taskset on the first {_cores(pinned)}, as many as each rank "
                     f"of {max(ranks)} has; free, one rank keeps more cores busy than its threads")
    print(benchlib.entry("bench_prepare", benchlib.environment(), sys.argv[1:], [("", columns, table)], notes))


def measure(args: argparse.Namespace, work: Path) -> None:
    """The one-process table: the inputs written into ``work``, each measurement in a child."""
    inputs = write_inputs(args.rows, work)
    parquet_toml = work / "avazu-parquet.toml"
    parquet_toml.write_text(parquet_schema_toml())
    runs = [("prepare csv", "csv", inputs["csv"], "avazu"),
            ("prepare parquet", "parquet", inputs["parquet"], str(parquet_toml)),
            ("prepare criteo", "criteo", inputs["criteo"], "criteo"),
            ("pandas read_csv", "pandas", inputs["csv"], "-")]
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:,.1f} MB" for p in inputs.values())
    print(f"{args.rows:,} rows each; input sizes: {sizes}", flush=True)
    timed: dict[str, list[float]] = {label: [] for label, *_ in runs}
    counted: dict[str, int] = {}
    peaks: dict[str, float] = {label: 0.0 for label, *_ in runs}
    for round_number in range(1, args.rounds + 1):
        for label, kind, source, schema in runs:
            result, peak = run_child([kind, str(source), str(work / f"store-{kind}"), schema, str(args.chunk_rows)])
            timed[label].append(result["seconds"])
            counted[label] = result["rows"]
            peaks[label] = max(peaks[label], peak / 2**20)
            print(f"  round {round_number}, {label}: {result['seconds']:.2f} s", flush=True)
            shutil.rmtree(work / f"store-{kind}", ignore_errors=True)
    rows = []
    for label, kind, source, _ in runs:
        seconds = statistics.median(timed[label])
        rows.append({"what": label, "rounds": " / ".join(f"{s:.2f}" for s in timed[label]), "seconds": seconds,
                     "rows_s": counted[label] / seconds, "mb_s": source.stat().st_size / 1e6 / seconds,
                     "rss": peaks[label]})
    pandas_rate = rows[-1]["rows_s"]
    for row in rows:
        row["x_pandas"] = row["rows_s"] / pandas_rate
    columns = [("what", "what", ""), ("rounds", "rounds (s)", ""), ("seconds", "median s", ".2f"),
               ("rows_s", "rows/s", ",.0f"), ("x_pandas", "x pandas", ".2f"), ("mb_s", "MB/s", ".1f"),
               ("rss", "peak RSS MiB", ",.0f")]
    print(benchlib.entry("bench_prepare", benchlib.environment(), sys.argv[1:], [("", columns, rows)],
                         [f"{args.rows:,} rows each; input sizes: {sizes}; each measurement in a process of "
                          f"its own, {args.rounds} round(s) in turn, medians (imports and a warm-up not timed; "
                          "peak RSS of the whole process, the largest of the rounds)"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of each input (default 2,000,000)")
    parser.add_argument("--chunk-rows", type=int, default=1 << 18, help="prepare's chunk (default 262144)")
    parser.add_argument("--rounds", type=int, default=3, help="without --ranks: every measurement this many times, "
                        "in turn; the table gives each round and the medians (default 3)")
    parser.add_argument("--workdir", help="where the temporary directory of the inputs and stores goes (default: the "
                        "system's); removed at the end, this folder too if the run created it")
    parser.add_argument("--ranks", help="rank counts to compare, e.g. 1,8 (prepare on every rank of a job)")
    parser.add_argument("--kinds", default="csv,criteo", help="with --ranks: the inputs (csv, criteo)")
    parser.add_argument("--one-rank-cores", type=int, default=None,
                        help="with --ranks: also time one rank under taskset on this many cores (default: the usable "
                             "cores over the largest rank count; 0: not)")
    parser.add_argument("--first-use", action=argparse.BooleanOptionalAction, default=True,
                        help="with --ranks: the first job once, untimed, before the timed ones (a fresh machine's "
                             "first job runs slower)")
    parser.add_argument("--parts", type=int, default=max(1, min(os.cpu_count() or 1, 16)),
                        help="with --ranks: pieces each input is written in, side by side (default: the cores, <= 16)")
    parser.add_argument("--child", nargs=5, metavar=("KIND", "SOURCE", "OUTPUT", "SCHEMA", "CHUNK"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--ranks-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected at least 1")
    if args.child or args.ranks_child:
        kind, source, output, schema, chunk = args.child or args.ranks_child
        (child if args.child else ranks_child)(kind, source, output, schema, int(chunk))
        return
    created = args.workdir is not None and not Path(args.workdir).exists()
    if created:
        Path(args.workdir).mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-", dir=args.workdir))
    try:
        if args.ranks:
            on_ranks(args, work)
        else:
            measure(args, work)
    finally:
        shutil.rmtree(args.workdir if created else work, ignore_errors=True)


if __name__ == "__main__":
    main()
