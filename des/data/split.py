"""Deterministic train/validation/test assignment of rows.

The split of row ``i`` is a pure function of ``(seed, i)``: with ``h`` the i-th output of a
SplitMix64 stream seeded with ``seed`` and ``x = (h >> 11) / 2^53`` in [0, 1), the row is
``train`` if ``x < f_train``, ``validation`` if ``x < f_train + f_validation``, else ``test``.
So a store can be written in streaming chunks of any size and gets the same split.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from .errors import DataError
from ..splitmix import seed_to_uint64, stream_value, unit_float

SPLIT_NAMES: tuple[str, ...] = ("train", "validation", "test")
DEFAULT_SPLIT: tuple[float, float, float] = (0.9, 0.05, 0.05)


def check_fractions(fractions: Sequence[float] | str | None) -> tuple[float, float, float]:
    """Validate split fractions (a 3-sequence or ``"0.9,0.05,0.05"``; ``None`` = the default 90/5/5)."""
    if fractions is None:
        return DEFAULT_SPLIT
    if isinstance(fractions, str):
        try:
            fractions = [float(part) for part in fractions.split(",")]
        except ValueError:
            raise DataError(f"split {fractions!r} is not three comma-separated numbers") from None
    values = tuple(float(x) for x in fractions)
    if len(values) != 3:
        raise DataError(f"split needs 3 fractions (train, validation, test), got {len(values)}")
    if any(not np.isfinite(x) or x < 0 for x in values) or abs(sum(values) - 1.0) > 1e-6:
        raise DataError(f"split fractions {values} must be non-negative and sum to 1")
    return values  # type: ignore[return-value]


@numba.njit(cache=True)
def _assign_kernel(seed: np.uint64, start: int, cut_train: float, cut_validation: float, out: np.ndarray) -> None:
    for i in range(out.shape[0]):
        x = unit_float(stream_value(seed, np.uint64(start + i)))
        if x < cut_train:
            out[i] = 0
        elif x < cut_validation:
            out[i] = 1
        else:
            out[i] = 2


def assign_splits(seed: int, fractions: Sequence[float], start: int, count: int) -> np.ndarray:
    """Split codes (uint8: 0 train, 1 validation, 2 test) of rows ``start .. start+count-1``."""
    f_train, f_validation, _ = check_fractions(fractions)
    out = np.empty(count, dtype=np.uint8)
    _assign_kernel(seed_to_uint64(seed), int(start), f_train, f_train + f_validation, out)
    return out


def split_code(name: str) -> int:
    """The code (0, 1, 2) of a split name."""
    try:
        return SPLIT_NAMES.index(name)
    except ValueError:
        raise DataError(f"unknown split {name!r} (expected one of {', '.join(SPLIT_NAMES)} or 'all')") from None
