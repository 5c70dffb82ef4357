"""A table's memory: the bytes its storage holds by part, the raw payload of its rows, and the bytes
it would take at a given number of rows (the planner's and the reports' figures).

The figures count the row capacity and the index, never the address space reserved beyond the
capacity (``_memory.py``: it holds no memory until used). Read from the table's public surface
(``arrays``, ``row_capacity``, ``capacity``, its initial sizes), so they follow its layout.
"""

from __future__ import annotations

import math
from typing import Any

from .layout import MIN_CAPACITY


def payload_bytes_per_row(table: Any) -> int:
    """Raw payload of one row: key + values + slots (+ Adam step count)."""
    return 8 + sum(b.width * table.stored_dtype.itemsize + (4 if b.optimizer.needs_step else 0) for b in table.blocks)


def _row_bytes(table: Any) -> tuple[int, int]:
    """Bytes per row of capacity: (values, slots and step counts; key and meta)."""
    arrays = table.arrays
    values = (sum(d.itemsize * d.shape[1] for d in arrays.blocks)
              + sum(s.itemsize for s, b in zip(arrays.steps, table.blocks) if b.optimizer.needs_step))
    return values, arrays.keys.itemsize + arrays.meta.itemsize * arrays.meta.shape[1]


def estimated_bytes(table: Any, rows: int, capacity: int | None = None, initial_rows: int | None = None) -> int:
    """Memory ``table`` takes once it holds ``rows`` keys, without growth slack: row arrays of
    exactly ``rows`` rows and an index at its load bound (or the initial allocation, if larger: the
    table's, or a table of the same layout created with ``capacity`` slots and ``initial_rows``
    rows). The real figure is at most ~``ROW_GROWTH`` = 1.15x (rows) and ``INDEX_GROWTH`` = 1.5x
    (index) above it."""
    values, meta = _row_bytes(table)
    index = table.arrays.index
    slot_bytes = index.itemsize * index.shape[1]
    start = table.initial_capacity if capacity is None else max(MIN_CAPACITY, int(capacity))
    slots = max(start, math.ceil(rows / table.max_load) + 1)
    if initial_rows is None:
        initial_rows = table.initial_rows
    else:  # as the table's constructor allocates them: at most its index's fill bound, at least MIN_CAPACITY
        initial_rows = max(MIN_CAPACITY, min(start - 1, int(start * table.max_load), int(initial_rows)))
    return max(rows, initial_rows) * (meta + values) + slots * slot_bytes


def memory(table: Any) -> dict[str, Any]:
    """Allocated bytes by part, rows, pending keys (in the index, no row), capacity, load factor
    (rows and pending keys) and the raw payload for comparison."""
    index = table.arrays.index.nbytes
    cap, n = table.row_capacity, len(table)
    row_values, row_meta = _row_bytes(table)
    values, meta = cap * row_values, cap * row_meta
    total = index + values + meta
    payload = n * payload_bytes_per_row(table)
    return {"bytes": total, "index_bytes": index, "values_bytes": values,
            "metadata_bytes": meta, "rows": n, "row_capacity": cap, "pending": table.pending_count,
            "capacity": table.capacity, "load_factor": (n + table.pending_count) / table.capacity,
            "payload_bytes": payload,
            "bytes_per_row": total / n if n else float("nan"),
            "overhead": total / payload if payload else float("nan")}
