"""Helpers for tests: small raw Criteo files with known content."""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .keys import NUM_CAT_FIELDS, NUM_INT_FIELDS


def criteo_line(label: int | str, ints: Sequence[object], cats: Sequence[object]) -> str:
    """One raw TSV line (no newline); ``None`` values become empty (missing) columns."""
    values = [label, *ints, *cats]
    return "\t".join("" if v is None else str(v) for v in values)


def random_criteo_lines(count: int, seed: int = 0, missing_rate: float = 0.2) -> list[str]:
    """``count`` valid raw lines with small vocabularies (so ids repeat) and some missing values."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(count) < 0.25).astype(int).tolist()
    ints = rng.integers(-3, 1000, (count, NUM_INT_FIELDS)).tolist()
    cats = (rng.integers(0, 50, (count, NUM_CAT_FIELDS)) * 2654435761 % 2**32).tolist()
    int_missing = (rng.random((count, NUM_INT_FIELDS)) < missing_rate).tolist()
    cat_missing = (rng.random((count, NUM_CAT_FIELDS)) < missing_rate).tolist()
    return [
        criteo_line(
            labels[row],
            [None if gone else v for v, gone in zip(ints[row], int_missing[row])],
            [None if gone else f"{v:08x}" for v, gone in zip(cats[row], cat_missing[row])],
        )
        for row in range(count)
    ]


def write_lines(path: str | Path, lines: Sequence[str], compress: bool | None = None) -> Path:
    """Write lines (each followed by a newline) as text, gzip-compressed if ``compress`` or a .gz name."""
    target = Path(path)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if compress if compress is not None else target.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    target.write_bytes(data)
    return target
