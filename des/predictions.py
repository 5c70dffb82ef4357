"""A split's predictions by a strategy, and their exact metrics: the floor above the data's reader
and below the loop (:mod:`des.run`, :mod:`des.runner`), the streams' progressive validation
(:mod:`des.sources`), ``des.evaluate`` and ``des.check``. The metrics themselves are
:mod:`des.metrics`, which knows nothing of stores or readers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from des.data.batch_reader import BatchReader
from des.metrics import auc_or_none, logloss


def predict_split(strategy, store, split: str, batch_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Predictions and labels of a whole split of ``store`` in store order, by ``strategy`` (on every
    rank of its evaluators); ``None`` when the split has no rows."""
    reader = BatchReader(store, split, batch_size=batch_size, seed=0, shuffle=False, drop_last=False,
                         **strategy.reader_options())
    if reader.num_rows == 0:
        return None
    parts = [strategy.predict(batch) for batch in reader]
    return np.concatenate([p for p, _ in parts]), np.concatenate([y for _, y in parts])


def evaluate_split(strategy, store, split: str, batch_size: int) -> dict[str, Any] | None:
    """Exact AUC and logloss over a whole split; AUC ``None`` (n/a, ``null`` in JSON) with one
    warning from the first evaluating rank when the split has one class."""
    result = predict_split(strategy, store, split, batch_size)
    if result is None:
        return None
    p, y = result
    auc = auc_or_none(y, p, f"the {split} split", warn=strategy.comm.rank == strategy.evaluators[0])
    return {"auc": auc, "logloss": logloss(y, p), "rows": int(y.size)}
