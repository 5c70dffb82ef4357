"""Shared helpers of the benchmark scripts (``scripts/bench_*.py`` import it; it is run as a script
only inside :meth:`Bench.steady`'s jobs, see :func:`train_with_warmup`).

* :func:`entry` -- a run's result as an entry of ``docs/benchmarks.md``: a title, the table of
  date, machine, command and commit, the result tables and the notes. Every script prints one at
  the end, to be pasted into that file as it is.
* :class:`Bench` -- one benchmark run: its folder ``runs/bench/<script>/<UTC time>/`` with
  ``config.json`` (the script's arguments), ``environment.json`` (machine and versions),
  ``log.txt`` (every child's command line and output), and at the end ``results.csv``,
  ``results.json``, ``table.md`` (the entry) and ``figure.png`` (left out, with a note, under
  ``--no-figure`` or where matplotlib does not import: checked when the run starts); a script may
  make ``--out DIR`` that folder itself (``add_common_arguments(out_is_run_folder=True)``).
  :meth:`Bench.train` runs one ``python -m des.train`` job under :data:`MPIEXEC` (the venv's, or
  ``mpiexec`` on PATH with this interpreter where there is no venv: :func:`launcher`) with a
  timeout and returns its ``summary.json``; :meth:`Bench.steady` runs one job of ``W + K`` steps
  whose throughput and phase timers leave out the first ``W`` (des.train's warm-up) and returns
  the steady-state ms per phase and samples/s of steps ``W+1 .. W+K`` (the first steps trace the
  tf.functions and fill the tables: seconds, not milliseconds); :meth:`Bench.steady_many` does
  that for several jobs in one launch; :meth:`Bench.run_together` runs commands at the same time.
* :func:`dataset` -- ``--data criteo|multihot|din|PATH`` (the multi-hot and DIN stores made on first use).
* :func:`markdown_table` / :func:`write_csv` -- the writers (tested in ``tests/test_bench_scripts.py``).
* :func:`machine_note` -- the line every table carries about this machine vs the paper's cluster.

Children get ``TF_CPP_MIN_LOG_LEVEL=2``; TensorFlow's oneDNN is des's choice in every child (des
jobs, the roofline and DeepCTR alike: ``des/_tensorflow_env.py``, on with AVX-512 where each rank
has a core of its own or computes in bf16) unless ``TF_ENABLE_ONEDNN_OPTS`` is set, which then holds for all; threads
are sized by ``des.runtime`` (cores // ranks intra-op threads per rank).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import csv
import datetime as _dt
import io
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from des._tensorflow_env import onednn_chosen_by_user

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"


def launcher(venv_bin: Path = VENV_BIN) -> tuple[Path, Path]:
    """``(mpiexec, python)`` of the jobs: the venv's where ``.venv/bin/mpiexec`` exists, else
    ``mpiexec`` on PATH and this interpreter (a machine without the venv, e.g. one whose packages
    come from PATH and PYTHONPATH)."""
    if (venv_bin / "mpiexec").exists():
        return venv_bin / "mpiexec", venv_bin / "python"
    return Path(shutil.which("mpiexec") or "mpiexec"), Path(sys.executable)


MPIEXEC, PYTHON = launcher()
SAMPLE = REPO / "datasets" / "criteo_sample.txt.gz"

PAPER_SETUP = ("paper: 4 servers x 2 x 24-core Xeon E5-2670v3 (48 threads each), 10 GbE without RDMA, "
               "TF 1.13 + OpenMPI 4.0.1, Criteo 45M rows")


# ---------------------------------------------------------------------------------------- strategies
#: The names the benchmark tables use -> des.train flags (:data:`STRATEGY_NOTE` says what each is).
STRATEGY_FLAGS: dict[str, dict[str, str]] = {
    "des": {"strategy": "des", "upper": "data-parallel", "plan": "auto"},
    "des-partials": {"strategy": "des", "upper": "data-parallel", "plan": "partials"},
    "des-measure": {"strategy": "des", "upper": "data-parallel", "plan": "measure"},
    "des-replicated": {"strategy": "des", "upper": "replicated", "plan": "partials"},
    "des-bf16": {"strategy": "des", "upper": "data-parallel", "plan": "auto", "compute_dtype": "bfloat16"},
    "alltoall": {"strategy": "alltoall"},
    "ps": {"strategy": "ps"},
    "persia-1": {"strategy": "persia", "staleness": "1"},
    "persia-4": {"strategy": "persia", "staleness": "4"},
    "persia-16": {"strategy": "persia", "staleness": "16"},
    "hierarchical-g1": {"strategy": "hierarchical", "group_size": "1"},
    "hierarchical-g2": {"strategy": "hierarchical", "group_size": "2"},
}
STRATEGY_NOTE = ("des = the default command: the upper network data-parallel (reduce-scatter of the partials by "
                 "rows, all-gather of their gradient, AllReduce of the top gradients) and --plan auto (the planner "
                 "exchanges an operator's inputs where that is cheaper in bytes, collective calls and per-id work: "
                 "on Criteo every operator, on heavy multi-hot data none); "
                 "des-partials = every operator as partial sums (--plan partials); des-measure = des with the "
                 "plan timed on the machine (--plan measure: the model's plan and the pure ones, 2 + 3 steps each, two rounds); des-replicated = the paper's step "
                 "(--upper replicated: one AllReduce, every rank runs the upper network on the whole batch); des-bf16 "
                 "= des with --compute-dtype bfloat16 (the upper network and the first FC layer's matmuls in bf16 on float32 master "
                 "weights); alltoall "
                 "= every operator exchanged (--plan exchange, TorchRec-style); persia-T = Persia's hybrid training "
                 "(alltoall's step, the sparse updates applied T steps late: --strategy persia --staleness T); "
                 "hierarchical-gG = Hierarchical Training (groups of G ranks, each its own upper network, EASGD every "
                 "4 steps: --strategy hierarchical --group-size G).")


def strategy_flags(name: str) -> dict[str, str]:
    """des.train flags of a benchmark strategy name (see :data:`STRATEGY_FLAGS`)."""
    if name not in STRATEGY_FLAGS:
        raise SystemExit(f"unknown strategy {name!r} (choose from {', '.join(STRATEGY_FLAGS)})")
    return dict(STRATEGY_FLAGS[name])


# ---------------------------------------------------------------------------------------- data
#: where generated benchmark data go (``--cache``): des's own cache folder
CACHE = os.environ.get("DES_CACHE_DIR", os.path.expanduser("~/.cache/des"))

#: ``--data multihot``: every categorical field multi-hot with 0-50 ids, vocabularies x20 (about 650
#: ids and 148 distinct ids per row block per sample at B=4096, N=4: the paper's kind of data, where
#: a sample has hundreds of feature values), 40,000 rows; generated once into the cache
MULTIHOT = {"rows": 40_000, "max_hot": 50, "vocab_scale": 20.0, "seed": 0}


def multihot_config():
    """The ``des.data.synth`` configuration of ``--data multihot``."""
    from des.data.synth import FIELD_NAMES, NUM_INT_FIELDS, default_config

    return default_config(seed=MULTIHOT["seed"], multi_hot_fields=FIELD_NAMES[NUM_INT_FIELDS:],
                          max_hot=MULTIHOT["max_hot"], vocab_scale=MULTIHOT["vocab_scale"])


#: ``--data din``: a behaviour sequence for DIN (``des.data.synth_schema`` of :func:`din_schema`):
#: a candidate ``item_id`` (100,000 ids), its ``history`` of up to ``max_length`` earlier items read
#: item by item (``pooling = "none"``: fields ``history@1..L`` sharing ``item_id``'s table), four
#: other one-hot fields and a mean-pooled multi-valued one; no dense features. Generated once into the cache
DIN_DATA = {"rows": 40_000, "max_length": 30, "seed": 0}


def din_schema(max_length: int = DIN_DATA["max_length"]):
    """The schema of ``--data din`` (the synthetic generator's vocabulary follows a column's place:
    10, 1,000, 100,000, 100, 10,000, ...; the history draws ``item_id``'s ids)."""
    from des.data.schema import Schema

    categorical = lambda name: {"name": name, "kind": "categorical"}  # noqa: E731
    return Schema.from_dict({
        "name": "din_bench", "format": {"type": "csv", "delimiter": ",", "header": True},
        "label": {"column": "click"},
        "columns": [categorical("gender"), categorical("user_id"), categorical("item_id"), categorical("category"),
                    categorical("zip_code"),
                    {"name": "genres", "kind": "multi_valued", "separator": "|", "pooling": "mean"},
                    {"name": "history", "kind": "sequence", "max_length": max_length, "pooling": "none",
                     "table": "item_id"}]}, source="bench din data")


def dataset(bench: Bench | None, data: str, cache: str, rows: int | None = None) -> str | None:
    """``--data``: None for the shipped Criteo sample (des.train's default), the multi-hot or the
    DIN store (made on first use; ``rows`` instead of their default count), or a store or data path
    as given."""
    if data == "criteo":
        return None
    if data not in ("multihot", "din"):
        return data
    spec = dict(MULTIHOT if data == "multihot" else DIN_DATA, **({"rows": rows} if rows else {}))
    name = ("bench-multihot-{rows}-s{seed}-h{max_hot}-v{vocab_scale:g}" if data == "multihot"
            else "bench-din-{rows}-s{seed}-l{max_length}").format(**spec)
    path = Path(cache) / name
    if not (path / "manifest.json").is_file():
        from des.data.synth import synthesize_store
        from des.data.synth_schema import synthesize_schema

        if bench is not None:
            bench.log(f"generating the {data} data into {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        if data == "multihot":
            synthesize_store(path, spec["rows"], multihot_config(), overwrite=True)
        else:
            synthesize_schema(path, spec["rows"], din_schema(spec["max_length"]), seed=spec["seed"], overwrite=True)
    return str(path)


# ---------------------------------------------------------------------------------------- writers
Column = tuple[str, str, str]  # (key in the row dict, header, format spec or "" for str())


def format_cell(value: Any, spec: str) -> str:
    """One table cell: ``None``/NaN as ``-``, numbers with ``spec`` (e.g. ``,.0f``), else ``str``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value).replace("|", "\\|")


def markdown_table(columns: Sequence[Column], rows: Iterable[Mapping[str, Any]]) -> str:
    """A GitHub Markdown table; numeric columns (a format spec given) are right-aligned."""
    header = "| " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|" + "|".join("---:" if spec else "---" for _, _, spec in columns) + "|"
    lines = [header, rule]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(row.get(key), spec) for key, _, spec in columns) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path | None, rows: Sequence[Mapping[str, Any]]) -> str:
    """All keys of all rows (first-seen order) as CSV; nested values as JSON. Returns the text and
    writes it to ``path`` when one is given."""
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()})
    text = buffer.getvalue()
    if path is not None:
        Path(path).write_text(text)
    return text


def positive_ints(text: str, flag: str) -> list[int]:
    """``"4096,512"`` -> ``[4096, 512]``: a flag's comma-separated positive integers, in the order given."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--{flag} must be comma-separated integers, not {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--{flag} must be positive integers, not {text!r}")
    return values


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value); NaN for none."""
    values = [v for v in values if v is not None]
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def steady_from_phases(summary: Mapping[str, Any], batch_size: int) -> float:
    """Samples/s from the phase timers of a job run with the timers restarted after warm-up: the
    batch over the time inside the training step (ps: the first worker's step; every worker trains
    a whole batch per step, so the job trains ``workers`` batches in that time)."""
    step_ms = sum((summary.get("ms_per_phase") or {}).values())
    workers = summary["ranks"] - int(summary.get("ps_servers", 1)) if summary["strategy"] == "ps" else 1
    return workers * batch_size * 1000.0 / step_ms if step_ms > 0 else math.nan


# ---------------------------------------------------------------------------------------- machine
def _run_text(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model() -> str:
    for line in _run_text(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def environment() -> dict[str, Any]:
    """What the numbers were measured on (``environment.json``)."""
    versions = {}
    for package in ("numpy", "numba", "tensorflow-cpu", "mpi4py", "mpich", "pandas", "matplotlib", "scikit-learn"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    try:
        import psutil

        memory = psutil.virtual_memory().total
    except ImportError:  # pragma: no cover
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    dirty = _run_text(["git", "status", "--porcelain", "--", "des"])
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "lscpu": _run_text(["lscpu"]),
        "memory_bytes": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "mpi": _run_text([str(MPIEXEC), "--version"]).splitlines()[:3],
        # a copy of the tree without its .git (another machine): the commit as the caller gives it
        "git_commit": _run_text(["git", "rev-parse", "HEAD"]) or os.environ.get("DES_BENCH_COMMIT", ""),
        "git_des_dirty": dirty.splitlines(),
        "load_average_at_start": os.getloadavg(),
        # des's default decides in every child (by its ranks on this machine) unless the user set it
        "tf_enable_onednn_opts": os.environ["TF_ENABLE_ONEDNN_OPTS"] if onednn_chosen_by_user() else "des default",
    }


def machine_description(env: Mapping[str, Any]) -> str:
    """``2 cores, <CPU> (AVX-512 BF16), 8 GiB``: what a benchmark's numbers depend on first."""
    flags = next((line.split(":", 1)[1].split() for line in str(env.get("lscpu", "")).splitlines()
                  if line.startswith("Flags:")), [])
    vector = ("AVX-512 BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags
              else "AVX2" if "avx2" in flags else "")
    memory = f", {env['memory_bytes'] / 2**30:.0f} GiB" if env.get("memory_bytes") else ""
    return f"{env.get('cores')} cores, {env.get('cpu')}" + (f" ({vector})" if vector else "") + memory


def machine_note(env: Mapping[str, Any] | None = None) -> str:
    env = env or {"cores": os.cpu_count(), "cpu": cpu_model(), "memory_bytes": 0}
    onednn = env.get("tf_enable_onednn_opts")
    onednn = ("" if onednn is None else ", TF oneDNN as des sets it in every job (on with AVX-512 where each rank has "
              "a core of its own or computes in bf16)" if onednn == "des default"
              else f", TF_ENABLE_ONEDNN_OPTS={onednn} in every job")
    return (f"Machine: {machine_description(env)}{onednn}, all ranks on one machine over shared memory "
            f"(MPICH); {PAPER_SETUP}.")


def entry(script: str, env: Mapping[str, Any], argv: Sequence[str],
          tables: Sequence[tuple[str, Sequence[Column], Sequence[Mapping[str, Any]]]], notes: Sequence[str]) -> str:
    """A run as an entry of ``docs/benchmarks.md``: ``### <script>, <date>``, the table of date,
    machine, command and commit, then the result tables (title, columns, rows) and the notes."""
    commit = (env.get("git_commit") or "unknown")[:10] + (" + uncommitted changes in des/" if env.get("git_des_dirty") else "")
    python = ".venv/bin/python" if PYTHON == VENV_BIN / "python" else PYTHON.name
    command = " ".join([python, f"scripts/{script}.py", *map(shlex.quote, argv)])
    run = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"), "machine": machine_description(env),
           "command": f"`{command}`", "commit": commit}
    parts = [f"### {script}, {run['date']}\n", markdown_table([(k, k, "") for k in run], [run])]
    for title, columns, rows in tables:
        if title:
            parts.append(f"**{title}**\n")
        parts.append(markdown_table(columns, rows))
    if notes:
        parts.append("\n".join(f"* {n}" for n in notes) + "\n")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------- runs
