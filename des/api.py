"""A trained model in a notebook: ``des.load(run_or_checkpoint)`` and what it does with DataFrames.

    import des, pandas as pd
    model = des.load("runs/deepfm-20260101-120000")       # a run folder, checkpoints/ or a checkpoint
    df = pd.read_csv("day-7.csv", dtype=model.dtypes)      # the schema's raw columns
    p = model.predict(df)                                  # click probabilities, in frame order
    model.evaluate(df)                                     # {"auc": ..., "logloss": ..., "rows": ...}
    model.importance(df)                                   # a DataFrame: AUC and logloss drop per field

Everything runs on one process (``MPI.COMM_SELF``) through des's own evaluation path
(``des/evaluate.py``): the frame's rows become a store prepared whole with the checkpoint's schema
and training statistics (``des.data.frames``), and the checkpoint's model predicts them with the
``des`` strategy, so ``predict`` gives what ``des.evaluate --predictions`` gives for the same rows in
a file. Ids never seen in training are looked up without being inserted: calls never change the
model. Train in a notebook with :func:`des.train.run`; the page is ``docs/python-api.md``.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from des.errors import ConfigError


def load(path: str | Path, *, schema: str = "", batch_size: int = 8192) -> Model:
    """The model of a run folder, a ``checkpoints/`` folder (its ``latest``) or a checkpoint folder,
    on this process. ``schema``: a schema to check the checkpoint's against (as ``--schema``)."""
    return Model(path, schema=schema, batch_size=batch_size)


class Model:
    """A checkpoint's model, loaded once (see the module doc)."""

    def __init__(self, path: str | Path, *, schema: str = "", batch_size: int = 8192) -> None:
        from mpi4py import MPI

        from des import runtime
        from des.checkpoint import resolve_checkpoint
        from des.collectives import Communicator
        from des.evaluate import load_model, read_checkpoint

        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        runtime.configure_threads()
        self.checkpoint = resolve_checkpoint(path).resolve()
        self.config, self.manifest, self.schema = read_checkpoint(self.checkpoint, schema)
        self.batch_size = batch_size
        self._strategy = load_model(self.checkpoint, self.config, self.manifest, Communicator(MPI.COMM_SELF))

    def __repr__(self) -> str:
        return (f"<des model {self.config.model} of schema {self.schema.name}, step {self.manifest['step']}, "
                f"{self.manifest['num_fields']} fields: {self.checkpoint}>")

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def columns(self) -> dict[str, str]:
        """The raw columns a frame holds and their value dtypes (``int``, ``float``, ``string``),
        the label first (needed by :meth:`evaluate` and :meth:`importance` only)."""
        from des.data.frames import frame_columns

        return frame_columns(self.schema)

    @property
    def dtypes(self) -> dict[str, Any]:
        """``pandas.read_csv(..., dtype=model.dtypes)``: each column read as the schema reads it
        (text as ``str``, integers as nullable ``Int64``, numbers as ``float64``)."""
        return {name: {"int": "Int64", "float": "float64", "string": str}[kind] for name, kind in self.columns.items()}

    @contextmanager
    def _store(self, frame: Any):
        from des.data.frames import frame_store
        from des.evaluate import check_data

        with tempfile.TemporaryDirectory(prefix="des-frame-") as folder:
            store = frame_store(frame, self.schema, Path(folder) / "store")
            check_data(store, self.manifest, "the DataFrame")
            yield store

    def _predicted(self, store: Any) -> tuple[np.ndarray, np.ndarray]:
        from des.predictions import predict_split

        return predict_split(self._strategy, store, "all", self.batch_size)

    def predict(self, frame: Any) -> np.ndarray:
        """Click probabilities of the rows of ``frame`` (a pandas DataFrame of the schema's raw
        columns, :attr:`columns`), in frame order, in the model's dtype."""
        with self._store(frame) as store:
            return self._predicted(store)[0]

    def evaluate(self, frame: Any, label: Any = None) -> dict[str, Any]:
        """AUC (None with one class), logloss and rows of ``frame``'s rows against ``label``: None,
        the schema's label column (its rule applied); a column name, that column read as the label
        column; or 0/1 values, one per row."""
        from des.metrics import auc_or_none, logloss

        frame, labels = _with_label(frame, label, self.columns)
        with self._store(frame) as store:
            p, y = self._predicted(store)
        y = y if labels is None else labels
        return {"auc": auc_or_none(y, p, "the DataFrame's rows"), "logloss": logloss(y, p), "rows": int(y.size)}

    def importance(self, frame: Any, label: Any = None, *, seed: int = 0) -> Any:
        """Permutation importance (``des/importance.py``, as ``des.evaluate --importance``): a
        DataFrame of one row per field and dense feature (input, kind, auc, auc_drop, logloss,
        logloss_rise), largest AUC drop first, the baseline (input ``(none)``) on top."""
        import pandas as pd

        from des.importance import COLUMNS, permutation_importance

        frame, labels = _with_label(frame, label, self.columns)
        with self._store(frame) as store:
            records = permutation_importance(self._strategy, store, "all", self.batch_size, seed=seed, labels=labels)
        table = pd.DataFrame(records, columns=list(COLUMNS))
        order = table.iloc[1:].sort_values(["auc_drop", "logloss_rise"], ascending=False, na_position="last")
        return pd.concat([table.iloc[:1], order]).reset_index(drop=True)


def _with_label(frame: Any, label: Any, columns: dict[str, str]) -> tuple[Any, np.ndarray | None]:
    """The frame whose label column is ``label``'s, and the labels given as values (or None)."""
    name = next(iter(columns))  # the schema's label column
    if label is None:
        if name not in frame.columns:
            raise ConfigError(f"the DataFrame has no label column {name!r}: pass label=COLUMN or label=VALUES")
        return frame, None
    if isinstance(label, str):
        if label not in frame.columns:
            raise ConfigError(f"the DataFrame has no column {label!r}")
        return frame.assign(**{name: frame[label]}), None
    labels = np.asarray(label, dtype=np.float64).ravel()
    if labels.size != len(frame) or not np.isin(labels, (0.0, 1.0)).all():
        raise ConfigError(f"label: expected {len(frame)} values of 0 or 1, one per row")
    return frame, labels
