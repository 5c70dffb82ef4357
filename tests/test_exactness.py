"""The property we sell: training with N ranks is the same computation as training with 1 rank,
checked through the public harness ``des.check`` (what a user runs on their own model/strategy).

For LR, FM, W&D, DeepFM, DCN-v2, DLRM, FinalMLP and xDeepFM, K = 12 steps from the same seed with N = 1, 2, 3, 4 ranks give the same
held-out predictions, the same table rows (every id's values, optimizer slots and step counts), the
same field slices of the first FC layer and the same top parameters with their optimizer states:
≤ 1e-9 relative in float64, ≤ 1e-5 in float32 (all parameters with AdaGrad embeddings; predictions
with Adam). "Relative" is to the largest magnitude of each array (floored at 1e-3), not
element-wise, so near-zero entries are not held to 1e-9 of themselves. The multi-hot synthetic data
(CSR fields, weighted ids, three dense features) and the balanced placement go through the same check; alltoall on N ranks
ends where des ends on 1 rank, and so does ps with one server and one worker. des runs its default
data-parallel upper network (batch 64: not divisible by 3) and, for LR and DeepFM, the replicated one;
the planner's plans (``--plan``: all exchange = alltoall, a mixed plan, auto) are held to the same
bound.

Every rank count costs one mpiexec launch for all cases (a rank's start-up is seconds), and every
case costs its set-up and trace on each rank of each launch. So the models in float64 run on every
N (LR, FM and W&D, whose operators DeepFM holds together, on 2 and 4); the variants (replicated upper network, multi-hot data with balanced placement, float32,
the plans) run with DeepFM, the model with every operator, on two or three N, and some on one N with
the other models: N = 4 (the most partial sums, fields split unevenly) or N = 3 (rows of the batch
split unevenly), so every N meets every variant at least once. Bounded tables (a row budget and a
TTL every 4 steps) run on N = 2. DCN-v2, DLRM, FinalMLP and xDeepFM, whose operators
include the concatenated embeddings, also run on the multi-hot data with dense features under
partials and exchange plans (FinalMLP also without its gates: its streams' first layers
substituted); DCN-v2 and DLRM also with the replicated upper network, alltoall and ps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from des.check import Case, check
from tests.conftest import criteo_head, driver_env

MODELS = ("lr", "fm", "wdl", "deepfm", "dcnv2", "dlrm", "finalmlp", "xdeepfm")
# LR, FM and W&D are DeepFM's operators apart: on 2 and 4 ranks; FinalMLP and xDeepFM (the
# concatenated embeddings, DLRM's and DCN-v2's operator, and the first FC layer) on two N; the others on every N
MODEL_RANKS = {"lr": (2, 4), "fm": (2, 4), "wdl": (2, 4), "deepfm": (2, 3, 4), "dcnv2": (2, 3, 4), "dlrm": (2, 3, 4),
               "finalmlp": (2, 4), "xdeepfm": (2, 3)}
# the newer models' own widths, small as SMALL's (their defaults are 800 and 256,128 wide)
MODEL_FLAGS = {"finalmlp": ("--model-options", "mlp2_hidden=8;fs_hidden=8;num_heads=2"),
               "xdeepfm": ("--model-options", "cin_layers=4,3")}
# FinalMLP without its gates: the two streams' first layers substituted as one first FC layer
NO_GATES = ("--model-options", "mlp2_hidden=8;fs_hidden=8;num_heads=2;use_fs=false")
# DCN-v2's other form: stacked, a mixture of low-rank experts (DCNMix)
MIX = ("--model-options", "cross_layers=2;structure=stacked;cross=mix;low_rank=3;experts=2")
# (model, flags, plan, ranks) on the multi-hot data with dense features
NEW_MODEL_PLANS = [("dcnv2", (), "partials", (2,)), ("dcnv2", MIX, "exchange", (3,)),
                   ("dcnv2", (), "embeddings=exchange", (4,)),  # a mixed plan: the cross and deep layers split
                   ("dlrm", (), "exchange", (2,)), ("dlrm", (), "partials", (4,)),
                   ("finalmlp", MODEL_FLAGS["finalmlp"], "partials", (3,)), ("finalmlp", NO_GATES, "exchange", (4,)),
                   ("xdeepfm", MODEL_FLAGS["xdeepfm"], "embeddings=exchange", (2,))]
EVERY_KIND = Path(__file__).parent / "data" / "every_kind.toml"
THREE_FIELDS = Path(__file__).parent / "data" / "three_fields.toml"
# Fields split by key over the ranks (one shared out-of-vocabulary row per field cannot be split:
# --unadmitted init), with whole fields beside them, on one-hot and multi-hot data
SPLIT = ("--placement", "split", "--split-fields", "I1,C3,C9,C20", "--unadmitted", "init")
SPLIT_SCHEMA = ("--placement", "split", "--split-fields", "user,tags,scores", "--unadmitted", "init")
AUTO_SPLIT = ("--placement", "split", "--unadmitted", "init")  # 3 fields on 4 ranks: split as needed
MIXED_PLAN = "fm2=exchange"  # (see the plans below)
# The schema's data under every plan: all partials, all exchange, and the two mixed plans.
SCHEMA_PLANS = {"partials": (2, 3), "exchange": (2, 3), MIXED_PLAN: (3,), "linear=exchange,first_fc=exchange": (2,)}
RANKS = (1, 2, 3, 4)
BUDGET = 80  # below the largest tables: rows are made only for ids admitted (seen twice) in 12 steps of 64 rows
BOUNDED = ("--max-rows-per-field", str(BUDGET), "--evict-every", "4", "--ttl", "6")
SGD_AVERAGE = ("--dense-optimizer", "sgd:lr=0.05", "--group-sync", "average", "--sync-every", "1")
SMALL = ("--embedding-dim", "4", "--hidden", "16,8", "--linear-optimizer", "ftrl:alpha=0.1,l1=0.01,l2=0.001",
         "--dense-optimizer", "adam:lr=0.01")
ADAM = ("--embedding-optimizer", "adam:lr=0.01")
REPLICATED = ("--upper", "replicated")
PER_ID = ("--unadmitted", "init")
# the row-wise optimizers (one value of state per row): partial row-wise Adam embeddings, row-wise
# AdaGrad order-1 weights
ROWWISE = ("--embedding-optimizer", "rowwise_adam:lr=0.01", "--linear-optimizer", "rowwise_adagrad:lr=0.1")
CATCHUP = ("--embedding-optimizer", "adam:lr=0.01,catchup=1", "--unadmitted", "shared", "--min-count", "2")
# Validations every 2 steps: in 12 steps the plateau schedule halves the dense rate (at step 8).
SCHEDULES = ("--sparse-schedule", "cosine:warmup=3,end=0.1", "--dense-schedule", "plateau:factor=0.5,patience=1",
             "--eval-every", "2", "--monitor", "logloss")
# The variants' rank counts per model (see the module docstring).
REPLICATED_RANKS = {"lr": (4,), "deepfm": (2, 3)}
MULTI_HOT_RANKS = {"fm": (3,), "deepfm": RANKS[1:]}
FLOAT32_RANKS = {"deepfm": (2, 3)}  # and its Adam predictions on 4 ranks
# Plans (--plan, des/planner.py). The des cases run the default --plan auto, which at this size (B=64, a 16-wide
# first FC layer) is all partials for every model and N; all exchange is alltoall; the mixed plan
# exchanges FM's block while the first FC layer (reading the same block) stays partials (one
# optimizer step on both gradients).
SYNTH_PLAN = "linear=exchange,first_fc=exchange"
PIPELINED_PARTIALS = SMALL + CATCHUP + SCHEDULES + ("--pipeline", "on", "--plan", "partials")
SWITCHES = f"4:exchange;8:{MIXED_PLAN}"  # --plan-switch: after steps 4 and 8 of 12 (validated steps)
EXCHANGE_RANKS = {"lr": (3,), "wdl": (4,), "deepfm": (2, 4)}  # FM's operator: exchanged in DeepFM
PLAN_RANKS = {MIXED_PLAN: {"deepfm": (4,)}}  # and on 2 and 3 ranks with the schedules case below
# The exchanged blocks pooled by their owner and sent per row and field (--exchange-by rows), held
# to the 1-rank run of another plan: all partials, or (Persia's delayed updates, which the pipeline
# must not fuse) the exchange per distinct id. (name, model, data, flags, plan, ranks, reference flags)
# Every operator exchanged per distinct id, pipelined: a step's sparse update on the owner's synthetic
# batch of distinct ids runs in the next step's gather pass (with catch-up Adam, admission and
# schedules; beside the shares of fields split by key), held to one rank of all partials
FUSED_EXCHANGE = {"catch-up": SMALL + CATCHUP + SCHEDULES, "split": SMALL + ADAM + SPLIT}
PIPELINED_EXCHANGE = ("--pipeline", "on", "--plan", "exchange")
ROWS = ("--exchange-by", "rows")
BY_ROWS = [("multi-hot", "deepfm", "synth", SMALL + ADAM + ("--placement", "balanced"), "exchange", 3, None),
           ("fused", "deepfm", "criteo", SMALL + CATCHUP + SCHEDULES + ("--pipeline", "on"), MIXED_PLAN, 2, None),
           ("split", "deepfm", "criteo", SMALL + ADAM + SPLIT, "exchange", 4, None),
           ("dcnv2", "dcnv2", "synth", SMALL + ADAM, "embeddings=exchange", 2, None),
           ("a rank without whole fields", "deepfm", "three", SMALL + ADAM + AUTO_SPLIT, "exchange", 4, None),
           ("persia", "deepfm", "criteo", SMALL + ADAM + ("--staleness", "3", "--pipeline", "on"), None, 3, "ids")]


def variant_params(ranks_by_model: dict[str, tuple[int, ...]]) -> list[tuple[str, int]]:
    return [(model, n) for model, ranks in ranks_by_model.items() for n in ranks]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    from des.data import prepare
    from des.data.synth import default_config, synthesize_store

    root = tmp_path_factory.mktemp("exactness-data")
    criteo = root / "criteo"
    prepare(criteo_head(root / "criteo_head.tsv", 3000), criteo, split=(0.9, 0.1, 0.0), seed=1)
    synth = root / "synth"
    config = default_config(seed=2, multi_hot_fields=("C3", "C7", "C20"), max_hot=4, weighted=True, vocab_scale=0.001,
                            dense=3)
    synthesize_store(synth, 3000, config, split=(0.9, 0.1, 0.0))
    # a declared schema with every kind of column (mean-pooled and weighted multi-valued fields,
    # quantile and log_squared buckets, dense features, derived fields), read from its raw CSV
    from des.data.synth_schema import synthesize_schema

    synthesize_schema(root / "every_kind.csv", 3000, str(EVERY_KIND), seed=3, file_format="raw")
    schema = root / "schema"
    prepare(root / "every_kind.csv", schema, schema=str(EVERY_KIND), split=(0.9, 0.1, 0.0), seed=1)
    synthesize_schema(root / "three.csv", 2000, str(THREE_FIELDS), seed=5, file_format="raw")
    three = root / "three"
    prepare(root / "three.csv", three, schema=str(THREE_FIELDS), split=(0.9, 0.1, 0.0), seed=1)
    return {"criteo": str(criteo), "synth": str(synth), "schema": str(schema), "three": str(three)}


@pytest.fixture(scope="module")
def results(datasets, monkeypatch_module) -> dict[tuple, object]:
    """One ``des.check`` over every case: one mpiexec launch per rank count."""
    criteo, synth = datasets["criteo"], datasets["synth"]
    cases = [Case(m, "des", criteo, "float64", SMALL + ADAM + MODEL_FLAGS.get(m, ()), ranks=MODEL_RANKS[m])
             for m in MODELS]  # data-parallel
    cases += [Case(m, "des", criteo, "float64", SMALL + ADAM + REPLICATED, ranks=n) for m, n in REPLICATED_RANKS.items()]
    cases += [Case(m, "des", synth, "float64", SMALL + ADAM + ("--placement", "balanced"), ranks=n)
              for m, n in MULTI_HOT_RANKS.items()]
    # Every plan trains the same model: alltoall (= des --plan exchange) and ps with 1 server + 1
    # worker vs des on 1 rank (all partials); a mixed plan vs the same plan on 1 rank.
    cases += [Case(m, "alltoall", criteo, "float64", SMALL + ADAM, ranks=n, reference_strategy="des")
              for m, n in EXCHANGE_RANKS.items()]
    cases.append(Case("deepfm", "alltoall", synth, "float64", SMALL + ADAM + ("--placement", "balanced"),
                      ranks=(3,), reference_strategy="des"))
    cases += [Case(m, "des", criteo, "float64", SMALL + ADAM + ("--plan", plan), ranks=n)
              for plan, ranks_by_model in PLAN_RANKS.items() for m, n in ranks_by_model.items()]
    cases.append(Case("deepfm", "des", synth, "float64", SMALL + ADAM + ("--placement", "balanced", "--plan", SYNTH_PLAN),
                      ranks=(3,)))
    # (ps counts an id once per requesting worker and step: with every id its own row, admission
    # with --min-count 2, DeepFM's auto, cannot differ)
    cases.append(Case("deepfm", "ps", criteo, "float64", SMALL + ADAM + PER_ID))
    # dense features (the synthetic data's three) with the replicated upper network and under ps
    cases.append(Case("deepfm", "des", synth, "float64", SMALL + ADAM + REPLICATED, ranks=(3,)))
    cases.append(Case("deepfm", "ps", synth, "float64", SMALL + ADAM + PER_ID))
    cases += [Case("deepfm", "des", datasets["schema"], "float64", SMALL + ADAM + ("--plan", plan), ranks=n)
              for plan, n in SCHEMA_PLANS.items()]
    cases += [Case(m, "des", synth, "float64", SMALL + ADAM + flags + ("--plan", plan), ranks=n)
              for m, flags, plan, n in NEW_MODEL_PLANS]
    cases.append(Case("dcnv2", "des", synth, "float64", SMALL + ADAM + MIX + REPLICATED, ranks=(4,)))
    cases.append(Case("dlrm", "alltoall", criteo, "float64", SMALL + ADAM, ranks=(3,), reference_strategy="des"))
    cases.append(Case("dcnv2", "ps", synth, "float64", SMALL + ADAM + PER_ID))
    # Learning-rate schedules (a factor of the global step; plateau: of the validation history) and
    # Adam with TF's dense semantics caught up lazily (adam:catchup=1), one shared row per field for
    # the ids seen fewer than --min-count times (--unadmitted shared).
    # With the pipelined step forced on: --pipeline auto turns it off when a rank has one core, as
    # every N > 1 launch here does, and admission (--min-count 2) is what the overlap could break.
    # The mixed plan's exchange routes the next batch on the background thread too.
    cases.append(Case("deepfm", "des", criteo, "float64",
                      SMALL + CATCHUP + SCHEDULES + ("--pipeline", "on", "--plan", MIXED_PLAN), ranks=(2, 3)))
    # Every operator as partials, pipelined: a step's sparse update runs at the start of the next
    # one, in one pass with its gather (no exchange to route)
    cases.append(Case("deepfm", "des", criteo, "float64", PIPELINED_PARTIALS, ranks=(2,)))
    # A plan switched twice mid-run (a resume within the job: des/plan_review.py), pipelined, with
    # lazily caught-up Adam rows, admission and schedules: held to the 1-rank run of all partials
    cases.append(Case("deepfm", "des", criteo, "float64", PIPELINED_PARTIALS + ("--plan-switch", SWITCHES),
                      ranks=(3,), reference_flags=PIPELINED_PARTIALS))
    # float32 with AdaGrad embeddings: Adam's m/sqrt(v) turns float32 reassociation noise of
    # near-zero gradients into ~1e-4 relative differences of single embedding entries
    # (predictions still agree to ~3e-7), which would hide real bugs behind a loose bound.
    cases += [Case(m, "des", criteo, "float32", SMALL + ("--embedding-optimizer", "adagrad:lr=0.05"), ranks=n, rtol=1e-5)
              for m, n in FLOAT32_RANKS.items()]
    # fields split by key: every plan and strategy, both upper networks, one-hot and multi-hot
    # data with mean and weighted pooling, and more ranks than fields
    # (all partials pipelined: each step's sparse update of both shards runs with the next gather)
    cases += [Case("deepfm", "des", criteo, "float64", SMALL + ADAM + SPLIT + pipeline + ("--plan", plan), ranks=n)
              for plan, n, pipeline in (("partials", (3,), ("--pipeline", "on")), (MIXED_PLAN, (2,), ()),
                                        ("exchange", (4,), ()))]
    cases.append(Case("deepfm", "alltoall", criteo, "float64", SMALL + ADAM + SPLIT, ranks=(2,), reference_strategy="des"))
    cases.append(Case("wdl", "des", criteo, "float64", SMALL + ADAM + SPLIT + REPLICATED, ranks=(4,)))
    cases += [Case("deepfm", "des", datasets["schema"], "float64", SMALL + ADAM + SPLIT_SCHEMA + ("--plan", plan),
                   ranks=n) for plan, n in (("exchange", (2,)),)]
    cases.append(Case("deepfm", "des", datasets["three"], "float64", SMALL + ADAM + AUTO_SPLIT, ranks=(4,)))
    cases.append(Case("deepfm", "des", criteo, "float32", SMALL + ("--embedding-optimizer", "adam:lr=0.001"),
                      ranks=(4,), rtol=1e-5, compare="predictions"))
    cases.append(Case("deepfm", "des", criteo, "float64", SMALL + ROWWISE, ranks=(2, 3, 4)))
    # bounded tables: a row budget and a TTL every 4 steps, with the shared row (DeepFM's auto)
    cases.append(Case("deepfm", "des", criteo, "float64", SMALL + ADAM + BOUNDED, ranks=(2,)))
    # Persia's hybrid training: its bound held at every step (so N-independent), and tau = 0 is alltoall
    cases.append(Case("deepfm", "persia", criteo, "float64", SMALL + ADAM + ("--staleness", "0"), ranks=(2,),
                      reference_strategy="alltoall", reference_flags=SMALL + ADAM))
    cases.append(Case("deepfm", "persia", criteo, "float64", SMALL + ADAM + ("--staleness", "3"), ranks=(3,)))
    # Hierarchical Training: with SGD and the replicas averaged every step, any number of groups of
    # equal rows trains des's model (the mean of the groups' mean gradients)
    # (one group runs des's code path: tests/test_check.py checks it through des.check's own rule)
    cases.append(Case("deepfm", "hierarchical", criteo, "float64", SMALL + ADAM + SGD_AVERAGE + ("--group-size", "2"),
                      ranks=(4,), reference_strategy="des", reference_flags=SMALL + ADAM + SGD_AVERAGE))
    cases += [Case("deepfm", "des", criteo, "float64", flags + PIPELINED_EXCHANGE, ranks=(2,),
                   reference_flags=flags + ("--plan", "partials")) for flags in FUSED_EXCHANGE.values()]
    for _, model, data, flags, plan, n, reference in BY_ROWS:
        planned = flags + (("--plan", plan) if plan else ())
        cases.append(Case(model, "persia" if "--staleness" in flags else "des", datasets[data], "float64",
                          planned + ROWS, ranks=(n,), reference_flags=planned if reference else flags))
    return {(r.case.model, r.case.strategy, r.case.data, r.case.dtype, r.case.compare,
             "replicated" in r.case.flags, r.ranks) + plan_of(r.case.flags) + ("split",) * ("split" in r.case.flags)
            + ("bounded",) * ("--evict-every" in r.case.flags) + ("rowwise",) * (ROWWISE[1] in r.case.flags)
            + strategy_options(r.case.flags) + ("rows",) * (ROWS[1] in r.case.flags)
            + ("switched",) * ("--plan-switch" in r.case.flags): r
            for r in check(cases, RANKS, steps=12, batch_size=64, rtol=1e-9, timeout=600)}


def strategy_options(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The persia and hierarchical options a case sets, as ``("--staleness=3",)``."""
    return tuple(f"{name}={flags[flags.index(name) + 1]}" for name in ("--staleness", "--group-size") if name in flags)


