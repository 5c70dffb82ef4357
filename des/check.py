"""Public conformance checks, in the spirit of scikit-learn's ``check_estimator``: run them on your
own model, substitution or strategy.

    .venv/bin/python -m des.check --model deepfm --strategy des --ranks 1,2,3
    .venv/bin/python -m des.check --model fwlr --plugins examples/field_weighted_lr.py --strategy alltoall
    .venv/bin/python -m des.check --model deepfm --data movielens.csv --schema examples/movielens.toml --plan exchange

Expect ``des.check: ok`` and one line per rank count with the largest difference found (about
1e-16 .. 1e-13 relative in float64). For each rank count it launches the venv's ``mpiexec -n N`` (else the
one on PATH), trains K steps (``--steps``, default 20) in float64 on the shipped Criteo sample (or ``--data``)
and compares with the 1-rank run: every validation prediction, every table row (keys, values,
optimizer slots, Adam's per-row step counts) and every dense weight and its optimizer state must
agree to ``--rtol`` (1e-9) relative to the largest magnitude of each array. Admission counts and
last-seen steps are bookkeeping, not parameters, and are not compared. It exits 1 with one line
per failure.

A strategy whose model depends on N (``ps``: its asynchronous workers; ``hierarchical``: its groups,
``Strategy.exact_over_ranks``) is not expected to match across N; for it the check says so and
checks instead that 2 ranks under ``Strategy.des_equivalent_flags`` train exactly what ``des`` trains
on one rank: one ps server and one worker (nothing is stale), one hierarchical group of 2 ranks.

:func:`check_model` checks a model's declarations in-process, without MPI (see
:mod:`des.models.conformance`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from des.config import SHIPPED_SAMPLE
from des.errors import ArgumentParser, DesError

BOOKKEEPING = ("count", "last_seen")  # table columns that are not parameters


class CheckFailed(DesError):
    """N ranks did not train what 1 rank trains."""


@dataclass(frozen=True)
class Case:
    """One training to compare with a 1-rank run."""

    model: str
    strategy: str = "des"
    data: str = str(SHIPPED_SAMPLE)
    dtype: str = "float64"
    flags: tuple[str, ...] = ()  # further des.train flags (e.g. "--placement", "balanced")
    plugins: str = ""
    #: rank counts to compare (empty: those given to :func:`check`; a strategy not exact over ranks: 2)
    ranks: tuple[int, ...] = ()
    #: the 1-rank run to compare with is this strategy's (empty: the same strategy; a strategy
    #: not exact over ranks: ``des``)
    reference_strategy: str = ""
    #: the 1-rank run's flags, where they differ (a strategy's own options the reference does not
    #: take, e.g. ``--group-size``: its run is then shared with the cases that have those flags)
    reference_flags: tuple[str, ...] | None = None
    #: tolerance (0: the one given to :func:`check`)
    rtol: float = 0.0
    #: ``"all"`` or ``"predictions"`` (float32 with Adam: only predictions are held to 1e-5)
    compare: str = "all"

    @property
    def name(self) -> str:
        """Identifies the training (not the comparison), so one run serves several comparisons."""
        digest = hashlib.sha256(json.dumps([self.data, self.flags, self.plugins]).encode()).hexdigest()[:8]
        return f"{self.model}-{self.strategy}-{self.dtype}-{digest}"

    def reference(self) -> "Case":
        return replace(self, strategy=self.reference_strategy or self.strategy, ranks=(1,), reference_strategy="",
                       flags=self.flags if self.reference_flags is None else self.reference_flags, reference_flags=None,
                       rtol=0.0, compare="all")


@dataclass
class Comparison:
    case: Case
    ranks: int
    max_difference: float = 0.0
    arrays: int = 0
    failures: list[str] = field(default_factory=list)
    dtypes: dict[str, Any] = field(default_factory=dict)  # of the N-rank run's arrays
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # of the arrays compared
    losses: list[float] = field(default_factory=list)  # the 1-rank run's training losses


def check(cases: Sequence[Case], ranks: Sequence[int] = (1, 2, 3), *, steps: int = 20, batch_size: int = 64,
          rtol: float = 1e-9, workdir: str | Path | None = None, timeout: float = 900,
          ) -> list[Comparison]:
    """Train every case on 1 rank and on its rank counts (one ``mpiexec`` launch per rank count for
    all cases) and compare. Returns one :class:`Comparison` per case and rank count > 1."""
    from des.strategies import get_strategy

    resolved = []
    for case in cases:
        cls = get_strategy(case.strategy)
        if not cls.exact_over_ranks and not case.ranks:  # 2 ranks training what des trains on 1
            case = replace(case, ranks=(2,), flags=case.flags + cls.des_equivalent_flags(2))
        resolved.append(replace(case, ranks=tuple(sorted(set(case.ranks or ranks) - {1})),
                                reference_strategy=case.reference_strategy or ("" if cls.exact_over_ranks else "des")))
    wanted: dict[int, dict[str, Case]] = {}
    for case in resolved:
        wanted.setdefault(1, {})[case.reference().name] = case.reference()
        for n in case.ranks:
            wanted.setdefault(n, {})[case.name] = case
    with tempfile.TemporaryDirectory(prefix="des-check-", dir=workdir) as tmp:
        root = Path(tmp)
        _run_jobs(wanted, root, steps, batch_size, timeout)
        return [_compare(case, n, root / "n1" / case.reference().name, root / f"n{n}" / case.name, case.rtol or rtol)
                for case in resolved for n in case.ranks]


def _run_jobs(wanted: dict[int, dict[str, Case]], root: Path, steps: int, batch_size: int, timeout: float) -> None:
    """One ``mpiexec`` job per rank count, training its cases into ``root / f"n{N}"``. All at once where
    the machine has a core for every rank; else one after the other (MPI ranks poll while they wait:
    jobs sharing cores slow each other down, 1.06x the time of the exactness tests on 2 cores)."""
    together = sum(wanted) <= (os.cpu_count() or 1)
    jobs: list[tuple[int, subprocess.Popen]] = []
    try:
        for n, group in sorted(wanted.items()):
            jobs.append((n, _launch(n, list(group.values()), root / f"n{n}", steps, batch_size)))
            if not together:
                _finish(n, jobs[-1][1], root / f"n{n}", timeout)
        for n, job in jobs if together else []:
            _finish(n, job, root / f"n{n}", timeout)
    finally:
        for _, job in jobs:
            if job.poll() is None:  # mpiexec and every rank it started
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()


def _launch(ranks: int, cases: list[Case], out: Path, steps: int, batch_size: int) -> subprocess.Popen:
    """Start the ``mpiexec -n ranks`` job that trains ``cases`` into ``out``."""
    out.mkdir(parents=True)
    (out / "cases.json").write_text(json.dumps([asdict(c) for c in cases]))
    mpiexec = Path(sys.executable).parent / "mpiexec"  # the venv's; else the one on PATH
    if not mpiexec.exists():
        mpiexec = Path(shutil.which("mpiexec") or mpiexec)
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, "-m", "des.check", "--worker", str(out),
           "--steps", str(steps), "--batch-size", str(batch_size)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if ranks >= (os.cpu_count() or 1):
        env["NUMBA_NUM_THREADS"] = "1"
    with open(out / "stderr.txt", "wb") as stderr:  # a file: a pipe nobody reads yet could fill and stall the job
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)


def _finish(ranks: int, job: subprocess.Popen, out: Path, timeout: float) -> None:
    """Wait for a job of :func:`_launch` (``timeout`` seconds from now); a one-line error if it fails."""
    try:
        job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{ranks} rank(s): the training job did not finish within {timeout:.0f} s") from None
    if job.returncode != 0:
        stderr = (out / "stderr.txt").read_text(errors="replace")
        lines = [line for line in stderr.splitlines() if "error:" in line] or stderr.strip().splitlines()
        raise CheckFailed(f"{ranks} rank(s): the training job failed: {lines[0] if lines else job.returncode}")


def _worker(out: Path, steps: int, batch_size: int) -> None:
    """Inside the job: train each case ``steps`` steps and dump what the comparison reads."""
    from des import runtime
    from des.checkpoint import save_checkpoint
    from des.collectives import Communicator
    from des.config import load_config
    from des.predictions import predict_split
    from des.runner import loop
    from des.startup import setup

    comm = Communicator()
    runtime.configure_threads()
    for spec in json.loads((out / "cases.json").read_text()):
        case = Case(**{**spec, "flags": tuple(spec["flags"]), "ranks": tuple(spec["ranks"])})
        folder = out / case.name
        config = load_config(["--model", case.model, "--strategy", case.strategy, "--data", case.data,
                              "--dtype", case.dtype, "--plugins", case.plugins, "--batch-size", str(batch_size),
                              "--epochs", "0", "--max-steps", str(steps), "--seed", "3", "--table-capacity", "64",
                              "--output", str(folder / "run"), "--no-progress", "--eval-batch-size", "512",
                              "--early-stop", "0", *case.flags])
        run = setup(config, comm)
        strategy = run.strategy
        predictions = None
        if strategy.role == "serve":
            strategy.serve()
        else:
            loop(run)
            strategy = run.strategy  # (--plan-switch replaces it)
            if comm.rank in strategy.evaluators:
                predictions = predict_split(strategy, run.store, "validation", config.eval_batch_size)
            strategy.close()
        if strategy.synchronous:  # a replicated top network is bit-identical on every rank
            digests = comm.allgather(np.frombuffer(bytes.fromhex(strategy.state().dense.top_checksum()), np.uint8),
                                     "check")
            if any(not np.array_equal(digests[0], d) for d in digests):
                raise CheckFailed(f"{case.model} {case.strategy}: the top parameters differ between ranks")
        save_checkpoint(strategy, folder / "state", epoch=0, next_batch=steps, config=run.config.to_dict())
        if comm.rank == strategy.evaluators[0] and predictions is not None:
            np.save(folder / "predictions.npy", predictions[0])
            np.save(folder / "losses.npy", np.array(run.meter.losses))
        comm.barrier("check")


def widened(table, a: np.ndarray) -> np.ndarray:
    """A table array as numbers: 16-bit rows' values and slots widened to float32 (compared as floats,
    not as their bits)."""
    from des.hashtable.bfloat16 import convert

    return convert(a, "float32") if table.table_dtype == "bfloat16" and a.dtype == np.uint16 else a


def state_arrays(folder: Path) -> dict[str, np.ndarray]:
    """Every number a checkpoint holds but bookkeeping: dense weights and their optimizer state,
    and each table's keys, values, slots and step counts ordered by key."""
    from des.checkpoint import field_table, read_manifest, table_file, table_fields

    folder, manifest = read_manifest(folder)
    out: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("*.npz")):
        with np.load(path, allow_pickle=False) as arrays:
            out.update({f"{path.name}/{k}": arrays[k] for k in arrays.files})
    for field in table_fields(manifest):  # a field split by key: its shares as one table
        table = field_table(folder, manifest, field)
        arrays = table.to_arrays()
        order = np.argsort(arrays["keys"], kind="stable")
        out.update({f"{table_file(field)}/{k}": widened(table, v)[order] for k, v in arrays.items()
                    if k not in BOOKKEEPING and not k.startswith("pending.")})
        # the keys counted but not admitted yet, and their counts (by key): admission is the same too
        out.update({f"{table_file(field)}/{k}": v for k, v in arrays.items() if k.startswith("pending.")})
    return out


