"""Which rank owns which field.

Every rank owns whole fields: their hash tables, optimizer slots and the field slices of any weight
(the DES paper, section 5). Two policies, both pure functions of their inputs, so every rank computes
the same placement without talking:

* ``"mod"`` -- field ``f`` goes to rank ``f mod N`` (the paper's choice);
* ``"balanced"`` -- greedy longest-processing-time on per-field distinct-id counts (the biggest
  field first, each to the rank with the fewest ids so far; ties to the lower field / rank), which
  spreads table memory and lookups when a few fields hold most ids, as in Criteo.
"""

from __future__ import annotations

from collections.abc import Sequence

from des.errors import ConfigError, PlacementError

PLACEMENTS = ("mod", "balanced")


def place_fields(
    num_fields: int,
    num_ranks: int,
    policy: str = "mod",
    distinct_counts: Sequence[int] | None = None,
) -> list[list[int]]:
    """Fields of each rank (sorted), for ``num_ranks`` ranks."""
    if num_ranks < 1:
        raise PlacementError(f"need at least one rank, got {num_ranks}")
    if num_ranks > num_fields:
        raise PlacementError(
            f"{num_ranks} ranks but the data has only {num_fields} fields: every rank must own at "
            f"least one field, so run with at most {num_fields} ranks"
        )
    if policy == "mod":
        return [[f for f in range(num_fields) if f % num_ranks == r] for r in range(num_ranks)]
    if policy == "balanced":
        if distinct_counts is None or len(distinct_counts) != num_fields:
            raise ConfigError("the balanced placement needs the distinct-id count of every field")
        load = [0] * num_ranks
        owned: list[list[int]] = [[] for _ in range(num_ranks)]
        for field in sorted(range(num_fields), key=lambda f: (-int(distinct_counts[f]), f)):
            # The first num_ranks fields land on distinct (empty) ranks, so none is left without one.
            rank = min(range(num_ranks), key=lambda r: (load[r], len(owned[r]), r))
            owned[rank].append(field)
            load[rank] += max(int(distinct_counts[field]), 1)
        return [sorted(fields) for fields in owned]
    raise ConfigError(f"unknown placement {policy!r} (choose one of: {', '.join(PLACEMENTS)})")
