""".venv/bin/python scripts/bench_checkpoint.py [--rows 1e6] [--dim 16] [--repeats 3] [--dir /dev/shm]

Full vs incremental checkpoints of one table (``--full-checkpoint-every``, ``des/checkpoint.py``),
in this process, no MPI: a float32 table of ``--rows`` rows (an FTRL linear block and an Adam
embedding block of ``--dim``) is saved whole once; then, for 1%, 10% and 100% of its rows looked up
in one training step, the increment (``EmbeddingTable.save(since=...)``: the rows with ``last_seen``
from that step on, and the evicted keys) is written, and the chain is read back (the full table,
then the increment upserted). One row per fraction: bytes and seconds (median of ``--repeats``) of
the full checkpoint and of the increment, their ratios, and the seconds of reading the chain vs the
full table alone. Files go to ``--dir`` (a tmpfs by default: disk speed is not what is measured; every
table file is fsynced).

Expect, on a 2-core machine, an increment's bytes in proportion to the rows touched (about 1% and
10% of the full checkpoint's, about 100% at 100%), its seconds
close to that proportion plus a scan of every row's ``last_seen`` (so 1% costs a few % of a full
save), and reading a chain to cost a full read plus the increment's rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from des.hashtable import BlockSpec, EmbeddingTable  # noqa: E402
from des.hashtable.init import Initializer  # noqa: E402
from des.hashtable.optimizers import FTRL, Adam  # noqa: E402

FRACTIONS = (0.01, 0.1, 1.0)


def make_table(rows: int, dim: int) -> EmbeddingTable:
    table = EmbeddingTable(0, [BlockSpec("linear", 1, FTRL(0.05), Initializer("zeros")),
                               BlockSpec("embedding", dim, Adam(0.001), Initializer("normal", 0.01))],
                           seed=0, dtype=np.float32, capacity=int(rows / 0.5), rows=rows)
    keys = np.random.default_rng(0).permutation(rows * 4)[:rows].astype(np.int64)
    for lo in range(0, rows, 1 << 16):  # inserted at step 0
        table.lookup(keys[lo:lo + (1 << 16)], insert=True, step=0)
    return table


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, default=1e6)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args(argv)
    rows = int(args.rows)
    table = make_table(rows, args.dim)
    keys = table.keys()
    print(f"table: {rows:,} rows, linear[1] FTRL + embedding[{args.dim}] Adam, float32")
    print(f"{'touched':>8} {'full MB':>9} {'full s':>8} {'incr MB':>9} {'incr s':>8} {'bytes':>7} {'time':>7} "
          f"{'read full s':>12} {'read chain s':>13}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        full, inc, evicted = Path(tmp) / "full.table", Path(tmp) / "inc.table", Path(tmp) / "inc.evicted.npy"
        for step, fraction in enumerate(FRACTIONS, start=1):
            touched = keys[np.random.default_rng(step).permutation(rows)[:max(1, int(rows * fraction))]]
            table.lookup(touched, insert=True, step=step)  # the rows of one step since the base
            full_s = timed(lambda: table.save(full), args.repeats)

            def save_increment() -> None:
                table.save(inc, since=step)
                np.save(evicted, np.zeros(0, np.int64))

            inc_s = timed(save_increment, args.repeats)
            full_b, inc_b = full.stat().st_size, inc.stat().st_size + evicted.stat().st_size
            read_s = timed(lambda: EmbeddingTable.load(full), args.repeats)

            def read_chain() -> None:
                base = EmbeddingTable.load(full)
                base.delete(np.load(evicted))
                base.upsert(EmbeddingTable.load(inc).to_arrays())

            read_chain()  # the first compiles the upsert's kernel
            chain_s = timed(read_chain, args.repeats)
            print(f"{fraction:>8.0%} {full_b / 1e6:>9.2f} {full_s:>8.3f} {inc_b / 1e6:>9.2f} {inc_s:>8.3f} "
                  f"{inc_b / full_b:>7.1%} {inc_s / full_s:>7.1%} {read_s:>12.3f} {chain_s:>13.3f}")


if __name__ == "__main__":
    main()
