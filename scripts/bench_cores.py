""".venv/bin/python scripts/bench_cores.py [--cores 1,2,8,16] [--seconds 3] [--size 768] [--rounds 1]

What a machine's cores give when several are busy at once, before any des code runs: the ceiling
of every scaling figure measured on it. For each count ``k`` of ``--cores`` (capped at the cores
this process may use), ``k`` processes, each bound to one core (0 .. k-1), start together and
time for ``--seconds``:

* ``scalar``: a chain of 64-bit integer multiplies and shifts, each step waiting for the one
  before (``x = (x·a) ^ (x >> 17)``): its rate follows the core's clock only;
* ``matmul``: one-thread float32 matrix products of ``--size`` x ``--size`` (numpy's BLAS, its
  vector units: AVX-512 FMA on a recent Xeon).

It prints, per probe and count, the mean, lowest and highest rate a core gave, and the mean over the
mean with one core busy. Then, for ranks of 2 threads on the cores (N ranks x 2 = the count), the
matmul ceiling of N ranks over one rank on two cores: ``N x mean(2N busy) / mean(2 busy)``, what a
step spent in TF's matmuls cannot beat on this machine (``docs/benchmarks.md``, "The exchange by
rows on multi-hot data"). A last probe runs the scalar chain on core 0 while matmuls run on every
other core. ``--rounds`` repeats every count (which cores are slow may change from round to round).

Expect (a 2-core machine: counts 1 and 2 only; the 16-core Xeon's figures are in
``docs/benchmarks.md``): on a 2-core VM the two counts within a few percent of each other (ratio
about 1.0); on the 16-core Xeon the scalar chain at 0.70-0.73 G steps/s whatever the count, the
matmuls at 124-200 GFLOP/s a core with one or two busy and 105-129 (0.59-0.72 of two) with all 16,
so a matmul ceiling of about 4.7-5.8x for 8 ranks of 2 threads (this script on another host of it,
``--cores 1,2,8,16 --seconds 2``: 120 GFLOP/s with 16 busy, 0.79 of one, a ceiling of 6.06x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PROBES = ("scalar", "matmul")
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def child(kind: str, seconds: float, start: float, size: int) -> float:
    """One core's rate for ``seconds`` from the epoch time ``start``: G steps/s (scalar) or GFLOP/s."""
    import numpy as np

    if kind == "scalar":
        from numba import njit

        @njit(cache=False)
        def chain(n, x):  # pragma: no cover - compiled
            for _ in range(n):
                x = (x * np.uint64(6364136223846793005)) ^ (x >> np.uint64(17))
            return x

        chain(100, np.uint64(1))
        steps = 5_000_000
        work, per = (lambda: chain(steps, np.uint64(7))), steps
    elif kind == "matmul":
        a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
        b = a.copy()
        a @ b
        work, per = (lambda: a @ b), 2 * size**3
    else:
        raise SystemExit(f"bench_cores: no probe {kind!r} (scalar, matmul)")
    while time.time() < start:
        time.sleep(0.001)
    began, done = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        work()
        done += 1
    return done * per / (time.perf_counter() - began) / 1e9


def run_set(kinds: list[str], cores: list[int], seconds: float, size: int) -> list[float]:
    """``kinds[i]`` on core ``cores[i]``, all started together: each one's rate, in order."""
    env = {**os.environ, **{name: "1" for name in THREAD_VARIABLES}}
    start = time.time() + 2.0 + 0.05 * len(cores)  # every child imported numpy (and numba) by then
    procs = [subprocess.Popen([sys.executable, __file__, "--child", kind, str(core), str(seconds), repr(start),
                               str(size)], env=env, stdout=subprocess.PIPE, text=True)
             for kind, core in zip(kinds, cores)]
    out = []
    try:
        for proc in procs:
            try:
                text, _ = proc.communicate(timeout=seconds + 120)
            except subprocess.TimeoutExpired:
                raise SystemExit(f"bench_cores: the probe on core {cores[len(out)]} did not finish within "
                                 f"{seconds + 120:.0f} s") from None
            if proc.returncode:
                raise SystemExit(f"bench_cores: a probe on core {cores[len(out)]} failed (exit {proc.returncode})")
            out.append(float(text.split()[-1]))
    finally:  # a failed or late probe ends the set: no probe is left running
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def ceilings(matmul: dict[int, float], threads: int = 2) -> dict[int, float]:
    """N ranks of ``threads`` over one: ``N x mean(N·threads busy) / mean(threads busy)``, for every
    count measured that is a multiple of ``threads`` (``matmul``: count -> mean rate a core)."""
    if threads not in matmul:
        return {}
    return {count // threads: count // threads * matmul[count] / matmul[threads]
            for count in sorted(matmul) if count % threads == 0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--cores", default="1,2,8,16", help="counts of busy cores, comma-separated")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each probe times")
    parser.add_argument("--size", type=int, default=768, help="the matrices' side")
    parser.add_argument("--rounds", type=int, default=1, help="times every count runs")
    args = parser.parse_args(argv)
    usable = sorted(os.sched_getaffinity(0))
    counts = sorted({min(int(c), len(usable)) for c in args.cores.split(",") if int(c) > 0})
    print(f"bench_cores: {len(usable)} usable cores, counts {counts}, {args.seconds:g} s a probe, "
          f"matmul {args.size}^3 on one thread")
    means: dict[str, dict[int, float]] = {kind: {} for kind in PROBES}
    for kind in PROBES:
        unit = "G steps/s" if kind == "scalar" else "GFLOP/s"
        for count in counts:
            rates = [r for _ in range(args.rounds) for r in run_set([kind] * count, usable[:count], args.seconds,
                                                                      args.size)]
            means[kind][count] = statistics.mean(rates)
            base = means[kind][counts[0]]
            print(f"  {kind:<6} {count:>3} busy: mean {means[kind][count]:8.3f} {unit} a core (lowest "
                  f"{min(rates):.3f}, highest {max(rates):.3f}), {means[kind][count] / base:.2f} of {counts[0]} busy")
    for ranks, ceiling in ceilings(means["matmul"]).items():
        print(f"  matmul ceiling, {ranks} rank(s) of 2 threads over one on two cores: {ceiling:.2f}x")
    if len(usable) > 1:
        rates = run_set(["scalar"] + ["matmul"] * (len(usable) - 1), usable, args.seconds, args.size)
        print(f"  scalar on core {usable[0]} beside {len(usable) - 1} matmuls: {rates[0]:.3f} G steps/s "
              f"({rates[0] / means['scalar'][counts[0]]:.2f} of {counts[0]} busy)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, kind, core, seconds, start, size = sys.argv
        os.sched_setaffinity(0, {int(core)})
        print(f"{child(kind, float(seconds), float(start), int(size)):.6f}", flush=True)
    else:
        main()
