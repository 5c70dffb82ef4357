""".venv/bin/python scripts/bench_throughput.py [--quick] [--models lr,fm,wdl,deepfm,dcnv2,dlrm,finalmlp,xdeepfm,din] [--ranks 1,2,4] [--batch-size 4096,512] [--deepctr] [--warmup 3] [--steps 10] [--rounds 1] [--data criteo|multihot|din|PATH] [--data-rows N]

Shows the DES paper's Table 5 on this machine, and des on one process against what a dense TF
program and DeepCTR reach, all measured in one run, for every batch size of ``--batch-size`` (a
comma-separated list, default 4096):

* **Training throughput**: samples/s of LR, FM, W&D and DeepFM under ``des``, ``des-replicated``,
  ``alltoall`` (N = 1, 2, 4) and ``ps`` (N = 2, 4: one server, N-1 asynchronous workers) at the
  same global batch, over ``--steps`` timed steps after ``--warmup`` steps (the first steps trace
  the tf.functions and fill the tables: excluded), plus the peak RSS per rank. ``--steps`` counts
  at the largest batch; a smaller batch runs proportionally more steps (the same samples timed).
* **TF-only roofline** (W&D, DeepFM, DCN-v2, DLRM, FinalMLP, xDeepFM and DIN; LR's and FM's logit is a sum of the
  partials, no top network), at 2 threads (what one rank gets) and 1 thread (what each of 2 or 4 ranks gets):
  "top network only" = the top network every ``des-replicated`` rank repeats on the whole batch
  (DeepFM: FM combine + the MLP 400-400-400-1 behind the substituted first layer, on the [B, 410]
  buffer; forward + backward); "dense roofline" = the same model as a plain TF program: order-1
  sum of [B, 39, 1] + FM of [B, 39, 8] + the MLP 312-400-400-400-1 as dense matmuls, forward,
  backward (with the gradients of both inputs) and Adam (``ResourceApplyAdam``) on its 446,402
  dense parameters in one ``tf.function``; the embeddings are given as dense inputs: no hash
  tables, lookups, pooling or sparse updates. DCN-v2, DLRM, FinalMLP, xDeepFM and DIN: each substitution's textbook
  ``reference`` on the dense inputs and the model's top network, with all its weights, likewise
  (DIN: its first layer on the fields but the items, the attention unit over the candidate and its
  items, its tower 200-80). On ``--data din`` every network is built as des.train builds it for that
  store (its fields and shared tables).
* **Rounds** (``--rounds R``): every des/alltoall/ps job, the rooflines and DeepCTR run R times,
  round-robin over the configurations of a batch size (so a drift in the machine's load hits all of
  them alike); a row gives the median samples/s (of an even count of rounds, the mean of the middle
  two), the median job's phases and memory (the lower middle one) and the min-max over the rounds
  (the rooflines and DeepCTR: the median round's figures). On a shared VM one job's samples/s
  moves between otherwise identical runs by more than many of the differences measured here: small
  ratios of single jobs are not readable without rounds.
* **des vs the roofline and DeepCTR** (one process): per model and batch, the dense roofline at
  2 threads, DeepCTR 0.9.4's DeepFM (for DCN-v2: its DCN with matrix cross layers; for DIN: its DIN
  with PReLU for Dice, des's din network) (``model.fit`` over ``--warmup`` + the timed steps of the
  data in des's batch order, same batch size and network, its defaults: Adam on
  everything, l2 1e-5 on the tables; 2 TF threads), des at N = 1, des / roofline and des / DeepCTR.
  DeepCTR runs in ``.venv-deepctr`` (see ``scripts/bench_deepctr.py``): ``--deepctr`` runs it and
  creates that venv if it is missing (from PyPI); by default it runs only when the
  venv exists and the run is not ``--quick``; ``--no-deepctr`` never.

* **Data** (``--data``): the shipped Criteo sample (default: 39 fields, one id each), or
  ``multihot``: 40,000 synthetic rows (``des.data.synth``) with every categorical field multi-hot
  (0-50 ids, vocabularies x20: ~650 ids per sample, the paper's kind of data), generated once into
  ``--cache``; ``din``: 40,000 synthetic rows (``des.data.synth_schema`` of ``benchlib.din_schema``)
  with a behaviour sequence: a candidate ``item_id``, its history of up to 30 items read item by
  item (``pooling = "none"``, sharing ``item_id``'s table), five other fields, for ``--models
  din,deepfm`` (des's din as DeepCTR's DIN: ``--hidden 200,80 --activation prelu --model-options
  'wide=none;attention_softmax=false'``; des strategies
  only: alltoall keeps a table per field); ``--data-rows`` generates another count; or any path
  des.train reads. The roofline and DeepCTR run on Criteo and din only.

The figure shows grouped bars (log scale) per model and batch, with the rooflines and DeepCTR as
short lines. Every child (des, the roofline, DeepCTR) runs with des's oneDNN setting: on where the
CPU has AVX-512 and each rank has a core of its own or the job computes in bf16, else off
(``des/_tensorflow_env.py``; at N=4 on 2 cores: off for des, on for des-bf16);
``TF_ENABLE_ONEDNN_OPTS`` set overrides it for all.

Expect (a 2-core machine; every recorded run is in ``docs/benchmarks.md``, "Throughput"): des
N=1 below the dense roofline (it adds the tables' lookup, gather and update) and above DeepCTR, by
more at B=512; des-bf16 above des on CPUs with bf16 units (AVX512-BF16, AMX), below it elsewhere;
on Criteo des = alltoall at N = 2 and 4 (the planner exchanges every operator: the same step); with
``--data multihot`` the planner picks all partials, so des = des-partials, ahead of alltoall (the
exchange's per-id work grows with the ids per sample, the partials' bytes do not). N = 4 on 2
cores time-shares them and shows no scaling. On ``--data din`` (recorded on a 2-core machine
shared with other jobs, "DIN on a synthetic behaviour sequence"): des's din at N = 1 about at its
dense roofline (0.90, median of six rounds at B = 4096), nearly all of which is DIN's attention
over the 30 items (the 200-80 tower alone about a tenth of it), and below DeepCTR's DIN (0.56),
by more than des's DeepFM trails DeepCTR's on the same rows under that load (0.66); din at N = 2
below N = 1 (0.43: the attention runs on the one rank holding the candidate and its items).
Other jobs on the machine move every figure: compare ratios within one run, with ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import bench_deepctr
import benchlib

STRATEGY_RANKS = {"des": (1, 2, 4), "des-partials": (2, 4), "des-replicated": (1, 2, 4), "des-bf16": (1, 2, 4),
                  "alltoall": (1, 2, 4), "ps": (2, 4)}
FIELDS, EMBEDDING_DIM, HIDDEN = 39, 8, (400, 400, 400)  # des.train's defaults: the network measured
TITLES = {"lr": "LR", "fm": "FM", "wdl": "W&D", "deepfm": "DeepFM", "dcnv2": "DCN-v2", "dlrm": "DLRM",
          "finalmlp": "FinalMLP", "xdeepfm": "xDeepFM", "din": "DIN"}
#: des.train flags of a model's jobs (and its roofline and DeepCTR's network) beyond des.train's
#: defaults: DIN's own tower (des/models/din.py), without DeepFM's shallow part (as DeepCTR's DIN)
MODEL_FLAGS = {"din": {"hidden": "200,80", "activation": "prelu",
                       "model_options": "wide=none;attention_softmax=false"}}

# the models with a top network (LR's and FM's top is a sum)
ROOFLINE_MODELS = ("wdl", "deepfm", "dcnv2", "dlrm", "finalmlp", "xdeepfm", "din")
ROOFLINE_THREADS = (2, 1)  # what one rank gets on 2 cores, and what each of 2 or 4 ranks gets
NO_TOP_NETWORK = {
    "lr": "LR: no top network (logit = sum of the 39 per-field partials + bias), so no TF-only roofline",
    "fm": "FM: no top network (logit = combine of the order-1 and order-2 partials), so no TF-only roofline",
}


def batch_sizes(text: str) -> list[int]:
    """``"4096,512"`` -> ``[4096, 512]`` (``--batch-size``)."""
    return benchlib.positive_ints(text, "batch-size")


def scaled_steps(steps: int, batch: int, batches: Sequence[int]) -> int:
    """``steps`` counts at the largest batch; a smaller batch runs proportionally more, so every
    batch size is timed over about the same number of samples."""
    return max(steps, round(steps * max(batches) / batch))


# ------------------------------------------------------------------------------------ roofline child
def roofline_child(threads: int, batches: Sequence[int], repeats: int, models: Sequence[str] = ROOFLINE_MODELS,
                   data: str | None = None) -> dict:
    """Runs in its own process (TF threads must be set before the first op); prints JSON:
    ``{batch: {model: {"top": s, "plain": s, "top_median": s, "plain_median": s}}}`` (seconds per
    call, see :func:`_roofline_model`; the models as des.train builds them for ``data``, None: the
    Criteo sample)."""
    from des import runtime  # quiet TF
    import tensorflow as tf

    runtime.keep_freed_memory()  # the heap as des sets it for itself
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return {str(b): {name: _roofline_model(roofline_model(name, data), b, repeats) for name in models} for b in batches}


def model_hidden(name: str) -> tuple[int, ...]:
    """The tower's widths of ``name``'s jobs (:data:`MODEL_FLAGS`, else des.train's default)."""
    return tuple(int(h) for h in MODEL_FLAGS[name]["hidden"].split(",")) if "hidden" in MODEL_FLAGS.get(name, {}) \
        else HIDDEN


def roofline_model(name: str, data: str | None = None):
    """des's model ``name`` as its jobs here train it: on the Criteo sample (``data`` None) 39 one-hot
    fields of dimension 8 and the 400-400-400 tower; on a store, as des.train builds it for that
    store (its fields, dense features and shared tables) with :data:`MODEL_FLAGS`."""
    from des.models import get_model

    if data is None:
        return get_model(name)(num_fields=FIELDS, embedding_dim=EMBEDDING_DIM, hidden=model_hidden(name))
    from des.building import build_model, strategy_class
    from des.config import TrainConfig
    from des.data import ColumnStore
    from des.startup import shared_table_numbers

    store = ColumnStore.open(data)
    config = TrainConfig(model=name, data=data, **MODEL_FLAGS.get(name, {}))
    model = build_model(shared_table_numbers(config, store, strategy_class(config)), store.num_fields, store.num_dense)
    if model.num_dense:
        raise ValueError(f"the roofline gives no dense features, and {data} has {model.num_dense}")
    return model


def plain_network(name: str, fields: int = FIELDS, dim: int = EMBEDDING_DIM, hidden: Sequence[int] = HIDDEN):
    """W&D or DeepFM as a plain TF program (no substitution, no tables): ``(variables, logits)`` with
    ``logits(linear [B, F, 1], embedding [B, F, d]) -> [B]`` = bias + the order-1 sum (+ DeepFM's
    FM second order) + the MLP ``F*d - hidden - 1`` on the flattened embeddings, relu. The variables
    are the model's dense parameters (446,402 for 39 x 8 and 400-400-400, as des's top + first FC)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    sizes = [fields * dim, *hidden, 1]
    variables = [tf.Variable(np.zeros(1, np.float32), name="bias")]
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        limit = np.sqrt(6.0 / (fan_in + fan_out))  # glorot uniform
        variables.append(tf.Variable(rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32), name=f"kernel_{i}"))
        variables.append(tf.Variable(np.zeros(fan_out, np.float32), name=f"bias_{i}"))

    def logits(linear, embedding):
        out = variables[0][0] + tf.reduce_sum(linear, axis=[1, 2])
        if name == "deepfm":
            total = tf.reduce_sum(embedding, axis=1)
            out += 0.5 * tf.reduce_sum(total * total - tf.reduce_sum(embedding * embedding, axis=1), axis=1)
        h = tf.reshape(embedding, [-1, fields * dim])
        for i in range(len(sizes) - 1):
            h = tf.matmul(h, variables[1 + 2 * i]) + variables[2 + 2 * i]
            if i < len(sizes) - 2:
                h = tf.nn.relu(h)
        return out + h[:, 0]

    return variables, logits


def reference_network(model: Any):
    """Any des model as a plain TF program on dense inputs: ``(variables, logits)``, the variables
    its whole field weights (every field's slice) and its top network, ``logits(linear, embedding)``
    = the top network on each substitution's ``reference`` (the textbook operator on all fields).
    For DCN-v2, DLRM, FinalMLP and xDeepFM, whose operators' references are matmuls and reshapes; W&D's and DeepFM's
    hand-written :func:`plain_network` keeps FM's eq. (6) (its reference is the double sum)."""
    import numpy as np
    import tensorflow as tf

    from des.substitutions.base import draw_param

    fields = range(model.num_fields)
    weights = [{name: tf.Variable(value.astype(np.float32)) for name, value in sub.init_field_params(0, fields).items()}
               for sub in model.substitutions()]
    top = {name: tf.Variable(draw_param(spec, 0, model.name, "top", name).astype(np.float32))
           for name, spec in model.top_params().items()}

    def logits(linear, embedding):
        pooled = {"linear": linear, "embedding": embedding}
        return model.top(top, [sub.reference(pooled[sub.block], params)
                               for sub, params in zip(model.substitutions(), weights)])

    return [v for params in weights for v in params.values()] + list(top.values()), logits


def _roofline_model(model: Any, batch: int, repeats: int) -> dict:
    """Seconds per call of ``top`` (des's top network on the [B, P] buffer, forward + backward) and
    ``plain`` (:func:`plain_network`, forward + backward + Adam) of des model ``model``: the wall time of ``repeats`` calls
    after 3 untimed ones over ``repeats`` (as des's and DeepCTR's samples/s), and the median call."""
    import numpy as np
    import tensorflow as tf

    from des.substitutions.base import draw_param

    name, fields, dim = model.name, model.num_fields, model.embedding_dim
    subs = model.substitutions()
    starts = np.concatenate([[0], np.cumsum([s.width for s in subs])]).astype(int).tolist()
    names = list(model.top_params())
    top = [tf.constant(draw_param(spec, 0, model.name, "top", n).astype(np.float32))
           for n, spec in model.top_params().items()]
    rng = np.random.default_rng(0)
    buffer = tf.constant(rng.normal(0, 0.1, (batch, starts[-1])).astype(np.float32))
    labels = tf.constant((rng.random(batch) < 0.25).astype(np.float32))
    linear = tf.constant(rng.normal(0, 0.01, (batch, fields, 1)).astype(np.float32))
    emb = tf.constant(rng.normal(0, 0.01, (batch, fields, dim)).astype(np.float32))

    @tf.function
    def top_step(buf, y, params):
        with tf.GradientTape() as tape:
            tape.watch([buf, params])
            outputs = [s.combine(buf[:, starts[i]:starts[i + 1]]) for i, s in enumerate(subs)]
            logits = model.top(dict(zip(names, params)), outputs)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
        return tape.gradient(loss, [buf, params])

    variables, plain_logits = (plain_network(name, fields, dim, model.tower.hidden) if name in ("wdl", "deepfm")
                               else reference_network(model))
    slots = [(tf.Variable(tf.zeros_like(v)), tf.Variable(tf.zeros_like(v))) for v in variables]
    adam_step = tf.Variable(0.0)
    lr, beta1, beta2, epsilon = 0.001, 0.9, 0.999, 1e-7  # Keras's Adam defaults

    @tf.function
    def plain_step(lin, e, y):
        with tf.GradientTape() as tape:
            tape.watch([lin, e])
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=plain_logits(lin, e)))
        # (DLRM reads no order-1 weights: their gradient is zeros)
        grads = tape.gradient(loss, [lin, e, *variables], unconnected_gradients=tf.UnconnectedGradients.ZERO)
        t = adam_step.assign_add(1.0)
        for var, (m, v), g in zip(variables, slots, grads[2:]):
            tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle, beta1_power=tf.pow(beta1, t),
                                         beta2_power=tf.pow(beta2, t), lr=lr, beta1=beta1, beta2=beta2,
                                         epsilon=epsilon, grad=g)
        return grads[0], grads[1], loss  # the inputs' gradients: what the tables would receive

    result = {}
    for kind, call in (("top", lambda: top_step(buffer, labels, top)), ("plain", lambda: plain_step(linear, emb, labels))):
        for _ in range(3):
            call()
        times = [time.perf_counter()]
        for _ in range(repeats):
            out = call()
            _ = float(tf.reduce_sum(out[0]))  # results are materialised
            times.append(time.perf_counter())
        result[kind] = (times[-1] - times[0]) / repeats
        result[f"{kind}_median"] = float(np.median(np.diff(times)))
    return result