def _compare(case: Case, ranks: int, one: Path, many: Path, rtol: float) -> Comparison:
    result = Comparison(case, ranks, losses=np.load(one / "losses.npy").tolist())
    expected, got = state_arrays(one / "state"), state_arrays(many / "state")
    if case.compare == "predictions":
        expected, got = {}, {}
    if (one / "predictions.npy").exists():
        expected["predictions"] = np.load(one / "predictions.npy")
        got["predictions"] = np.load(many / "predictions.npy") if (many / "predictions.npy").exists() else None
    for key in sorted(set(expected) | set(got)):
        if key not in expected or key not in got or got[key] is None:
            result.failures.append(f"{key} is missing in the {'1-rank' if key not in expected else f'{ranks}-rank'} run")
            continue
        a, b = expected[key], got[key]
        if a.shape != b.shape:
            result.failures.append(f"{key} has shape {b.shape}, the 1-rank run {a.shape}")
            continue
        result.arrays += 1
        result.dtypes[key], result.shapes[key] = b.dtype, b.shape
        if a.dtype.kind in "iub":
            if not np.array_equal(a, b):
                result.failures.append(f"{key} differs ({int(np.sum(a != b))} of {a.size} entries)")
            continue
        scale = max(float(np.max(np.abs(a))) if a.size else 0.0, 1e-3)
        err = float(np.max(np.abs(a - b))) / scale if a.size else 0.0
        if not np.isfinite(err) or err > rtol:
            result.failures.append(f"{key} differs by {err:.3e} relative (tolerance {rtol:g})")
        result.max_difference = max(result.max_difference, err if np.isfinite(err) else np.inf)
    return result


