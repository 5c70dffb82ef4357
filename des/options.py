"""Options of the engine that entry points build before TensorFlow is loaded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LearningRates:
    """Multipliers of the optimizers' rates for the next step (``des.schedules``): the runner sets
    them from the global step before every step; the components pass them to the kernels."""

    sparse: float = 1.0
    dense: float = 1.0


@dataclass(frozen=True)
class Optimizers:
    """Which optimizer updates what: one per embedding block (sparse, per row) and one for all
    dense parameters (the field slices of substituted layers and the top network); ``rates`` is
    the current schedule factor of each group (shared by every table and dense state of a rank)."""

    sparse: Mapping[str, Any]
    dense: Any
    rates: LearningRates = field(default_factory=LearningRates)


@dataclass(frozen=True)
class TableOptions:
    capacity: int = 1 << 14
    min_count: int = 1
    unadmitted: str = "init"