# ------------------------------------------------------------------------------------ parent
def roofline_command(threads: int, batches: Sequence[int], repeats: int, models: Sequence[str],
                     data: str | None = None) -> list[str]:
    """The command line of a roofline child (:func:`roofline_child`; its output: :func:`roofline_result`)."""
    return [str(benchlib.PYTHON), __file__, "--roofline-child", str(threads), "--batch-size", ",".join(map(str, batches)),
            "--repeats", str(repeats), "--roofline-models", ",".join(models), *(["--data", data] if data else [])]


def roofline_result(output: str) -> dict:
    """A roofline child's result from its output: ``{batch: {model: {...}}}`` (:func:`roofline_child`)."""
    lines = [line for line in output.splitlines() if line.startswith("ROOFLINE ")]
    if not lines:
        raise ValueError("the roofline child printed no result")
    return json.loads(lines[-1][len("ROOFLINE "):])


def roofline_rows(bench: benchlib.Bench, threads: int, batch: int, repeats: int, models: Sequence[str],
                  data: str | None = None) -> list[dict]:
    """The TF-only rooflines of ``models`` at one batch size and thread count (a child process), of
    the network des.train builds for ``data`` (None: the Criteo sample)."""
    cmd = roofline_command(threads, [batch], repeats, models, data)
    try:
        proc = bench.run_command(cmd, label=f"roofline b{batch} ({threads} threads)", timeout=bench.timeout)
        result = roofline_result(proc.stdout)[str(batch)]
    except (benchlib.BenchError, KeyError, ValueError) as exc:
        bench.failures.append(f"roofline b{batch} ({threads} threads): {exc}")
        return []
    rows, load = [], os.getloadavg()[0]
    for model in models:
        for kind, what in (("top", "top network only (replicated in DES)"),
                           ("plain", "dense roofline: plain TF fwd + bwd + Adam")):
            seconds = result[model][kind]
            rows.append({"model": model, "kind": kind, "threads": threads, "batch": batch, "what": f"{TITLES[model]} {what}",
                         "ms": 1000 * seconds, "ms_median": 1000 * result[model][f"{kind}_median"], "calls": repeats,
                         "samples_per_second": batch / seconds, "load_average": load})
    return rows


