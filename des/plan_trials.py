"""Choosing ``--plan`` by measured time on this machine, not by bytes alone.

The planner's cost model (``des/planner.py``) ranks plans by bytes plus constants for a collective
call and for the exchange's per-id work, calibrated on one machine. Bytes are not time: where ranks
have cores of their own the per-id work and the buffer's memory traffic weigh differently, and the
model can pick a plan measured well slower (heavy multi-hot data on 8 ranks of a 16-core host). So a
long run measures its candidates: each plan is built as a throwaway strategy (its own fresh tables:
the run's state is never touched), trains the first batches of the training order, and its step
time after a warm-up is taken as the slowest rank's (every rank waits for it). The candidates are
timed in :data:`ROUNDS` rounds, each plan keeping its fastest: the first plan timed also pays what
every plan shares the first time it runs (numba compiling the table kernels on a fresh cache: an
exchange measured 6x its steady step on a fresh 16-core host that way, and lost to a plan no
faster). The fastest plan is chosen, the same on every rank (the times are all-gathered, the rule
is deterministic given them).

Plans train the same model (``des.check``), so the choice changes speed only. It does depend on
timing, so it is cached per host, rank count, batch size, model and data in the cache folder
(``plan-trials.json``): a rerun on the same machine takes the same plan without measuring, and
``config.json`` records the plan that ran (``--plan`` of it reproduces the run bit for bit).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

#: runs with fewer planned steps keep the cost model's plan (measuring costs a few steps per plan
#: plus tracing each plan's step: worth it only when the run is long)
MIN_STEPS = 1000
WARMUP, TIMED = 2, 3
#: rounds over the candidates (each plan's fastest round counts: see the module docstring)
ROUNDS = 2
CACHE_FILE = "plan-trials.json"


@dataclass(frozen=True)
class Trials:
    """Measured milliseconds per step of each candidate plan (the slowest rank's), and the choice."""

    ms_per_step: dict[str, float]
    chosen: str
    cached: bool = False

    def record(self) -> dict[str, Any]:
        return {"ms_per_step": dict(self.ms_per_step), "chosen": self.chosen, "cached": self.cached}

    def lines(self) -> list[str]:
        fastest = min(self.ms_per_step.values())
        rows = [f"    {plan:<40} {ms:8.1f} ms/step  {ms / fastest:5.2f}x" for plan, ms in
                sorted(self.ms_per_step.items(), key=lambda item: item[1])]
        source = ("cached for this host" if self.cached else
                  f"median of {TIMED} steps after {WARMUP}, slowest rank, best of {ROUNDS} rounds")
        return [f"  plans measured ({source}): --plan {self.chosen}", *rows]


def wanted(config: Any, ranks: int, planned_steps: int) -> bool:
    """Measure when ``--plan auto`` meets several ranks and a long run, or ``--plan measure``."""
    if config.plan == "measure":
        return ranks > 1
    return config.plan == "auto" and ranks > 1 and planned_steps >= MIN_STEPS


def candidates(modelled: str) -> list[str]:
    """The cost model's choice and the two pure plans (each once, the model's first)."""
    return list(dict.fromkeys([modelled, "partials", "exchange"]))


def cache_key(config: Any, ranks: int, fingerprint: str, placement: Sequence[Sequence[int]]) -> str:
    """What a measurement holds for: host, ranks, threads and their cores, batch, model options, data,
    placement, the way exchanges travel."""
    parts = {"host": platform.node(), "ranks": ranks, "threads": config.threads, "batch": config.batch_size,
             "pin": getattr(config, "pin_cores", "off"),
             "dtype": config.dtype, "compute": config.compute_dtype, "xla": getattr(config, "xla", "off"),
             "model": config.model, "options": [config.embedding_dim, config.hidden, config.model_options],
             "data": fingerprint, "placement": [list(p) for p in placement], "strategy": config.strategy,
             "exchange_by": getattr(config, "exchange_by", "ids")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _cache_path(config: Any) -> Path:
    """In ``--cache-dir``, else where prepared data is cached (``$DES_CACHE_DIR`` or ``~/.cache/des``)."""
    from des.data.build import default_cache_dir

    return (Path(config.cache_dir) if config.cache_dir else default_cache_dir()) / CACHE_FILE


def read_cached(config: Any, key: str) -> Trials | None:
    try:
        entry = json.loads(_cache_path(config).read_text()).get(key)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("ms_per_step"), dict):
        return None
    return Trials({str(k): float(v) for k, v in entry["ms_per_step"].items()}, str(entry["chosen"]), cached=True)


def write_cached(config: Any, key: str, trials: Trials) -> None:
    """Best effort (rank 0): a cache that cannot be written only means measuring again next time."""
    path = _cache_path(config)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            held = json.loads(path.read_text())
        except (OSError, ValueError):
            held = {}
        held[key] = {"ms_per_step": trials.ms_per_step, "chosen": trials.chosen}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(held, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass


def measure(plans: Sequence[str], train_one: Any, comm: Any, rounds: int = ROUNDS) -> Trials:
    """``train_one(plan)`` -> this rank's seconds per timed step of that plan; the slowest rank's
    (all-gathered) decides a round, each plan's fastest of ``rounds`` rounds over the candidates
    counts, the fastest plan wins (ties: the earlier candidate)."""
    ms: dict[str, float] = {}
    for _ in range(rounds):
        for plan in plans:
            mine = np.array([train_one(plan)], dtype=np.float64)
            slowest = 1000.0 * float(np.max(comm.allgather(mine, "setup")))
            ms[plan] = min(ms.get(plan, slowest), slowest)
    chosen = min(plans, key=lambda p: (ms[p], plans.index(p)))
    return Trials(ms, chosen)


def trial_step_seconds(build: Any, batches: Any, *, overlap: bool = False) -> float:
    """Build a throwaway strategy, train ``WARMUP`` then ``TIMED`` batches (``overlap``: each next
    batch prefetched, as the run's pipeline does); the median seconds of a timed step (one slow
    step, a late compilation or a collection, does not decide the plan)."""
    strategy = build()
    try:
        read, following, seconds = batches(strategy), None, []
        for i in range(WARMUP + TIMED):
            start = time.perf_counter()
            batch = following.batch() if following is not None else read(i)
            following = None
            if overlap and i + 1 < WARMUP + TIMED:
                following = strategy.prefetch(lambda after=i + 1: read(after), strategy.step_count + 1)
            strategy.train_step(batch)
            if i >= WARMUP:
                seconds.append(time.perf_counter() - start)
        return float(np.median(seconds))
    finally:
        strategy.close()
        del strategy
        gc.collect()


def choose(config: Any, comm: Any, key: str, modelled: str, train_one: Any) -> Trials:
    """The cached choice for ``key`` (rank 0 reads, every rank gets it), else measured and cached."""
    cached = read_cached(config, key) if comm.rank == 0 else None
    shared = comm.bcast_json(cached.record() if cached else None, "setup")
    if shared is not None:
        return Trials(shared["ms_per_step"], shared["chosen"], cached=True)
    trials = measure(candidates(modelled), train_one, comm)
    if comm.rank == 0:
        write_cached(config, key, trials)
    return replace(trials, cached=False)
