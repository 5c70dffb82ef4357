"""Dynamic embedding tables for DES: numba open-addressing hash tables from int64 feature ids to
rows of value blocks with co-located optimizer slots, deterministic counter-based initialization,
admission, eviction and a pickle-free checkpoint format; plus the optimizer kernels that dense
parameters share with the sparse rows. See DESIGN.md section 5."""

from . import _cacheguard

_cacheguard.check()  # before any kernel is compiled or loaded from the numba cache

from .format import TableFormatError  # noqa: E402
from .init import Initializer
from .optimizers import (FTRL, SGD, AdaGrad, Adam, DenseOptimizerState, optimizer_from_dict,
                         optimizer_from_spec)
from .table import EMPTY_KEY, BlockSpec, EmbeddingTable

__all__ = ["EmbeddingTable", "BlockSpec", "Initializer", "SGD", "AdaGrad", "Adam", "FTRL",
           "DenseOptimizerState", "optimizer_from_dict", "optimizer_from_spec", "TableFormatError",
           "EMPTY_KEY"]