def deepctr_store(bench: benchlib.Bench, data: str | None = None):
    """bench_deepctr's venv (created if missing, else used as it is) and the store DeepCTR reads
    (``data``, None: the Criteo sample); None (a failure noted) if the venv cannot be made."""
    try:
        bench_deepctr.ensure_venv(bench, skip=bench_deepctr.DEEPCTR_PYTHON.exists())
    except benchlib.BenchError as exc:
        bench.failures.append(f"DeepCTR venv: {exc}")
        bench.log(f"FAILED DeepCTR venv: {exc}")
        return None
    return bench_deepctr.open_store(data or benchlib.SAMPLE)


def deepctr_rows(bench: benchlib.Bench, store, batch: int, warmup: int, steps: int, model: str = "deepfm") -> list[dict]:
    """DeepCTR's model of des's ``model`` (bench_deepctr.DEEPCTR_MODELS: DeepFM, DCN with matrix
    cross layers, DIN), with des's tower for it (:func:`model_hidden`), throughput only, at one
    batch size (bench_deepctr's child)."""
    label = f"deepctr {model} b{batch}"
    try:
        r = bench_deepctr.run_deepctr(bench, str(store.path), label=label, seed=0, batch=batch, warmup=warmup,
                                      hidden=model_hidden(model), dim=EMBEDDING_DIM, throughput_steps=steps, model=model)
    except (benchlib.BenchError, ValueError) as exc:
        bench.failures.append(f"{label}: {exc}")
        return []
    bench.log(f"  {label}: {r['samples_per_second']:,.0f} samples/s over {r['measured_steps']} steps "
              f"(TF {r['tensorflow']}, {r['params']:,} parameters)")
    return [{"kind": "deepctr", "model": model, "batch": batch, "load_average": os.getloadavg()[0],
             **{k: r[k] for k in ("samples_per_second", "ms_per_step", "measured_steps", "params", "tensorflow")}}]


