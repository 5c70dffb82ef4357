"""The benchmark scripts' own arithmetic and writers (fast: no MPI launch)."""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))

import benchlib  # noqa: E402
import bench_breakdown as breakdown  # noqa: E402
import bench_cores as cores  # noqa: E402
import bench_communication as comm  # noqa: E402
import bench_deepctr as deepctr  # noqa: E402
import bench_scaling as scaling  # noqa: E402
import bench_synthetic as synthetic  # noqa: E402
import bench_throughput as throughput  # noqa: E402
import bench_torchrec as torchrec  # noqa: E402
import select_defaults  # noqa: E402

# The paper's tables and figures (des.train jobs, with --quick); the other bench_* scripts are
# single-process micro-benchmarks (bench_data, bench_hashtable).
BENCH_SCRIPTS = ("bench_communication", "bench_throughput", "bench_quality", "bench_breakdown", "bench_deepctr",
                 "bench_synthetic", "bench_torchrec", "bench_scaling")
ALL_SCRIPTS = tuple(sorted(p.stem for p in SCRIPTS.glob("bench_*.py")))


@pytest.fixture
def jobs_env(monkeypatch) -> None:
    """A script's jobs and children start in the tests' environment, as tests/conftest.py's
    launches do (``NO_KERAS``: no eager Keras import in their TensorFlow)."""
    from tests.conftest import NO_KERAS

    for key, value in NO_KERAS.items():
        monkeypatch.setenv(key, value)


def test_select_defaults_chooses_the_best_candidate_per_model():
    rows = [{"model": "lr", "flags": "--batch-size 256", "validation_auc": 0.7795},
            {"model": "lr", "flags": "--min-count 2 --unadmitted shared", "validation_auc": 0.7802},
            {"model": "lr", "flags": "--batch-size 1024", "validation_auc": 0.7782},
            {"model": "deepfm", "flags": "--batch-size 512", "validation_auc": 0.77}]
    select_defaults.mark_chosen(rows)
    assert [r.get("chosen") for r in rows] == [None, "yes", None, "yes"]  # the shared row is eligible
    for model, candidates in select_defaults.CANDIDATES.items():  # every candidate names the same flags
        assert len({tuple(sorted(flags)) for flags in candidates.values()}) == 1, model


def test_select_defaults_cv_folds_hold_out_each_training_row_once(tmp_path):
    """--cv K: the folds partition the training rows (raw lines, file order), the validation split is
    written for early stopping, and no test row is written."""
    from des.data import open_dataset

    from tests.conftest import criteo_head

    head = criteo_head(tmp_path / "head.tsv", 300)
    validation, folds = select_defaults.cv_folds(str(head), 3, tmp_path / "folds", tmp_path / "cache")
    lines = head.read_text().splitlines(keepends=True)
    store = open_dataset(head, cache_dir=tmp_path / "cache", split=[0.9, 0.05, 0.05], seed=0)
    rows = {name: [lines[r] for r in store.split_rows(name)] for name in ("train", "validation", "test")}
    assert validation.read_text() == "".join(rows["validation"])
    held_out = [h.read_text().splitlines(keepends=True) for _, h in folds]
    assert sorted(sum(held_out, [])) == sorted(rows["train"])
    assert max(map(len, held_out)) - min(map(len, held_out)) <= 1
    for (train, _), out in zip(folds, held_out):
        assert train.read_text() == "".join(line for line in rows["train"] if line not in out)  # file order


def test_model_sizes_by_hand():
    shapes = {m: comm.build_shape(m, 39) for m in ("lr", "fm", "wdl", "deepfm")}
    assert [shapes[m].buffer_width for m in ("lr", "fm", "wdl", "deepfm")] == [1, 10, 401, 410]
    assert [sum(shapes[m].blocks.values()) for m in ("lr", "fm", "wdl", "deepfm")] == [1, 9, 9, 9]
    # W&D / DeepFM: output bias 1, first FC 39*8*400 = 124,800, its bias 400,
    # 400x400+400 twice, 400x1+1  ->  1 + 124,800 + 400 + 160,400 + 160,400 + 401
    assert comm.dense_params(shapes["wdl"]) == comm.dense_params(shapes["deepfm"]) == 446_402
    assert comm.dense_params(shapes["lr"]) == comm.dense_params(shapes["fm"]) == 1
    assert comm.dense_params(comm.build_shape("wdl", 2, 3, (4,))) == 1 + 2 * 3 * 4 + 4 + (4 * 1 + 1)


def test_bench_bytes_are_the_planners_plans():
    """des (auto), des-partials, des-replicated and alltoall columns: des/planner.py's cheapest,
    all-partials (data-parallel and replicated upper network) and all-exchange plans, checked by
    hand for DeepFM at B=4096, N=2."""
    import numpy as np

    from des.planner import UniqueIds

    # 100 distinct ids per field and row block; mod placement: rank 0 owns 20 fields, rank 1 19
    unique = UniqueIds(4096, 2, np.full((2, 39), 100.0))
    p = comm.predictions(comm.build_shape("deepfm", 39), 4096, 2, unique, 39)
    assert p["des_replicated"].per_rank() == [6_717_440] * 2  # 2 (N-1)/N * 4 * B * P = 4096 * 410 * 4
    # reduce-scatter + all-gather of the other block (2048 rows x 410 floats), top gradients + loss
    assert p["des_partials"].per_rank() == [2 * 2048 * 410 * 4 + 4 * (321_602 + 1)] * 2
    # rank 0: values of its 20 fields' ids to rank 1, gradients of the 19 remote fields' ids
    # (9 floats each); the AllReduce of every dense weight and the loss; no keys, no counts
    dense = 4 * (446_402 + 1)
    assert p["alltoall"].per_rank() == [2000 * 36 + 1900 * 36 + dense] * 2
    assert p["des"].mean <= min(p["des_partials"].mean, p["alltoall"].mean)  # auto: the cheapest
    assert comm.saving(8_008 / 4, 8_008) == pytest.approx(0.75)
    # measured / predicted, per rank 0, mean and worst site
    sites = {k: float(np.mean(v)) for k, v in p["des_partials"].sites().items()}
    summary = {"bytes_per_step_by_site": {**sites, "top_gradients": sites["top_gradients"] * 1.01},
               "bytes_per_step_per_rank": p["des_partials"].per_rank(), "bytes_per_step": p["des_partials"].mean}
    check = comm.measured_check(summary, p["des_partials"])
    assert check["rank0"] == check["mean"] == 1.0 and check["worst_site"] == pytest.approx(0.01)