def plan_of(flags: tuple[str, ...]) -> tuple[str, ...]:
    """``(plan,)`` for a case run with ``--plan``, else ``()`` (the default, all partials)."""
    return (flags[flags.index("--plan") + 1],) if "--plan" in flags else ()


@pytest.fixture(scope="module")
def monkeypatch_module():
    """The launches get the test environment (quiet TF, one BLAS thread, this checkout first)."""
    mp = pytest.MonkeyPatch()
    for key, value in driver_env(4).items():
        mp.setenv(key, value)
    yield mp
    mp.undo()


def assert_ok(result) -> None:
    assert result.arrays > 0 and not result.failures, "\n".join(result.failures)


@pytest.mark.mpi
@pytest.mark.parametrize(("model", "ranks"), variant_params(MODEL_RANKS))
def test_n_ranks_equal_one_rank_float64(results, datasets, model: str, ranks: int) -> None:
    result = results[(model, "des", datasets["criteo"], "float64", "all", False, ranks)]
    assert_ok(result)
    # Training moved the parameters (a check that compares untrained models proves nothing).
    assert result.losses[-1] < result.losses[0]


@pytest.mark.mpi
@pytest.mark.parametrize(("model", "ranks"), variant_params(REPLICATED_RANKS) + [("deepfm-synth", 3)])
def test_the_replicated_upper_network_too(results, datasets, model: str, ranks: int) -> None:
    """--upper replicated (the paper's step: every rank runs the top network on the whole batch);
    the other tests run the default, --upper data-parallel."""
    data = datasets["synth" if model.endswith("-synth") else "criteo"]
    assert_ok(results[(model.removesuffix("-synth"), "des", data, "float64", "all", True, ranks)])