def report(results: Sequence[Comparison], rtol: float) -> tuple[str, bool]:
    """The lines ``python -m des.check`` prints, and whether everything passed."""
    lines, ok = [], True
    for r in results:
        c = r.case
        what = f"{c.model} {c.strategy} {r.ranks} ranks vs {c.reference_strategy or c.strategy} on 1 rank"
        status = "ok" if not r.failures else f"FAIL ({len(r.failures)} arrays)"
        lines.append(f"  {what}, {c.dtype}: max relative difference {r.max_difference:.2e} over {r.arrays} arrays "
                     f"(tolerance {rtol:g}): {status}")
        for failure in r.failures:
            lines.append(f"des.check: FAIL {c.model} {c.strategy} {r.ranks} ranks: {failure}")
        ok = ok and not r.failures
    return "\n".join(lines), ok


def check_model(cls: Any, **kwargs: Any):
    """In-process checks of a model's declarations (see :func:`des.models.check_model`)."""
    from des.models.conformance import check_model as _check_model

    return _check_model(cls, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(prog="des.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model name(s), comma-separated")
    parser.add_argument("--strategy", default="des", help="strategy name(s), comma-separated (default: des)")
    parser.add_argument("--plugins", default="", help="modules or .py files that register models/strategies")
    parser.add_argument("--ranks", default="1,2,3", help="rank counts to compare with 1 rank (default: 1,2,3)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--data", default=str(SHIPPED_SAMPLE), help="raw file (another schema than Criteo's: with "
                        "--schema, which goes to des.train as any further flag does) or prepared directory")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--rtol", type=float, default=1e-9)
    parser.add_argument("--compare", default="all", choices=("all", "predictions"),
                        help="what must match (float32 with Adam: predictions only, see docs/guarantees.md)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mpiexec launch")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args, flags = parser.parse_known_args(argv)
    if args.worker:
        _worker(Path(args.worker), args.steps, args.batch_size)
        return 0
    if not args.model:
        raise DesError("--model is required (see --help)")
    try:
        ranks = sorted({int(x) for x in args.ranks.split(",") if x.strip()})
    except ValueError:
        raise DesError(f"--ranks must be comma-separated integers, got {args.ranks!r}") from None
    if not ranks or min(ranks) < 1 or args.steps < 1:
        raise DesError("--ranks needs positive rank counts and --steps at least 1")
    from des.plugins import load_plugins
    from des.strategies import get_strategy

    load_plugins(args.plugins)
    plugins = ",".join(str(Path(p).resolve()) if p.endswith(".py") else p for p in args.plugins.split(",") if p)
    data = str(Path(args.data).resolve()) if Path(args.data).exists() else args.data
    cases = [Case(m, s, data, args.dtype, tuple(flags), plugins, compare=args.compare) for m in args.model.split(",")
             for s in args.strategy.split(",")]

    for s in dict.fromkeys(c.strategy for c in cases):
        cls = get_strategy(s)
        if not cls.exact_over_ranks:
            flags = " ".join(cls.des_equivalent_flags(2))
            print(f"des.check: {s}'s model depends on the number of ranks, so N ranks are not expected to match 1 "
                  f"rank; checking instead that 2 ranks{' with ' + flags if flags else ''} train exactly what des "
                  "trains on 1 rank", flush=True)
    print(f"des.check: {args.model} under {args.strategy}, {args.dtype}, {args.steps} steps of {args.batch_size} rows "
          f"on {Path(data).name}, ranks {','.join(map(str, ranks))}", flush=True)
    results = check(cases, ranks, steps=args.steps, batch_size=args.batch_size, rtol=args.rtol, timeout=args.timeout)
    text, ok = report(results, args.rtol)
    print(text)
    print("des.check: ok" if ok else "des.check: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    from des.collectives import run_main

    run_main(main, "des.check")
