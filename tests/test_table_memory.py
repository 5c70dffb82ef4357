"""Table memory before training: the start-up's prediction of each rank's tables for the run's row
layout (optimizers, table dtype) at the data's distinct ids, and the refusal of a run whose
prediction exceeds a host's memory (des/startup.py: refuse_what_cannot_fit)."""

from __future__ import annotations

import math

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
    # per row: FTRL (z, n; w computed when read) 8 B + Adam (w, m, v) 192 B + its step 4 B, against (w, a) 4 B +
    # (16 w + 1 a) 34 B; + 1: a shared row each; a table starts with 16 rows at least
    ids = [sum(max(DISTINCT[f] + 1, 16) for f in fields) for fields in PLACEMENT]
    assert [x - y for x, y in zip(a, b)] == [n * (204 - 38) for n in ids]
    # FTRL storing w (store_w=1, or any sparse rate schedule: w computed when read would take the reading
    # step's rate): 4 B more per id
    for stored in (TrainConfig(model="deepfm", embedding_dim=16, linear_optimizer="ftrl:alpha=0.05,store_w=1"),
                   TrainConfig(model="deepfm", embedding_dim=16, sparse_schedule="warmup:steps=10")):
        assert [x - y for x, y in zip(predicted(stored), a)] == [n * 4 for n in ids]


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
        assert [b.computed for b in table.blocks] == [True, False]  # FTRL's order-1 rows hold z and n only
        table.lookup(np.arange(1, distinct[f] + 1, dtype=np.int64), insert=True, step=0)
    memory = [table.memory() for table in shard.tables.values()]
    predicted = predicted_table_bytes([list(range(len(distinct)))], distinct, layout_table(config, len(distinct)),
                                      tables)
    assert sum(m["bytes"] for m in memory) == predicted[0]
    keyed = sum(m["index_bytes"] + m["metadata_bytes"] for m in memory) / sum(distinct)
    assert keyed < 24 if min_count == 1 else keyed > 24


def test_rows_are_sized_from_the_keys_the_training_split_admits(tmp_path) -> None:
    """--min-count 2: the rows are the admitted keys' (a key counted once is pending, its index
    slot alone), sized from the training split's counts (``admitted_keys``), the index from every
    key; the start-up's prediction is what the tables allocate, and a pass over the split admits
    exactly the keys counted: bytes per trained row near the layout's per id, not 3x it."""
    import numpy as np

    from des.building import build_model, build_optimizers
    from des.data.counting import admitted_keys
    from des.data.synth import default_config, synthesize_store
    from des.strategies.components import FieldShard

    store = synthesize_store(tmp_path / "store", 3000, default_config())
    config = TrainConfig(model="deepfm", embedding_dim=8, min_count=2)
    distinct = [store.distinct_count(f) for f in range(store.num_fields)]
    admitted = admitted_keys(store, 2)
    tables = table_options(config, distinct, admitted)
    shard = FieldShard(range(store.num_fields), build_model(config, store.num_fields).blocks(),
                       build_optimizers(config), seed=0, dtype=np.dtype(config.dtype), tables=tables)
    train = store.split_rows("train")
    for f, table in shard.tables.items():
        for lo in range(0, train.shape[0], 256):
            table.lookup(store.gather(f, train[lo:lo + 256]).keys, insert=True, step=lo)
    memory = [table.memory() for table in shard.tables.values()]
    assert [m["rows"] for m in memory] == [a + 1 for a in admitted]  # and the shared row
    assert sum(m["pending"] for m in memory) > sum(admitted)  # most keys of this data are seen once
    fields = list(range(store.num_fields))
    layout = layout_table(config, store.num_fields)
    assert sum(m["bytes"] for m in memory) == predicted_table_bytes([fields], distinct, layout, tables)[0]
    big = [f for f in fields if admitted[f] > 200]  # fields past the tables' floor of 16 rows
    per_row = sum(memory[f]["bytes"] for f in big) / sum(memory[f]["rows"] for f in big)
    per_id = layout.estimated_bytes(10**6, math.ceil(10**6 * 1.5 / 0.7) + 1, 10**6) / 10**6  # sized from data
    assert per_row < 1.3 * per_id