@pytest.mark.mpi
@pytest.mark.parametrize(("model", "ranks"), variant_params(FLOAT32_RANKS))
def test_n_ranks_equal_one_rank_float32(results, datasets, model: str, ranks: int) -> None:
    assert_ok(results[(model, "des", datasets["criteo"], "float32", "all", False, ranks)])


@pytest.mark.mpi
def test_float32_with_adam_gives_the_same_predictions(results, datasets) -> None:
    result = results[("deepfm", "des", datasets["criteo"], "float32", "predictions", False, 4)]
    assert_ok(result)
    assert result.arrays == 1  # the predictions only


@pytest.mark.mpi
@pytest.mark.parametrize(("model", "ranks"), variant_params(MULTI_HOT_RANKS))
def test_multi_hot_balanced_placement(results, datasets, model: str, ranks: int) -> None:
    assert_ok(results[(model, "des", datasets["synth"], "float64", "all", False, ranks)])


@pytest.mark.mpi
@pytest.mark.parametrize(("model", "ranks"), variant_params(EXCHANGE_RANKS) + [("deepfm-synth", 3)])
def test_alltoall_equals_des(results, datasets, model: str, ranks: int) -> None:
    """The all-exchange plan (alltoall, the TorchRec-style baseline) trains the same model as DES's
    partials on one rank."""
    data = datasets["synth" if model.endswith("-synth") else "criteo"]
    assert_ok(results[(model.removesuffix("-synth"), "alltoall", data, "float64", "all", False, ranks)])