def add_common_arguments(parser: argparse.ArgumentParser, out_is_run_folder: bool = False) -> None:
    """``--quick``, ``--timeout``, ``--out`` and ``--no-figure``. ``out_is_run_folder``: ``--out DIR``
    is the run folder itself (every output in one folder, e.g. one whose files are fetched from
    another machine; the jobs' run folders then go to a temporary folder, removed at the end)."""
    parser.add_argument("--quick", action="store_true", help="a few-minute smoke-test version")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per des.train job (default 900)")
    if out_is_run_folder:
        parser.add_argument("--out", help="the run folder itself, new or empty: config, environment, log, results "
                                          "and table go there, the jobs to a temporary folder (default: a new "
                                          "runs/bench/<script>/<UTC time>/ with the jobs in it)")
        parser.set_defaults(out_is_run_folder=True)
    else:
        parser.add_argument("--out", default=str(REPO / "runs" / "bench"), help="parent of the run folders")
    parser.add_argument("--no-figure", action="store_true",
                        help="no figure.png (also left out, with a note, where matplotlib does not import)")


def figure_unavailable(args: Mapping[str, Any]) -> str | None:
    """Why a run draws no figure (None: it does): ``--no-figure``, or matplotlib missing. Checked
    when the run starts, before anything is measured, so a missing optional package never fails a
    run after its measurements."""
    if args.get("no_figure"):
        return "No figure (--no-figure)."
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "No figure: matplotlib does not import here (results.json and table.md hold every number)."
    return None


