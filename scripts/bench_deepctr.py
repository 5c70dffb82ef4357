""".venv/bin/python scripts/bench_deepctr.py [--quick] [--seeds 0,1,2] [--epochs 1] [--batch-size 1024] [--des-ranks 1,2]

Shows DeepCTR's DeepFM (0.9.4, a popular Keras implementation) as an outside reference next to
des's DeepFM on the same data: the shipped Criteo sample's split (90/5/5, split seed 0), the same
39 categorical ids per row (des's keys, re-indexed per field), embedding size 8, MLP 400-400-400,
ReLU, no dropout/BN/l2, the same batch size and the same batches in the same order (des's epoch
permutation, last partial batch dropped); test AUC and logloss (mean +- std over seeds) and
training samples/s after a warm-up of a few steps, both at 2 TF threads, one process.

DeepCTR does not work with Keras 3 and is NOT installed into the main venv: this script creates (once)
``.venv-deepctr`` next to ``.venv`` with ``tensorflow-cpu==2.21.*``, numpy/pandas/scikit-learn/numba,
``pip install --no-deps tf-keras==2.21.0 deepctr==0.9.4 h5py`` and ``pip install --no-deps -e .``
(for des's data reader), and runs the DeepCTR part in that interpreter as a subprocess with
``TF_USE_LEGACY_KERAS=1``. ``--skip-install`` uses the venv as it is.

What still differs (stated in the table): DeepCTR uses one Adam (lr 0.001) for everything, des uses
FTRL for the order-1 weights and Adam for embeddings and dense weights; DeepCTR's MLP starts from
Glorot-normal kernels, des's from Glorot-uniform. DeepCTR's samples/s includes its Keras input
pipeline. The figure shows test AUC (error bars: std over seeds) and samples/s side by side.

Expect (2-core machine, defaults: 1 epoch, batch 1024, seeds 0,1,2): DeepCTR's DeepFM slightly
ahead on AUC (about 0.736 vs des 0.728 on the same split, within about 1 AUC point: the optimizer
and initializers differ), des N = 1 and N = 2 identical AUC (same math), and training throughput
of the same order for both (roughly 14k-18k samples/s; des N = 2 below des N = 1 on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

import benchlib

DEEPCTR_VENV = benchlib.REPO / ".venv-deepctr"
DEEPCTR_PYTHON = DEEPCTR_VENV / "bin" / "python"


# ------------------------------------------------------------------------------------ child (.venv-deepctr)
def deepctr_child(store_path: str, seed: int, epochs: int, batch: int, warmup: int, hidden: Sequence[int],
                  dim: int) -> dict:
    """Train DeepCTR's DeepFM in this process (.venv-deepctr, TF_USE_LEGACY_KERAS=1); returns metrics."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(os.cpu_count() or 1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from deepctr.feature_column import SparseFeat
    from deepctr.models import DeepFM
    from sklearn.metrics import log_loss, roc_auc_score

    from des.data import BatchReader, ColumnStore

    store = ColumnStore.open(store_path)
    rows = np.arange(store.num_rows)
    names = [f"f{i}_{n}" for i, n in enumerate(store.field_names)]
    inputs, vocab = {}, {}
    for f, name in enumerate(names):
        ids = store.gather(f, rows)
        if ids.keys.size != store.num_rows:
            raise SystemExit(f"field {store.field_names[f]} is not one-hot")
        uniques, index = np.unique(ids.keys, return_inverse=True)  # des key -> 0..V-1 per field
        inputs[name], vocab[name] = index.astype(np.int32), uniques.size
    labels = np.asarray(store.labels).astype(np.float32)

    tf.keras.utils.set_random_seed(seed)
    init = tf.keras.initializers.RandomNormal(stddev=0.01, seed=seed)
    features = [SparseFeat(n, vocabulary_size=vocab[n], embedding_dim=dim, embeddings_initializer=init) for n in names]
    model = DeepFM(features, features, dnn_hidden_units=tuple(hidden), l2_reg_linear=0.0, l2_reg_embedding=0.0,
                   l2_reg_dnn=0.0, dnn_dropout=0.0, dnn_activation="relu", seed=seed, task="binary")
    model.compile(tf.keras.optimizers.Adam(learning_rate=0.001), "binary_crossentropy")

    class StepTimer(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends: list[float] = []

        def on_train_batch_end(self, batch_index, logs=None):
            self.ends.append(time.perf_counter())

    timer, steady_samples, steady_seconds, total_seconds, steps = StepTimer(), 0, 0.0, 0.0, 0
    for epoch in range(epochs):
        reader = BatchReader(store, "train", batch_size=batch, seed=seed, epoch=epoch)
        order = reader.row_order[: len(reader) * batch]  # des's batches, last partial batch dropped
        x = {n: inputs[n][order] for n in names}
        timer.ends.clear()
        start = time.perf_counter()
        model.fit(x, labels[order], batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
        total_seconds += time.perf_counter() - start
        steps += len(timer.ends)
        if len(timer.ends) > warmup:  # steps after the warm-up ones (tracing) of this epoch
            steady_seconds += timer.ends[-1] - timer.ends[warmup - 1]
            steady_samples += (len(timer.ends) - warmup) * batch
    test = store.split_rows("test")
    p = model.predict({n: inputs[n][test] for n in names}, batch_size=8192, verbose=0).reshape(-1).astype(np.float64)
    y = labels[test]
    return {"test_auc": float(roc_auc_score(y, p)), "test_logloss": float(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7))),
            "steps": steps, "samples_per_second": steady_samples / steady_seconds if steady_seconds else None,
            "samples_per_second_incl_warmup": steps * batch / total_seconds, "params": int(model.count_params()),
            "tensorflow": tf.__version__}