@pytest.mark.mpi
@pytest.mark.parametrize(("plan", "model", "ranks"),
                         [(plan, m, n) for plan, by_model in PLAN_RANKS.items() for m, n in variant_params(by_model)]
                         + [(SYNTH_PLAN, "deepfm-synth", 3)])
def test_every_plan_is_exact(results, datasets, plan: str, model: str, ranks: int) -> None:
    """--plan with a mixed plan (multi-hot data and balanced placement too)."""
    data = datasets["synth" if model.endswith("-synth") else "criteo"]
    assert_ok(results[(model.removesuffix("-synth"), "des", data, "float64", "all", False, ranks, plan)])


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(FUSED_EXCHANGE))
def test_the_pipelined_exchange_update_is_exact(results, datasets, name: str) -> None:
    """Every operator exchanged per distinct id with the pipelined step: each step's sparse update
    on the owner's synthetic batch runs in the next step's gather pass; 2 ranks train what one
    rank of all partials trains (catch-up Adam, admission and schedules; fields split by key)."""
    flags = FUSED_EXCHANGE[name] + PIPELINED_EXCHANGE
    result = next(r for r in results.values() if r.case.flags == flags and r.ranks == 2)
    assert_ok(result)


@pytest.mark.mpi
@pytest.mark.parametrize("name", [case[0] for case in BY_ROWS])
def test_the_exchange_by_rows_is_exact(results, datasets, name: str) -> None:
    """``--exchange-by rows`` (the owners pool, the pooled values travel per row and field) trains
    on N ranks what all partials train on one (multi-hot weighted fields with dense features,
    DeepFM's FM block exchanged while its first FC layer reads it as partials with the pipelined
    update, fields split by key, DCN-v2's concatenated embeddings, three fields on 4 ranks where a
    rank holds only shares), and Persia with it what Persia per distinct id trains (its delayed
    updates are never fused into the next gather)."""
    _, model, data, flags, plan, ranks, _ = next(case for case in BY_ROWS if case[0] == name)
    result = next(r for r in results.values() if r.case.model == model and r.case.data == datasets[data]
                  and r.case.flags[:len(flags)] == flags and ROWS[1] in r.case.flags and r.ranks == ranks)
    assert_ok(result)
    assert result.losses[-1] < result.losses[0]