class BenchError(RuntimeError):
    pass


class Bench:
    """One benchmark run and its folder."""

    def __init__(self, script: str, args: argparse.Namespace) -> None:
        self.script = Path(script).stem
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.temporary_jobs = bool(getattr(args, "out_is_run_folder", False) and args.out)
        if self.temporary_jobs:  # --out is the run folder (add_common_arguments(out_is_run_folder=True))
            self.folder = Path(args.out)
            if self.folder.is_dir() and any(self.folder.iterdir()):
                raise SystemExit(f"--out {self.folder}: not empty (the run folder must be new or empty)")
            self.folder.mkdir(parents=True, exist_ok=True)
            self.jobs = Path(tempfile.mkdtemp(prefix=f"{self.script}-jobs-"))
            atexit.register(shutil.rmtree, self.jobs, ignore_errors=True)  # also when the run fails or stops
        else:
            self.folder = Path(args.out or REPO / "runs" / "bench") / self.script / stamp
            self.folder.mkdir(parents=True, exist_ok=False)
            self.jobs = self.folder / "jobs"
        self.timeout = float(getattr(args, "timeout", 900))
        self.args = vars(args)
        self.failures: list[str] = []
        self.started = time.perf_counter()
        (self.folder / "config.json").write_text(json.dumps(
            {"script": self.script, "argv": sys.argv, "arguments": self.args}, indent=1, default=str))
        self.env = environment()
        (self.folder / "environment.json").write_text(json.dumps(self.env, indent=1))
        self.log_path = self.folder / "log.txt"
        self.log(f"{self.script}: run folder {self.folder}" + (f", jobs in {self.jobs}" if self.temporary_jobs else ""))
        self.figure_note = figure_unavailable(self.args)
        if self.figure_note:
            self.log(self.figure_note)

    # -------------------------------------------------------------------- logging
    def log(self, text: str, echo: bool = True) -> None:
        with open(self.log_path, "a") as fh:
            fh.write(text.rstrip("\n") + "\n")
        if echo:
            print(text, file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    # -------------------------------------------------------------------- children
    def run_command(self, cmd: Sequence[str], *, timeout: float | None = None, env: Mapping[str, str] | None = None,
                    label: str = "") -> subprocess.CompletedProcess:
        """Run ``cmd`` (its own process group, killed as a group on timeout); its output (stdout and
        stderr together) goes to log.txt and is returned as ``.stdout``; raises on failure."""
        out = self.run_together([cmd], timeout=timeout, env=env, label=label)[0]
        return subprocess.CompletedProcess(cmd, 0, out, None)

    def run_together(self, cmds: Sequence[Sequence[str]], *, timeout: float | None = None,
                     env: Mapping[str, str] | None = None, label: str = "") -> list[str]:
        """Run ``cmds`` at the same time (each in its own process group; all killed as groups once
        ``timeout`` seconds have passed) and wait for all; each one's output (stdout and stderr
        together) goes to log.txt and is returned, in order; raises if any fails."""
        timeout = timeout or self.timeout
        full_env = dict(os.environ)
        full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        full_env.update(env or {})
        with contextlib.ExitStack() as stack:
            files, procs = [], []
            start = time.perf_counter()
            for cmd in cmds:
                self.log(f"$ {' '.join(map(str, cmd))}", echo=False)
                files.append(stack.enter_context(tempfile.TemporaryFile("w+")))
                procs.append(subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=full_env, stdout=files[-1],
                                              stderr=subprocess.STDOUT, text=True, start_new_session=True))
            timed_out = False
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.0, start + timeout - time.perf_counter()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
            if timed_out:
                for proc in procs:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            seconds = time.perf_counter() - start
            outs = []
            for proc, fh in zip(procs, files):
                fh.seek(0)
                outs.append(fh.read())
                self.log(outs[-1].rstrip() + f"\n[exit {proc.returncode}, {seconds:.1f} s]", echo=False)
        name = label or str(cmds[0][0])
        if timed_out:
            raise BenchError(f"{name}: timed out after {timeout:.0f} s")
        for proc, out in zip(procs, outs):
            if proc.returncode != 0:
                last = [line for line in out.splitlines() if line.strip()][-1:] or ["(no output)"]
                raise BenchError(f"{name}: exit {proc.returncode}: {last[0]}")
        return outs

    def train(self, ranks: int, tag: str, *, keep_checkpoints: bool = False, restart_timers_after: int = 0,
              **flags: Any) -> dict[str, Any] | None:
        """``mpiexec -n ranks python -m des.train --flag value ...``; returns summary.json (with the
        job's wall seconds and command), or None after logging the failure. With
        ``restart_timers_after=W`` the job runs through :func:`train_with_warmup`."""
        output = self.jobs / tag
        entry = ["-m", "des.train"] if not restart_timers_after else [
            __file__, "--restart-timers-after", str(restart_timers_after)]
        argv = [str(MPIEXEC), "-n", str(ranks), str(PYTHON), *entry, *train_flags(output, flags)]
        start = time.perf_counter()
        try:
            self.run_command(argv, label=f"{tag} ({ranks} ranks)")
            summary = json.loads((output / "summary.json").read_text())
        except (BenchError, OSError, ValueError) as exc:
            self.failures.append(str(exc))
            self.log(f"FAILED {exc}")
            return None
        finally:
            if not keep_checkpoints:
                shutil.rmtree(output / "checkpoints", ignore_errors=True)
        summary["job_seconds"] = time.perf_counter() - start
        summary["command"] = " ".join(argv)
        summary["load_average"] = os.getloadavg()[0]
        self._log_summary(tag, summary, restart_timers_after)
        return summary

    def _log_summary(self, tag: str, summary: dict[str, Any], restart_timers_after: int) -> None:
        if restart_timers_after:  # bytes_per_step divides all bytes by the steps after the restart
            summary["bytes_per_step"] = summary["bytes_per_step_by_site"] = None
            summary["restart_timers_after"] = restart_timers_after
        phases = " ".join(f"{k} {v:.0f}" for k, v in (summary.get("ms_per_phase") or {}).items())
        seconds = f"{summary['job_seconds']:.0f} s; " if "job_seconds" in summary else ""
        self.log(f"  {tag}: {summary['steps']} steps, {summary['samples_per_second']:,.0f} samples/s (job), "
                 + (f"{summary['bytes_per_step']:,.0f} B/step" if summary["bytes_per_step"] is not None
                    else "bytes not counted (timers restarted)")
                 + f", test AUC {summary.get('test_auc') or float('nan'):.4f}, "
                 f"ms {phases} ({seconds}{self.elapsed():.0f} s so far)")

    def train_many(self, ranks: int, runs: Sequence[tuple[str, Mapping[str, Any]]], *, warmup: int | None = None,
                   timeout: float | None = None, prefix: Sequence[str] = ()) -> dict[str, dict[str, Any] | None]:
        """Several ``des.train`` runs ``(tag, flags)`` in ONE ``mpiexec`` launch (this file run with
        ``--train-many SPEC``, see :func:`train_many`): a rank's start-up (TensorFlow's import,
        numba's kernels) is paid once. Each run has its own Communicator, run folder and
        summary.json, so bytes and results are those of separate launches; wall times are not (the
        later runs start warm). ``warmup=W``: each run's timers restart after its first W steps
        (as :func:`train_with_warmup`; None: des.train's own default). ``prefix``: what the launch
        runs under (``taskset -c 4,5``). A run that fails ends the launch: it and the runs after it
        have no summary. Returns tag -> summary (None for a run that did not finish)."""
        spec = self.jobs / f"launch-n{ranks}-{len(runs)}-runs-{runs[0][0]}.json"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(json.dumps({"warmup": warmup, "runs": [train_flags(self.jobs / tag, flags) for tag, flags in runs]},
                                   indent=1))
        try:
            self.run_command([*prefix, str(MPIEXEC), "-n", str(ranks), str(PYTHON), __file__, "--train-many", str(spec)],
                             label=f"{len(runs)} runs ({ranks} ranks)", timeout=timeout)
        except BenchError as exc:
            self.failures.append(str(exc))
            self.log(f"FAILED {exc}")
        out: dict[str, dict[str, Any] | None] = {}
        for tag, _ in runs:
            try:
                out[tag] = json.loads((self.jobs / tag / "summary.json").read_text())
                out[tag]["load_average"] = os.getloadavg()[0]
                self._log_summary(tag, out[tag], warmup or 0)
            except (OSError, ValueError):
                out[tag] = None
            shutil.rmtree(self.jobs / tag / "checkpoints", ignore_errors=True)
        return out

    def steady(self, ranks: int, tag: str, warmup: int, steps: int, **flags: Any) -> dict[str, Any] | None:
        """One job of ``warmup + steps`` steps (``--epochs 0``; per worker for ``ps``, whose
        ``--max-steps`` counts the batches of all workers) with its timers restarted after
        ``warmup`` steps (:func:`train_with_warmup`). Returns its summary plus ``steady``:
        ``ms_per_phase`` of the last ``steps`` steps (rank 0, or the first ps worker) and
        ``samples_per_second``: for des/alltoall des.train's own figure (rank 0's training samples
        over its training wall seconds, of the steps after ``warmup``; the job validates once,
        after its last step, so no validation interrupts the pipelined steps), for ps from the
        phase timers (:func:`steady_from_phases`)."""
        flags = steady_flags(ranks, warmup, steps, flags)
        return add_steady(self.train(ranks, tag, restart_timers_after=warmup, **flags), flags, steps)

    def steady_many(self, ranks: int, runs: Sequence[tuple[str, Mapping[str, Any]]], warmup: int, steps: int, *,
                    timeout: float | None = None, prefix: Sequence[str] = ()) -> dict[str, dict[str, Any] | None]:
        """:meth:`steady` of each run ``(tag, flags)``, all in ONE launch (:meth:`train_many`, its
        start-up paid once): tag -> summary with ``steady`` (None for a run that did not finish)."""
        runs = [(tag, steady_flags(ranks, warmup, steps, flags)) for tag, flags in runs]
        found = self.train_many(ranks, runs, warmup=warmup, timeout=timeout, prefix=prefix)
        return {tag: add_steady(found[tag], flags, steps) for tag, flags in runs}

    # -------------------------------------------------------------------- results
    def finish(self, rows: Sequence[Mapping[str, Any]], tables: Sequence[tuple[str, Sequence[Column], Sequence[Mapping[str, Any]]]],
               notes: Sequence[str], figure: Callable[[Any], None] | None = None, extra: Mapping[str, Any] | None = None) -> str:
        """Write results.csv/json and table.md (the run's :func:`entry` for ``docs/benchmarks.md``),
        print table.md to stdout, then write figure.png; returns table.md's text."""
        write_csv(self.folder / "results.csv", rows)
        (self.folder / "results.json").write_text(json.dumps(
            {"rows": list(rows), "failures": self.failures, "seconds": self.elapsed(), **(extra or {})},
            indent=1, default=str))
        all_notes = list(notes) + [machine_note(self.env), f"Run folder `{self.folder.name}`; "
                                   f"{self.elapsed() / 60:.1f} min; load average at start "
                                   f"{self.env['load_average_at_start'][0]:.2f}."]
        if self.failures:
            all_notes.append("FAILED jobs: " + "; ".join(self.failures))
        if figure is not None and self.figure_note:
            all_notes.append(self.figure_note)
        text = entry(self.script, self.env, sys.argv[1:], tables, all_notes)
        (self.folder / "table.md").write_text(text)
        print(text, flush=True)  # before the figure, which needs matplotlib ('.[bench]')
        if self.temporary_jobs:
            shutil.rmtree(self.jobs, ignore_errors=True)
        if figure is not None and not self.figure_note:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig = figure(plt)
            if fig is not None:  # a figure function may have nothing to draw
                fig.savefig(self.folder / "figure.png", dpi=110, bbox_inches="tight")
                plt.close(fig)
        return text