def test_markdown_table_and_csv():
    columns = [("name", "name", ""), ("value", "value", ",.1f"), ("n", "N", "d")]
    rows = [{"name": "a|b", "value": 1234.56, "n": 2}, {"name": "c", "value": None, "n": 4},
            {"name": "d", "value": math.nan, "n": 1, "extra": [1, 2]}]
    table = benchlib.markdown_table(columns, rows)
    assert table.splitlines() == [
        "| name | value | N |",
        "|---|---:|---:|",
        "| a\\|b | 1,234.6 | 2 |",
        "| c | - | 4 |",
        "| d | - | 1 |",
    ]
    text = benchlib.write_csv(None, rows)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert list(parsed[0]) == ["name", "value", "n", "extra"]
    assert parsed[0]["name"] == "a|b" and float(parsed[0]["value"]) == 1234.56
    assert json.loads(parsed[2]["extra"]) == [1, 2] and parsed[1]["extra"] == ""


def test_mean_std():
    assert benchlib.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert benchlib.mean_std([5.0, None]) == (5.0, 0.0)
    assert all(math.isnan(x) for x in benchlib.mean_std([]))


def test_steady_speeds():
    # a bench job's throughput counts the steps after the warm-up ones: the run's meter with a
    # warm-up of 3 steps (des.train's warmup_steps, which benchlib.train_with_warmup sets)
    from des.run import Meter
    from des.strategies.base import PhaseTimer

    meter, timer = Meter(warmup=3), PhaseTimer(["top"])
    for seconds in (9.0, 5.0, 5.0, 1.0, 3.0):  # step 1 (tracing), 2-3 warm-up, 4-5 timed
        meter.record(0.5, 4096, seconds, timer)
    assert meter.samples_per_second == pytest.approx(2 * 4096 / 4.0) and meter.samples == 5 * 4096
    summary = {"strategy": "des", "ranks": 2, "steps": 13, "train_samples": 13 * 4096,
               "samples_per_second": 12 * 4096 / 8.0, "ms_per_phase": {"top": 400.0, "allreduce": 100.0}}
    # phases sum to 500 ms per step: 4096 samples per 0.5 s; ps: 3 workers each train a batch per step
    assert benchlib.steady_from_phases(summary, 4096) == pytest.approx(8192.0)
    ps = {**summary, "strategy": "ps", "ranks": 4, "ps_servers": 1}
    assert benchlib.steady_from_phases(ps, 4096) == pytest.approx(3 * 8192.0)


def docstring(name: str) -> str:
    doc = ast.get_docstring(ast.parse((SCRIPTS / f"{name}.py").read_text()))
    assert doc, f"scripts/{name}.py has no docstring"
    return doc


def test_every_script_is_listed():
    assert set(BENCH_SCRIPTS) <= set(ALL_SCRIPTS)
    assert {"bench_data", "bench_hashtable"} <= set(ALL_SCRIPTS)


def test_the_cores_ceiling_scales_the_per_core_rate() -> None:
    """N ranks of 2 threads over one rank on two cores: N x the per-core rate with 2N cores busy
    over that with 2 busy; counts that are not whole ranks, and no 2-core base, give nothing."""
    assert cores.ceilings({1: 150.0, 2: 180.0, 8: 133.0, 16: 117.0}) == {1: 1.0, 4: 4 * 133 / 180, 8: 8 * 117 / 180}
    assert cores.ceilings({1: 150.0, 3: 120.0}) == {}


def test_a_cores_probe_reports_its_rate() -> None:
    """One matmul probe on the first usable core, in a child process: a positive rate (GFLOP/s)."""
    (rate,) = cores.run_set(["matmul"], [min(os.sched_getaffinity(0))], 0.05, 64)
    assert rate > 0