@pytest.mark.mpi
@pytest.mark.parametrize("data", ("criteo", "synth"))
def test_one_server_one_worker_equals_des(results, datasets, data: str) -> None:
    """ps with a single worker has nothing stale: it trains exactly what des trains on one rank."""
    assert_ok(results[("deepfm", "ps", datasets[data], "float64", "all", False, 2)])


@pytest.mark.mpi
def test_dense_features_are_trained_and_compared(results, datasets) -> None:
    """The synthetic data's dense features: their weights (replicated with the top network) move
    in training and are among the arrays the N-vs-1 check compares."""
    result = results[("deepfm", "des", datasets["synth"], "float64", "all", False, 3)]
    assert_ok(result)
    names = {name for name in result.dtypes if name.startswith("dense.npz/")}
    assert {"dense.npz/0:linear:dense_weight__value", "dense.npz/2:first_fc:dense_kernel__value"} <= names


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", (2, 3))
def test_schedules_are_exact(results, datasets, ranks: int) -> None:
    """Warm-up + cosine decay of the sparse rates and reduce-on-plateau of the dense rate, with
    catch-up Adam on the embeddings and --unadmitted shared."""
    result = next(r for key, r in results.items() if "--sparse-schedule" in r.case.flags and r.ranks == ranks
                  and "--plan-switch" not in r.case.flags)
    assert_ok(result)