def steady_flags(ranks: int, warmup: int, steps: int, flags: Mapping[str, Any]) -> dict[str, Any]:
    """des.train flags of a :meth:`Bench.steady` job: ``warmup + steps`` steps (``--epochs 0``; per
    worker for ``ps``, whose ``--max-steps`` counts the batches of all workers), validation once at
    the end."""
    ps = flags.get("strategy") == "ps"
    workers = ranks - int(flags.get("ps_servers", 1)) if ps else 1
    flags = {"epochs": 0, **flags, "max_steps": (warmup + steps) * workers}
    if not ps:
        flags["eval_every"] = flags["max_steps"]
    return flags


def add_steady(summary: dict[str, Any] | None, flags: Mapping[str, Any], steps: int) -> dict[str, Any] | None:
    """A steady job's summary plus ``steady`` (see :meth:`Bench.steady`); None stays None."""
    if summary is None:
        return None
    ps = flags.get("strategy") == "ps"
    summary["ps_servers"] = int(flags.get("ps_servers", 1))
    batch = int(flags.get("batch_size", 1024))
    steady = {"ms_per_phase": summary["ms_per_phase"], "measured_steps": steps,
              "ms_per_phase_by_rank": summary.get("ms_per_phase_by_rank", {}),
              "ms_waiting_by_rank": summary.get("ms_waiting_by_rank", {}),
              "samples_per_second_from_phases": steady_from_phases(summary, batch)}
    steady["samples_per_second"] = steady["samples_per_second_from_phases"] if ps else summary["samples_per_second"]
    summary["steady"] = steady
    return summary


