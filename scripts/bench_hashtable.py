""".venv/bin/python scripts/bench_hashtable.py [--sizes 1e6,1e7] [--with-50m] [--repeats 5] [--no-baselines] [--clock wall|cpu]
    [--linear-optimizer SPEC] [--embedding-optimizer SPEC] [--table-dtype float32|bfloat16] [--compact]

Benchmarks ``des.hashtable.EmbeddingTable`` and prints, per table size (1M and 10M keys; 50M with
``--with-50m``, about 9 GB of RAM), one row per operation. Every operation runs on one thread
except the initialization of new rows and evaluation lookups, which use numba's thread count
(``NUMBA_NUM_THREADS``, printed; set it to 1 for one-thread figures):

* ``insert``: ns per new key, inserting all N keys in batches of 4096 x 39 (includes growth,
  rehash and the deterministic init of both blocks);
* ``lookup eval``: ns/key of ``lookup(insert=False)`` on batches of 4096 x 39 keys with a Zipf-ish
  mix of hits (Zipf exponent 1.1 over the keys, ranks beyond N drawn uniformly; keys are random
  int64, rank order = insertion order, i.e. popular ids were seen first, as in a real stream);
* ``lookup eval uniform``: the same with uniformly drawn keys (every access a cache miss);
* ``lookup train``: ``lookup(insert=True)`` on Zipf batches with 2% new keys (counts, last_seen,
  inserts and init of the new ones);
* ``gather``: ns/key to gather the 8-wide embedding block for a Zipf batch;
* ``update adam8`` / ``update ftrl1``: ``apply_gradients`` in ns per unique row (duplicates summed
  first) of the 8-wide Adam block and the 1-wide FTRL block, for a Zipf batch;
* ``memory``: allocated bytes per row (index + values + slots + metadata) vs the raw payload
  (key + values + slots + Adam step = 120 B/row), and the ratio; the process RSS and its peak
  (the peak includes the transient copy while a row array grows, and the benchmark's own arrays);
* baselines on the same batches: a Python ``dict`` (key -> row; insert with ``setdefault``, lookup
  with ``dict.get``) and a numpy sorted array (``searchsorted``; "insert" = one full sort of N keys,
  incremental inserts would re-sort per batch).

Each timing is the median over ``--repeats`` runs (min in brackets), batches precomputed; wall time,
or with ``--clock cpu`` the process's CPU time (all threads: on a machine shared with other jobs it
does not count the time the benchmark waits for a core; with ``NUMBA_NUM_THREADS=1`` it is the
one-thread cost).
The table rows are float32 "linear" (dim 1, FTRL) + "embedding" (dim 8, Adam, normal init); the
options choose other optimizers (the update rows are named by their kinds), bfloat16 rows and
(``--compact``) the layout without per-row counters (no count or last_seen, 4-byte index slots:
the layout of runs that need no admission count, eviction or incremental checkpoint).

Expect (a 2-core machine; recorded runs in ``docs/benchmarks.md``, "Hash tables"): lookups of
known keys in tens of ns per key (Zipf faster than uniform, training lookups slower), Adam updates
several times the cost of FTRL's, memory below 1.44x the raw payload (the bound of the growth
factors, ``des/hashtable/table.py``); lookups an order of magnitude faster than the ``dict`` and
``searchsorted`` baselines. Per-key times grow once the table no longer fits in cache. An insert
is mostly the normal initial values, the index probe and the first touch of fresh memory, whose
speed on a VM depends on the host: the insert figure moves between runs for that alone.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time

import numba
import numpy as np
import psutil

import benchlib
from des.hashtable import BlockSpec, EmbeddingTable, Initializer, optimizer_from_spec

BATCH = 4096 * 39
N_BATCHES = 8
ZIPF_A = 1.1
NEW_FRACTION = 0.02


CLOCK = time.perf_counter  # --clock cpu: time.process_time


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median, min) seconds of ``fn()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return statistics.median(times), min(times)


def zipf_batches(rng: np.random.Generator, keys: np.ndarray, n: int,
                 uniform: bool = False) -> list[np.ndarray]:
    out = []
    for _ in range(n):
        if uniform:
            ranks = rng.integers(0, keys.size, BATCH)
        else:
            ranks = rng.zipf(ZIPF_A, BATCH) - 1
            tail = ranks >= keys.size
            ranks[tail] = rng.integers(0, keys.size, int(tail.sum()))
        out.append(keys[ranks])  # keys is in random order: hot ranks are scattered keys
    return out


ROWS = {"linear": "ftrl:alpha=0.05,l1=0.1", "embedding": "adam:lr=0.001", "table_dtype": "float32",
        "counters": True}  # the options


def make_table() -> EmbeddingTable:
    return EmbeddingTable(field=3, seed=1, capacity=1024, table_dtype=ROWS["table_dtype"], counters=ROWS["counters"], blocks=[
        BlockSpec("linear", 1, optimizer_from_spec(ROWS["linear"]), Initializer("zeros")),
        BlockSpec("embedding", 8, optimizer_from_spec(ROWS["embedding"]), Initializer("normal", 0.01))])


def report(name: str, seconds: tuple[float, float], count: int, unit: str = "key") -> None:
    med, best = seconds
    print(f"  {name:<28s} {med / count * 1e9:9.1f} ns/{unit}   [min {best / count * 1e9:7.1f}]", flush=True)


def bench_size(n: int, repeats: int, baselines: bool, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    # keys as the data layer makes them: ((field + 1) << 40) | u, here u random and distinct
    keys = ((np.int64(4) << 40) | rng.choice(np.int64(1) << 40, size=n, replace=False)).astype(np.int64)
    print(f"\n== N = {n:,} keys, batches of {BATCH:,} keys ==", flush=True)
    results: dict = {}

    make_table().lookup(keys[:BATCH], insert=True, step=0)  # loads the kernels: not insert time
    table = make_table()
    gc.collect()
    t0 = CLOCK()
    for i in range(0, n, BATCH):
        table.lookup(keys[i:i + BATCH], insert=True, step=0)
    t_insert = CLOCK() - t0
    report("insert (new keys)", (t_insert, t_insert), n)
    results["insert"] = t_insert / n * 1e9
    mem = table.memory()

    zipf = zipf_batches(rng, keys, N_BATCHES)
    unif = zipf_batches(rng, keys, N_BATCHES, uniform=True)
    total = BATCH * N_BATCHES

    def run_lookup(batches, insert):
        for b in batches:
            table.lookup(b, insert=insert, step=1)

    run_lookup(zipf[:1], False)  # warm
    s = timed(lambda: run_lookup(zipf, False), repeats)
    report("lookup eval (zipf)", s, total)
    results["lookup_eval_zipf"] = s[0] / total * 1e9
    s = timed(lambda: run_lookup(unif, False), repeats)
    report("lookup eval (uniform)", s, total)
    results["lookup_eval_uniform"] = s[0] / total * 1e9

    # training lookups: zipf hits plus 2% keys never seen before (fresh per repeat)
    fresh_base = np.int64(5) << 40
    train_sets = []
    for r in range(repeats):
        batches = []
        for j, b in enumerate(zipf):
            b = b.copy()
            pos = rng.choice(BATCH, int(BATCH * NEW_FRACTION), replace=False)
            b[pos] = fresh_base + (r * N_BATCHES + j) * BATCH + np.arange(pos.size)
            batches.append(b)
        train_sets.append(batches)
    it = iter(train_sets)
    s = timed(lambda: run_lookup(next(it), True), repeats)
    report("lookup train (zipf, 2% new)", s, total)
    results["lookup_train"] = s[0] / total * 1e9

    b = zipf[0]
    rows = table.lookup(b, insert=False)
    s = timed(lambda: table.gather("embedding", b, rows), repeats)
    report("gather embedding[8]", s, BATCH)
    uniq = np.unique(rows).size
    g8 = rng.normal(size=(BATCH, 8)).astype(np.float32)
    g1 = rng.normal(size=(BATCH, 1)).astype(np.float32)
    for block, g, dim in (("embedding", g8, 8), ("linear", g1, 1)):
        kind = table.blocks[table.block_index(block)].optimizer.kind
        s = timed(lambda: table.apply_gradients(block, rows, g, 1), repeats)
        report(f"update {kind}{dim} ({uniq:,} uniq)", s, uniq, "row")
        results[f"update_{kind}{dim}"] = s[0] / uniq * 1e9

    payload_row = table.payload_bytes_per_row()
    print(f"  memory at N: {mem['bytes'] / n:6.1f} B/row vs payload {payload_row} B/row = "
          f"{mem['bytes'] / mem['payload_bytes']:.3f}x  (index {mem['index_bytes'] / n:.1f} B/row at "
          f"load {mem['load_factor']:.3f}; rows {mem['row_capacity']:,} allocated for {mem['rows']:,})",
          flush=True)
    results["memory_ratio"] = mem["bytes"] / mem["payload_bytes"]
    rss = psutil.Process().memory_info().rss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"  process RSS {rss / 2**30:.2f} GiB, peak so far {peak / 2**30:.2f} GiB "
          f"(table {mem['bytes'] / 2**30:.2f} GiB, key array {keys.nbytes / 2**30:.2f} GiB)", flush=True)
    del table, rows
    gc.collect()

    if baselines:
        d: dict[int, int] = {}
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            setdefault = d.setdefault
            np.array([setdefault(k, len(d)) for k in keys[i:i + BATCH].tolist()], dtype=np.int64)
        t = time.perf_counter() - t0
        report("dict insert", (t, t), n)
        get = d.get
        s = timed(lambda: [np.array([get(k, -1) for k in x.tolist()], dtype=np.int64) for x in zipf],
                  max(1, repeats // 2))
        report("dict lookup (zipf)", s, total)
        results["dict_lookup"] = s[0] / total * 1e9
        del d
        gc.collect()
        t0 = time.perf_counter()
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        t = time.perf_counter() - t0
        report("searchsorted build (sort)", (t, t), n)

        def ss_lookup():
            for x in zipf:
                pos = np.searchsorted(sorted_keys, x)
                pos = np.minimum(pos, n - 1)
                np.where(sorted_keys[pos] == x, order[pos], -1)

        s = timed(ss_lookup, repeats)
        report("searchsorted lookup (zipf)", s, total)
        results["searchsorted_lookup"] = s[0] / total * 1e9
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--with-50m", action="store_true", help="also run N = 50M (about 9 GB of RAM)")
    p.add_argument("--sizes", default="1e6,1e7", help="comma-separated table sizes")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-baselines", action="store_true", help="skip the dict/searchsorted baselines")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: the process's CPU time (all threads), steadier than wall time on a shared machine")
    p.add_argument("--linear-optimizer", default=ROWS["linear"], help="the dim-1 block's optimizer")
    p.add_argument("--embedding-optimizer", default=ROWS["embedding"], help="the dim-8 block's optimizer")
    p.add_argument("--table-dtype", default=ROWS["table_dtype"], choices=("float32", "bfloat16"))
    p.add_argument("--compact", action="store_true", help="tables without counters (no count or last_seen)")
    args = p.parse_args()
    ROWS.update(linear=args.linear_optimizer, embedding=args.embedding_optimizer, table_dtype=args.table_dtype,
                counters=not args.compact)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    if args.with_50m:
        sizes.append(50_000_000)
    print(f"numba threads (new-row initialization, eval lookups): {numba.get_num_threads()}; {args.clock} clock; "
          f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    # compile (or load from the numba cache) outside the timings
    t = make_table()
    r = t.lookup(np.arange(1, 1000), insert=True)
    t.lookup(np.arange(1, 1000), insert=False)
    t.gather("embedding", np.arange(1, 1000), r)
    t.apply_gradients("embedding", r, np.ones((r.size, 8), np.float32), 0)
    t.apply_gradients("linear", r, np.ones((r.size, 1), np.float32), 0)
    summary = {}
    for n in sizes:
        summary[n] = bench_size(n, args.repeats, baselines=not args.no_baselines and n <= 10_000_000)
    print("\nsummary (median ns/key; memory as allocated/payload):")
    for n, res in summary.items():
        print(f"  N={n:>11,}: " + ", ".join(f"{k}={v:.1f}" if "memory" not in k else f"{k}={v:.3f}"
                                           for k, v in res.items()))
    keys = list(dict.fromkeys(k for res in summary.values() for k in res))
    columns = [("keys", "N keys", ",d")] + [(k, k if "memory" in k else f"{k} (ns)", ".3f" if "memory" in k else ".1f")
                                           for k in keys]
    note = (f"Median of {args.repeats} repeats, {args.clock} clock, {numba.get_num_threads()} numba thread(s); "
            "per key, the updates per unique row; memory as allocated / payload.")
    print("\n" + benchlib.entry("bench_hashtable", benchlib.environment(), sys.argv[1:],
                                [("", columns, [{"keys": n, **res} for n, res in summary.items()])], [note]))


if __name__ == "__main__":
    main()
