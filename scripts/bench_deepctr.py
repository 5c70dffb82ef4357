""".venv/bin/python scripts/bench_deepctr.py [--quick] [--data STORE] [--seeds 0,1,2] [--models lr,fm,wdl,deepfm,dcnv2,dlrm] [--systems des,deepctr,sklearn] [--des-flags "..."]

Model quality of des's *default command* next to outside references on the same split of the shipped
Criteo sample (90/5/5, split seed 0): every model trained with ``python -m des.train --model M
--seed S`` (its defaults: early stopping on the validation split, the best checkpoint restored;
LR all 20 epochs without it),
DeepCTR's DeepFM (0.9.4; for dcnv2 its DCN with full-rank cross layers) with DeepCTR's defaults (one Adam lr 0.001 for everything, embeddings
N(0, 1e-4), l2 1e-5 on the embedding and linear tables, batch 512; up to ``--epochs`` 3 epochs in
des's batch order, the epoch with the best validation AUC), and scikit-learn's LogisticRegression on
one-hot ids of the training rows with C chosen by 3-fold cross-validation on them. Test AUC and
logloss, mean +- std over seeds (scikit-learn: deterministic, one run). ``--des-flags`` adds flags
to every des run (ablations).

``--data STORE`` compares on a prepared column store of any schema instead (its own train /
validation / test rows; des runs ``python -m des.train --model M --data STORE --seed S``). DeepCTR's
inputs are built from the store itself (:func:`deepctr_inputs`): a one-hot field is a ``SparseFeat``
(its keys re-indexed 0..V-1); a multi-hot field (or a weighted one-hot one) a ``VarLenSparseFeat``
of ``maxlen`` = its longest row in the store, ids re-indexed 1..V and 0 the padding (DeepCTR masks
id 0 of a var-len input), ``combiner="sum"`` and, for a weighted field, the store's per-id weights
as its ``weight_name`` input with ``weight_norm=False`` (DeepCTR's default softmax-normalizes
them): the pooled vector is des's ``Σ_t w_t e_t``, so a field pooled by ``mean`` (stored as
``w_t / n``) is the mean in both; every dense feature a ``DenseFeat(name, 1)`` fed the store's
values (DeepCTR adds it to the linear part and the DNN input, as des does). scikit-learn reads
the same columns (weighted ids, dense values).

DeepCTR does not work with Keras 3 and is NOT installed into the main venv: this script creates (once)
``.venv-deepctr`` next to ``.venv`` with ``tensorflow-cpu==2.21.*``, numpy/pandas/scikit-learn/numba,
``pip install --no-deps tf-keras==2.21.0 deepctr==0.9.4 h5py`` and ``pip install --no-deps -e .``
(for des's data reader), and runs the DeepCTR part in that interpreter as a subprocess with
``TF_USE_LEGACY_KERAS=1``. ``--skip-install`` uses the venv as it is.

Expect (a 2-core machine takes minutes per system; seeds 0,1,2): docs/quality.md's "Model quality"
table (its runs, with the earlier defaults', are in ``docs/benchmarks.md``, "Model quality"):
des's DeepFM at or above DeepCTR's and des's LR at or above scikit-learn's on the test split, the
gaps within the standard error of an AUC on the ~1.7k test rows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import benchlib

DEEPCTR_VENV = benchlib.REPO / ".venv-deepctr"
DEEPCTR_PYTHON = DEEPCTR_VENV / "bin" / "python"


# ------------------------------------------------------------------------------------ DeepCTR's inputs
@dataclass(frozen=True)
class InputFeature:
    """One of DeepCTR's feature columns as :func:`deepctr_inputs` builds it from a store."""

    kind: str  # "sparse" (SparseFeat), "varlen" (VarLenSparseFeat) or "dense" (DenseFeat)
    name: str  # its Keras input's name (the key of its array in the inputs)
    source: str  # the store's field or dense feature it reads
    vocabulary_size: int = 0  # sparse: V, ids 0..V-1; varlen: V + 1, ids 1..V and 0 the padding
    maxlen: int = 0  # varlen: the field's longest row in the store (at least 1)
    weight_name: str | None = None  # varlen of a weighted field: the input of its per-id weights