def train_flags(output: Path, flags: Mapping[str, Any]) -> list[str]:
    """des.train's command line for ``output`` and ``flags`` (``batch_size=512`` -> ``--batch-size
    512``; booleans as ``--flag`` / ``--no-flag``)."""
    argv = ["--no-progress", "--output", str(output)]
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv


def ensure_venv(bench: Bench, venv: Path, steps: Sequence[Sequence[str]], probe: str, skip: bool) -> str:
    """A venv of its own for an outside system, next to ``.venv`` (``.venv-deepctr``,
    ``.venv-torchrec``): created with this venv's Python if missing, then ``steps`` run in it (each
    the arguments after its ``python``, e.g. ``["-m", "pip", "install", ...]``); ``skip`` uses it as
    it is (and refuses a missing one). Then ``python -c probe``: its lines starting ``PROBE`` are
    logged and returned."""
    python = venv / "bin" / "python"
    if not python.exists():
        if skip:
            raise BenchError(f"{venv} does not exist (run without --skip-install)")
        bench.run_command([str(PYTHON), "-m", "venv", str(venv)], label="venv", timeout=300)
    if not skip:
        for step in steps:
            bench.run_command([str(python), *step], label="pip " + " ".join(step[3:]), timeout=1200)
    out = bench.run_command([str(python), "-c", probe], label="import probe", timeout=300).stdout
    found = " ".join(line for line in out.splitlines() if line.startswith("PROBE"))
    bench.log(found)
    return found