# ------------------------------------------------------------------------------------ parent
INSTALL_STEPS = [
    ["-m", "pip", "install", "--quiet", "--upgrade", "pip"],
    ["-m", "pip", "install", "--quiet", "tensorflow-cpu==2.21.*", "numpy>=2.0.2,<2.6", "numba>=0.61,<0.69",
     "pandas", "scikit-learn"],
    ["-m", "pip", "install", "--quiet", "--no-deps", "tf-keras==2.21.0", "deepctr==0.9.4", "h5py"],
    ["-m", "pip", "install", "--quiet", "--no-deps", "-e", str(benchlib.REPO)],
]


def ensure_venv(bench: benchlib.Bench, skip: bool) -> None:
    if not DEEPCTR_PYTHON.exists():
        if skip:
            raise benchlib.BenchError(f"{DEEPCTR_VENV} does not exist (run without --skip-install)")
        bench.run_command([str(benchlib.PYTHON), "-m", "venv", str(DEEPCTR_VENV)], label="venv", timeout=300)
    if not skip:
        for step in INSTALL_STEPS:
            bench.run_command([str(DEEPCTR_PYTHON), *step], label="pip " + " ".join(step[3:]), timeout=1200)
    probe = bench.run_command([str(DEEPCTR_PYTHON), "-c", "import os; os.environ['TF_USE_LEGACY_KERAS']='1'; "
                               "import tensorflow as tf, tf_keras, deepctr; print('PROBE', tf.__version__, "
                               "tf.keras.__name__, deepctr.__version__)"], label="import probe", timeout=300)
    bench.log(" ".join(line for line in probe.stdout.splitlines() if line.startswith("PROBE")))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3, help="steps per epoch not timed (tracing)")
    parser.add_argument("--des-ranks", default="1,2")
    parser.add_argument("--hidden", default="400,400,400")
    parser.add_argument("--embedding-dim", type=int, default=8)
    parser.add_argument("--data", default=str(benchlib.SAMPLE))
    parser.add_argument("--skip-install", action="store_true", help="use .venv-deepctr as it is")
    parser.add_argument("--child", metavar="STORE", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    hidden = [int(h) for h in args.hidden.split(",")]
    if args.child:
        result = deepctr_child(args.child, args.seed, args.epochs, args.batch_size, args.warmup, hidden,
                               args.embedding_dim)
        print("DEEPCTR " + json.dumps(result), flush=True)
        return 0
    if args.quick:
        args.seeds, args.des_ranks = "0", "1"
    seeds = [int(s) for s in args.seeds.split(",")]
    bench = benchlib.Bench(__file__, args)
    from des.data import open_dataset

    store = open_dataset(args.data, split=[0.9, 0.05, 0.05], seed=0)  # the store des.train uses
    runs = []
    try:
        ensure_venv(bench, args.skip_install)
        installed = True
    except benchlib.BenchError as exc:
        bench.failures.append(f"DeepCTR venv: {exc}")
        bench.log(f"FAILED DeepCTR venv: {exc}")
        installed = False
    for seed in seeds:
        if installed:
            cmd = [str(DEEPCTR_PYTHON), __file__, "--child", str(store.path), "--seed", str(seed), "--epochs",
                   str(args.epochs), "--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
                   "--hidden", args.hidden, "--embedding-dim", str(args.embedding_dim)]
            try:
                out = bench.run_command(cmd, label=f"deepctr seed {seed}", env={"TF_USE_LEGACY_KERAS": "1"}).stdout
                lines = [line for line in out.splitlines() if line.startswith("DEEPCTR ")]
                result = json.loads(lines[-1][len("DEEPCTR "):])
                runs.append({"system": "DeepCTR DeepFM", "ranks": 1, "seed": seed, **result})
                bench.log(f"  deepctr seed {seed}: AUC {result['test_auc']:.4f}, {result['samples_per_second']:,.0f} samples/s")
            except (benchlib.BenchError, IndexError, ValueError) as exc:
                bench.failures.append(f"deepctr seed {seed}: {exc}")
        for n in [int(x) for x in args.des_ranks.split(",")]:
            tag = f"des-n{n}-s{seed}"
            s = bench.train(n, tag, model="deepfm", strategy="des", seed=seed, epochs=args.epochs,
                            batch_size=args.batch_size, eval_every=args.warmup, data=args.data,
                            embedding_dim=args.embedding_dim, hidden=args.hidden)
            if s is not None:
                first = json.loads((bench.jobs / tag / "metrics.jsonl").read_text().splitlines()[0])
                runs.append({"system": "des DeepFM", "ranks": n, "seed": seed, "test_auc": s["test_auc"],
                             "test_logloss": s["test_logloss"], "steps": s["steps"],
                             "samples_per_second": benchlib.steady_from_metrics(first, s)["samples_per_second"],
                             "samples_per_second_incl_warmup": s["samples_per_second"]})
    rows = []
    for system, n in sorted({(r["system"], r["ranks"]) for r in runs}):
        sel = [r for r in runs if r["system"] == system and r["ranks"] == n]
        auc = benchlib.mean_std([r["test_auc"] for r in sel])
        ll = benchlib.mean_std([r["test_logloss"] for r in sel])
        sps = benchlib.mean_std([r["samples_per_second"] for r in sel])
        rows.append({"system": system, "ranks": n, "seeds": len(sel), "steps": sel[0]["steps"],
                     "auc": f"{auc[0]:.4f} ± {auc[1]:.4f}", "logloss": f"{ll[0]:.4f} ± {ll[1]:.4f}",
                     "test_auc": auc[0], "test_logloss": ll[0], "samples_per_second": sps[0],
                     "samples_per_second_std": sps[1], "params": sel[0].get("params")})
    columns = [("system", "system", ""), ("ranks", "processes", "d"), ("seeds", "seeds", "d"), ("steps", "steps", "d"),
               ("auc", "test AUC (mean ± std)", ""), ("logloss", "test logloss", ""),
               ("samples_per_second", "train samples/s (after warm-up)", ",.0f")]
    notes = [
        f"Shipped Criteo sample, split 90/5/5 (split seed 0): the same {args.epochs} epoch(s) of batches of "
        f"{args.batch_size} in des's order for both; k={args.embedding_dim}, MLP {args.hidden}, ReLU, no dropout/BN/l2; "
        f"seeds {args.seeds}. Samples/s: after {args.warmup} warm-up steps per epoch, 2 TF threads (des N=1; at N=2 "
        "each des rank has 1 thread).",
        "Differences that remain: DeepCTR trains everything with one Adam (lr 0.001), des uses FTRL (alpha 0.05) for "
        "the order-1 weights and Adam (lr 0.001) for embeddings and dense weights; DeepCTR's MLP initializers are "
        "Glorot normal (des: Glorot uniform); both have zero-initialized per-id linear weights and one output bias. Ids "
        "that never occur in training get an untrained (initial) embedding in both.",
        "DeepCTR 0.9.4 needs Keras 2 (tf-keras 2.21.0 with TF_USE_LEGACY_KERAS=1); it runs from .venv-deepctr as a "
        "subprocess, never in the main venv.",
    ]
    def figure(plt):
        labels = [f"{r['system']}\n{r['ranks']} proc." for r in rows]
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        aucs = [benchlib.mean_std([x["test_auc"] for x in runs if (x["system"], x["ranks"]) == (r["system"], r["ranks"])])
                for r in rows]
        left.bar(range(len(rows)), [a[0] for a in aucs], yerr=[a[1] for a in aucs], capsize=4, color="C0")
        left.set_ylim(min([a[0] for a in aucs] + [0.7]) - 0.02, max([a[0] for a in aucs] + [0.7]) + 0.02)
        left.set_ylabel("test AUC")
        right.bar(range(len(rows)), [r["samples_per_second"] or 0 for r in rows],
                  yerr=[r["samples_per_second_std"] or 0 for r in rows], capsize=4, color="C1")
        right.set_ylabel("train samples/s after warm-up")
        for ax in (left, right):
            ax.set_xticks(range(len(rows)), labels, fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(f"DeepFM on the shipped Criteo sample, batch {args.batch_size}, {args.epochs} epoch(s)")
        return fig

    bench.finish(rows, [("DeepFM: DeepCTR vs des", columns, rows)], notes, figure if rows else None,
                 extra={"runs": runs})
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