@pytest.mark.mpi
def test_the_pipelined_update_is_exact(results, datasets) -> None:
    """The pipelined step with every operator as partials leaves its sparse update to the next
    step (``ShardTables.apply_then_gather``), with its own step's schedule factor: 2 ranks with
    the schedules, catch-up Adam and admission above, validating every 2 steps (steps before a
    validation are not pipelined)."""
    assert_ok(results[("deepfm", "des", datasets["criteo"], "float64", "all", False, 2, "partials")])


@pytest.mark.mpi
def test_a_plan_switched_mid_run_is_exact(results, datasets) -> None:
    """``--plan-switch``: all partials, all exchange after step 4, the mixed plan after step 8 (what
    a run's plan review does, des/plan_review.py): the running strategy's checkpoint loaded into one
    built with the next plan, the step before it not pipelined, against one rank of all partials."""
    assert_ok(results[("deepfm", "des", datasets["criteo"], "float64", "all", False, 3, "partials", "switched")])


def test_dtype_modes_really_differ(results, datasets) -> None:
    """The float32 and float64 runs keep their parameters in their own precision."""
    f64 = results[("deepfm", "des", datasets["criteo"], "float64", "all", False, 2)]
    f32 = results[("deepfm", "des", datasets["criteo"], "float32", "all", False, 2)]
    assert f64.dtypes["field-020.dense.npz/2:first_fc:kernel__value"] == np.float64
    assert f32.dtypes["field-020.dense.npz/2:first_fc:kernel__value"] == np.float32
    assert f32.dtypes["dense.npz/deep_kernel_1__value"] == np.float32