def input_name(text: str) -> str:
    """A Keras input name (characters other than letters, digits and ``_ . -`` become ``_``). The
    names :func:`deepctr_inputs` gives start ``f<field number>_`` or ``d<dense column>_``, so they
    never collide; Criteo's are ``f0_I1`` ... ``f38_C26`` as they were."""
    return re.sub(r"[^0-9A-Za-z_.-]", "_", text)


def deepctr_inputs(store) -> tuple[list[InputFeature], dict]:
    """DeepCTR's feature columns for a column store and their arrays over ALL its rows (index them
    by rows, e.g. ``inputs[name][order]``), in field order, then the dense features:

    * a one-hot field without weights -> ``sparse``: ``inputs[name]`` int32 [N], its keys
      re-indexed 0..V-1 (sorted keys);
    * a multi-hot field, or a weighted one-hot one -> ``varlen``: ``inputs[name]`` int32 [N, maxlen],
      row r's ids re-indexed 1..V in the store's order, then 0s (DeepCTR masks id 0); a weighted
      field also ``inputs[weight_name]`` float32 [N, maxlen, 1], the store's weights of those ids
      and 0 at the padding. ``Σ_t weights[r, t] · E[ids[r, t]]`` (an unweighted field: over its
      non-zero ids) is des's pooled ``Σ_t w_t e_t`` of row r (``des.hashtable.pooling.pool``);
    * dense feature j -> ``dense``: ``inputs[name]`` float32 [N, 1], the store's column j.

    Plain numpy: DeepCTR is not imported."""
    import numpy as np

    features: list[InputFeature] = []
    inputs: dict[str, np.ndarray] = {}
    num_rows = store.num_rows
    for f, field in enumerate(store.field_names):
        name = input_name(f"f{f}_{field}")
        offsets, keys, weights = store.field(f)
        uniques, index = np.unique(np.asarray(keys), return_inverse=True)  # des key -> 0..V-1 per field
        if store.is_one_hot(f) and weights is None:
            features.append(InputFeature("sparse", name, field, int(uniques.size)))
            inputs[name] = index.astype(np.int32)
            continue
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        maxlen = max(1, int(lengths.max(initial=0)))
        rows = np.repeat(np.arange(num_rows, dtype=np.int64), lengths)  # each id's row and slot in it
        slots = np.arange(index.size, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        ids = np.zeros((num_rows, maxlen), dtype=np.int32)
        ids[rows, slots] = index + 1
        inputs[name] = ids
        weight_name = None
        if weights is not None:
            weight_name = input_name(f"f{f}_{field}_weight")
            values = np.zeros((num_rows, maxlen, 1), dtype=np.float32)
            values[rows, slots, 0] = np.asarray(weights)
            inputs[weight_name] = values
        features.append(InputFeature("varlen", name, field, int(uniques.size) + 1, maxlen, weight_name))
    if store.num_dense:
        dense = store.take_dense(np.arange(num_rows))
        for j, feature in enumerate(store.dense_names):
            name = input_name(f"d{j}_{feature}")
            features.append(InputFeature("dense", name, feature))
            inputs[name] = np.ascontiguousarray(dense[:, j:j + 1], dtype=np.float32)
    return features, inputs


# ------------------------------------------------------------------------------------ child (.venv-deepctr)
DEFAULT_INIT_STD, DEFAULT_L2 = 1e-4, 1e-5  # DeepCTR's own defaults (embedding init std; l2 on the tables)


#: des model -> DeepCTR's model of the same network: DeepFM, and DCN with the full-rank cross layers of
#: DCN-v2 (``cross_parameterization="matrix"``; parallel with the DNN, a linear logit, as des's dcnv2)
DEEPCTR_MODELS = {"deepfm": "DeepFM", "dcnv2": "DCN (cross_parameterization='matrix')",
                  "din": "DIN (PReLU in its DNN and attention unit)"}
DCN_CROSS_LAYERS = 3  # des's dcnv2 default


def _deepctr_model(name: str, columns: list, hidden: Sequence[int], l2: float, seed: int):
    """DeepCTR's model for des model ``name`` (:data:`DEEPCTR_MODELS`), its defaults otherwise. DIN:
    des's ``din`` network (PReLU, a learned slope per unit, in the DNN and in the attention unit
    80-40, for Dice; scores not normalized, DeepCTR's default), ``columns`` from :func:`feature_columns`."""
    import tensorflow as tf
    from deepctr.models import DCN, DIN, DeepFM

    if name == "din":
        return DIN(columns, ["item_id"], dnn_hidden_units=tuple(hidden), dnn_activation=tf.keras.layers.PReLU,
                   att_hidden_size=(80, 40), att_activation=tf.keras.layers.PReLU, l2_reg_embedding=l2, seed=seed)

    common = dict(dnn_hidden_units=tuple(hidden), l2_reg_linear=l2, l2_reg_embedding=l2, l2_reg_dnn=0.0,
                  dnn_dropout=0.0, dnn_activation="relu", seed=seed, task="binary")
    if name == "dcnv2":
        return DCN(columns, columns, cross_num=DCN_CROSS_LAYERS, cross_parameterization="matrix", **common)
    return DeepFM(columns, columns, **common)


def _compiled_model(store_path: str, seed: int, hidden: Sequence[int], dim: int, init_std: float, l2: float,
                    model_name: str = "deepfm"):
    """DeepCTR's model of des's ``model_name`` (:data:`DEEPCTR_MODELS`: DeepFM, DCN) over the store's
    fields and dense features (:func:`deepctr_inputs`), compiled with Adam (lr 0.001), in this
    process (.venv-deepctr, TF_USE_LEGACY_KERAS=1). Returns ``(store, inputs, labels, model,
    timer)``: ``inputs`` maps every Keras input's name to its array over all rows; ``timer`` is a
    Keras callback recording the end time of every training batch of a ``fit`` (``timer.ends``;
    ``timer.steady(warmup)``)."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import des  # noqa: F401  (TensorFlow's log level and oneDNN exactly as des sets them for itself)
    import numpy as np
    import tensorflow as tf

    from des import runtime

    runtime.keep_freed_memory()  # the heap as des sets it for itself

    tf.config.threading.set_intra_op_parallelism_threads(os.cpu_count() or 1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from des.data import ColumnStore

    store = ColumnStore.open(store_path)
    labels = np.asarray(store.labels).astype(np.float32)

    tf.keras.utils.set_random_seed(seed)
    columns, inputs = feature_columns(store, model_name, dim, tf.keras.initializers.RandomNormal(stddev=init_std, seed=seed))
    model = _deepctr_model(model_name, columns, hidden, l2, seed)
    model.compile(tf.keras.optimizers.Adam(learning_rate=0.001), "binary_crossentropy")

    class StepTimer(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.begin, self.ends = 0.0, []

        def on_train_begin(self, logs=None):
            self.begin, self.ends = time.perf_counter(), []

        def on_train_batch_end(self, batch_index, logs=None):
            self.ends.append(time.perf_counter())

        def steady(self, warmup: int) -> tuple[int, float]:
            """(steps, seconds) of this ``fit``'s steps after its first ``warmup`` (tracing)."""
            if len(self.ends) <= warmup:
                return 0, 0.0
            return len(self.ends) - warmup, self.ends[-1] - ([self.begin] + self.ends)[warmup]

    return store, inputs, labels, model, StepTimer()


def feature_columns(store, model_name: str, dim: int, init) -> tuple[list, dict]:
    """DeepCTR's feature columns of a store for ``model_name`` and their arrays over all its rows, by
    input name (in .venv-deepctr): :func:`deepctr_inputs`' columns, or for DIN bench_din's (the
    candidate ``item_id`` and its ``history@1..L`` as ``hist_item_id``, sharing its embedding)."""
    from deepctr.feature_column import DenseFeat, SparseFeat, VarLenSparseFeat

    if model_name == "din":
        import bench_din

        data = bench_din.din_inputs(str(store.path))
        columns = bench_din.din_columns(data, dim, init)
        return columns, {c.name: data[c.name] for c in columns}
    features, inputs = deepctr_inputs(store)
    columns = []
    for feature in features:
        if feature.kind == "dense":
            columns.append(DenseFeat(feature.name, 1))
            continue
        sparse = SparseFeat(feature.name, vocabulary_size=feature.vocabulary_size, embedding_dim=dim,
                            embeddings_initializer=init)
        # combiner "sum" over the unmasked ids (0 is masked), times the store's weights when given;
        # weight_norm=False: the weights as they are (DeepCTR's default softmax-normalizes them)
        columns.append(sparse if feature.kind == "sparse" else VarLenSparseFeat(
            sparse, maxlen=feature.maxlen, combiner="sum", weight_name=feature.weight_name, weight_norm=False))
    return columns, inputs


def _rows_of(inputs: dict, rows):
    """The model's input dict for ``rows`` (in that order)."""
    return {name: values[rows] for name, values in inputs.items()}


def batch_order(store, batch: int, seed: int, epoch: int, batches: int | None = None):
    """des's training rows in des's batch order from ``epoch`` on (the last partial batch of every
    epoch dropped): one epoch, or ``batches`` whole batches over as many epochs as they need."""
    import numpy as np

    from des.data import BatchReader

    parts, count = [], 0
    while True:
        reader = BatchReader(store, "train", batch_size=batch, seed=seed, epoch=epoch)
        take = len(reader) if batches is None else min(len(reader), batches - count)
        parts.append(reader.row_order[: take * batch])
        count, epoch = count + take, epoch + 1
        if batches is None or count >= batches or not len(reader):
            return np.concatenate(parts)


def deepctr_child(store_path: str, seed: int, epochs: int, batch: int, warmup: int, hidden: Sequence[int],
                  dim: int, init_std: float = 0.01, l2: float = 0.0, model_name: str = "deepfm") -> dict:
    """Train DeepCTR's DeepFM (or ``model_name``'s model) in this process (.venv-deepctr,
    TF_USE_LEGACY_KERAS=1); returns metrics."""
    store, inputs, labels, model, timer = _compiled_model(store_path, seed, hidden, dim, init_std, l2, model_name)
    import numpy as np
    import tensorflow as tf
    from sklearn.metrics import log_loss, roc_auc_score

    def metrics(split: str) -> tuple[float, float]:
        rows = store.split_rows(split)
        p = model.predict(_rows_of(inputs, rows), batch_size=8192, verbose=0).reshape(-1)
        y = labels[rows]
        return float(roc_auc_score(y, p)), float(log_loss(y, np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)))

    best: dict = {}  # the epoch with the best validation AUC (DeepCTR has no early stopping of its own)
    steady_samples, steady_seconds, total_seconds, steps = 0, 0.0, 0.0, 0
    for epoch in range(epochs):
        order = batch_order(store, batch, seed, epoch)
        x = _rows_of(inputs, order)
        start = time.perf_counter()
        model.fit(x, labels[order], batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
        total_seconds += time.perf_counter() - start
        steps += len(timer.ends)
        timed_steps, seconds = timer.steady(warmup)  # steps after the warm-up ones (tracing) of this epoch
        steady_samples, steady_seconds = steady_samples + timed_steps * batch, steady_seconds + seconds
        val_auc, val_ll = metrics("validation")
        if not best or val_auc > best["validation_auc"]:
            test_auc, test_ll = metrics("test")
            best = {"validation_auc": val_auc, "validation_logloss": val_ll, "test_auc": test_auc,
                    "test_logloss": test_ll, "best_epoch": epoch + 1}
    return {**best, "steps": steps, "samples_per_second": steady_samples / steady_seconds if steady_seconds else None,
            "samples_per_second_incl_warmup": steps * batch / total_seconds, "params": int(model.count_params()),
            "tensorflow": tf.__version__}


def deepctr_throughput_child(store_path: str, seed: int, batch: int, warmup: int, steps: int, hidden: Sequence[int],
                             dim: int, init_std: float = DEFAULT_INIT_STD, l2: float = DEFAULT_L2,
                             model_name: str = "deepfm") -> dict:
    """Throughput only: one ``model.fit`` over ``warmup + steps`` batches in des's batch order (as
    many epochs of the training split as that takes), no validation; samples/s of the last ``steps``."""
    store, inputs, labels, model, timer = _compiled_model(store_path, seed, hidden, dim, init_std, l2, model_name)
    import tensorflow as tf

    order = batch_order(store, batch, seed, 0, warmup + steps)
    model.fit(_rows_of(inputs, order), labels[order], batch_size=batch, epochs=1, shuffle=False,
              verbose=0, callbacks=[timer])
    timed_steps, seconds = timer.steady(warmup)
    return {"batch": batch, "steps": len(timer.ends), "measured_steps": timed_steps,
            "samples_per_second": timed_steps * batch / seconds if seconds else None,
            "ms_per_step": 1000 * seconds / timed_steps if timed_steps else None,
            "params": int(model.count_params()), "tensorflow": tf.__version__}


# ------------------------------------------------------------------------------------ parent
INSTALL_STEPS = [
    ["-m", "pip", "install", "--quiet", "--upgrade", "pip"],
    ["-m", "pip", "install", "--quiet", "tensorflow-cpu==2.21.*", "numpy>=2.0.2,<2.6", "numba>=0.61,<0.69",
     "pandas", "scikit-learn"],
    ["-m", "pip", "install", "--quiet", "--no-deps", "tf-keras==2.21.0", "deepctr==0.9.4", "h5py"],
    ["-m", "pip", "install", "--quiet", "--no-deps", "-e", str(benchlib.REPO)],
]


def ensure_venv(bench: benchlib.Bench, skip: bool) -> None:
    benchlib.ensure_venv(bench, DEEPCTR_VENV, INSTALL_STEPS,
                         "import os; os.environ['TF_USE_LEGACY_KERAS']='1'; import tensorflow as tf, tf_keras, deepctr; "
                         "print('PROBE', tf.__version__, tf.keras.__name__, deepctr.__version__)", skip)


def open_store(data: str | os.PathLike = benchlib.SAMPLE):
    """The column store des.train trains on (split 90/5/5, split seed 0); DeepCTR reads the same."""
    from des.data import open_dataset

    return open_dataset(data, split=[0.9, 0.05, 0.05], seed=0)


DEEPCTR_COLUMNS_NOTE = ("one-hot fields as SparseFeat, multi-hot (and weighted one-hot) fields as VarLenSparseFeat "
                        "(ids 1..V, 0 the masked padding, maxlen the longest row, combiner sum, the store's weights "
                        "with weight_norm off: des's pooling), dense features as DenseFeat(name, 1).")


def store_note(store) -> str:
    """What a (non-sample) store holds, for the table's notes: rows per split, fields by kind (a
    multi-hot field with its longest row), dense features."""
    import numpy as np

    split = "/".join(f"{len(store.split_rows(name)):,}" for name in ("train", "validation", "test"))
    multi, weighted_one_hot = [], []
    for f, field in enumerate(store.field_names):
        offsets, _, weights = store.field(f)
        if not store.is_one_hot(f):
            longest = int(np.diff(np.asarray(offsets)).max(initial=0))
            multi.append(f"{field} (up to {longest}{', weighted' if weights is not None else ''})")
        elif weights is not None:
            weighted_one_hot.append(field)
    parts = [f"{store.num_fields - len(multi)} one-hot fields"
             + (f" ({len(weighted_one_hot)} weighted: {', '.join(weighted_one_hot)})" if weighted_one_hot else "")]
    if multi:
        parts.append(f"{len(multi)} multi-hot: {', '.join(multi)}")
    parts.append(f"{store.num_dense} dense features")
    return (f"Store {store.display_name}: {store.num_rows:,} rows, its own split ({split} train/validation/test), "
            + ", ".join(parts))


def run_deepctr(bench: benchlib.Bench, store_path: str, *, label: str, seed: int, batch: int, warmup: int,
                hidden: Sequence[int], dim: int, init_std: float = DEFAULT_INIT_STD, l2: float = DEFAULT_L2,
                epochs: int = 1, throughput_steps: int = 0, model: str = "deepfm") -> dict:
    """Run this script's child in .venv-deepctr (:func:`ensure_venv` first): the quality run
    (:func:`deepctr_child`, ``epochs``) or, with ``throughput_steps``, :func:`deepctr_throughput_child`.
    Returns the child's result; raises :class:`benchlib.BenchError` (or ValueError on bad output)."""
    cmd = [str(DEEPCTR_PYTHON), __file__, "--child", str(store_path), "--seed", str(seed), "--epochs", str(epochs),
           "--batch-size", str(batch), "--warmup", str(warmup), "--hidden", ",".join(map(str, hidden)),
           "--embedding-dim", str(dim), "--init-std", str(init_std), "--l2", str(l2),
           "--throughput-steps", str(throughput_steps), "--deepctr-model", model]
    out = bench.run_command(cmd, label=label, env={"TF_USE_LEGACY_KERAS": "1"}).stdout
    lines = [line for line in out.splitlines() if line.startswith("DEEPCTR ")]
    if not lines:
        raise benchlib.BenchError(f"{label}: no DEEPCTR line in the output")
    return json.loads(lines[-1][len("DEEPCTR "):])


def lr_matrix(store):
    """scikit-learn's inputs over all rows: a CSR matrix of every field's ids (keys re-indexed per
    field, fields side by side; the store's weights, else 1; an id twice in a row adds up) and then
    the dense features' values, and the 0/1 labels. For Criteo: one 1 per field and row."""
    import numpy as np
    from scipy import sparse

    rows, columns, values, width = [], [], [], 0
    for f in range(store.num_fields):
        offsets, keys, weights = store.field(f)
        _, index = np.unique(np.asarray(keys), return_inverse=True)
        rows.append(np.repeat(np.arange(store.num_rows), np.diff(np.asarray(offsets))))
        columns.append(index + width)
        values.append(np.ones(index.size) if weights is None else np.asarray(weights, dtype=np.float64))
        width += int(index.max(initial=-1)) + 1
    if store.num_dense:
        rows.append(np.repeat(np.arange(store.num_rows), store.num_dense))
        columns.append(np.tile(np.arange(width, width + store.num_dense), store.num_rows))
        values.append(store.take_dense(np.arange(store.num_rows)).astype(np.float64).reshape(-1))
        width += store.num_dense
    row = np.concatenate(rows)
    order = np.argsort(row, kind="stable")  # row by row, each row's entries in field order
    indptr = np.zeros(store.num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=store.num_rows), out=indptr[1:])
    x = sparse.csr_matrix((np.concatenate(values)[order], np.concatenate(columns)[order], indptr),
                          shape=(store.num_rows, width))
    x.sum_duplicates()
    return x, np.asarray(store.labels).astype(np.int64)


