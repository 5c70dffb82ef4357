""".venv/bin/python scripts/bench_din.py --data STORE [--seeds 0,1,2] [--epochs 10] [--venv PATH] [--predictions DIR]

DeepCTR's DIN (0.9.4, its defaults: Dice, DNN 256-128-64, attention 80-40, Adam 1e-3, batch 256)
on a store prepared with ``examples/movielens_din.toml`` (MovieLens 100K with each rating's
history read item by item), given des's features: the candidate ``item_id`` and its history
``history@1..L`` as DeepCTR's ``hist_item_id`` sharing its embedding (ids re-indexed 1..V over
both, 0 the padding DeepCTR masks), the other one-hot fields as ``SparseFeat``, ``genres`` as a
mean-pooled ``VarLenSparseFeat``, ``age`` as a ``DenseFeat``. Its best of ``--epochs`` epochs on
the validation AUC; test AUC and logloss there, per seed. DeepCTR runs in its own interpreter
(``--venv``: tensorflow-cpu 2.21, ``pip install --no-deps tf-keras==2.21.0 deepctr==0.9.4 h5py``,
``TF_USE_LEGACY_KERAS=1``; it breaks under Keras 3), fed arrays this process writes.
``--predictions DIR`` also writes each seed's test predictions of its best epoch, in store order,
for ``scripts/compare_predictions.py``.

Expect, on a 2-core machine: DeepCTR's DIN at a test AUC of about 0.776 (0.7764 ± 0.0016
recorded), level with des's ``din`` as the paper's (``--hidden 200,80 --activation prelu
--model-options 'wide=none;attention_softmax=false'``: 0.7771 ± 0.0018) and below des's DeepFM
without the history (0.7905): docs/benchmarks.md, "DIN's target attention" (and "DIN with
DeepFM's shallow part" for des's default ``din``). On the time-ordered split
(``examples/movielens_history.py --split-by-time 0.8,0.1,0.1``): about 0.711 (0.7114 ± 0.0028),
above des's default ``din`` (0.7058) and level with des's DeepFM on the mean-pooled history
("DIN's target attention on a time-ordered split").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def din_inputs(store_path: str) -> dict[str, np.ndarray]:
    """The store's rows as DeepCTR's DIN inputs (see the module docstring), plus labels and splits."""
    from des.data import ColumnStore

    store = ColumnStore.open(store_path)
    names = list(store.field_names)
    items = [f for f, n in enumerate(names) if n.startswith("history@")]
    candidate = names.index("item_id")
    n = store.num_rows
    keys = {f: store.field(f) for f in range(len(names))}
    movie_keys = np.concatenate([np.asarray(keys[f][1]) for f in (candidate, *items)])
    vocabulary = np.unique(movie_keys)
    out: dict[str, np.ndarray] = {"label": np.asarray(store.labels, np.float32)}
    for split in ("train", "validation", "test"):
        out[f"rows_{split}"] = np.asarray(store.split_rows(split), np.int64)
    out["item_id"] = (np.searchsorted(vocabulary, np.asarray(keys[candidate][1])) + 1).astype(np.int32)
    history = np.zeros((n, len(items)), np.int32)
    for t, f in enumerate(items):
        offsets, k, _ = keys[f]
        has = np.diff(np.asarray(offsets)) > 0
        history[has, t] = np.searchsorted(vocabulary, np.asarray(k)) + 1
    out["hist_item_id"] = history
    for f, name in enumerate(names):
        if f == candidate or f in items:
            continue
        offsets, k, _ = keys[f]
        uniques, index = np.unique(np.asarray(k), return_inverse=True)
        if store.is_one_hot(f):
            out[name] = index.astype(np.int32)
        else:
            lengths = np.diff(np.asarray(offsets, np.int64))
            ids = np.zeros((n, max(1, int(lengths.max()))), np.int32)
            ids[np.repeat(np.arange(n), lengths), np.arange(index.size) - np.repeat(np.asarray(offsets)[:-1], lengths)] = index + 1
            out[name] = ids
    for j, name in enumerate(store.dense_names):
        out[name] = np.asarray(store.take_dense(np.arange(n))[:, j:j + 1], np.float32)
    out["vocabulary"] = np.int64([vocabulary.size + 1])
    return out


def din_columns(data: dict[str, np.ndarray], dim: int = 8, initializer=None) -> list:
    """DeepCTR's feature columns of :func:`din_inputs`' arrays (the module docstring; in the DeepCTR
    venv): ``item_id`` and ``hist_item_id`` sharing its embedding, the others by their arrays'
    shapes, embeddings ``dim`` wide (``initializer``: DeepCTR's default where None). Each column's
    name is the key of its array."""
    from deepctr.feature_column import DenseFeat, SparseFeat, VarLenSparseFeat

    init = {} if initializer is None else {"embeddings_initializer": initializer}
    skip = {"label", "vocabulary", "item_id", "hist_item_id"} | {k for k in data if k.startswith("rows_")}
    movies = int(data["vocabulary"][0])
    columns = [SparseFeat("item_id", movies, embedding_dim=dim, **init)]
    for name in sorted(k for k in data if k not in skip):
        a = data[name]
        if a.dtype == np.float32:
            columns.append(DenseFeat(name, 1))
        elif a.ndim == 1:
            columns.append(SparseFeat(name, int(a.max()) + 1, embedding_dim=dim, **init))
        else:
            columns.append(VarLenSparseFeat(SparseFeat(name, int(a.max()) + 1, embedding_dim=dim, **init), a.shape[1],
                                            "mean"))
    columns.append(VarLenSparseFeat(SparseFeat("hist_item_id", movies, embedding_dim=dim, embedding_name="item_id",
                                               **init), data["hist_item_id"].shape[1]))
    return columns


def child(inputs_path: str, seed: int, epochs: int, predictions: str = "") -> dict:
    """In the DeepCTR venv: train DIN, the best epoch on validation AUC, its test metrics (and its
    test predictions written to ``predictions``, one per line in store order, when given)."""
    import tensorflow as tf
    from deepctr.models import DIN
    from sklearn.metrics import log_loss, roc_auc_score

    data = dict(np.load(inputs_path))
    tf.random.set_seed(seed)
    np.random.seed(seed)
    columns = din_columns(data)
    model = DIN(columns, ["item_id"], seed=seed)
    model.compile("adam", "binary_crossentropy")
    names = [c.name for c in columns]
    part = lambda split: ({k: data[k][data[f"rows_{split}"]] for k in names}, data["label"][data[f"rows_{split}"]])  # noqa: E731
    (x, y), (xv, yv), (xt, yt) = part("train"), part("validation"), part("test")
    best = None
    for epoch in range(epochs):
        model.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=True)
        pv, pt = (model.predict(z, batch_size=4096, verbose=0)[:, 0] for z in (xv, xt))
        val = roc_auc_score(yv, pv)
        if best is None or val > best["validation_auc"]:
            best = {"epoch": epoch + 1, "validation_auc": val, "test_auc": roc_auc_score(yt, pt),
                    "test_logloss": log_loss(yt, np.clip(pt.astype(np.float64), 1e-7, 1 - 1e-7))}
            if predictions:
                np.savetxt(predictions, pt, fmt="%.8f")
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--venv", default=".venv-deepctr")
    parser.add_argument("--predictions", default="", metavar="DIR", help="write each seed's test predictions (its "
                        "best epoch's) to DIR/deepctr-din-sSEED.test.txt, for scripts/compare_predictions.py")
    parser.add_argument("--predictions-file", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, int(args.seeds), args.epochs, args.predictions_file or "")))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inputs.npz"
        np.savez(path, **din_inputs(args.data))
        env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
        results = []
        if args.predictions:
            Path(args.predictions).mkdir(parents=True, exist_ok=True)
        for seed in args.seeds.split(","):
            written = ["--predictions-file", str(Path(args.predictions) / f"deepctr-din-s{seed}.test.txt")] \
                if args.predictions else []
            done = subprocess.run([str(Path(args.venv) / "bin" / "python"), __file__, "--data", args.data, "--child",
                                   str(path), "--seeds", seed, "--epochs", str(args.epochs), *written], env=env,
                                  capture_output=True, text=True, check=True)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"seed {seed}: {json.dumps(results[-1])}", flush=True)
    auc, loss = (np.array([r[k] for r in results]) for k in ("test_auc", "test_logloss"))
    print(f"DeepCTR DIN: test AUC {auc.mean():.4f} ± {auc.std(ddof=1) if len(auc) > 1 else 0:.4f}, "
          f"logloss {loss.mean():.4f} ± {loss.std(ddof=1) if len(loss) > 1 else 0:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
