"""The ``inspect`` report of a column store: a tidy text table built from the manifest."""

from __future__ import annotations

from .store import ColumnStore


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "-"


def format_summary(store: ColumnStore) -> str:
    """Rows, positive rate, split counts, sources and a per-field table (distinct ids, top-10 share)."""
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
    header = f"{'#':>3}  {'field':<6} {'kind':<12} {'hotness':<9} {'distinct':>12} {'ids/row':>8} {'top-10 share':>13}"
    lines += [header, "-" * len(header)]
    for entry in manifest["fields"]:
        ids_per_row = entry["nnz"] / rows if rows else 0.0
        lines.append(
            f"{entry['index']:>3}  {entry['name']:<6} {entry['kind']:<12} {entry['hotness']:<9} "
            f"{entry['distinct']:>12,} {ids_per_row:>8.2f} {100.0 * entry['top10_share']:>12.2f}%"
        )
    return "\n".join(lines)
