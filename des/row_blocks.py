"""The row blocks of a global batch, below the data, the collectives and the planner, which all
split batches by them."""

from __future__ import annotations


def row_bounds(rows: int, parts: int) -> list[int]:
    """Part ``p`` of ``rows`` rows split into ``parts`` is ``[bounds[p], bounds[p+1])``, ``bounds[p] =
    p·rows // parts`` (the remainder spread evenly). The one definition of a global batch's row
    blocks: a sharded reader's part, the Communicator's row-block collectives and the planner's
    counts must agree row for row (alltoall's rows are DES's row blocks)."""
    return [p * rows // parts for p in range(parts + 1)]