def sklearn_lr(store, cs: Sequence[float]) -> dict:
    """scikit-learn ``LogisticRegression`` on :func:`lr_matrix` (one-hot ids, the weights of
    weighted ids, dense values), C chosen by 3-fold cross-validation (ROC AUC) on the training rows
    only; test and validation metrics."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.metrics import log_loss, roc_auc_score

    x, y = lr_matrix(store)
    train = store.split_rows("train")
    model = LogisticRegressionCV(Cs=list(cs), cv=3, scoring="roc_auc", solver="liblinear", max_iter=1000)
    model.fit(x[train], y[train])
    out = {"C": float(model.C_[0])}
    for split in ("validation", "test"):
        r = store.split_rows(split)
        p = model.predict_proba(x[r])[:, 1]
        out[f"{split}_auc"], out[f"{split}_logloss"] = float(roc_auc_score(y[r], p)), float(log_loss(y[r], p))
    return out


def des_flags(text: str) -> dict[str, str]:
    """``"--embedding-optimizer adam:lr=0.003 --epochs 3"`` -> keyword flags of :meth:`Bench.train`."""
    words = text.split()
    if len(words) % 2:
        raise SystemExit(f"--des-flags must be pairs of --flag value, got {text!r}")
    return {words[i].lstrip("-").replace("-", "_"): words[i + 1] for i in range(0, len(words), 2)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--models", default="lr,fm,wdl,deepfm", help="des models, each with its default command")
    parser.add_argument("--des-flags", default="", help="extra des.train flags for every des run (ablations)")
    parser.add_argument("--des-ranks", default="1")
    parser.add_argument("--systems", default="des,deepctr,sklearn", help="which of des, deepctr, sklearn to run")
    parser.add_argument("--epochs", type=int, default=3, help="DeepCTR epochs; the best on validation is reported")
    parser.add_argument("--batch-size", type=int, default=512, help="DeepCTR batch size")
    parser.add_argument("--init-std", type=float, default=DEFAULT_INIT_STD, help="DeepCTR embedding init std (its default)")
    parser.add_argument("--l2", type=float, default=DEFAULT_L2, help="DeepCTR l2 on embedding and linear tables (its default)")
    parser.add_argument("--warmup", type=int, default=3, help="steps per epoch not timed (tracing)")
    parser.add_argument("--hidden", default="400,400,400")
    parser.add_argument("--embedding-dim", type=int, default=8)
    parser.add_argument("--sklearn-cs", default="0.01,0.03,0.1,0.3,1", help="C values for the cross-validation")
    parser.add_argument("--data", default=str(benchlib.SAMPLE))
    parser.add_argument("--skip-install", action="store_true", help="use .venv-deepctr as it is")
    parser.add_argument("--child", metavar="STORE", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--throughput-steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--deepctr-model", default="deepfm", help=argparse.SUPPRESS)
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    hidden = [int(h) for h in args.hidden.split(",")]
    if args.child and args.throughput_steps:
        result = deepctr_throughput_child(args.child, args.seed, args.batch_size, args.warmup, args.throughput_steps,
                                          hidden, args.embedding_dim, args.init_std, args.l2, args.deepctr_model)
        print("DEEPCTR " + json.dumps(result), flush=True)
        return 0
    if args.child:
        result = deepctr_child(args.child, args.seed, args.epochs, args.batch_size, args.warmup, hidden,
                               args.embedding_dim, args.init_std, args.l2, args.deepctr_model)
        print("DEEPCTR " + json.dumps(result), flush=True)
        return 0
    if args.quick:
        args.seeds, args.models, args.epochs = "0", "lr,deepfm", 1
    seeds = [int(s) for s in args.seeds.split(",")]
    bench = benchlib.Bench(__file__, args)
    store = open_store(args.data)
    runs = []
    try:
        if "deepctr" in args.systems.split(","):
            ensure_venv(bench, args.skip_install)
        installed = True
    except benchlib.BenchError as exc:
        bench.failures.append(f"DeepCTR venv: {exc}")
        bench.log(f"FAILED DeepCTR venv: {exc}")
        installed = False
    systems = args.systems.split(",")
    if "lr" in args.models.split(",") and "sklearn" in systems:
        result = sklearn_lr(store, [float(c) for c in args.sklearn_cs.split(",")])
        runs.append({"system": f"scikit-learn LogisticRegression (C={result['C']:g} by 3-fold CV)", "model": "lr",
                     "ranks": 1, "seed": 0, **result})
        bench.log(f"  scikit-learn LR: C {result['C']:g}, test AUC {result['test_auc']:.4f}")
    extra = des_flags(args.des_flags)
    for seed in seeds:
        for model in [m for m in args.models.split(",") if m in DEEPCTR_MODELS] if installed and "deepctr" in systems \
                else ():
            try:
                result = run_deepctr(bench, str(store.path), label=f"deepctr {model} seed {seed}", seed=seed,
                                     batch=args.batch_size, warmup=args.warmup, hidden=hidden, dim=args.embedding_dim,
                                     init_std=args.init_std, l2=args.l2, epochs=args.epochs, model=model)
                runs.append({"system": f"DeepCTR 0.9.4 {DEEPCTR_MODELS[model]} (its defaults, best epoch on validation)",
                             "model": model, "ranks": 1, "seed": seed, **result})
                bench.log(f"  deepctr {model} seed {seed}: AUC {result['test_auc']:.4f} (epoch {result['best_epoch']})")
            except (benchlib.BenchError, ValueError) as exc:
                bench.failures.append(f"deepctr {model} seed {seed}: {exc}")
        for model in args.models.split(",") if "des" in systems else ():
            for n in [int(x) for x in args.des_ranks.split(",")]:
                tag = f"des-{model}-n{n}-s{seed}"
                s = bench.train(n, tag, model=model, seed=seed, data=args.data, **extra)
                if s is not None:
                    runs.append({"system": "des (default command)" + (f" {args.des_flags}" if extra else ""),
                                 "model": model, "ranks": n, "seed": seed,
                                 **{k: s[k] for k in ("test_auc", "test_logloss", "validation_auc", "validation_logloss",
                                                      "steps", "samples_per_second")}})
    rows = []
    for model, system, n in sorted({(r["model"], r["system"], r["ranks"]) for r in runs}, key=lambda k: (k[0], k[1])):
        sel = [r for r in runs if (r["model"], r["system"], r["ranks"]) == (model, system, n)]
        auc, ll, val = (benchlib.mean_std([r.get(k) for r in sel]) for k in ("test_auc", "test_logloss", "validation_auc"))
        rows.append({"model": model, "system": system, "ranks": n, "seeds": len(sel),
                     "auc": f"{auc[0]:.4f} ± {auc[1]:.4f}", "logloss": f"{ll[0]:.4f} ± {ll[1]:.4f}",
                     "val": f"{val[0]:.4f}", "test_auc": auc[0], "test_logloss": ll[0],
                     "steps": sel[0].get("steps"), "epoch": sel[0].get("best_epoch")})
    columns = [("model", "model", ""), ("system", "system", ""), ("ranks", "processes", "d"), ("seeds", "seeds", "d"),
               ("auc", "test AUC (mean ± std)", ""), ("logloss", "test logloss", ""), ("val", "validation AUC", ""),
               ("steps", "steps (seed 0)", "")]
    sample = Path(args.data).resolve() == benchlib.SAMPLE.resolve()
    notes = [
        (f"Shipped Criteo sample, split 90/5/5 (split seed 0), seeds {args.seeds}. des: `python -m des.train --model M "
         f"--seed S`" if sample else f"{store_note(store)}; seeds {args.seeds}. des: `python -m des.train --model M "
         f"--data {args.data} --seed S`")
        + f" (its defaults{', plus ' + args.des_flags if extra else ''}; early stopping on the validation split "
        "restores the best checkpoint, except for LR, which trains all 20 epochs).",
        f"DeepCTR 0.9.4 DeepFM (and for dcnv2 its DCN with {DCN_CROSS_LAYERS} full-rank cross layers, "
        "cross_parameterization='matrix', parallel with the MLP, l2 1e-5 on the cross kernels) with its defaults: "
        f"one Adam (lr 0.001) for everything, embeddings N(0, {args.init_std:g}), "
        f"l2 {args.l2:g} on the embedding and linear tables, batch {args.batch_size}, k={args.embedding_dim}, MLP "
        f"{args.hidden}, up to {args.epochs} epoch(s) in des's batch order, the epoch with the best validation AUC"
        + ("." if sample else "; " + DEEPCTR_COLUMNS_NOTE),
        "scikit-learn LogisticRegression (liblinear) on one-hot ids of the training rows, C by 3-fold CV (ROC AUC) "
        f"over {args.sklearn_cs}" + ("." if sample else " (weighted ids: their weights; dense features: their values)."),
    ]
    bench.finish(rows, [("des defaults vs DeepCTR / scikit-learn", columns, rows)], notes, None, extra={"runs": runs})
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
