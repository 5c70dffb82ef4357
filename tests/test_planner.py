"""des/planner.py: the per-operator byte cost model -- its formulas on hand-computed
cases, the ``--plan`` text, and on one 2-rank job the Communicator's measured bytes of every plan
(auto, the default; all exchange = alltoall; a mixed one) equal its prediction exactly, site by
site and rank by rank."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from des.planner import (EXCHANGE, PARTIALS, ModelShape, Operator, UniqueIds, best_plan, estimate_unique_ids,
                         model_shape, normalize_plan, operator_costs, partials_bytes, plan_cost, report, row_blocks,
                         unique_ids_of_batches)

# A 3-field model: a 1-wide linear operator and a 3-wide "fc" on a 2-float block (6 weights per
# field, 18 in all), a 5-parameter top. Rank 0 owns fields 0 and 2, rank 1 field 1.
TINY = ModelShape(operators=(Operator("linear", "linear", 1, 1, 0), Operator("fc", "emb", 2, 3, 18)),
                  blocks={"linear": 1, "emb": 2}, top_params=5, num_fields=3)
PLACEMENT = [[0, 2], [1]]
# U_{q,f}: distinct ids of field f in row block q (B = 5: rank 0 has rows 0-1, rank 1 rows 2-4)
UNIQUE = UniqueIds(5, 2, np.array([[2, 1, 2], [3, 2, 1]]))


def test_row_blocks_split_the_remainder_like_the_communicator() -> None:
    assert row_blocks(5, 2) == [2, 3]
    assert row_blocks(10, 3) == [3, 3, 4] and row_blocks(4096, 4) == [1024] * 4
    assert row_blocks(7, 1) == [7]


def test_partials_by_hand() -> None:
    cost = plan_cost(TINY, PARTIALS, 5, PLACEMENT, None)
    # reduce-scatter and all-gather of (1 + 3) float32 columns, all rows but the rank's own block
    assert cost.terms["partials_reduce_scatter"] == [3 * 4 * 4, 2 * 4 * 4]
    assert cost.terms["gradient_allgather"] == [48, 32]
    # ring AllReduce, 2 (N-1)/N = 1 float sent per float: 5 top gradients and the loss
    assert cost.terms["top_gradients"] == [20, 20] and cost.terms["loss"] == [4, 4]
    assert cost.per_rank() == [120, 88] and cost.mean == 104
    assert cost.sites() == {"partials_reduce_scatter": [48, 32], "gradient_allgather": [48, 32],
                            "top_gradients": [24, 24]}
    # float64 doubles every float, and an even split gives the paper's 2 (N-1)/N · s · B · w
    assert plan_cost(TINY, PARTIALS, 5, PLACEMENT, None, dtype_size=8).per_rank() == [240, 176]
    assert np.mean(partials_bytes(400, 4096, 4)) == 2 * 3 / 4 * 4 * 4096 * 400
    assert partials_bytes(1, 10, 3) == [2 * 7 * 4, 2 * 7 * 4, 2 * 6 * 4]


def test_replicated_upper_is_one_allreduce_of_the_buffer() -> None:
    cost = plan_cost(TINY, PARTIALS, 5, PLACEMENT, None, upper="replicated")
    assert cost.terms == {"forward_partials": [5 * 4 * 4, 5 * 4 * 4]}  # 2 (N-1)/N · 4 · B · P, P = 4
    assert cost.sites() == {"forward_partials": [80, 80]}
    with pytest.raises(ValueError, match="all-partials"):
        plan_cost(TINY, EXCHANGE, 5, PLACEMENT, UNIQUE, upper="replicated")


def test_exchange_by_hand() -> None:
    cost = plan_cost(TINY, EXCHANGE, 5, PLACEMENT, UNIQUE)
    # rank 0 serves fields 0 and 2 of rank 1's rows (3 + 1 distinct ids) and returns the gradients
    # of field 1 in its own rows (1); rank 1 serves field 1 of rank 0's rows (1) and returns fields
    # 0 and 2 of its rows (3 + 1); values are both blocks, 1 + 2 floats; no keys, no counts
    assert cost.terms["rows"] == [4 * 3 * 4, 4 * 3 * 1]
    assert cost.terms["row_gradients"] == [4 * 3 * 1, 4 * 3 * 4]
    assert cost.terms["field_weight_gradients"] == [18 * 4, 18 * 4]
    assert cost.per_rank() == [48 + 12 + 72 + 24, 12 + 48 + 72 + 24]
    sites = cost.sites()
    assert sites == {"exchange_values": [48, 12], "exchange_gradients": [12, 48], "top_gradients": [72 + 24] * 2}
    assert sum(map(sum, sites.values())) == sum(cost.per_rank())


def test_exchange_by_rows_by_hand() -> None:
    cost = plan_cost(TINY, EXCHANGE, 5, PLACEMENT, None, exchange_by="rows")
    # rank 0 sends its 2 fields of rank 1's 3 rows and gets back field 1's of its own 2 rows; rank
    # 1 its 1 field of rank 0's 2 rows, and returns fields 0 and 2 of its 3 rows: 1 + 2 floats each
    assert cost.terms["rows"] == [4 * 3 * 3 * 2, 4 * 3 * 2 * 1]
    assert cost.terms["row_gradients"] == [4 * 3 * 2 * 1, 4 * 3 * 3 * 2]
    assert cost.id_pairs == 0 and cost.terms["field_weight_gradients"] == [18 * 4, 18 * 4]
    assert cost.sites()["exchange_values"] == [72, 24]


def test_the_way_exchanges_travel_is_the_one_of_fewer_bytes() -> None:
    """Per distinct id where row blocks repeat ids (TINY's UNIQUE: at most one id a row and field),
    by rows where a row holds more ids than it has fields (multi-hot); the planner then ranks every
    plan with that way, and by rows no per-id work is counted."""
    from des.planner import Planning, exchange_way

    assert exchange_way(TINY, 5, PLACEMENT, UNIQUE) == "ids"
    multi_hot = UniqueIds(5, 2, np.array([[6, 5, 6], [9, 8, 7]]))
    assert exchange_way(TINY, 5, PLACEMENT, multi_hot) == "rows"
    assert exchange_way(TINY, 5, PLACEMENT, None) == "ids"
    planning = Planning(TINY, 5, PLACEMENT, multi_hot, exchange_by="auto")
    assert planning.exchange_by == "rows" and planning.cost(EXCHANGE).exchange_by == "rows"
    assert planning.cost(EXCHANGE).id_pairs == 0 and "travel by rows" in planning.report()
    assert Planning(TINY, 5, PLACEMENT, multi_hot, exchange_by="ids").cost(EXCHANGE).id_pairs > 0
    assert "3 pooled fields/sample (by rows)" in planning.report()
    split = Planning(TINY, 5, [[0, 2], [1, 2]], multi_hot, exchange_by="rows")  # field 2 split: in the partials
    assert "2 pooled fields/sample (by rows)" in split.report()


def test_a_block_read_by_two_exchanged_operators_travels_once() -> None:
    shape = ModelShape((Operator("fm", "emb", 2, 3, 0), Operator("fc", "emb", 2, 4, 10)), {"emb": 2}, 0, 3)
    one = plan_cost(shape, {"fc": EXCHANGE}, 5, PLACEMENT, UNIQUE)
    both = plan_cost(shape, EXCHANGE, 5, PLACEMENT, UNIQUE)
    for term in ("rows", "row_gradients"):
        assert both.terms[term] == one.terms[term], term
    # what exchanging fm too changes: its partials go, no weights come (it has none)
    assert both.mean == one.mean - np.mean(partials_bytes(3, 5, 2))
    assert (one.calls, both.calls) == (5, 3)  # a mixed plan adds the partials' two collectives
    assert best_plan(shape, 5, PLACEMENT, UNIQUE).score <= min(both.score, one.score)


def test_mixed_plan_and_its_operator_costs() -> None:
    mixed = plan_cost(TINY, {"fc": EXCHANGE}, 5, PLACEMENT, UNIQUE)
    assert mixed.plan == {"linear": PARTIALS, "fc": EXCHANGE}
    assert mixed.terms["partials_reduce_scatter"] == [3 * 4 * 1, 2 * 4 * 1]  # linear's column only
    assert mixed.terms["rows"] == [4 * 2 * 4, 4 * 2 * 1]  # the emb block only
    assert mixed.sites() == {"partials_reduce_scatter": [12, 8], "gradient_allgather": [12, 8],
                             "exchange_values": [32, 8], "exchange_gradients": [8, 32], "top_gradients": [96, 96]}
    costs = {c.operator.name: c for c in operator_costs(TINY, 5, PLACEMENT, UNIQUE)}
    assert costs["fc"].partials == np.mean([2 * 3 * 4 * 3, 2 * 2 * 4 * 3])
    assert costs["fc"].exchange == pytest.approx(np.mean([32 + 8 + 72, 8 + 32 + 72]))
    assert costs["fc"].cheaper == PARTIALS  # 5 rows, 18 weights: nothing to win
    best = best_plan(TINY, 5, PLACEMENT, UNIQUE)
    pure = [plan_cost(TINY, m, 5, PLACEMENT, UNIQUE) for m in (PARTIALS, EXCHANGE)]
    assert best.mean <= min(p.mean for p in pure) and best.score <= min(p.score for p in pure)


def test_a_collective_call_costs_bytes() -> None:
    """A mixed plan that saves fewer bytes than two collective calls cost loses to a pure plan; one
    that saves more wins (DeepFM, N=4: Criteo-like ids at B=512; every id distinct at B=65536, where
    the order-1 weights are cheaper as partials)."""
    from des.models import get_model
    from des.planner import CALL_BYTES

    shape = model_shape(get_model("deepfm")())
    placement = [list(range(r, 39, 4)) for r in range(4)]
    for batch, per_field, expected in ((512, 20.0, "exchange"), (65_536, 16_384.0, "linear=partials")):
        unique = UniqueIds(batch, 4, np.full((4, 39), per_field))
        best = best_plan(shape, batch, placement, unique)
        pure = min((plan_cost(shape, m, batch, placement, unique) for m in (PARTIALS, EXCHANGE)), key=lambda c: c.mean)
        mixed = plan_cost(shape, {"fm2": EXCHANGE, "first_fc": EXCHANGE}, batch, placement, unique)
        assert (mixed.mean < pure.mean) and mixed.calls == pure.calls + 2
        assert (pure.mean - mixed.mean > 2 * CALL_BYTES) == (expected != "exchange")
        assert (best.plan == pure.plan) == (expected == "exchange"), (batch, best.plan)


def test_the_exchange_local_work_counts() -> None:
    """Heavy multi-hot data (DeepFM B=4096, N=4, ~148 distinct ids per sample and row block, as
    ``bench_throughput --data multihot``): a mixed plan moves the fewest bytes, but its ~300k
    (id, row block) pairs per rank of exchange work outweigh them, so auto runs all partials (1.7x
    the mixed plan's speed, measured); Criteo-like ids (~7) still exchange everything."""
    from des.models import get_model
    from des.planner import ID_BYTES

    shape = model_shape(get_model("deepfm")())
    placement = [list(range(r, 39, 4)) for r in range(4)]
    heavy = UniqueIds(4096, 4, np.full((4, 39), 148 * 4096 / (4 * 39)))
    partials = plan_cost(shape, PARTIALS, 4096, placement, heavy)
    mixed = plan_cost(shape, {"fm2": EXCHANGE, "first_fc": EXCHANGE}, 4096, placement, heavy)
    assert mixed.mean < partials.mean and mixed.id_pairs == pytest.approx(2 * 148 * 4096 / 4)
    assert partials.id_pairs == 0 and partials.score < mixed.score
    assert mixed.score == pytest.approx(mixed.mean + 5 * 65_536 + ID_BYTES * mixed.id_pairs)
    assert set(best_plan(shape, 4096, placement, heavy).plan.values()) == {PARTIALS}
    light = UniqueIds(4096, 4, np.full((4, 39), 7 * 4096 / (4 * 39)))
    assert set(best_plan(shape, 4096, placement, light).plan.values()) == {EXCHANGE}


def test_plan_option_text() -> None:
    from des.planner import AUTO, format_plan, parse_plan

    assert parse_plan("auto", TINY) == AUTO
    assert parse_plan("exchange", TINY) == {"linear": EXCHANGE, "fc": EXCHANGE}
    assert parse_plan(" fc=exchange ", TINY) == {"linear": PARTIALS, "fc": EXCHANGE}
    assert format_plan({"linear": PARTIALS, "fc": EXCHANGE}) == "linear=partials,fc=exchange"
    assert format_plan({"linear": EXCHANGE, "fc": EXCHANGE}) == EXCHANGE
    for bad in ("fc", "fc=both", "nope=exchange", "sometimes"):
        with pytest.raises(ValueError, match="--plan"):
            parse_plan(bad, TINY)


def test_one_rank_sends_nothing() -> None:
    shape = ModelShape((Operator("linear", "linear", 1, 1, 0), Operator("fm2", "emb", 8, 9, 0),
                        Operator("first_fc", "emb", 8, 400, 124_800)), {"linear": 1, "emb": 8}, 321_602, 39)
    unique = UniqueIds(4096, 1, np.full((1, 39), 100.0))
    for plan in (PARTIALS, EXCHANGE, {"first_fc": EXCHANGE}):
        cost = plan_cost(shape, plan, 4096, [list(range(39))], unique)
        assert cost.per_rank() == [0.0], plan
    assert "one rank: nothing moves" in report(shape, 4096, [list(range(39))], unique)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="placement"):
        plan_cost(TINY, PARTIALS, 5, [[0], [1]], None)
    with pytest.raises(ValueError, match="unknown operators"):
        plan_cost(TINY, {"nope": EXCHANGE}, 5, PLACEMENT, UNIQUE)
    with pytest.raises(ValueError, match="unique ids"):
        plan_cost(TINY, EXCHANGE, 5, PLACEMENT, None)
    with pytest.raises(ValueError, match="unique ids"):
        plan_cost(TINY, EXCHANGE, 6, PLACEMENT, UNIQUE)  # statistics of another batch size
    with pytest.raises(ValueError, match="per_block"):
        UniqueIds(5, 3, np.zeros((2, 3)))


def test_model_shapes_of_the_built_in_models() -> None:
    from des.models import get_model

    deepfm = model_shape(get_model("deepfm")())
    assert [(o.name, o.block, o.block_dim, o.width) for o in deepfm.operators] == [
        ("linear", "linear", 1, 1), ("fm2", "embedding", 8, 9), ("first_fc", "embedding", 8, 400)]
    assert deepfm.buffer_width == 410 and deepfm.operators[2].field_params == 39 * 8 * 400
    # the top: output bias, first-layer bias, 400x400+400 twice, 400x1+1
    assert deepfm.top_params == 1 + 400 + 2 * 160_400 + 401
    assert [model_shape(get_model(m)()).buffer_width for m in ("lr", "fm", "wdl")] == [1, 10, 401]
    assert model_shape(get_model("lr")()).blocks == {"linear": 1}


def _batch(columns: list[list[list[int]]]) -> SimpleNamespace:
    """A stand-in for des.data.Batch: columns[f][row] = the ids of field f in that row."""
    rows = len(columns[0])

    def take(lo: int, hi: int) -> SimpleNamespace:
        fields = [SimpleNamespace(keys=np.array([k for row in col[lo:hi] for k in row], dtype=np.int64))
                  for col in columns]
        return SimpleNamespace(size=hi - lo, fields=fields)

    return SimpleNamespace(size=rows, take=take)


def test_unique_ids_are_counted_per_row_block() -> None:
    # 5 rows, 2 fields; field 1 multi-hot. Row blocks of 2 ranks: rows 0-1 and 2-4.
    first = _batch([[[1], [1], [2], [3], [2]], [[7, 8], [8], [], [9, 9], [7]]])
    second = _batch([[[1], [2], [3], [4], [5]], [[7], [7], [7], [7], [7]]])
    u = unique_ids_of_batches([first, second], 2, 2)
    np.testing.assert_array_equal(u.per_block, [[(1 + 2) / 2, (2 + 1) / 2], [(2 + 3) / 2, (2 + 1) / 2]])
    assert u.batches == 2 and u.per_sample == pytest.approx(u.per_block.sum() / 5)
    with pytest.raises(ValueError, match="no batch"):
        unique_ids_of_batches([], 2, 2)


def test_report_explains_the_choice() -> None:
    from des.models import get_model

    shape = model_shape(get_model("deepfm")())
    placement = [list(range(0, 39, 2)), list(range(1, 39, 2))]
    # Criteo-like: about 3.6 distinct ids per sample and field block -> the first FC exchanges;
    # the paper's data, ~950 per sample -> partials everywhere
    for per_field, expected in ((3.6 * 2048 / 39, EXCHANGE), (950 * 2048 / 39, PARTIALS)):
        unique = UniqueIds(4096, 2, np.full((2, 39), per_field))
        text = report(shape, 4096, placement, unique)
        line = next(l for l in text.splitlines() if l.strip().startswith("first_fc"))
        assert re.search(r"B  (\w+) ", line)[1] == expected, text
        assert "AllReduce of 124,800 weights" in line and "1,600 B/sample" in line
        assert "cheapest" in text and "top gradients + loss" in text


# ------------------------------------------------------------------------------ measured bytes
@pytest.mark.mpi
def test_measured_bytes_equal_the_prediction(tmp_path: Path) -> None:
    """DeepFM in float64 on 2 ranks, 3 steps of 63 rows (row blocks 31 + 32), des and alltoall in
    one launch: summary.json's bytes per site (mean over ranks) and per rank are the planner's."""
    from des.data import open_dataset
    from des.models import get_model
    from des.placement import place_fields
    from des.planner import id_bytes_for
    from tests.conftest import criteo_head, run_mpi

    data = criteo_head(tmp_path / "head.tsv", 400)
    flags = ["--model", "deepfm", "--embedding-dim", "4", "--hidden", "16,8", "--dtype", "float64",
             "--batch-size", "63", "--max-steps", "3", "--split", "1,0,0", "--data", str(data),
             "--cache-dir", str(tmp_path / "cache"), "--placement", "mod", "--no-progress"]
    mixed = "first_fc=exchange,linear=exchange"  # FM's partials and the embedding block's exchange
    run_mpi(2, ["-m", "tests.mpi_programs.train_strategies", str(tmp_path / "runs"), "des", "alltoall",
                f"mixed:des:{mixed}", f"rows:des:{mixed}:rows", "--", *flags], timeout=180)
    store = open_dataset(data, cache_dir=tmp_path / "cache", split=[1, 0, 0], seed=0)
    shape = model_shape(get_model("deepfm")(num_fields=store.num_fields, embedding_dim=4, hidden=(16, 8)))
    unique = estimate_unique_ids(store, 63, 2, batches=3, seed=0)
    placement = place_fields(store.num_fields, 2, "mod")
    # des runs the default --plan auto: the planner's cheapest plan (all partials at this size)
    best = best_plan(shape, 63, placement, estimate_unique_ids(store, 63, 2, batches=4, seed=0), dtype_size=8).plan
    assert set(best.values()) == {PARTIALS}
    runs = (("des", best), ("alltoall", EXCHANGE), ("mixed", {"first_fc": EXCHANGE, "linear": EXCHANGE}),
            ("rows", {"first_fc": EXCHANGE, "linear": EXCHANGE}))
    for strategy, plan in runs:
        summary = json.loads((tmp_path / "runs" / strategy / "summary.json").read_text())
        assert summary["steps"] == 3 and summary["planner"]["plan"] == normalize_plan(shape, plan), strategy
        machine, usable = os.cpu_count() or 1, len(os.sched_getaffinity(0))  # 2 ranks of machine // 2 threads
        assert summary["planner"]["bytes_per_exchanged_id"] == id_bytes_for(max(1, machine // 2), 2, usable)
        by = "rows" if strategy == "rows" else "ids"
        assert summary.get("exchange_by", "ids") == by and summary["planner"]["exchange_by"] == by, strategy
        cost = plan_cost(shape, plan, 63, placement, unique, dtype_size=8, exchange_by=by)
        predicted = {site: float(np.mean(v)) for site, v in cost.sites().items()}
        measured = summary["bytes_per_step_by_site"]  # every declared site (des: forward_partials = 0 here)
        assert set(predicted) <= set(measured), (strategy, measured)
        assert measured == pytest.approx({site: predicted.get(site, 0.0) for site in measured}, rel=1e-12), strategy
        assert summary["bytes_per_step_per_rank"] == pytest.approx(cost.per_rank(), rel=1e-12), strategy
        if strategy == "des":  # uneven rows and fields: per rank, not only the mean (an exchange on 2 ranks is
            assert cost.per_rank()[0] != cost.per_rank()[1]  # symmetric: each sends served + returned = the same)


def test_ranks_with_cores_of_their_own_weigh_the_exchange_local_work_more() -> None:
    """On a 16-core host, 8 ranks of 2 threads, heavy multi-hot data (~11,700 distinct ids per field
    and row block at a global batch of 32,768, as ``--data multihot``): the byte-cheapest mixed plan
    ran 1.7x slower than all partials. Counted as where ranks share cores it still wins; counted as
    ranks with cores of their own, all partials do. Criteo-shaped ids (~645 per field and row block,
    N = 2, B = 8192: the exchange measured 1.16x the partials) exchange everything either way. Only
    ranks of two threads or more that fit the machine's cores count as having cores of their own."""
    from des.models import get_model
    from des.planner import ID_BYTES, ID_BYTES_OWN_CORES, id_bytes_for

    shape = model_shape(get_model("deepfm")())
    for n, batch, per_field, shared, own in ((8, 32_768, 11_711.0, {"fm2": EXCHANGE}, {PARTIALS}),
                                             (2, 8192, 645.0, {"fm2": EXCHANGE}, {EXCHANGE})):
        placement = [list(range(r, 39, n)) for r in range(n)]
        unique = UniqueIds(batch, n, np.full((n, 39), per_field))
        assert best_plan(shape, batch, placement, unique).plan.items() >= shared.items()
        assert set(best_plan(shape, batch, placement, unique, id_bytes=ID_BYTES_OWN_CORES).plan.values()) == own
    assert id_bytes_for(2, 8, 16) == ID_BYTES_OWN_CORES
    assert id_bytes_for(2, 2, 2) == id_bytes_for(1, 2, 2) == id_bytes_for(1, 16, 16) == ID_BYTES
    assert id_bytes_for(4, 5, 16) == ID_BYTES
