from __future__ import annotations

import pytest

from des.errors import ConfigError, PlacementError
from des.placement import place_fields


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 39])
def test_mod_placement_is_a_partition(ranks: int) -> None:
    placement = place_fields(39, ranks)
    assert sorted(f for fields in placement for f in fields) == list(range(39))
    assert all(f % ranks == r for r, fields in enumerate(placement) for f in fields)


def test_balanced_placement_spreads_ids() -> None:
    counts = [1_000_000, 900_000, 5, 5, 5, 5, 800_000, 10]
    placement = place_fields(8, 3, "balanced", counts)
    assert sorted(f for fields in placement for f in fields) == list(range(8))
    loads = [sum(counts[f] for f in fields) for fields in placement]
    assert max(loads) == 1_000_000  # the three giants land on three different ranks
    assert all(placement)


def test_more_ranks_than_fields_is_a_clear_error() -> None:
    with pytest.raises(PlacementError, match="5 ranks but the data has only 4 fields"):
        place_fields(4, 5)


def test_unknown_policy() -> None:
    with pytest.raises(ConfigError, match="unknown placement 'random'"):
        place_fields(4, 2, "random")
    with pytest.raises(ConfigError, match="distinct-id count"):
        place_fields(4, 2, "balanced")