@pytest.mark.mpi
@pytest.mark.parametrize(("plan", "ranks"), [(plan, n) for plan, ns in SCHEMA_PLANS.items() for n in ns])
def test_a_declared_schema_is_exact_under_every_plan(results, datasets, plan: str, ranks: int) -> None:
    """Data of a declared schema (tests/data/every_kind.toml, from its raw CSV): mean-pooled and
    weighted multi-valued fields, bucketized numbers, dense features, derived fields."""
    assert_ok(results[("deepfm", "des", datasets["schema"], "float64", "all", False, ranks, plan)])


@pytest.mark.mpi
@pytest.mark.parametrize(("model", "flags", "plan", "ranks"),
                         [(m, f, p, n) for m, f, p, ns in NEW_MODEL_PLANS for n in ns])
def test_the_newer_models_on_multi_hot_data_with_dense_features(results, datasets, model, flags, plan, ranks) -> None:
    """The concatenated embeddings split (partials) or exchanged, with the dense features in its
    last columns (DLRM's bottom MLP reads them); DCN-v2 also stacked with a mixture of experts;
    FinalMLP also without gates (its streams' first layers as one first FC layer)."""
    assert_ok(results[(model, "des", datasets["synth"], "float64", "all", False, ranks, plan)])


@pytest.mark.mpi
def test_dcnv2_and_dlrm_under_the_other_strategies(results, datasets) -> None:
    """DCN-v2 with the replicated upper network and under ps (one server, one worker); DLRM under
    alltoall."""
    assert_ok(results[("dcnv2", "des", datasets["synth"], "float64", "all", True, 4)])
    assert_ok(results[("dcnv2", "ps", datasets["synth"], "float64", "all", False, 2)])
    assert_ok(results[("dlrm", "alltoall", datasets["criteo"], "float64", "all", False, 3)])


