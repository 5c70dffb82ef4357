"""Table memory before training: the start-up's prediction of each rank's tables for the run's row
layout (optimizers, table dtype) at the data's distinct ids, and the refusal of a run whose
prediction exceeds a host's memory (des/startup.py: refuse_what_cannot_fit)."""

from __future__ import annotations

import pytest

from des.building import layout_table, table_options
from des.config import TrainConfig
from des.errors import ConfigError
from des.placement import predicted_table_bytes
from des.startup import RANK_BASE_BYTES, refuse_what_cannot_fit

PLACEMENT = [[0, 2], [1, 3]]
DISTINCT = [1_000_000, 10, 2_000_000, 5]


def predicted(config: TrainConfig) -> list[int]:
    layout = layout_table(config, len(DISTINCT))
    return predicted_table_bytes(PLACEMENT, DISTINCT, layout, table_options(config, DISTINCT))


def test_the_prediction_follows_the_row_layout() -> None:
    """DeepFM k = 16: float32 Adam + FTRL rows against bfloat16 row-wise AdaGrad rows, by exactly
    the payload difference per id (the index and metadata are the same)."""
    today = TrainConfig(model="deepfm", embedding_dim=16)
    compact = TrainConfig(model="deepfm", embedding_dim=16, table_dtype="bfloat16",
                          embedding_optimizer="rowwise_adagrad:lr=0.05", linear_optimizer="rowwise_adagrad:lr=0.05")
    a, b = predicted(today), predicted(compact)
    # per row: FTRL (w, z, n) 12 B + Adam (w, m, v) 192 B + its step 4 B, against (w, a) 4 B + (16 w + 1 a) 34 B
    # + 1: a shared row each; a table starts with 16 rows at least
    ids = [sum(max(DISTINCT[f] + 1, 16) for f in fields) for fields in PLACEMENT]
    assert [x - y for x, y in zip(a, b)] == [n * (208 - 38) for n in ids]


def test_a_run_that_cannot_fit_is_refused_before_training() -> None:
    config = TrainConfig(model="deepfm", embedding_dim=16)
    need = predicted(config)
    fits = {"h1": ([0], need[0] + RANK_BASE_BYTES), "h2": ([1], need[1] + RANK_BASE_BYTES)}
    refuse_what_cannot_fit(config, len(DISTINCT), 0, PLACEMENT, DISTINCT, fits)
    with pytest.raises(ConfigError, match=r"rank\(s\) 0,1 on host h1 are predicted at .* more than its .* use "
                                          r"--table-dtype bfloat16"):
        refuse_what_cannot_fit(config, len(DISTINCT), 0, PLACEMENT, DISTINCT,
                               {"h1": ([0, 1], sum(need) + 2 * RANK_BASE_BYTES - 1)})


@pytest.mark.parametrize("layout", ["counters", "compact"])
def test_the_prediction_is_what_the_tables_allocate(layout) -> None:
    """Tables sized from the data hold its distinct ids in exactly the bytes the start-up report
    predicts, in the layout with counters and in the compact one (--table-layout compact, which
    --min-count 2 refuses: key, index and metadata under 24 B per id)."""
    import numpy as np

    from des.building import build_model, build_optimizers
    from des.strategies.components import FieldShard

    config = TrainConfig(model="deepfm", embedding_dim=8, min_count=1, table_layout=layout)
    with pytest.raises(ConfigError, match="--table-layout compact keeps no admission count .* --min-count 2 read"):
        TrainConfig(model="deepfm", min_count=2, table_layout="compact").validate()
    with pytest.raises(ConfigError, match="--min-count 2, --ttl read"):  # the shared row's default of 2 named
        TrainConfig(model="lr", unadmitted="shared", ttl=5, table_layout="compact").validate()
    distinct = [3000, 10, 5000, 7]
    tables = table_options(config, distinct)
    assert tables.counters == (layout == "counters") == config.needs_counters()
    min_count = 1 if layout == "compact" else 2
    shard = FieldShard(range(len(distinct)), build_model(config, len(distinct)).blocks(), build_optimizers(config),
                       seed=0, dtype=np.dtype(config.dtype), tables=tables)
    for f, table in shard.tables.items():
        table.lookup(np.arange(1, distinct[f] + 1, dtype=np.int64), insert=True, step=0)
    memory = [table.memory() for table in shard.tables.values()]
    predicted = predicted_table_bytes([list(range(len(distinct)))], distinct, layout_table(config, len(distinct)),
                                      tables)
    assert sum(m["bytes"] for m in memory) == predicted[0]
    keyed = sum(m["index_bytes"] + m["metadata_bytes"] for m in memory) / sum(distinct)
    assert keyed < 24 if min_count == 1 else keyed > 24