def test_a_failed_cores_probe_leaves_no_probe_running() -> None:
    """The first probe fails (an unknown kind); the second, set to run 60 s, is ended with it."""
    core = min(os.sched_getaffinity(0))
    with pytest.raises(SystemExit, match="a probe on core"):
        cores.run_set(["no-such-probe", "matmul"], [core, core], 60.0, 64)
    mine = str(os.getpid())
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            probe = b"bench_cores.py" in (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[1] == mine and fields[0] != "Z" and probe:  # a live probe started by this process
            left.append(stat.parent.name)
    assert not left


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_docstrings_start_with_the_command(name):
    doc = docstring(name)
    assert doc.startswith(f".venv/bin/python scripts/{name}.py")
    if name in BENCH_SCRIPTS:
        assert "--quick" in doc.splitlines()[0]


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_docstrings_state_the_expected_result(name):
    """Every script says what it should show: a paragraph starting with "Expect", naming the kind of
    machine it is for (a 2-core one; the recorded runs' figures are in docs/benchmarks.md)."""
    doc = docstring(name)
    paragraphs = [p for p in re.split(r"\n\s*\n", doc) if p.lstrip().startswith("Expect")]
    assert paragraphs, f"scripts/{name}.py: no paragraph starting with 'Expect' in the docstring"
    expect = " ".join(paragraphs)
    assert "2-core" in expect, f"scripts/{name}.py: the expectation does not say which machine it is for"
    assert re.search(r"\d", expect), f"scripts/{name}.py: the expectation gives no number"


# ------------------------------------------------------------------------------------ breakdown phases
def test_breakdown_places_every_declared_phase():
    """Phases come from the strategies (a strategy's timer refuses an undeclared phase); each maps
    to one category of Figure 7, and communication holds the collectives and messages only."""
    from des.strategies import CATEGORIES, PhaseTimer, default_strategies

    mapping = {cls.name: breakdown.category_of(cls.name) for cls in default_strategies()}
    for strategy, phases in mapping.items():
        assert set(phases.values()) <= set(CATEGORIES) == set(breakdown.CATEGORIES), strategy
    communication = {s: {p for p, c in m.items() if c == "communication"} for s, m in mapping.items()}
    des = {"allreduce", "reduce_scatter", "allgather", "exchange_values", "exchange_gradients"}
    assert communication == {"des": des, "alltoall": des, "ps": {"pull", "push"}, "persia": des,
                             "hierarchical": des | {"group_sync"}}
    assert set(breakdown.server_phases()) == {"serve_rows", "apply_rows", "serve_dense", "apply_dense"}
    timer = PhaseTimer(mapping["des"])
    with timer("top"):
        pass
    with pytest.raises(KeyError, match="phase 'mystery' is not declared"):
        with timer("mystery"):
            pass


def test_breakdown_categorize():
    phases = {"lookup": 10.0, "exchange_values": 2.0, "top": 50.0, "allreduce": 1.0,
              "sparse_backward": 4.0, "exchange_gradients": 3.0, "update": 5.0, "mystery": 7.0}
    out = breakdown.categorize("alltoall", phases)
    assert out == {"lookup": 10.0, "partials": 0.0, "communication": 6.0, "top": 50.0, "backward": 4.0,
                   "update": 5.0, "other": 7.0}
    des = breakdown.categorize("des", {"lookup": 1.0, "partials": 2.0, "allreduce": 0.0, "top": 3.0,
                                       "local_backward": 4.0, "update": 5.0})
    assert des["communication"] == 0.0 and des["backward"] == 4.0 and des["other"] == 0.0


# ------------------------------------------------------------------------------------ synthetic data
def test_synthetic_config_scales_zipf_exponents():
    from des.data.synth import default_config

    assert synthetic.synth_config(0, 1.0, 1.0) == default_config(seed=0)  # the same data as the CLI
    base, flat = default_config(seed=3, vocab_scale=0.5), synthetic.synth_config(3, 0.5, 0.5)
    assert [f.zipf * 0.5 for f in base.fields] == [f.zipf for f in flat.fields]
    assert [f.vocab for f in base.fields] == [f.vocab for f in flat.fields]
    assert synthetic.store_name(2_000_000, 0, 1.0, 1.0) == "bench-synth-2000000-s0-v1"  # cached data stay valid
    assert synthetic.store_name(4_000_000, 0, 1.0, 0.5) == "bench-synth-4000000-s0-v1-z0.5"
    with pytest.raises(ValueError):
        synthetic.synth_config(0, 1.0, 0.0)


# ------------------------------------------------------------------------------------ throughput vs roofline / DeepCTR
def test_throughput_batch_sizes_and_steps():
    assert throughput.batch_sizes("4096,512") == [4096, 512] and throughput.batch_sizes("1024") == [1024]
    for bad in ("0", "4096,x", ""):
        with pytest.raises(SystemExit):
            throughput.batch_sizes(bad)
    # --steps counts at the largest batch; smaller batches time about as many samples
    assert [throughput.scaled_steps(10, b, [4096, 512]) for b in (4096, 512)] == [10, 80]
    assert throughput.scaled_steps(10, 3000, [4096, 3000]) == 14
    assert throughput.scaled_steps(3, 4096, [4096]) == 3


def test_throughput_multihot_data_is_multi_hot():
    from des.data.synth import FIELD_NAMES, NUM_INT_FIELDS

    config = benchlib.multihot_config()
    hot = {f.name: f.max_hot for f in config.fields}
    assert all(hot[n] == benchlib.MULTIHOT["max_hot"] for n in FIELD_NAMES[NUM_INT_FIELDS:])
    assert not any(hot[n] for n in FIELD_NAMES[:NUM_INT_FIELDS])
    assert benchlib.dataset(None, "criteo", "/nowhere") is None  # des.train's default data
    assert benchlib.dataset(None, "/some/store", "/nowhere") == "/some/store"


def test_throughput_compare_rows():
    rows = [{"model": "deepfm", "strategy": "des", "ranks": 1, "batch": 512, "samples_per_second": 20.0},
            {"model": "deepfm", "strategy": "des", "ranks": 2, "batch": 512, "samples_per_second": 99.0},
            {"model": "deepfm", "strategy": "alltoall", "ranks": 1, "batch": 512, "samples_per_second": 99.0},
            {"model": "deepfm", "strategy": "des-bf16", "ranks": 1, "batch": 512, "samples_per_second": 32.0},
            {"model": "wdl", "strategy": "des", "ranks": 1, "batch": 512}]  # a failed job: no samples/s
    roof = [{"model": "deepfm", "kind": "plain", "threads": 2, "batch": 512, "samples_per_second": 40.0},
            {"model": "deepfm", "kind": "plain", "threads": 1, "batch": 512, "samples_per_second": 25.0},
            {"model": "deepfm", "kind": "top", "threads": 2, "batch": 512, "samples_per_second": 50.0},
            {"model": "wdl", "kind": "plain", "threads": 2, "batch": 512, "samples_per_second": 30.0}]
    dctr = [{"kind": "deepctr", "model": "deepfm", "batch": 512, "samples_per_second": 16.0}]
    out = throughput.compare_rows(["lr", "wdl", "deepfm"], [512], rows, roof, dctr)
    assert [(r["model"], r["batch"]) for r in out] == [("wdl", 512), ("deepfm", 512)]  # LR: no top network
    assert out[1] == {"kind": "compare", "model": "deepfm", "batch": 512, "roofline": 40.0, "deepctr": 16.0,
                      "des": 20.0, "des_vs_roofline": 0.5, "des_vs_deepctr": 1.25,
                      "des_bf16": 32.0, "des_bf16_vs_roofline": 0.8, "des_bf16_vs_deepctr": 2.0}
    assert out[0]["roofline"] == 30.0 and out[0]["des"] is None and out[0]["des_vs_roofline"] is None
    assert out[0]["des_bf16"] is None and out[0]["des_bf16_vs_deepctr"] is None  # W&D: no bf16 job
    assert out[0]["deepctr"] is None and out[0]["des_vs_deepctr"] is None



def test_throughput_rounds_take_the_median_job():
    def job(samples_per_second: float, top_ms: float) -> dict:
        return {"steady": {"samples_per_second": samples_per_second, "measured_steps": 10,
                           "ms_per_phase": {"top": top_ms}},
                "samples_per_second": samples_per_second, "peak_rss_bytes_per_rank": [2**20], "load_average": 1.0}

    row = throughput.throughput_row("deepfm", "des", 2, 4096, [job(30.0, 1), job(10.0, 2), job(20.0, 3)])
    assert (row["samples_per_second"], row["ms_per_phase"], row["spread"]) == (20.0, {"top": 3}, "10-30")
    assert row["samples_per_second_rounds"] == [30, 10, 20]
    even = throughput.throughput_row("deepfm", "des", 2, 4096, [job(30.0, 1), job(10.0, 2)])
    # an even count: the middle two's mean, the lower one's phases
    assert (even["samples_per_second"], even["ms_per_phase"]) == (20.0, {"top": 2})
    assert even["ms_per_step"] == pytest.approx(1000 * 4096 / 20.0)
    one = throughput.throughput_row("lr", "des", 1, 512, [job(5.0, 1)])
    assert (one["samples_per_second"], one["spread"]) == (5.0, "")
    assert "samples_per_second" not in throughput.throughput_row("lr", "des", 1, 512, [])  # every job failed
    dctr = [[{"samples_per_second": 3.0}], [], [{"samples_per_second": 1.0}], [{"samples_per_second": 2.0}]]
    assert throughput.median_of_rounds(dctr) == [{"samples_per_second": 2.0, "samples_per_second_rounds": [3, 1, 2],
                                                  "spread": "1-3"}]
    assert throughput.median_of_rounds([[], []]) == []
    even_rounds = throughput.median_of_rounds(dctr[:2] + dctr[3:])  # an even count: the middle two's mean
    assert even_rounds == [{"samples_per_second": 2.5, "samples_per_second_rounds": [3, 2], "spread": "2-3"}]
    roof = [[{"kind": k, "samples_per_second": r * f} for k, f in (("plain", 1), ("top", 10))] for r in (5.0, 4.0, 6.0)]
    assert [(r["kind"], r["samples_per_second"], r["spread"]) for r in throughput.median_of_rounds(
        roof, key=lambda r: r["kind"])] == [("plain", 5.0, "4-6"), ("top", 50.0, "40-60")]

def test_plain_roofline_network_is_the_model():
    """The dense roofline's network has des's dense parameters (top + first FC) and DeepFM = W&D + FM."""
    import numpy as np

    for model in ("wdl", "deepfm"):
        variables, _ = throughput.plain_network(model)
        assert sum(v.shape.num_elements() for v in variables) == comm.dense_params(comm.build_shape(model, 39))
    rng = np.random.default_rng(1)
    linear = rng.normal(size=(5, 3, 1)).astype(np.float32)
    emb = rng.normal(size=(5, 3, 2)).astype(np.float32)
    (_, wdl), (_, dfm) = (throughput.plain_network(m, fields=3, dim=2, hidden=(4, 3)) for m in ("wdl", "deepfm"))
    fm = 0.5 * ((emb.sum(1) ** 2) - (emb ** 2).sum(1)).sum(1)
    np.testing.assert_allclose(dfm(linear, emb).numpy() - wdl(linear, emb).numpy(), fm, rtol=1e-4, atol=1e-5)


def test_reference_roofline_network_is_the_model():
    """DCN-v2's and DLRM's dense roofline: all their dense parameters, and the engine's forward on
    one rank (its split form, reduced over nothing) for the same weights and inputs."""
    import numpy as np
    import tensorflow as tf

    from des.models import get_model

    for name in ("dcnv2", "dlrm"):
        model = get_model(name)(num_fields=39, embedding_dim=8, hidden=(400, 400, 400))
        variables, _ = throughput.reference_network(model)
        assert sum(v.shape.num_elements() for v in variables) == comm.dense_params(comm.build_shape(name, 39))
        small = get_model(name)(num_fields=3, embedding_dim=2, hidden=(4, 3))
        variables, logits = throughput.reference_network(small)
        rng = np.random.default_rng(2)
        linear, emb = rng.normal(size=(5, 3, 1)).astype(np.float32), rng.normal(size=(5, 3, 2)).astype(np.float32)
        weights = dict(zip([f"{i}:{p}" for i, sub in enumerate(small.substitutions()) for p in sub.field_params()],
                           variables))
        top = dict(zip(small.top_params(), variables[len(weights):]))
        pooled = {"linear": linear, "embedding": emb}
        outputs = []
        for i, sub in enumerate(small.substitutions()):
            params = {p: weights[f"{i}:{p}"] for p in sub.field_params()}
            if sub.reads_field_indices:
                params["field_indices"] = tf.constant([0, 1, 2])
            outputs.append(sub.combine(sub.local(tf.constant(pooled[sub.block]), params)))
        np.testing.assert_allclose(logits(linear, emb).numpy(), small.top(top, outputs).numpy(), rtol=1e-5, atol=1e-6)


def _din_store(tmp_path: Path, rows: int = 600) -> str:
    """``--data din`` at ``rows`` rows (made in ``tmp_path``)."""
    return benchlib.dataset(None, "din", str(tmp_path / "cache"), rows=rows)


def test_din_roofline_network_is_the_model(tmp_path):
    """``--data din``: a candidate and its history sharing its table; DIN's roofline is des's din as
    des.train builds it for that store (DIN's tower), and its plain network is the engine's forward
    on one rank for the same weights and inputs."""
    import numpy as np
    import tensorflow as tf

    from des.data import ColumnStore

    store = ColumnStore.open(_din_store(tmp_path))
    length = benchlib.DIN_DATA["max_length"]
    assert store.num_dense == 0 and store.field_names[store.num_fields - length:] == tuple(
        f"history@{t}" for t in range(1, length + 1))
    model = throughput.roofline_model("din", str(store.path))
    candidate = store.field_names.index("item_id")
    assert model.groups == [(candidate, tuple(range(store.num_fields - length, store.num_fields)))]
    assert model.tower.hidden == (200, 80) and model.tower.activation == "prelu" and model.wide == "none"
    assert not model.attention.unit.softmax
    assert throughput.roofline_model("deepfm", str(store.path)).num_fields == store.num_fields
    small = type(model)(num_fields=5, embedding_dim=2, hidden=(4, 3), shared_tables="3:1,4:1", attention_hidden=(3, 2),
                        wide=model.wide, attention_softmax=False)
    variables, logits = throughput.reference_network(small)
    weights, at = [], 0
    for sub in small.substitutions():
        weights.append(dict(zip(sub.field_params(), variables[at:at + len(sub.field_params())])))
        at += len(sub.field_params())
    top = dict(zip(small.top_params(), variables[at:]))
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(6, 5, 2)).astype(np.float32)
    emb[:2, 4] = 0.0  # an empty slot of the history
    outputs = [sub.combine(sub.local(tf.constant(emb), {**params, "field_indices": tf.range(5)}))
               for sub, params in zip(small.substitutions(), weights)]
    np.testing.assert_allclose(logits(np.zeros((6, 5, 1), np.float32), emb).numpy(), small.top(top, outputs).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_din_deepctr_inputs_read_the_stores_rows(tmp_path):
    """DeepCTR's DIN reads des's rows: the candidate and the history re-indexed over one vocabulary
    (1..V, 0 the padding of an empty slot), each slot's id the store's, the other fields' rows."""
    import numpy as np

    import bench_din

    from des.data import ColumnStore

    store = ColumnStore.open(_din_store(tmp_path))
    data = bench_din.din_inputs(str(store.path))
    names = list(store.field_names)
    keys = {name: store.field(f) for f, name in enumerate(names)}
    vocabulary = np.unique(np.concatenate([np.asarray(keys[n][1]) for n in names if n == "item_id" or "@" in n]))
    assert int(data["vocabulary"][0]) == vocabulary.size + 1
    assert np.array_equal(vocabulary[data["item_id"] - 1], np.asarray(keys["item_id"][1]))
    hist = data["hist_item_id"]
    assert hist.shape == (store.num_rows, benchlib.DIN_DATA["max_length"])
    for t in (0, hist.shape[1] - 1):
        offsets, k, _ = keys[f"history@{t + 1}"]
        has = np.diff(np.asarray(offsets)) > 0
        assert 0 < has.sum() < store.num_rows and not hist[~has, t].any()
        assert np.array_equal(vocabulary[hist[has, t] - 1], np.asarray(k))
    assert data["genres"].ndim == 2 and data["gender"].shape == (store.num_rows,)


@pytest.mark.mpi
def test_throughput_din_on_its_data(tmp_path, jobs_env):
    """bench_throughput's din on ``--data din`` at the smallest size (one rank, a warm-up step and
    2 timed ones of 64 rows): des's samples/s, both rooflines of its network at 2 and 1 threads, and
    the comparison row of des against the dense roofline."""
    out = tmp_path / "run"
    code = throughput.main(["--models", "din", "--strategies", "des", "--ranks", "1", "--batch-size", "64",
                            "--warmup", "1", "--steps", "2", "--repeats", "2", "--data", "din", "--data-rows", "600",
                            "--cache", str(tmp_path / "cache"), "--no-deepctr", "--no-figure", "--out", str(out)])
    (folder,) = out.glob("bench_throughput/*")  # the run folder
    results = json.loads((folder / "results.json").read_text())
    assert code == 0 and results["failures"] == []
    rows = results["rows"]
    des = [r for r in rows if r.get("strategy") == "des"]
    assert [(r["model"], r["ranks"]) for r in des] == [("din", 1)] and des[0]["samples_per_second"] > 0
    assert sorted((r["kind"], r["threads"]) for r in rows if r.get("kind") in ("top", "plain")) == [
        ("plain", 1), ("plain", 2), ("top", 1), ("top", 2)]
    compare = [r for r in rows if r.get("kind") == "compare"]
    assert len(compare) == 1 and compare[0]["des_vs_roofline"] == pytest.approx(
        compare[0]["des"] / compare[0]["roofline"])
    assert "Data: din (" in (folder / "table.md").read_text()


def test_deepctr_batch_order(tmp_path):
    """DeepCTR trains des's batches: one epoch (last partial batch dropped), or N batches over epochs."""
    from des.data import BatchReader, open_dataset

    from tests.conftest import criteo_head

    store = open_dataset(criteo_head(tmp_path / "head.tsv", 200), cache_dir=tmp_path / "cache", split=[0.9, 0.05, 0.05])
    epoch = [BatchReader(store, "train", batch_size=32, seed=3, epoch=e).row_order for e in (0, 1, 2)]
    per_epoch = len(BatchReader(store, "train", batch_size=32)) * 32
    assert list(deepctr.batch_order(store, 32, 3, 1)) == list(epoch[1][:per_epoch])
    order = deepctr.batch_order(store, 32, 3, 0, batches=2 * per_epoch // 32 + 1)
    assert list(order) == list(epoch[0][:per_epoch]) + list(epoch[1][:per_epoch]) + list(epoch[2][:32])


def _tiny_multi_hot_store(path: Path):
    """400 synthetic rows: C6 and C14 multi-hot with weights, C24 multi-hot without, 3 dense features."""
    import dataclasses

    from des.data.synth import default_config, synthesize_store

    config = default_config(0, multi_hot_fields=("C6", "C14", "C24"), max_hot=5, weighted=True, vocab_scale=0.002,
                            dense=3, calibration_rows=1)
    fields = tuple(dataclasses.replace(f, weighted=False) if f.name == "C24" else f for f in config.fields)
    return synthesize_store(path, 400, dataclasses.replace(config, fields=fields))


def test_deepctr_inputs_pool_as_des(tmp_path):
    """DeepCTR's inputs from a store with multi-hot (weighted and not) fields and dense features:
    the weighted sums over a padded row are des's pooled sums (with a non-zero padding row in the
    table), padding is id 0 with weight 0, the dense inputs are the store's values."""
    import numpy as np

    from des.hashtable.pooling import pool

    store = _tiny_multi_hot_store(tmp_path / "store")
    features, inputs = deepctr.deepctr_inputs(store)
    assert [f.kind for f in features] == ["sparse" if store.is_one_hot(f) else "varlen"
                                         for f in range(store.num_fields)] + ["dense"] * 3
    assert [f.source for f in features] == list(store.field_names) + ["D1", "D2", "D3"]
    by_source = {f.source: f for f in features}
    assert [by_source[n].weight_name is not None for n in ("C6", "C14", "C24")] == [True, True, False]
    assert set(inputs) == {f.name for f in features} | {f.weight_name for f in features if f.weight_name}
    rng = np.random.default_rng(0)
    rows = rng.permutation(store.num_rows)[:300]  # any rows, in any order
    for f, field in enumerate(store.field_names):
        feature = by_source[field]
        offsets, keys, weights = store.field(f)
        uniques = np.unique(np.asarray(keys))
        batch = store.gather(f, rows)
        if feature.kind == "sparse":
            assert inputs[feature.name].dtype == np.int32 and feature.vocabulary_size == uniques.size
            np.testing.assert_array_equal(inputs[feature.name][rows], np.searchsorted(uniques, batch.keys))
            continue
        lengths = np.diff(np.asarray(offsets))
        ids = inputs[feature.name]
        assert ids.dtype == np.int32 and ids.shape == (store.num_rows, feature.maxlen) == (store.num_rows, lengths.max())
        assert feature.vocabulary_size == uniques.size + 1 and ids.max() == uniques.size
        # each row: its ids (1..V) in the store's order, then the padding id 0
        assert np.array_equal((ids != 0).sum(axis=1), lengths) and np.all((ids != 0)[:, :-1] >= (ids != 0)[:, 1:])
        weight = (inputs[feature.weight_name][:, :, 0] if feature.weight_name else (ids != 0).astype(np.float32))
        assert weight.dtype == np.float32 and np.all(weight[ids == 0] == 0)
        table = rng.normal(size=(feature.vocabulary_size, 4)).astype(np.float32)  # row 0: the padding's
        expected = np.zeros((rows.size, 4), dtype=np.float32)
        pool(table[np.searchsorted(uniques, batch.keys) + 1], batch.offsets, batch.weights, expected)
        got = np.einsum("rt,rtk->rk", weight[rows], table[ids[rows]])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    dense = np.concatenate([inputs[f.name] for f in features if f.kind == "dense"], axis=1)
    assert dense.dtype == np.float32
    np.testing.assert_array_equal(dense[rows], store.take_dense(rows))
    assert "3 multi-hot: C6 (up to 5, weighted), C14 (up to 5, weighted), C24 (up to 5), 3 dense" in deepctr.store_note(store)


def test_deepctr_inputs_by_hand(tmp_path):
    """A weighted one-hot field is a var-len input of length 1 with its weights; empty rows are all
    padding; an id twice in a row stays twice; scikit-learn's matrix adds those up."""
    import numpy as np

    from des.data import ColumnStore, FieldBatch
    from des.data.store import MULTI_HOT, FieldSpec, StoreWriter

    price = FieldBatch(np.arange(5), np.array([3, 3, 4, 8]), np.array([0.5, 1, 2, 3], dtype=np.float32))
    tags = FieldBatch(np.array([0, 2, 2, 5, 5]), np.array([7, 5, 7, 7, 9]), None)
    (tmp_path / "s").mkdir()
    with StoreWriter(tmp_path / "s", [FieldSpec("price", "categorical", weighted=True),
                                      FieldSpec("tag list", "categorical", MULTI_HOT)], [0.5, 0.25, 0.25], 0,
                     dense_names=["x"]) as writer:
        writer.append(np.array([0, 1, 0, 1], dtype=np.uint8), [price, tags],
                      dense=np.array([[0.5], [-1], [2], [0]], dtype=np.float32))
        writer.finish(sources=[])
    store = ColumnStore.open(tmp_path / "s")
    features, inputs = deepctr.deepctr_inputs(store)
    assert features == [deepctr.InputFeature("varlen", "f0_price", "price", 4, 1, "f0_price_weight"),
                        deepctr.InputFeature("varlen", "f1_tag_list", "tag list", 4, 3, None),
                        deepctr.InputFeature("dense", "d0_x", "x")]
    assert inputs["f0_price"].tolist() == [[1], [1], [2], [3]]
    assert inputs["f0_price_weight"][:, :, 0].tolist() == [[0.5], [1], [2], [3]]
    assert inputs["f1_tag_list"].tolist() == [[2, 1, 0], [0, 0, 0], [2, 2, 3], [0, 0, 0]]
    assert inputs["d0_x"].tolist() == [[0.5], [-1], [2], [0]]
    x, y = deepctr.lr_matrix(store)  # columns: price 3, 4, 8; tags 5, 7, 9; x
    assert x.toarray().tolist() == [[0.5, 0, 0, 1, 1, 0, 0.5], [1, 0, 0, 0, 0, 0, -1], [0, 2, 0, 0, 2, 1, 2],
                                    [0, 0, 3, 0, 0, 0, 0]] and y.tolist() == [0, 1, 0, 1]


def test_deepctr_inputs_of_criteo_as_before(tmp_path):
    """On Criteo data every field is a SparseFeat fed its keys re-indexed 0..V-1, named f<i>_<field>;
    scikit-learn's matrix is one 1 per field and row, fields side by side."""
    import numpy as np

    from des.data import open_dataset

    from tests.conftest import criteo_head

    store = open_dataset(criteo_head(tmp_path / "head.tsv", 200), cache_dir=tmp_path / "cache", split=[0.9, 0.05, 0.05])
    features, inputs = deepctr.deepctr_inputs(store)
    assert [f.name for f in features] == [f"f{i}_{n}" for i, n in enumerate(store.field_names)] == list(inputs)
    assert {f.kind for f in features} == {"sparse"} and len(features) == 39
    rows = np.arange(store.num_rows)
    x, _ = deepctr.lr_matrix(store)
    columns, width = [], 0
    for f, feature in enumerate(features):
        uniques, index = np.unique(store.gather(f, rows).keys, return_inverse=True)
        assert feature.vocabulary_size == uniques.size and np.array_equal(inputs[feature.name], index)
        columns.append(index + width)
        width += uniques.size
    assert np.array_equal(x.indptr, np.arange(0, 39 * store.num_rows + 1, 39)) and np.all(x.data == 1)
    assert np.array_equal(x.indices, np.stack(columns, axis=1).reshape(-1)) and x.shape == (store.num_rows, width)


def test_train_flags_command_line(tmp_path):
    """benchlib.train_flags: des.train's command line, shared by Bench.train and Bench.train_many."""
    argv = benchlib.train_flags(tmp_path / "run", {"batch_size": 512, "strategy": "des", "pipeline": False,
                                                   "overwrite": True})
    assert argv == ["--no-progress", "--output", str(tmp_path / "run"), "--batch-size", "512", "--strategy", "des",
                    "--no-pipeline", "--overwrite"]


# ------------------------------------------------------------------------------------ scaling
def test_launcher_without_a_venv(tmp_path):
    """The venv's mpiexec and python where the venv has mpiexec; else mpiexec on PATH and this interpreter."""
    (tmp_path / "mpiexec").touch()
    assert benchlib.launcher(tmp_path) == (tmp_path / "mpiexec", tmp_path / "python")
    mpiexec, python = benchlib.launcher(tmp_path / "nowhere")
    assert mpiexec.name == "mpiexec" and python == Path(sys.executable)


def test_scaling_panels_jobs_and_rows():
    strong, weak = scaling.Panel("multihot", "strong", 4096), scaling.Panel("synth", "weak", 4096)
    assert [strong.global_batch(n) for n in (1, 2, 8)] == [4096] * 3 and strong.per_rank(8) == 512
    assert [weak.global_batch(n) for n in (1, 2, 8)] == [4096, 8192, 32768] and weak.per_rank(8) == 4096
    labels = scaling.labels(["des", "alltoall", "hierarchical"], ["auto", "partials", "exchange"])
    assert labels == ["des", "des-partials", "des-exchange", "alltoall", "hierarchical"]
    assert scaling.job_label("des-exchange", ["des", "alltoall"]) == "alltoall"  # the same step, measured once
    assert scaling.job_label("des-exchange", ["des"]) == "des-exchange"
    assert scaling.job_flags("des-partials", 2)[0] == {"strategy": "des", "upper": "data-parallel", "plan": "partials"}
    assert scaling.strategy_at("persia", 2)[0] == {"strategy": "persia", "staleness": "1"}
    assert scaling.strategy_at("hierarchical", 1)[0]["group_size"] == "1"
    assert scaling.strategy_at("hierarchical", 4)[0]["group_size"] == "2"
    assert scaling.strategy_at("hierarchical", 3) == (None, "hierarchical at N=3: --group-size 2 does not divide 3 ranks")
    assert scaling.plan_name({"linear": "exchange", "fm": "exchange"}) == "exchange"
    assert scaling.plan_name({"linear": "partials", "fm": "exchange"}) == "linear partials, fm exchange"
    assert scaling.plan_name(None) == "-"

    def job(rate: float, plan: str = "partials") -> dict:
        return {"steady": {"samples_per_second": rate, "measured_steps": 3, "ms_per_phase": {"top": 1.0}},
                "samples_per_second": rate, "peak_rss_bytes_per_rank": [2**20], "load_average": 1.0,
                "plan": {"fm": plan}}

    runs = {scaling.Job("synth", 1, 4096, "des"): [job(100.0), job(80.0), job(90.0)],
            scaling.Job("synth", 2, 8192, "des"): [job(150.0, "exchange")],
            scaling.Job("synth", 2, 8192, "alltoall"): [job(120.0, "exchange")],  # also des-exchange's
            scaling.Job("synth", 2, 8192, "des-partials"): [job(180.0)]}
    roof = [{"copies": 2, "per_copy_batch": 4096, "samples_per_second": 300.0}]
    rows = scaling.scaling_rows(weak, [1, 2], scaling.labels(["des", "alltoall"], ["auto", "partials", "exchange"]),
                                ["des", "des-partials", "alltoall", "alltoall"], runs, roof, "deepfm", [2])
    got = {(r["ranks"], r["strategy"]): r for r in rows}
    assert sorted(got) == [(1, "des"), (2, "alltoall"), (2, "des"), (2, "des-exchange"), (2, "des-partials")]
    assert (got[1, "des"]["samples_per_second"], got[1, "des"]["spread"], got[1, "des"]["rounds"]) == (90.0, "80-100", 3)
    assert got[2, "des"]["speedup"] == pytest.approx(150 / 90) and got[2, "des"]["efficiency"] == pytest.approx(75 / 90)
    assert got[2, "des"]["plan"] == "exchange" and got[2, "des"]["of_roofline"] == pytest.approx(0.5)
    assert "speedup" not in got[2, "alltoall"]  # no alltoall row at N=1
    assert got[2, "des-partials"]["speedup_over"] == "des N=1" and got[2, "des-partials"]["speedup"] == 2.0
    assert got[2, "des-partials"]["vs_planner"] == pytest.approx(1.2)
    assert got[2, "des-exchange"]["samples_per_second"] == 120.0 and got[2, "des-exchange"]["job"] == "synth-alltoall-n2-b8192"
    top, phases = scaling.phase_rows(rows)
    assert phases == ["top"] and {r["ranks"] for r in top} == {2}
    assert [r["strategy"] for r in top] == ["des", "des-partials", "alltoall"]  # des-exchange is alltoall's job


def test_a_run_that_fails_leaves_no_jobs_folder(tmp_path):
    """A run whose --out is its run folder keeps its jobs in a temporary folder: removed when the
    process ends, finished or not (here: an error right after the run starts)."""
    import subprocess

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    program = ("import argparse, sys; sys.path.insert(0, sys.argv[1]); import benchlib\n"
               "bench = benchlib.Bench('bench_x.py', argparse.Namespace(out=sys.argv[2], out_is_run_folder=True))\n"
               "assert bench.jobs.is_dir() and bench.jobs.parent == benchlib.Path(sys.argv[3])\n"
               "raise RuntimeError('stopped')")
    done = subprocess.run([sys.executable, "-c", program, str(SCRIPTS), str(tmp_path / "run"), str(temporary)],
                          env={**os.environ, "TMPDIR": str(temporary)}, capture_output=True, text=True, timeout=120)
    assert "RuntimeError: stopped" in done.stderr and "AssertionError" not in done.stderr
    assert list(temporary.iterdir()) == []
    assert (tmp_path / "run" / "config.json").is_file()  # the run folder stays


def test_scaling_spreads_the_one_rank_base_over_the_cores(monkeypatch):
    """--pin-one-rank: each round's N = 1 launch on its own group of --threads cores, the rounds spread
    over the machine (no one pair of cores sets the base); none without taskset."""
    monkeypatch.setattr(scaling.shutil, "which", lambda name: "/usr/bin/taskset")
    of_round = scaling.one_rank_cores(2, 3, cores=16)
    assert [of_round(r) for r in range(3)] == ["0,1", "4,5", "10,11"]
    assert [scaling.one_rank_cores(1, 4, cores=2)(r) for r in range(4)] == ["0", "0", "1", "1"]
    assert scaling.one_rank_cores(4, 2, cores=2) is None  # fewer cores than a rank's threads
    monkeypatch.setattr(scaling.shutil, "which", lambda name: None)
    assert scaling.one_rank_cores(2, 3, cores=16) is None


@pytest.mark.mpi
def test_scaling_runs_on_one_and_two_ranks(tmp_path, jobs_env):
    """bench_scaling on 1 and 2 ranks of the shipped sample (LR: the script, not a model, is tested),
    a warm-up step and 2 timed steps per job, the one-rank job on a core of its own (once more
    before the first round, untimed: --first-use):
    every output in --out (no jobs, no figure), a row per scaling and N, the job that strong and weak
    scaling share at N=1 run once, speed-ups and efficiencies as the samples/s give them, and the
    batch larger than the training split skipped with its reason."""
    out = tmp_path / "run"
    code = scaling.main(["--model", "lr", "--ranks", "1,2", "--data", "criteo", "--strategies", "des",
                         "--batch-size", "512,40000",
                         "--rows-per-rank", "512", "--warmup", "1", "--steps", "2", "--no-roofline", "--no-figure",
                         "--copies-steps", "3", "--pin-one-rank", "--out", str(out)])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "environment.json", "log.txt", "results.csv",
                                                     "results.json", "table.md"]
    results = json.loads((out / "results.json").read_text())
    rows = {(r["scaling"], r["ranks"]): r for r in results["rows"] if r["kind"] == "scaling"}
    assert sorted(rows) == [("strong", 1), ("strong", 2), ("weak", 1), ("weak", 2)]
    # the ceiling: des's one-rank job alone, then 2 copies at once at the per-rank batch of each
    # panel (weak: 512; strong at 512: 256 each); rows give des over it
    ceiling = {(r["per_copy_batch"], r["copies"]): r for r in results["rows"] if r["kind"] == "copies"}
    assert sorted(ceiling) == [(256, 2), (512, 1), (512, 2)]
    assert len(ceiling[512, 2]["per_copy_samples_per_second"]) == 2
    assert ceiling[512, 2]["samples_per_second"] == pytest.approx(sum(ceiling[512, 2]["per_copy_samples_per_second"]), abs=2)
    assert ceiling[512, 2]["pinned"] == ((os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None)
    for kind, batch in (("weak", 512), ("strong", 256)):
        assert rows[kind, 2]["of_copies"] == pytest.approx(rows[kind, 2]["samples_per_second"]
                                                           / ceiling[batch, 2]["samples_per_second"])
    assert [rows["weak", n]["batch"] for n in (1, 2)] == [512, 1024] and rows["strong", 2]["batch"] == 512
    assert rows["strong", 1]["job"] == rows["weak", 1]["job"] and len(results["jobs"]) == 3
    log = (out / "log.txt").read_text()  # --pin-one-rank: the N=1 job only, on a core of its own
    assert "first use: the N=1 launch once, untimed" in log and "ran once, untimed" in (out / "table.md").read_text()
    if shutil.which("taskset"):
        assert log.count("taskset -c 0 ") == 2 and "pin_cores=on" not in log
    else:
        assert log.count("pin_cores=on") == 2
    for job in results["jobs"]:  # every rank's phases, side by side
        by_rank = job["ms_per_phase_by_rank_rounds"][0]
        assert by_rank and all(len(ms) == job["ranks"] for ms in by_rank.values())
    for kind in ("strong", "weak"):
        one, two = rows[kind, 1], rows[kind, 2]
        assert one["speedup"] == 1.0 and one["plan"] in ("partials", "exchange") and two["plan"] != "-"
        assert two["speedup"] == pytest.approx(two["samples_per_second"] / one["samples_per_second"])
        assert two["efficiency"] == pytest.approx(two["speedup"] / 2) and two["rounds"] == 1
        assert set(two["ms_per_phase"]) >= {"lookup", "top", "update"}
    assert len(results["skipped"]) == 2 and all("global batch 40,000 > the" in s for s in results["skipped"])
    assert results["failures"] == [] and "No figure (--no-figure)." in (out / "table.md").read_text()


# ------------------------------------------------------------------------------------ TorchRec's DLRM
def _tiny_store(path: Path, fields, batches, dense=None):
    """A 4-row column store written by hand (split 50/25/25, split seed 0)."""
    import numpy as np

    from des.data import ColumnStore
    from des.data.store import StoreWriter

    path.mkdir()
    names = [] if dense is None else [f"x{j}" for j in range(dense.shape[1])]
    with StoreWriter(path, fields, [0.5, 0.25, 0.25], 0, dense_names=names) as writer:
        writer.append(np.array([0, 1, 0, 1], dtype=np.uint8), batches, dense=dense)
        writer.finish(sources=[])
    return ColumnStore.open(path)


def test_torchrec_arrays_by_hand(tmp_path):
    """The child's arrays: per field the keys re-indexed 0..V-1 (sorted keys) over all rows, fields side
    by side under DeepCTR's input names, the dense values, labels and split rows as the store has
    them; stores the child is not given (multi-hot or weighted fields, no dense features) refused,
    unless dense features are not needed (bench_fuxictr's FinalMLP)."""
    import numpy as np

    from des.data import FieldBatch
    from des.data.store import MULTI_HOT, FieldSpec

    one_hot = np.arange(5)
    site = FieldBatch(one_hot, np.array([30, 10, 30, 20]), None)
    ad = FieldBatch(one_hot, np.array([7, 7, 7, 7]), None)
    dense = np.array([[0.5, 1], [-1, 2], [2, 3], [0, 4]], dtype=np.float32)
    store = _tiny_store(tmp_path / "s", [FieldSpec("site", "categorical"), FieldSpec("ad id", "categorical")],
                        [site, ad], dense)
    arrays = torchrec.export_arrays(store)
    assert arrays["sparse_ids"].dtype == np.int32 and arrays["sparse_ids"].tolist() == [[2, 0], [0, 0], [2, 0], [1, 0]]
    assert arrays["vocab_sizes"].tolist() == [3, 1] and arrays["keys"].tolist() == ["f0_site", "f1_ad_id"]
    assert arrays["dense"].dtype == np.float32 and np.array_equal(arrays["dense"], dense)
    assert arrays["labels"].dtype == np.float32 and arrays["labels"].tolist() == [0, 1, 0, 1]
    splits = [arrays[s].tolist() for s in ("train", "validation", "test")]
    assert splits == [list(store.split_rows(s)) for s in ("train", "validation", "test")]
    assert sorted(sum(splits, [])) == [0, 1, 2, 3]
    assert all(a.dtype != object for a in arrays.values())  # np.savez / np.load(allow_pickle=False)

    tags = FieldBatch(np.array([0, 2, 2, 3, 4]), np.array([5, 7, 7, 9]), None)
    multi = _tiny_store(tmp_path / "m", [FieldSpec("site", "categorical"), FieldSpec("tags", "categorical", MULTI_HOT)],
                        [site, tags], dense)
    with pytest.raises(ValueError, match="only one-hot fields without weights.*: tags"):
        torchrec.export_arrays(multi)
    no_dense = _tiny_store(tmp_path / "n", [FieldSpec("site", "categorical")], [site])
    with pytest.raises(ValueError, match="needs dense features"):
        torchrec.export_arrays(no_dense)
    fuxictr_arrays = torchrec.export_arrays(no_dense, need_dense=False)  # bench_fuxictr's: ids only
    assert fuxictr_arrays["dense"].shape == (4, 0) and fuxictr_arrays["sparse_ids"].tolist() == [[2], [0], [2], [1]]


def test_torchrec_child_gets_the_parents_network(tmp_path):
    """The defaults are des's DLRM's; the child's command line carries every network flag as the
    parent parsed it; the table: a row per seed, then mean ± std (sample std) over them."""
    import argparse

    parent = argparse.ArgumentParser()
    torchrec.network_arguments(parent)
    defaults = parent.parse_args([])
    assert (defaults.embedding_dim, defaults.bottom, defaults.hidden, defaults.batch_size, defaults.epochs) == (
        8, "512,256", "400,400,400", 256, 3)
    assert (defaults.dense_lr, defaults.embedding_lr, defaults.init, defaults.init_std) == (0.001, 0.003, "des", 1e-4)
    args = parent.parse_args(["--bottom", "16", "--hidden", "4,2", "--init", "torchrec", "--embedding-lr", "0.01",
                              "--epochs", "1"])
    argv = torchrec.child_argv(tmp_path / "data.npz", 3, args)
    assert argv[:5] == [str(SCRIPTS / "bench_torchrec.py"), "--child", str(tmp_path / "data.npz"), "--seed", "3"]
    child = argparse.ArgumentParser()
    child.add_argument("--child")
    child.add_argument("--seed", type=int)
    torchrec.network_arguments(child)
    parsed = child.parse_args(argv[1:])
    assert {k: getattr(parsed, k) for k in torchrec.NETWORK_FLAGS} == {k: getattr(args, k) for k in torchrec.NETWORK_FLAGS}
    assert vars(parent.parse_args([])).keys() == set(torchrec.NETWORK_FLAGS)
    assert torchrec.widths("512,256") == [512, 256] and torchrec.widths("") == []

    runs = [{"seed": s, "best_epoch": 1, "test_auc": auc, "test_logloss": 0.5, "validation_auc": 0.78,
             "samples_per_second": 100.0 * (s + 1)} for s, auc in enumerate((0.75, 0.76, 0.77))]
    rows = torchrec.table_rows(runs)
    assert [r["seed"] for r in rows] == ["0", "1", "2", "mean ± std (3)"]
    assert rows[-1]["auc"] == "0.7600 ± 0.0100" and rows[-1]["logloss"] == "0.5000 ± 0.0000"
    assert rows[-1]["samples_per_second"] == 200.0 and rows[-1]["best_epoch"] == "1,1,1"
    assert torchrec.table_rows([]) == []