@pytest.mark.mpi
@pytest.mark.parametrize(("data", "strategy", "plan", "ranks"),
                         [("criteo", "des", "partials", 3), ("criteo", "des", MIXED_PLAN, 2),
                          ("criteo", "des", "exchange", 4), ("criteo", "alltoall", None, 2),
                          ("schema", "des", "exchange", 2)])
def test_fields_split_by_key_are_exact(results, datasets, data: str, strategy: str, plan: str | None,
                                       ranks: int) -> None:
    """Fields split by key over the ranks (each rank holds the ids of its share), next to whole
    ones: one-hot Criteo fields, and multi-valued fields with mean and weighted pooling."""
    result = results[("deepfm", strategy, datasets[data], "float64", "all", False, ranks)
                     + ((plan,) if plan else ()) + ("split",)]
    assert_ok(result)
    tables = {name.split("/")[0] for name in result.dtypes if name.endswith(".table/keys")}
    assert len(tables) == (39 if data == "criteo" else 9)  # every field's rows compared, split ones merged


@pytest.mark.mpi
def test_fields_split_by_key_with_the_replicated_upper_network(results, datasets) -> None:
    assert_ok(results[("wdl", "des", datasets["criteo"], "float64", "all", True, 4, "split")])


@pytest.mark.mpi
def test_more_ranks_than_fields(results, datasets) -> None:
    """Three fields on 4 ranks: the placement splits them by key, and the training is exact."""
    ranks = 4
    result = results[("deepfm", "des", datasets["three"], "float64", "all", False, ranks, "split")]
    assert_ok(result)
    assert result.losses[-1] < result.losses[0]


@pytest.mark.mpi
def test_bounded_tables_are_exact(results, datasets) -> None:
    """--max-rows-per-field and --ttl every 4 steps (--evict-every) on 2 ranks evict the rows 1 rank
    evicts: the same rows left, trained alike; the largest tables were cut to the budget."""
    bounded = results[("deepfm", "des", datasets["criteo"], "float64", "all", False, 2, "bounded")]
    assert_ok(bounded)
    unbounded = results[("deepfm", "des", datasets["criteo"], "float64", "all", False, 2)]
    rows = {name: shape[0] for name, shape in bounded.shapes.items() if name.endswith(".table/keys")}
    assert len(rows) == 39 and max(rows.values()) <= BUDGET
    assert any(unbounded.shapes[name][0] > BUDGET for name in rows)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", (2, 3, 4))
def test_rowwise_optimizers_are_exact(results, datasets, ranks: int) -> None:
    """Row-wise AdaGrad and partial row-wise Adam: a row's state is a statistic of the row, which one
    rank owns, so N ranks train what 1 rank trains."""
    result = results[("deepfm", "des", datasets["criteo"], "float64", "all", False, ranks, "rowwise")]
    assert_ok(result)
    assert any(name.endswith("slot.v") and shape[1:] == (1,) for name, shape in result.shapes.items())


@pytest.mark.mpi
def test_persia_without_staleness_is_alltoall(results, datasets) -> None:
    """tau = 0: every sparse update lands before the next step reads, the synchronous step."""
    assert_ok(results[("deepfm", "persia", datasets["criteo"], "float64", "all", False, 2, "--staleness=0")])


@pytest.mark.mpi
def test_persia_staleness_is_the_same_on_any_number_of_ranks(results, datasets) -> None:
    """Updates landing tau = 3 steps late, on every owner alike: 3 ranks train what 1 rank trains,
    and it is not the synchronous model (from step 1 on, a step misses the updates before it)."""
    stale = results[("deepfm", "persia", datasets["criteo"], "float64", "all", False, 3, "--staleness=3")]
    assert_ok(stale)
    synchronous = results[("deepfm", "persia", datasets["criteo"], "float64", "all", False, 2, "--staleness=0")]
    assert stale.losses[0] == synchronous.losses[0]
    assert all(abs(a - b) > 1e-6 for a, b in zip(stale.losses[1:], synchronous.losses[1:]))


@pytest.mark.mpi
def test_hierarchical_groups_averaged_every_step_under_sgd_are_des(results, datasets) -> None:
    """Each group's replica steps on its rows' mean gradient and the replicas are averaged: with
    SGD that is des's step on the batch. Holds the groups' reduction over their own ranks, its
    scaling and the averaging (2 groups of 2 ranks, each with its own row blocks)."""
    assert_ok(results[("deepfm", "hierarchical", datasets["criteo"], "float64", "all", False, 4, "--group-size=2")])
