""".venv/bin/python scripts/bench_table_memory.py [--ids 5e7] [--dims 8,16,64] [--measure 2e6] [--layouts counters,compact]

Bytes per id of DeepFM's table rows (an order-1 block of dim 1 and an embedding block of dim k) for
each optimizer setting, table dtype and row layout (``counters``: each row's admission count and
last-seen step and 12-byte index slots; ``compact``: neither, 4-byte index slots, the layout of a
run that needs no admission, eviction or incremental checkpoint), next to today's default (FTRL
order-1 rows of z and n + Adam embeddings, float32 rows, with counters; "ftrl storing w" is the
order-1 row that also stores w, ``ftrl:store_w=1``):

* ``predicted``: exactly what ``footprint.estimated_bytes`` (the start-up report's figure) gives for
  one table of ``--ids`` keys sized from the data (``--table-capacity 0``: the index at the load a
  growth leaves it at, ``INDEX_GROWTH / MAX_LOAD`` slots a key, rows for every key), and for a table
  grown to its load bound (``MAX_LOAD``), split into the rows' payload (values, slots, Adam's step
  count) and key + index + metadata;
* with ``--measure N``: a table of N random keys really built so (inserted in batches of 4096 x 39,
  sized from the data, in a fresh process of its own), its allocated bytes (``memory()``) per key
  and the growth of that process's RSS while it was built (the keys' own array excluded), per id. The layout is linear in the ids (a table of N ids holds N rows
  and an index of a fixed number of slots per id), so the measurement at N checks the prediction
  at any size.

One table at a time; at ``--measure 2e6`` the largest (k = 64, float32 Adam) holds about 1.7 GB.

Expect (a 2-core machine takes a few minutes with ``--measure 2e6``; recorded runs in
``docs/benchmarks.md``, "Table memory"): the measured bytes per id equal the predicted ones; at
k = 16 today's rows take about 246 B per id sized from the data (250 B storing FTRL's w),
bfloat16 row-wise AdaGrad rows about 80 B (0.32x); key, index and metadata 41.7 B per id with counters, 16.6 B compact.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys

import numpy as np
import psutil

import benchlib
from des.hashtable import BlockSpec, EmbeddingTable, Initializer, optimizer_from_spec
from des.options import TableOptions

BATCH = 4096 * 39
#: (name, order-1 optimizer, embedding optimizer, table dtype)
SETTINGS = [
    ("today: ftrl + adam", "ftrl:alpha=0.05", "adam:lr=0.001", "float32"),
    ("ftrl storing w + adam", "ftrl:alpha=0.05,store_w=1", "adam:lr=0.001", "float32"),
    ("ftrl + adam, bf16", "ftrl:alpha=0.05", "adam:lr=0.001", "bfloat16"),
    ("ftrl + rowwise_adam", "ftrl:alpha=0.05", "rowwise_adam:lr=0.001", "float32"),
    ("ftrl + rowwise_adam, bf16", "ftrl:alpha=0.05", "rowwise_adam:lr=0.001", "bfloat16"),
    ("rowwise_adagrad x2", "rowwise_adagrad:lr=0.05", "rowwise_adagrad:lr=0.05", "float32"),
    ("rowwise_adagrad x2, bf16", "rowwise_adagrad:lr=0.05", "rowwise_adagrad:lr=0.05", "bfloat16"),
    ("adagrad x2, bf16", "adagrad:lr=0.05", "adagrad:lr=0.05", "bfloat16"),
]


LAYOUTS = {"counters": True, "compact": False}  # the tables' ``counters``


def make_table(linear: str, embedding: str, table_dtype: str, dim: int, ids: int = 0,
               counters: bool = True) -> EmbeddingTable:
    """One field's table of this layout, sized from the data for ``ids`` keys (0: the default size)."""
    capacity, rows = TableOptions(capacity=0, distinct=(ids,)).initial_size(0) if ids else (1024, None)
    return EmbeddingTable(field=3, seed=1, capacity=capacity, rows=rows, table_dtype=table_dtype, counters=counters,
                          blocks=[
        BlockSpec("linear", 1, optimizer_from_spec(linear), Initializer("zeros")),
        BlockSpec("embedding", dim, optimizer_from_spec(embedding), Initializer("normal", 0.01))])


