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
    if split.get("inputs") is not None:
        roles = ", ".join(f"{role} {name}" for role, name in split["inputs"])
        lines.append(f"split        {counts}  [by input: {roles}]")
    elif [float(x) for x in split["fractions"]] == [0.0, 0.0, 1.0]:
        # prepared whole (inputs.WHOLE_FILE): a file of --train-data/--validation-data/--test-data or
        # des.evaluate --data; every row sits in the test split, but its role is the flag's
        lines.append(f"split        none: the file prepared whole, its rows in input order (a cache entry of "
                     f"--train-data, --validation-data, --test-data or des.evaluate --data: the flag says what "
                     f"its rows are for)")
    else:
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
    name_width = max([6, *(len(entry["name"]) for entry in manifest["fields"])])
    header = (f"{'#':>3}  {'field':<{name_width}} {'kind':<12} {'hotness':<9} {'distinct':>12} {'ids/row':>8} "
              f"{share_title:>{width}}")
    lines += [header, "-" * len(header)]
    shares = top_shares(store, top_k)
    for entry in manifest["fields"]:
        ids_per_row = entry["nnz"] / rows if rows else 0.0
        share = shares[entry["index"]]
        lines.append(
            f"{entry['index']:>3}  {entry['name']:<{name_width}} {entry['kind']:<12} {entry['hotness']:<9} "
            f"{entry['distinct']:>12,} {ids_per_row:>8.2f} {100.0 * share:>{width - 1}.2f}%"
        )
    if store.schema is not None:
        lines += ["", *format_schema(store.schema)]
    return "\n".join(lines)


def _number(x: float) -> str:
    return f"{x:.6g}"


def format_schema(data: dict) -> list[str]:
    """The lines of a store's schema: its fields (kind, hotness, pooling, what they are made of) and
    its dense features with their statistics."""
    from .schema import Schema

    schema = Schema.from_dict(data)
    label = schema.label.column + (f" {schema.label.rule}" if schema.label.rule else " (0/1)")
    lines = [f"schema       {schema.name} (key scheme 2, fingerprint {schema.fingerprint}), "
             f"{schema.format.type}, label {label}"]
    header = f"     {'field':<16} {'kind':<13} {'hotness':<9} {'pooling':<8} made of"
    lines += [header, "     " + "-" * (len(header) - 5)]
    for column in schema.sparse_columns:
        pooling, detail = "-", ""
        if column.is_list:
            pooling = column.pooling
            kept = "last" if column.kind == "sequence" else "first"
            detail = f"separator {column.separator!r}" \
                + (f", {kept} {column.max_length}" if column.max_length else "") \
                + (f", weights after {column.weight_separator!r}" if column.weight_separator else "") \
                + (f", {column.dtype} ids" if column.kind == "sequence" else "")
        elif column.kind == "categorical":
            detail = f"{column.dtype} values, hashed"
        elif column.buckets == "log_squared":
            detail = "buckets: v if v <= 2 else floor(ln(v)^2)"
        else:
            bounds = column.boundaries or ()
            shown = ", ".join(_number(b) for b in bounds[:6]) + (", ..." if len(bounds) > 6 else "")
            detail = f"{column.buckets}: {len(bounds) + 1} buckets at [{shown}]"
        if column.table is not None:
            detail += f"; the table of {column.table}"
        hotness = "multi-hot" if column.is_list else "one-hot"
        lines.append(f"     {column.name:<16} {column.kind:<13} {hotness:<9} {pooling:<8} {detail}")
    for derived in schema.derived:
        options = "".join(f", {k} {v!r}" for k, v in derived.options.items())
        lines.append(f"     {derived.name:<16} {'derived':<13} {'one-hot':<9} {'-':<8} "
                     f"{derived.transform}({', '.join(derived.inputs)}){options}")
    if schema.dense_columns:
        lines += ["", f"     {'dense feature':<16} made of"]
        for column in schema.dense_columns:
            parts = [f"missing -> {_number(column.fill)}"]
            if column.transform == "log1p":
                parts.append("log1p(max(x, 0))")
            if column.standardize:
                parts.append(f"standardized: mean {_number(column.mean)}, std {_number(column.std)}")
            lines.append(f"     {column.name:<16} {'; '.join(parts)}")
    return lines
