"""Dynamic embedding tables for DES: numba open-addressing hash tables from int64 feature ids to
rows of value blocks with co-located optimizer slots, deterministic counter-based initialization,
admission, eviction and a pickle-free checkpoint format; plus the optimizer kernels that dense
parameters share with the sparse rows. See ``docs/design.md``, "Hash tables"."""

import os as _os

from .._numba_cache import guard as _guard

# before any kernel is compiled or loaded from the numba cache: kernels inline helpers of other
# modules of this package and of des/splitmix.py, which numba's per-file cache check does not see
# (des/_numba_cache.py)
_guard(_os.path.dirname(_os.path.abspath(__file__)), "des_hashtable_sources.sha256")

from ._threads import background_thread  # noqa: E402
from .format import TableFormatError  # noqa: E402
from .init import Initializer  # noqa: E402
from .optimizers import (  # noqa: E402
    FTRL, SGD, AdaGrad, Adam, DenseOptimizerState, RowwiseAdaGrad, RowwiseAdam, optimizer_from_dict,
    optimizer_from_spec)
from .table import EMPTY_KEY, BlockSpec, EmbeddingTable  # noqa: E402

__all__ = ["EmbeddingTable", "BlockSpec", "Initializer", "SGD", "AdaGrad", "Adam", "FTRL",
           "RowwiseAdaGrad", "RowwiseAdam", "DenseOptimizerState", "optimizer_from_dict", "optimizer_from_spec", "TableFormatError",
           "EMPTY_KEY", "background_thread"]
