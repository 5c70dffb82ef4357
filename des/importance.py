"""Permutation importance of each input: how much worse a model predicts when one field's values
are shuffled over the evaluated rows (``des.evaluate --importance``, ``des.load(...).importance``).

Field ``f`` (every id of a row, with its weights) or dense feature ``d`` is taken from another row
of the evaluated rows, by a permutation of those rows drawn from ``default_rng([seed, 7, i])``
(``i`` the input's number: fields, then dense features). It is a function of the seed and the
rows only, so every rank reads the same permuted rows and N ranks report what one rank reports.
The labels stay in place. The drop is the baseline's AUC minus the permuted one's (positive: the
model leans on the input) and the permuted logloss minus the baseline's.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from des.metrics import auc_or_none, logloss
from des.predictions import predict_split

COLUMNS = ("input", "kind", "auc", "auc_drop", "logloss", "logloss_rise")


class PermutedStore:
    """A store whose field ``field`` (or dense column ``dense``) of row ``r`` is row
    ``mapping[r]``'s; everything else, labels included, is the store's."""

    def __init__(self, store: Any, mapping: np.ndarray, field: int | None = None, dense: int | None = None) -> None:
        self._store, self._mapping, self._field, self._dense = store, mapping, field, dense

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def gather_fields(self, fields, rows: np.ndarray):
        from des.data.batch import KeyedIds

        fields = list(fields)
        if self._field not in fields:
            return self._store.gather_fields(fields, rows)
        out = self._store.gather_fields([f for f in fields if f != self._field], rows)
        moved = self._store.gather_fields([self._field], self._mapping[rows])[self._field]
        return KeyedIds.of(fields, [moved if f == self._field else out[f] for f in fields])

    def gather(self, field, rows: np.ndarray):
        return self.gather_fields([self._store.field_index(field)], rows)[self._store.field_index(field)]

    def take_dense(self, rows: np.ndarray):
        dense = self._store.take_dense(rows)
        if dense is not None and self._dense is not None:
            dense = np.array(dense, copy=True)
            dense[:, self._dense] = self._store.take_dense(self._mapping[rows])[:, self._dense]
        return dense


def inputs_of(store: Any) -> list[tuple[str, str]]:
    """(name, kind) of each input permuted: the fields in store order, then the dense features."""
    kinds = [entry.get("kind", "field") for entry in store.manifest["fields"]] if hasattr(store, "manifest") else None
    fields = [(name, kinds[f] if kinds else "field") for f, name in enumerate(store.field_names)]
    return fields + [(name, "dense") for name in getattr(store, "dense_names", ())]


def permutation_mapping(store: Any, split: str, index: int, seed: int) -> np.ndarray:
    """Row ``r`` of the split reads input ``index`` from row ``mapping[r]`` (another row of the split)."""
    rows = store.split_rows(split)
    mapping = np.arange(store.num_rows, dtype=np.int64)
    mapping[rows] = rows[np.random.default_rng([int(seed), 7, int(index)]).permutation(rows.shape[0])]
    return mapping


def permutation_importance(strategy: Any, store: Any, split: str, batch_size: int, *, seed: int = 0,
                           labels: np.ndarray | None = None, predicted: tuple[np.ndarray, np.ndarray] | None = None
                           ) -> list[dict[str, Any]] | None:
    """One record per input (:data:`COLUMNS`), on every evaluating rank (collective: each input is
    one :func:`des.predictions.predict_split` pass), in input order; the baseline first, as input
    ``(none)``. ``labels`` replace the store's (as the rows are in split order); ``predicted``: the
    split's predictions and labels already made. None: no rows."""
    base = predicted if predicted is not None else predict_split(strategy, store, split, batch_size)
    if base is None:
        return None
    y = base[1] if labels is None else np.asarray(labels)
    talks = strategy.comm.rank == 0

    def metrics(p: np.ndarray, what: str) -> tuple[float | None, float]:
        return auc_or_none(y, p, what, warn=talks and what == "the evaluated rows"), logloss(y, p)

    base_auc, base_logloss = metrics(base[0], "the evaluated rows")
    records = [{"input": "(none)", "kind": "baseline", "auc": base_auc, "auc_drop": 0.0 if base_auc is not None
                else None, "logloss": base_logloss, "logloss_rise": 0.0}]
    num_fields = store.num_fields
    for index, (name, kind) in enumerate(inputs_of(store)):
        mapping = permutation_mapping(store, split, index, seed)
        permuted = PermutedStore(store, mapping, field=index if index < num_fields else None,
                                 dense=index - num_fields if index >= num_fields else None)
        p = predict_split(strategy, permuted, split, batch_size)[0]
        auc, loss = metrics(p, f"the rows with {name} permuted")
        records.append({"input": name, "kind": kind, "auc": auc,
                        "auc_drop": None if auc is None or base_auc is None else base_auc - auc,
                        "logloss": loss, "logloss_rise": loss - base_logloss})
    return records


def format_table(records: list[dict[str, Any]]) -> str:
    """The records as a text table, the inputs by AUC drop (largest first), the baseline on top."""
    def num(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    base, rest = records[0], records[1:]
    rest = sorted(rest, key=lambda r: (-(r["auc_drop"] if r["auc_drop"] is not None else -np.inf),
                                       -r["logloss_rise"]))
    width = max(8, *(len(r["input"]) for r in records))
    lines = [f"{'input':<{width}}  {'kind':<12} {'auc':>9} {'auc drop':>10} {'logloss':>9} {'logloss rise':>13}"]
    lines.append("-" * len(lines[0]))
    for r in [base, *rest]:
        lines.append(f"{r['input']:<{width}}  {r['kind']:<12} {num(r['auc'], '.6f'):>9} {num(r['auc_drop'], '+.6f'):>10} "
                     f"{r['logloss']:>9.6f} {r['logloss_rise']:>+13.6f}")
    return "\n".join(lines)


def write_importance(records: list[dict[str, Any]], folder: Path, *, about: dict[str, Any] | None = None
                     ) -> list[Path]:
    """``importance.csv`` and ``importance.json`` in ``folder`` (and ``importance.png``, a bar plot
    of the AUC drops, when matplotlib imports); returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    path = folder / "importance.csv"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: ("" if r[k] is None else r[k]) for k in COLUMNS} for r in records)
    os.replace(tmp, path)
    written.append(path)
    path = folder / "importance.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**(about or {}), "inputs": records}, indent=1))
    os.replace(tmp, path)
    written.append(path)
    plot = plot_importance(records, folder / "importance.png")
    if plot is not None:
        written.append(plot)
    return written


def plot_importance(records: list[dict[str, Any]], path: Path) -> Path | None:
    """A horizontal bar plot of the AUC drops (None, and nothing written, without matplotlib or
    without AUC)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - optional: any failure to import it means no plot
        return None
    rows = sorted((r for r in records[1:] if r["auc_drop"] is not None), key=lambda r: r["auc_drop"])
    if not rows:
        return None
    figure, axes = plt.subplots(figsize=(6, max(2.0, 0.22 * len(rows) + 1)))
    axes.barh([r["input"] for r in rows], [r["auc_drop"] for r in rows])
    axes.set_xlabel("AUC drop when the input is permuted")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
