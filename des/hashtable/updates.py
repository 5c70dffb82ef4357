"""A table's optimizer application: gradients of a batch into its rows, and the catch-up of rows
whose optimizer defers work (``docs/design.md``, section 4, "Optimizers").

Apart from the storage as SOK keeps its optimizers apart from ``DynamicVariable``: the slots live
in the table's rows (co-located with the values, ``layout.BlockSpec.columns``), the update rules
in ``optimizers.py``; this module only sums a batch's gradients by row and hands the rows to the
block's optimizer. It reads the table through its public storage surface (``arrays``, ``len``,
``block_index``) and writes the rows in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _index as K
from .bfloat16 import update_stored_rows
from .layout import check_rate


class RowUpdates:
    """The optimizer application of one table, passed in at each call (this object keeps only
    scratch buffers, so that it and the table hold no reference to each other)."""

    def __init__(self) -> None:
        self._scratch_bufs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def apply_gradients(self, table: Any, block: str, rows: np.ndarray, grads: np.ndarray, step: int,
                        lr_scale: float = 1.0) -> None:
        """Apply block ``block``'s optimizer to the rows of ``table``, in place.

        ``grads`` is ``[n, dim]``, one row per occurrence: gradients of duplicate rows are summed
        first (in occurrence order), then the optimizer runs once per unique admitted row. Rows -1
        and unadmitted rows are skipped. ``step`` is recorded as ``last_update_step`` only (Adam's
        step count is per row, see ``optimizers.py``). ``lr_scale``: a schedule's factor of the rate.
        """
        b = table.block_index(block)
        spec = table.blocks[b]
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        grads = np.asarray(grads)
        if grads.shape != (rows.shape[0], spec.dim):
            raise ValueError(f"apply_gradients({block!r}): grads shape {grads.shape} != "
                             f"({rows.shape[0]}, {spec.dim})")
        grads = np.ascontiguousarray(grads, dtype=table.dtype)
        check_rate((spec,), lr_scale)
        uniq, acc = self._scratch(rows.shape[0], spec.dim, table.dtype)
        arrays, n = table.arrays, len(table)
        u, bad = K.sum_duplicates(rows, grads, n, arrays.meta, table.min_count, uniq, acc)
        if bad >= 0:
            raise ValueError(f"apply_gradients: row {rows[bad]} at position {bad} is not a row of "
                             f"this table ({n} rows)")
        if table.table_dtype == "bfloat16":  # widened, updated and rounded back (bfloat16.py)
            widths = (*spec.slot_widths, 0, 0)
            args = spec.optimizer.kernel_args(table.dtype, lr_scale, int(step) + 1)
            update_stored_rows(arrays.blocks[b], spec.value_columns, widths[0], widths[1], arrays.steps[b],
                               np.ascontiguousarray(uniq[:u]), acc[:u], tuple(args), arrays.keys,
                               table.stream_bases[b], int(step) + 1)
        else:
            values, slots = spec.columns(arrays.blocks[b])
            spec.optimizer.apply_rows(values, slots, _steps(spec, arrays, b), uniq[:u], acc[:u], lr_scale,
                                      int(step) + 1)
        table.last_update_step = int(step)

    def _scratch(self, n: int, dim: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Reused buffers for the unique rows and summed gradients of one batch (fresh arrays of
        a few MB per call would cost page faults on every step)."""
        uniq, acc = self._scratch_bufs.get(dim, (None, None))
        if uniq is None or uniq.shape[0] < n:
            size = max(n, 1024)
            uniq = np.empty(size, dtype=np.int64)
            acc = np.empty((size, dim), dtype=dtype)
            self._scratch_bufs[dim] = (uniq, acc)
        return uniq, acc


def catch_up(table: Any, steps_done: int, lr_scale: float = 1.0) -> None:
    """Rows of ``table`` whose optimizer defers work (Adam with ``catchup``) take it up to
    ``steps_done`` global steps: before evaluation and checkpoints."""
    arrays, n = table.arrays, len(table)
    for b, spec in enumerate(table.blocks):
        values, slots = spec.columns(arrays.blocks[b])
        spec.optimizer.catch_up(values, slots, _steps(spec, arrays, b), n, int(steps_done), lr_scale)


def _steps(spec: Any, arrays: Any, b: int) -> np.ndarray | None:
    """Block ``b``'s per-row step counts, None where its optimizer keeps none."""
    return arrays.steps[b] if spec.optimizer.needs_step else None
