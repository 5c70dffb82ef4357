from __future__ import annotations

import pytest

import numpy as np

from des.data.batch import Batch, FieldBatch
from des.errors import ConfigError, PlacementError
from des.placement import ID_WORK, ROW_WORK, field_work, place_fields
from des.reporting import describe_placement


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


def loads(placement, cost) -> list[float]:
    return [sum(cost[f] for f in fields) for fields in placement]


#: bench_throughput's multi-hot data (des.data.synth, 40,000 rows): each field's distinct ids, and in
#: the first batch of 32768 rows its ids and distinct ids (13 one-hot fields, 26 of 0-50 ids a row)
MULTIHOT_DISTINCT = [94, 167, 168, 86, 284, 192, 147, 114, 150, 30, 70, 75, 114, 25404, 11655, 345006, 308904,
                     6088, 480, 99196, 11875, 60, 162331, 71445, 340878, 51434, 540, 106629, 331413, 200, 71366,
                     32985, 80, 338624, 360, 300, 190717, 2100, 173549]
MULTIHOT_BATCH_IDS = [32768] * 13 + [816133, 814630, 817300, 818236, 819118, 816533, 819279, 820252, 814601,
                                     816621, 817009, 817188, 820959, 817475, 817046, 815659, 823278, 821665,
                                     818281, 817618, 821862, 818388, 816817, 817650, 820334, 820262]
MULTIHOT_BATCH_DISTINCT = [94, 167, 167, 86, 284, 192, 144, 114, 150, 30, 69, 73, 114, 24183, 11639, 289731,
                           260845, 6067, 480, 88660, 11511, 60, 139808, 65283, 286744, 48232, 540, 94451, 278736,
                           200, 65270, 30841, 80, 285405, 360, 300, 162686, 2100, 148952]


def test_balanced_placement_weighs_work_with_memory() -> None:
    """By ids alone, one rank of 8 gathers 15 small multi-valued fields and 1.8x the mean work (a
    step waits for it); by both loads, work and memory are each within 10% of the mean."""
    memory = MULTIHOT_DISTINCT
    work = [i + ID_WORK * d + ROW_WORK * 32768 for i, d in zip(MULTIHOT_BATCH_IDS, MULTIHOT_BATCH_DISTINCT)]
    by_ids = place_fields(39, 8, "balanced", memory)
    by_both = place_fields(39, 8, "balanced", memory, work=work)
    assert sorted(f for fields in by_both for f in fields) == list(range(39)) and all(by_both)
    assert max(loads(by_ids, work)) > 1.5 * np.mean(loads(by_ids, work))
    assert max(loads(by_both, work)) < 1.1 * np.mean(loads(by_both, work))
    assert max(loads(by_both, memory)) < 1.1 * np.mean(loads(by_both, memory))
    assert place_fields(39, 8, "balanced", memory, work=work) == by_both  # a pure function
    assert place_fields(39, 1, "balanced", memory, work=work) == [list(range(39))]
    with pytest.raises(ConfigError, match="work of 3 fields, not 39"):
        place_fields(39, 8, "balanced", memory, work=[1.0, 2.0, 3.0])


def test_balanced_placement_by_work_leaves_no_rank_empty() -> None:
    """One field with nearly all the work: it gets a rank alone, and every other rank a field."""
    placement = place_fields(6, 4, "balanced", [10] * 6, work=[1e9, 1, 1, 1, 1, 1])
    assert all(placement) and [0] in placement


def test_field_work_counts_ids_distinct_ids_and_rows() -> None:
    # field 0: one id a row, two distinct; field 1: rows of 0, 3 and 1 ids, three distinct
    ids = {0: FieldBatch(np.array([0, 1, 2, 3]), np.array([5, 5, 6]), None),
           1: FieldBatch(np.array([0, 0, 3, 4]), np.array([7, 8, 9, 7]), None)}
    work = field_work(Batch(0, 0, np.arange(3), np.zeros(3, np.float32), ids), 2)
    assert work == [3 + ID_WORK * 2 + ROW_WORK * 3, 4 + ID_WORK * 3 + ROW_WORK * 3]


def test_placement_report_gives_each_ranks_share_of_the_work() -> None:
    text = describe_placement([[0], [1, 2]], [5, 5, 5], ["a", "b", "c"], work=[2.0, 1.0, 1.0])
    assert "rank 0:  1 fields,         5 distinct ids, 50.0% of the work  a" in text
    assert "rank 1:  2 fields,        10 distinct ids, 50.0% of the work  b,c" in text
