"""The ``inspect`` report of a column store: a tidy text table built from the manifest."""

from __future__ import annotations

import numpy as np

from .counting import KeyCounter
from .store import ColumnStore

DEFAULT_TOP_K = 10
_COUNT_CHUNK = 1 << 22


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "-"


def top_share(store: ColumnStore, field: int | str, k: int) -> float:
    """Fraction of the field's ids (all rows) taken by its ``k`` most frequent ids.

    The manifest records it for k = 10; other k are counted from the field's keys, chunk by chunk
    (memory proportional to the distinct ids, not to the rows).
    """
    entry = store.manifest["fields"][store.field_index(field)]
    if k == 10 and "top10_share" in entry:
        return float(entry["top10_share"])
    keys = store.field(field)[1]
    counter = KeyCounter()
    for start in range(0, keys.shape[0], _COUNT_CHUNK):
        counter.add(np.asarray(keys[start:start + _COUNT_CHUNK]))
    return counter.top_share(k)


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
    for entry in manifest["fields"]:
        ids_per_row = entry["nnz"] / rows if rows else 0.0
        share = top_share(store, entry["index"], top_k)
        lines.append(
            f"{entry['index']:>3}  {entry['name']:<6} {entry['kind']:<12} {entry['hotness']:<9} "
            f"{entry['distinct']:>12,} {ids_per_row:>8.2f} {100.0 * share:>{width - 1}.2f}%"
        )
    return "\n".join(lines)