def median_job(items: Sequence[dict], samples_per_second) -> dict:
    """The median of ``items`` by ``samples_per_second(item)`` (the lower one of an even count)."""
    return sorted(items, key=samples_per_second)[(len(items) - 1) // 2]


def throughput_row(model: str, strategy: str, n: int, batch: int, runs: Sequence[dict]) -> dict:
    """One table row from the ``--rounds`` jobs of a configuration: the median of their samples/s
    (of an even count, the mean of the middle two: the lower one alone would bias a ratio's base
    down), the median job's phases and memory (the lower middle one) and the spread (min-max)."""
    row: dict = {"model": model, "strategy": strategy, "ranks": n, "batch": batch}
    if not runs:
        return row
    rates = [r["steady"]["samples_per_second"] for r in runs]
    s = median_job(runs, lambda r: r["steady"]["samples_per_second"])
    rss = s["peak_rss_bytes_per_rank"]
    median = statistics.median(rates)
    row.update({
        "samples_per_second": median,
        "samples_per_second_rounds": [round(r) for r in rates],
        "spread": f"{min(rates):,.0f}-{max(rates):,.0f}" if len(runs) > 1 else "",
        "samples_per_second_des_train": s["samples_per_second"],
        "timed_steps": s["steady"]["measured_steps"],
        "ms_per_step": 1000 * batch / median,
        "ms_per_phase": s["steady"]["ms_per_phase"],
        "peak_rss_mib_max": max(rss) / 2**20,
        "peak_rss_mib_per_rank": [round(r / 2**20) for r in rss],
        "load_average": s["load_average"],
        "staleness_mean": s.get("staleness_mean"),
    })
    return row


def median_of_rounds(rounds: Sequence[Sequence[dict]], key=lambda row: None) -> list[dict]:
    """Per ``key(row)`` (one configuration: a DeepCTR run, a roofline), the median row over the
    rounds by samples/s (of an even count: the lower middle row, with the mean of the middle two's
    samples/s, as :func:`throughput_row`), with every round's samples/s."""
    found: dict[Any, list[dict]] = {}
    for rows in rounds:
        for r in rows:
            found.setdefault(key(r), []).append(r)
    out = []
    for same in found.values():
        row = dict(median_job(same, lambda r: r["samples_per_second"]))
        rates = [r["samples_per_second"] for r in same]
        row["samples_per_second"] = statistics.median(rates)
        row["samples_per_second_rounds"] = [round(r) for r in rates]
        row["spread"] = f"{min(rates):,.0f}-{max(rates):,.0f}" if len(same) > 1 else ""
        out.append(row)
    return out


def compare_rows(models: Sequence[str], batches: Sequence[int], rows: Sequence[dict], roof_rows: Sequence[dict],
                 deepctr: Sequence[dict]) -> list[dict]:
    """Per model with a top network and batch: the dense roofline at 2 threads, DeepCTR, des N=1
    (samples/s) and des's ratios to them."""
    def find(table, **keys):
        return next((r.get("samples_per_second") for r in table if all(r.get(k) == v for k, v in keys.items())), None)

    out = []
    for model in (m for m in models if m in ROOFLINE_MODELS):
        for batch in batches:
            row = {"kind": "compare", "model": model, "batch": batch,
                   "roofline": find(roof_rows, model=model, batch=batch, kind="plain", threads=ROOFLINE_THREADS[0]),
                   "deepctr": find(deepctr, model=model, batch=batch),
                   "des": find(rows, model=model, batch=batch, strategy="des", ranks=1),
                   "des_bf16": find(rows, model=model, batch=batch, strategy="des-bf16", ranks=1)}
            for ours in ("des", "des_bf16"):
                for key in ("roofline", "deepctr"):
                    row[f"{ours}_vs_{key}"] = row[ours] / row[key] if row[ours] and row[key] else None
            out.append(row)
    return out


def data_note(name: str, path: str | None, rows: int | None) -> str:
    """The table's note on ``--data`` ``name`` (``path``: where :func:`benchlib.dataset` put it)."""
    if name == "criteo":
        return "Data: the shipped Criteo sample (one id per field and sample)."
    if name == "multihot":
        return (f"Data: multihot ({path}: {rows or benchlib.MULTIHOT['rows']:,} synthetic rows, every categorical "
                f"field multi-hot with 0-{benchlib.MULTIHOT['max_hot']} ids, vocabularies x"
                f"{benchlib.MULTIHOT['vocab_scale']:g}); no roofline or DeepCTR (they model the Criteo sample's "
                "one-hot inputs and DIN's sequence).")
    if name == "din":
        length = benchlib.DIN_DATA["max_length"]
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in MODEL_FLAGS["din"].items())
        return (f"Data: din ({path}: {rows or benchlib.DIN_DATA['rows']:,} synthetic rows of benchlib.din_schema, "
                f"split 90/5/5: a candidate item_id (Zipf over 100,000 ids), its history of 0-{length + 2} items "
                f"cut to the most recent {length} and read item by item (history@1..{length} sharing item_id's "
                "table), four other one-hot fields and a mean-pooled multi-valued one; no dense features). "
                f"des's din with {flags} (its attention unit "
                "80-40, PReLU); the other models with des.train's defaults.")
    return f"Data: {name}."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lr,fm,wdl,deepfm")
    parser.add_argument("--strategies", default="des,des-replicated,alltoall,ps")
    parser.add_argument("--ranks", default="1,2,4", help="rank counts (ps uses those >= 2)")
    parser.add_argument("--batch-size", default="4096", help="global batch size(s), comma-separated (e.g. 4096,512)")
    parser.add_argument("--warmup", type=int, default=3, help="steps (per worker for ps) not timed")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every des/alltoall/ps job and DeepCTR this many times, round-robin, and report the "
                             "median (with the min-max spread): one job's samples/s varies between identical runs")
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps (per worker for ps) at the largest batch; smaller batches run proportionally more")
    parser.add_argument("--repeats", type=int, default=20, help="roofline: timed calls at the largest batch (more at a smaller one)")
    parser.add_argument("--deepctr", action=argparse.BooleanOptionalAction, default=None,
                        help="DeepCTR's DeepFM in .venv-deepctr (created if missing); default: only if that venv "
                             "exists and not --quick")
    parser.add_argument("--data", default="criteo",
                        help="criteo (the shipped sample, default), multihot (synthetic, every categorical field "
                             "multi-hot with 0-50 ids; no roofline or DeepCTR), din (synthetic, a candidate item "
                             "and its history of up to 30 items sharing its table: for --models din), or a data "
                             "path for des.train")
    parser.add_argument("--data-rows", type=int, help="rows of --data multihot or din (default 40,000)")
    parser.add_argument("--cache", default=benchlib.CACHE, help="where --data multihot and din are generated")
    parser.add_argument("--roofline-child", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    parser.add_argument("--roofline-models", default=",".join(ROOFLINE_MODELS), help=argparse.SUPPRESS)
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    batches = batch_sizes(args.batch_size)
    if args.roofline_child:
        result = roofline_child(args.roofline_child, batches, args.repeats, args.roofline_models.split(","),
                                None if args.data == "criteo" else args.data)
        print("ROOFLINE " + json.dumps(result), flush=True)
        return 0
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, not {args.rounds}")
    if args.quick:
        args.models, args.ranks, args.warmup, args.steps, args.repeats = "lr,deepfm", "1,2", 2, 3, 5
    models, strategies = args.models.split(","), args.strategies.split(",")
    ranks = [int(x) for x in args.ranks.split(",")]
    criteo = args.data == "criteo"
    modelled = args.data in ("criteo", "din")  # the data the rooflines and DeepCTR are built for
    deepctr_models = [m for m in models if m in bench_deepctr.DEEPCTR_MODELS]
    with_deepctr = modelled and deepctr_models and (
        args.deepctr if args.deepctr is not None else not args.quick and bench_deepctr.DEEPCTR_PYTHON.exists())
    bench = benchlib.Bench(__file__, args)
    data = benchlib.dataset(bench, args.data, args.cache, args.data_rows)
    data_flags = {} if data is None else {"data": data}

    rows, roof_rows, deepctr = [], [], []
    roof_models = [m for m in ROOFLINE_MODELS if m in models] if modelled else []
    store = deepctr_store(bench, data) if with_deepctr else None
    for batch in batches:  # des, the rooflines and DeepCTR of one batch size back to back (the load drifts)
        steps = scaled_steps(args.steps, batch, batches)
        configs = [(model, strategy, n) for model in models for strategy in strategies for n in ranks
                   if n in STRATEGY_RANKS[strategy]]
        runs: dict[tuple, list[dict]] = {c: [] for c in configs}
        roof_rounds, deepctr_rounds = [], []
        for round_ in range(args.rounds):  # round-robin: a drift in the machine's load hits every config,
            for model, strategy, n in configs:  # the rooflines and DeepCTR alike
                tag = f"{model}-{strategy}-n{n}-b{batch}" + (f"-r{round_}" if args.rounds > 1 else "")
                s = bench.steady(n, tag, args.warmup, steps, model=model, batch_size=batch, **data_flags,
                                 **MODEL_FLAGS.get(model, {}), **benchlib.strategy_flags(strategy))
                if s is not None:
                    runs[(model, strategy, n)].append(s)
            roof_rounds.append([row for threads in (ROOFLINE_THREADS if roof_models else ())
                                for row in roofline_rows(bench, threads, batch, scaled_steps(args.repeats, batch, batches),
                                                         roof_models, data)])
            if store is not None:
                deepctr_rounds.append([row for model in deepctr_models
                                       for row in deepctr_rows(bench, store, batch, args.warmup, steps, model)])
        rows += [throughput_row(model, strategy, n, batch, runs[(model, strategy, n)])
                 for model, strategy, n in configs]
        roof_rows += median_of_rounds(roof_rounds, key=lambda r: (r["model"], r["kind"], r["threads"]))
        deepctr += median_of_rounds(deepctr_rounds, key=lambda r: r["model"])
    for row in rows:  # speed-up over DES on one rank, and over alltoall at the same N (same model and batch)
        for key, strategy, base_ranks in (("vs_des_n1", "des", 1), ("vs_alltoall", "alltoall", row["ranks"])):
            base = next((r for r in rows if (r["model"], r["batch"]) == (row["model"], row["batch"])
                         and r["strategy"] == strategy and r["ranks"] == base_ranks), None)
            if base and base.get("samples_per_second") and row.get("samples_per_second"):
                row[key] = row["samples_per_second"] / base["samples_per_second"]

    roof_rows += [{"model": m, "kind": "none", "what": NO_TOP_NETWORK[m]} for m in models if m in NO_TOP_NETWORK]
    compare = compare_rows(models, batches, rows, roof_rows, deepctr)

    columns = [("model", "model", ""), ("strategy", "strategy", ""), ("ranks", "N", "d"), ("batch", "batch", "d"),
               ("samples_per_second", "samples/s", ",.0f"), ("spread", "min-max over rounds", ""),
               ("ms_per_step", "ms/step", ",.0f"), ("vs_des_n1", "vs DES N=1", ".2f"), ("vs_alltoall", "vs alltoall same N", ".2f"),
               ("samples_per_second_des_train", "des.train's samples/s", ",.0f"),
               ("peak_rss_mib_max", "peak RSS MiB/rank (max)", ",.0f"), ("peak_rss_mib_per_rank", "per rank", "")]
    roof_columns = [("what", "TF-only roofline", ""), ("threads", "threads", "d"), ("batch", "batch", "d"),
                    ("ms", "ms/step", ".1f"), ("ms_median", "median ms", ".1f"), ("samples_per_second", "samples/s", ",.0f"),
                    ("spread", "min-max over rounds", "")]
    compare_columns = [("model", "model", ""), ("batch", "batch", "d"),
                       ("roofline", f"dense roofline ({ROOFLINE_THREADS[0]} threads) samples/s", ",.0f"),
                       ("deepctr", "DeepCTR 0.9.4 samples/s", ",.0f"), ("des", "des N=1 samples/s", ",.0f"),
                       ("des_vs_roofline", "des / roofline", ".2f"), ("des_vs_deepctr", "des / DeepCTR", ".2f")]
    if "des-bf16" in strategies:  # the same step with the upper network in bf16 (the roofline stays float32)
        compare_columns += [("des_bf16", "des-bf16 N=1 samples/s", ",.0f"),
                            ("des_bf16_vs_roofline", "des-bf16 / roofline", ".2f"),
                            ("des_bf16_vs_deepctr", "des-bf16 / DeepCTR", ".2f")]
    notes = [
        data_note(args.data, data, args.data_rows),
        f"Global batch {', '.join(map(str, batches))}; samples/s over "
        f"{', '.join(str(scaled_steps(args.steps, b, batches)) for b in batches)} timed steps respectively after "
        f"{args.warmup} warm-up steps (ps: per worker). des/alltoall: training samples over rank 0's training wall "
        "time of the steps after the warm-up ones (des.train's own meter, restarted after them; the job validates "
        "once, after its last step, so no validation breaks the pipelined steps); ps: workers x batch / the first "
        "worker's time per step after warm-up (its phase timers). \"des.train's samples/s\" is the summary's own "
        "figure (des/alltoall: the same; ps: all workers' samples / the slowest worker's time).",
        benchlib.STRATEGY_NOTE,
        "des: every rank computes the partials of its fields for the whole batch; alltoall: each rank "
        "takes B/N rows; ps: ranks 1..N-1 are asynchronous workers each taking every (N-1)-th batch, rank 0 serves "
        "all tables and dense weights (so N=2 is one worker).",
        "2 cores: each rank gets max(1, 2 // N) TF threads; N=4 puts 4 ranks (4 x ~0.6 GB of TF) on 2 cores, so "
        "ranks time-share cores and N=4 is correct but slow; nothing here can show scaling beyond 2 cores. "
        "The paper's Table 5 (4 nodes x 48 threads, 10 GbE; PS = DiFacto): LR 50,397 vs 78,205 samples/s, "
        "W&D 11,024 vs 49,837, DeepFM 10,560 vs 41,296 (PS vs DES).",
        f"Roofline: one tf.function call per step, samples/s = batch over the wall time of {args.repeats} calls "
        "(more at a smaller batch, as the steps) after 3 untimed ones, as for des and DeepCTR (the median call is "
        "given too: it hides time lost to other processes); 'top network only' is what every "
        "des-replicated rank repeats on the whole batch (forward + backward on the [B, P] buffer, no optimizer); "
        f"'dense roofline' is the same model as a plain TF program on dense inputs [B, {FIELDS}, {EMBEDDING_DIM}] "
        f"and [B, {FIELDS}, 1] (MLP {FIELDS * EMBEDDING_DIM}-{'-'.join(map(str, HIDDEN))}-1 as dense matmuls, "
        "DeepFM's FM term), forward + backward (incl. the inputs' gradients) + Adam on the dense parameters: des "
        "on one process minus its hash tables (lookup, pooling, sparse update)."
        + ("" if criteo else " On this data each model's network as des.train builds it for the store (its fields, "
           "their pooled embeddings as the dense inputs; DIN: its first layer on the other fields and the "
           "attention's reference on the candidate and its items, then its tower)."),
        "DeepCTR: " + (f"DeepCTR 0.9.4 DeepFM in {bench_deepctr.DEEPCTR_VENV.name} (TF 2.21 + tf-keras), k="
                       f"{EMBEDDING_DIM}, MLP {'-'.join(map(str, HIDDEN))}, its defaults (one Adam lr 0.001 for "
                       f"everything, embeddings N(0, {bench_deepctr.DEFAULT_INIT_STD:g}), l2 "
                       f"{bench_deepctr.DEFAULT_L2:g} on the tables), one model.fit over the warm-up + timed steps "
                       "of the data's training split in des's batch order; samples/s of the steps after "
                       "the warm-up from per-batch callbacks; 2 TF threads."
                       + (" For dcnv2: DeepCTR's DCN with cross_parameterization='matrix' and "
                          f"{bench_deepctr.DCN_CROSS_LAYERS} cross layers (des's dcnv2 network)."
                          if "dcnv2" in deepctr_models else "")
                       + (" For din: DeepCTR's DIN with des's din network (DNN "
                          f"{'-'.join(map(str, model_hidden('din')))} and attention unit 80-40, both PReLU, scores "
                          "not normalized), item_id and hist_item_id (the history's items, 0 the masked padding) "
                          "sharing one embedding, the other fields as bench_din.py gives them."
                          if "din" in deepctr_models else "")
                       if with_deepctr else "not run (DeepFM, DCN-v2 and DIN only; --deepctr runs it, by default "
                       "only when .venv-deepctr exists and not --quick)."),
        "Other engineers' jobs may have shared the 2 cores during these runs (load average per job in results.csv): "
        "compare ratios within the run, not absolute numbers across runs.",
    ]

    def figure(plt):
        import numpy as np

        groups = [(m, b) for b in batches for m in models]
        configs = [(s, n) for s in strategies for n in ranks if n in STRATEGY_RANKS[s]]
        fig, ax = plt.subplots(figsize=(max(8, 2.4 * len(groups)), 4.8))
        width = 0.8 / max(len(configs), 1)
        for j, (strategy, n) in enumerate(configs):
            values = [next((r.get("samples_per_second") or 0 for r in rows if (r["model"], r["batch"]) == g
                            and r["strategy"] == strategy and r["ranks"] == n), 0) for g in groups]
            ax.bar(np.arange(len(groups)) + (j - (len(configs) - 1) / 2) * width, values, width,
                   label=f"{strategy} N={n}", color=f"C{list(benchlib.STRATEGY_FLAGS).index(strategy)}",
                   alpha=0.45 + 0.55 * (n / max(ranks)), edgecolor="black", linewidth=0.4)
        labelled = set()
        lines = [(r, f"roofline: {'top network only' if r['kind'] == 'top' else 'dense'}, {r['threads']} thread(s)")
                 for r in roof_rows if r["kind"] in ("top", "plain")] + [(r, "DeepCTR DeepFM") for r in deepctr]
        for r, label in lines:
            if (r["model"], r["batch"]) in groups:
                x = groups.index((r["model"], r["batch"]))
                color = "red" if r["kind"] == "deepctr" else "black" if r["kind"] == "plain" else "gray"
                ax.hlines(r["samples_per_second"], x - 0.45, x + 0.45, color=color, linewidth=1.2,
                          linestyle=":" if r.get("threads") == 1 else "--" if r["kind"] == "top" else "-",
                          label=None if label in labelled else label)
                labelled.add(label)
        ax.set_xticks(np.arange(len(groups)), [f"{m}\nB={b}" for m, b in groups])
        ax.set_yscale("log")
        ax.set_ylabel("training samples/s")
        ax.set_title("Throughput after warm-up, 2-core machine")
        ax.legend(fontsize=7, ncol=3)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        return fig

    tables = [("Training throughput", columns, rows)] + ([("", roof_columns, roof_rows)] if roof_rows else [])
    if compare:
        tables.insert(0, ("des on one process vs the dense roofline and DeepCTR", compare_columns, compare))
    bench.finish(rows + roof_rows + deepctr + compare, tables, notes, figure)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
