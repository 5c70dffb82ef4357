"""The ``inspect`` report of a column store: a tidy text table built from the manifest."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .counting import KeyCounter
from .store import ColumnStore

DEFAULT_TOP_K = 10
_COUNT_ROWS = 1 << 18  # rows per chunk (a field's hash map stays cached while it counts a chunk)


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "-"


def top_share(store: ColumnStore, field: int | str, k: int) -> float:
    """Fraction of the field's ids (all rows) taken by its ``k`` most frequent ids."""
    return top_shares(store, k, [field])[0]


def top_shares(store: ColumnStore, k: int, fields: Sequence[int | str] | None = None) -> list[float]:
    """:func:`top_share` of every field of ``fields`` (default: all). The manifest records k = 10;
    other k are counted in one pass over the rows, chunk by chunk (``ColumnStore.gather_fields``: one
    read of a chunk's row-major one-hot keys for every field); memory is proportional to the
    distinct ids and the chunk, not to the rows."""
    numbers = range(store.num_fields) if fields is None else [store.field_index(f) for f in fields]
    entries = store.manifest["fields"]
    shares = {f: float(entries[f]["top10_share"]) for f in numbers if k == 10 and "top10_share" in entries[f]}
    counting = {f: KeyCounter() for f in numbers if f not in shares}
    for start in range(0, store.num_rows if counting else 0, _COUNT_ROWS):
        rows = np.arange(start, min(start + _COUNT_ROWS, store.num_rows), dtype=np.int64)
        for f, block in store.gather_fields(list(counting), rows).items():
            counting[f].add(block.keys)
    shares.update({f: counter.top_share(k) for f, counter in counting.items()})
    return [shares[f] for f in numbers]


def format_summary(store: ColumnStore, top_k: int = DEFAULT_TOP_K) -> str:
    """Rows, positive rate, split counts, sources and a per-field table (distinct ids, share of
    the ``top_k`` most frequent ids)."""
    if top_k < 1:
        raise ValueError(f"top_k must be positive, not {top_k}")
    manifest = store.manifest
    rows = store.num_rows
    lines = [
        f"dataset      {store.path}",
        f"rows         {rows:,}",
        f"positives    {manifest['num_positives']:,} ({_percent(manifest['num_positives'], rows)})",
    ]
    split = manifest["split"]
    counts = "  ".join(
        f"{name} {split['rows'][name]:,} ({_percent(split['rows'][name], rows)})" for name in split["names"]
    )
    lines.append(f"split        {counts}  [fractions {split['fractions']}, seed {split['seed']}]")
    for source in manifest.get("sources", []):
        lines.append(f"source       {source['name']}  rows {source['rows']:,}  sha256 {source['sha256']}")
    bad = manifest.get("bad_rows")
    if bad and bad.get("skipped"):
        lines.append(f"bad rows     {bad['skipped']:,} skipped (first: {', '.join(bad['first_skipped'])})")
    synthetic = manifest.get("synthetic")
    if synthetic:
        oracle = synthetic["oracle"]
        auc = "-" if oracle["auc"] is None else f"{oracle['auc']:.5f}"
        logloss = "-" if oracle["logloss"] is None else f"{oracle['logloss']:.5f}"
        lines.append(
            f"synthetic    seed {synthetic['config']['seed']}, oracle on {oracle['split']} "
            f"({oracle['rows']:,} rows): AUC {auc}, logloss {logloss}"
        )
    lines.append("")
    share_title = f"top-{top_k} share"
    width = max(13, len(share_title))
    header = (f"{'#':>3}  {'field':<6} {'kind':<12} {'hotness':<9} {'distinct':>12} {'ids/row':>8} "
              f"{share_title:>{width}}")
    lines += [header, "-" * len(header)]
    shares = top_shares(store, top_k)
    for entry in manifest["fields"]:
        ids_per_row = entry["nnz"] / rows if rows else 0.0
        share = shares[entry["index"]]
        lines.append(
            f"{entry['index']:>3}  {entry['name']:<6} {entry['kind']:<12} {entry['hotness']:<9} "
            f"{entry['distinct']:>12,} {ids_per_row:>8.2f} {100.0 * share:>{width - 1}.2f}%"
        )
    return "\n".join(lines)