def predicted(table: EmbeddingTable, ids: int) -> dict[str, float]:
    """Bytes per id of ``ids`` keys: sized from the data, and grown to the load bound."""
    capacity, rows = TableOptions(capacity=0, distinct=(ids,)).initial_size(0)
    payload = table.payload_bytes_per_row() - 8  # values, slots, step counts (the key counts below)
    sized = table.estimated_bytes(ids, capacity, rows) / ids
    grown = table.estimated_bytes(ids, capacity=16, initial_rows=16) / ids
    return {"payload": payload, "sized": sized, "sized_overhead": sized - payload, "grown": grown,
            "grown_overhead": grown - payload}


def measure_one(setting: int, dim: int, n: int, counters: int = 1) -> dict[str, float]:
    """A table of ``n`` random keys built as a run sized from the data builds it (in this process)."""
    _, linear, embedding, table_dtype = SETTINGS[setting]
    rng = np.random.default_rng(0)
    keys = ((np.int64(4) << 40) | rng.choice(np.int64(1) << 40, size=n, replace=False)).astype(np.int64)
    make_table(linear, embedding, table_dtype, dim, counters=bool(counters)).lookup(keys[:BATCH], insert=True, step=0)
    gc.collect()
    rss0 = psutil.Process().memory_info().rss
    table = make_table(linear, embedding, table_dtype, dim, n, bool(counters))
    for i in range(0, n, BATCH):
        table.lookup(keys[i:i + BATCH], insert=True, step=0)
    rss = psutil.Process().memory_info().rss - rss0
    return {"allocated": table.memory()["bytes"] / n, "rss": rss / n}


def measured(setting: int, dim: int, n: int, counters: bool) -> dict[str, float]:
    """:func:`measure_one` in a fresh process (its RSS is the table's alone: no heap of earlier tables)."""
    out = subprocess.run([sys.executable, __file__, "--one", f"{setting},{dim},{n},{int(counters)}"], check=True, text=True,
                         capture_output=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ids", type=float, default=5e7, help="ids of the predicted figures")
    p.add_argument("--dims", default="8,16,64", help="embedding dims k")
    p.add_argument("--measure", type=float, default=0, help="also build tables of this many ids (0: no)")
    p.add_argument("--layouts", default="counters,compact", help="row layouts: counters, compact")
    p.add_argument("--one", help=argparse.SUPPRESS)  # SETTING,DIM,N,COUNTERS: measure_one, printed as JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure_one(*(int(float(x)) for x in args.one.split(",")))))
        return
    ids, n = int(args.ids), int(args.measure)
    rows = []
    for dim in (int(d) for d in args.dims.split(",")):
        base = None
        for layout, (index, setting) in ((x, s) for x in args.layouts.split(",") for s in enumerate(SETTINGS)):
            name, linear, embedding, table_dtype = setting
            table = make_table(linear, embedding, table_dtype, dim, counters=LAYOUTS[layout])
            row = {"k": dim, "layout": layout, "setting": name, **predicted(table, ids)}
            base = base or row["sized"]
            row["vs_today"] = row["sized"] / base
            if n:
                row.update(measured(index, dim, n, LAYOUTS[layout]))
            rows.append(row)
            print("  " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
    columns = [("k", "k", "d"), ("layout", "layout", ""), ("setting", "setting", ""), ("payload", "payload B/id", ".1f"),
               ("sized", f"B/id at {ids:,} ids (sized from data)", ".1f"), ("sized_overhead", "key+index+meta", ".1f"),
               ("grown", "B/id grown to load 0.7", ".1f"), ("vs_today", "x today", ".3f")]
    if n:
        columns += [("allocated", f"measured B/id at {n:,}", ".1f"), ("rss", "RSS growth B/id", ".1f")]
    print("\n" + benchlib.entry("bench_table_memory", benchlib.environment(), sys.argv[1:], [("", columns, rows)],
                                ["predicted: footprint.estimated_bytes; measured: a table built at N ids"]))


if __name__ == "__main__":
    main()
