"""Training strategies in the same engine, for honest comparison (``DESIGN.md`` section 7).

* ``des`` -- :class:`des.engine.DESEngine`: partials of the substituted operators, ONE AllReduce.
* ``alltoall`` -- :class:`des.strategies.alltoall.AllToAllEngine`: embeddings fetched from their
  owners and row gradients sent back (Alltoallv), dense gradients AllReduced.
* ``ps`` -- :mod:`des.strategies.ps`: an asynchronous parameter server.
"""

from __future__ import annotations

STRATEGIES = ("des", "alltoall", "ps")


def engine_class(strategy: str):
    """The engine class of a synchronous strategy."""
    if strategy == "des":
        from des.engine import DESEngine

        return DESEngine
    if strategy == "alltoall":
        from des.strategies.alltoall import AllToAllEngine

        return AllToAllEngine
    raise ValueError(f"{strategy!r} is not a synchronous engine strategy")
