"""Options of the engine that entry points build before TensorFlow is loaded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Optimizers:
    """Which optimizer updates what: one per embedding block (sparse, per row) and one for all
    dense parameters (the field slices of substituted layers and the top network)."""

    sparse: Mapping[str, Any]
    dense: Any


@dataclass(frozen=True)
class TableOptions:
    capacity: int = 1 << 14
    min_count: int = 1
    unadmitted: str = "init"