def train_many(spec: str) -> None:
    """``mpiexec -n N python scripts/benchlib.py --train-many SPEC``: ``des.train`` once per
    command line of SPEC's ``runs`` (JSON), one after the other in this launch (each
    ``des.train.main`` builds its own Communicator: byte counters start at zero), each with
    SPEC's ``warmup`` if given (:func:`train_with_warmup`)."""
    from des import train as des_train
    from des.collectives import run_main

    spec = json.loads(Path(spec).read_text())
    warmup = {} if spec["warmup"] is None else {"warmup_steps": spec["warmup"]}

    def main() -> int:
        for argv in spec["runs"]:
            des_train.main(list(argv), **warmup)
        return 0

    run_main(main, "des.train")


# ---------------------------------------------------------------------------------------- warm-up
def train_with_warmup(warmup: int, argv: Sequence[str]) -> None:
    """``mpiexec -n N python scripts/benchlib.py --restart-timers-after W <des.train flags>``:
    des.train with a warm-up of ``W`` steps (``des.train.main(warmup_steps=W)``): the phase timers
    (``ms_per_phase``) and the throughput meter (``samples_per_second`` in ``summary.json``)
    restart once a rank has trained ``W`` steps of this run (a ps worker counts its own steps).
    Only the reporting changes (``steps_this_run`` and ``bytes_per_step`` count every step)."""
    from des import train as des_train
    from des.collectives import run_main

    run_main(lambda: des_train.main(list(argv), warmup_steps=warmup), "des.train")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--restart-timers-after":
        train_with_warmup(int(sys.argv[2]), sys.argv[3:])
    elif len(sys.argv) == 3 and sys.argv[1] == "--train-many":
        train_many(sys.argv[2])
    else:
        raise SystemExit("benchlib is a library; the benchmarks are scripts/bench_*.py")
