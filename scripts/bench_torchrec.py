""".venv/bin/python scripts/bench_torchrec.py --data STORE [--quick] [--seeds 0,1,2] [--epochs 3] [--init des|torchrec] [--skip-install]

TorchRec's DLRM (``torchrec.models.dlrm.DLRM``, torchrec 1.8.0 on CPU) trained on des's train /
validation / test split of a prepared column store with dense features (e.g. one prepared with
``examples/criteo_dense.toml``: ``python -m des.train --model dlrm --schema
examples/criteo_dense.toml`` prepares it), to sit next to des's DLRM on the same rows. Test AUC and
logloss (scikit-learn's ``roc_auc_score`` / ``log_loss``) of the epoch with the best validation AUC,
its epoch and the training throughput, per seed and mean ± std over the seeds (sample std, as
``bench_deepctr.py``'s).

The network and optimizer are des's DLRM defaults: an unsharded ``EmbeddingBagCollection`` (one
table per field, sum pooling, ``--embedding-dim`` 8), the bottom MLP ``--bottom`` 512,256 then the
embedding dim, TorchRec's pairwise-dot interaction, the top MLP ``--hidden`` 400,400,400 then the
logit, ``BCEWithLogitsLoss``; ``torch.optim.Adam`` lr ``--dense-lr`` 0.001 on the MLPs and
``--embedding-lr`` 0.003 on the tables (dense gradients: des's ``catchup=1``); batch 256, the last
partial batch dropped; up to ``--epochs`` 3 epochs. Embeddings N(0, ``--init-std`` 1e-4) (des's
``--init-scale``; ``--init torchrec``: EmbeddingBagConfig's default uniform(±sqrt(1/V))). The notes
of the printed table list every difference from des's DLRM.

The parent (this script in des's ``.venv``) reads the store with des's reader, exactly as
``bench_deepctr.deepctr_inputs`` gives DeepCTR its inputs (each field's keys re-indexed 0..V-1
over all rows, the store's dense values), and writes the arrays as ``data.npz`` into the run folder
(plain arrays, no pickle); then, one process per seed, it runs this file with ``--child`` in
``.venv-torchrec``, which reads only that file and prints one ``TORCHREC {json}`` line. The child
imports numpy, torch, torchrec and scikit-learn, never des: des is not installed there.

TorchRec is NOT installed into the main venv: this script creates (once) ``.venv-torchrec`` next to
``.venv`` with ``pip install "torch==2.13.0+cpu" fbgemm-gpu-cpu==1.8.0 numpy scikit-learn``, then
``pip install --no-deps torchrec==1.8.0``, then ``pip install tensordict torchmetrics==1.0.3 tqdm
pyre-extensions "torch==2.13.0+cpu"`` (torchrec's own dependencies, torch pinned so that none of
them moves it). Why these versions: download.pytorch.org is unreachable here, so torch is the
local CPU wheel 2.13.0+cpu that pip's configured find-links offer (pip's constraints cap torch
there too); fbgemm-gpu-cpu 1.8 is the FBGEMM release built against torch 2.13 (TorchRec's kernels
need the matching pair), and torchrec 1.8.0 the release of that pairing; torchrec's declared
dependency ``fbgemm-gpu`` is the CUDA package, hence ``--no-deps`` and the CPU build beside it.
``--skip-install`` uses the venv as it is.

Expect (a 2-core machine: under a minute for seeds 0,1,2 and 3 epochs, about 15 s a seed; the
32,852 Criteo rows prepared with ``examples/criteo_dense.toml``): TorchRec's
DLRM at test AUC 0.759 ± 0.005 (logloss 0.481 ± 0.008), its best epoch the first (it overfits
after), next to des's DLRM at 0.7622 ± 0.0059 on the same rows (``docs/benchmarks.md``,
"bench_deepctr, 2026-11-28: DLRM with its chosen default"): equal within the seeds' spread; about
11,000 samples/s on one torch thread.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# benchlib and bench_deepctr import des: only the parent's functions import them (the child runs in
# .venv-torchrec, where des is not installed)
TORCHREC_VENV = Path(__file__).resolve().parent.parent / ".venv-torchrec"  # benchlib.REPO / ".venv-torchrec"
TORCHREC_PYTHON = TORCHREC_VENV / "bin" / "python"
RESULT_PREFIX = "TORCHREC "
TORCH = "torch==2.13.0+cpu"
INSTALL_STEPS = [
    ["-m", "pip", "install", "--quiet", TORCH, "fbgemm-gpu-cpu==1.8.0", "numpy", "scikit-learn"],
    ["-m", "pip", "install", "--quiet", "--no-deps", "torchrec==1.8.0"],
    ["-m", "pip", "install", "--quiet", "tensordict", "torchmetrics==1.0.3", "tqdm", "pyre-extensions", TORCH],
]


def widths(text: str) -> list[int]:
    """``"512,256"`` -> ``[512, 256]`` (empty: none)."""
    return [int(w) for w in text.split(",") if w.strip()]


# ------------------------------------------------------------------------------------ the arrays (des venv)
def export_arrays(store, need_dense: bool = True) -> dict:
    """The child's input: numpy arrays over ALL rows of a column store of one-hot fields (without
    weights) and dense features, from :func:`bench_deepctr.deepctr_inputs` (each field's keys
    re-indexed 0..V-1 over all rows, sorted keys; the store's dense values): ``sparse_ids`` int32
    [N, F], ``vocab_sizes`` [F], ``keys`` (the features' names, ``f<i>_<field>``), ``dense``
    float32 [N, D], ``labels`` float32 [N], and the rows of ``train`` / ``validation`` / ``test``.
    Raises ValueError for a store TorchRec's DLRM is not given here (multi-hot or weighted fields,
    no dense features unless ``need_dense`` is false: then ``dense`` may be [N, 0])."""
    import numpy as np

    import bench_deepctr

    features, inputs = bench_deepctr.deepctr_inputs(store)
    sparse = [f for f in features if f.kind == "sparse"]
    dense = [f for f in features if f.kind == "dense"]
    if len(sparse) + len(dense) != len(features):
        other = ", ".join(f.source for f in features if f.kind not in ("sparse", "dense"))
        raise ValueError(f"only one-hot fields without weights are supported here, not: {other}")
    if not dense and need_dense:
        raise ValueError("TorchRec's DLRM needs dense features (prepare the data with e.g. examples/criteo_dense.toml)")
    return {
        "sparse_ids": np.stack([inputs[f.name] for f in sparse], axis=1).astype(np.int32),
        "vocab_sizes": np.array([f.vocabulary_size for f in sparse], dtype=np.int64),
        "keys": np.array([f.name for f in sparse], dtype=np.str_),
        "dense": np.concatenate([inputs[f.name] for f in dense], axis=1).astype(np.float32) if dense
        else np.zeros((store.num_rows, 0), np.float32),
        "labels": np.asarray(store.labels).astype(np.float32),
        **{split: np.asarray(store.split_rows(split), dtype=np.int64) for split in ("train", "validation", "test")},
    }


# ------------------------------------------------------------------------------------ the child (.venv-torchrec)
def network_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags the parent passes on to the child (:func:`child_argv`)."""
    parser.add_argument("--embedding-dim", type=int, default=8, help="embedding size k (des's default)")
    parser.add_argument("--bottom", default="512,256", help="bottom MLP widths before its last layer of k units")
    parser.add_argument("--hidden", default="400,400,400", help="top MLP widths before the logit")
    parser.add_argument("--batch-size", type=int, default=256, help="training batch (des's DLRM default)")
    parser.add_argument("--eval-batch-size", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=3, help="epochs; the best on validation AUC is reported")
    parser.add_argument("--dense-lr", type=float, default=0.001, help="Adam lr of the MLPs (des's default)")
    parser.add_argument("--embedding-lr", type=float, default=0.003, help="Adam lr of the tables (des's DLRM default)")
    parser.add_argument("--init", choices=("des", "torchrec"), default="des",
                        help="embedding init: des's N(0, --init-std) or EmbeddingBagConfig's uniform(+-sqrt(1/V))")
    parser.add_argument("--init-std", type=float, default=1e-4, help="with --init des (des's --init-scale)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the child")


NETWORK_FLAGS = ("embedding_dim", "bottom", "hidden", "batch_size", "eval_batch_size", "epochs", "dense_lr",
                 "embedding_lr", "init", "init_std", "threads")


def child_argv(data: str | Path, seed: int, args: argparse.Namespace) -> list[str]:
    """The child's command line after the interpreter: this file, ``--child DATA --seed S`` and
    :func:`network_arguments`' flags as ``args`` has them."""
    argv = [str(Path(__file__).resolve()), "--child", str(data), "--seed", str(seed)]
    for name in NETWORK_FLAGS:
        argv += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return argv


def train_child(data: str, seed: int, args: argparse.Namespace) -> dict:
    """Train TorchRec's DLRM on ``data`` (:func:`export_arrays`' .npz) for one seed in this process
    (.venv-torchrec); returns the best epoch's metrics, every epoch's, the throughput and versions."""
    import fbgemm_gpu
    import numpy as np
    import torch
    import torchrec
    from sklearn.metrics import log_loss, roc_auc_score
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
    from torchrec.models.dlrm import DLRM

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    arrays = np.load(data, allow_pickle=False)
    keys = arrays["keys"].tolist()
    ids = torch.from_numpy(arrays["sparse_ids"].astype(np.int64))
    dense = torch.from_numpy(arrays["dense"])
    labels_np = arrays["labels"]
    labels = torch.from_numpy(labels_np)
    splits = {s: arrays[s] for s in ("train", "validation", "test")}

    def batch(rows: np.ndarray):
        r = torch.from_numpy(rows)
        # key-major values: all rows of the first field, then the second, ...; one id per row and field
        kjt = KeyedJaggedTensor(keys=keys, values=ids[r].t().reshape(-1),
                                lengths=torch.ones(len(keys) * rows.size, dtype=torch.int32))
        return dense[r], kjt, labels[r]

    def evaluate(split: str) -> tuple[float, float]:
        rows, out = splits[split], []
        model.eval()
        with torch.no_grad():
            for i in range(0, rows.size, args.eval_batch_size):
                x, kjt, _ = batch(rows[i:i + args.eval_batch_size])
                out.append(torch.sigmoid(model(x, kjt)).squeeze(1).double().numpy())
        model.train()
        p, y = np.concatenate(out), labels_np[rows]
        return float(roc_auc_score(y, p)), float(log_loss(y, p, labels=[0, 1]))

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    # des's N(0, std), or None: EmbeddingBagConfig's default uniform(-sqrt(1/V), sqrt(1/V))
    init_fn = functools.partial(torch.nn.init.normal_, mean=0.0, std=args.init_std) if args.init == "des" else None
    tables = [EmbeddingBagConfig(name=f"t_{k}", embedding_dim=args.embedding_dim, num_embeddings=int(v),
                                 feature_names=[k], pooling=PoolingType.SUM, init_fn=init_fn)
              for k, v in zip(keys, arrays["vocab_sizes"])]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=dense.shape[1],
                 dense_arch_layer_sizes=[*widths(args.bottom), args.embedding_dim],
                 over_arch_layer_sizes=[*widths(args.hidden), 1])
    tables_params = list(ebc.parameters())
    in_tables = {id(p) for p in tables_params}
    optimizer = torch.optim.Adam([{"params": [p for p in model.parameters() if id(p) not in in_tables],
                                   "lr": args.dense_lr},
                                  {"params": tables_params, "lr": args.embedding_lr}])
    loss_fn = torch.nn.BCEWithLogitsLoss()
    train_rows = splits["train"]
    steps = train_rows.size // args.batch_size  # the last partial batch dropped
    epochs, seconds = [], 0.0
    for epoch in range(1, args.epochs + 1):
        order = train_rows[rng.permutation(train_rows.size)]
        begin, total = time.perf_counter(), 0.0
        for s in range(steps):
            x, kjt, y = batch(order[s * args.batch_size:(s + 1) * args.batch_size])
            loss = loss_fn(model(x, kjt).squeeze(1), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        took = time.perf_counter() - begin
        seconds += took
        (val_auc, val_ll), (test_auc, test_ll) = evaluate("validation"), evaluate("test")
        epochs.append({"epoch": epoch, "train_loss": total / max(steps, 1), "validation_auc": val_auc,
                       "validation_logloss": val_ll, "test_auc": test_auc, "test_logloss": test_ll,
                       "samples_per_second": steps * args.batch_size / took})
        print(f"seed {seed} epoch {epoch}: train loss {epochs[-1]['train_loss']:.4f}, validation AUC {val_auc:.4f}, "
              f"test AUC {test_auc:.4f} logloss {test_ll:.4f}, {epochs[-1]['samples_per_second']:,.0f} samples/s",
              flush=True)
    best = max(epochs, key=lambda e: e["validation_auc"])
    return {"seed": seed, "best_epoch": best["epoch"],
            **{k: best[k] for k in ("test_auc", "test_logloss", "validation_auc", "validation_logloss")},
            "steps": steps * args.epochs, "samples_per_second": steps * args.batch_size * args.epochs / seconds,
            "params": sum(p.numel() for p in model.parameters()), "epochs": epochs,
            "versions": {"torch": torch.__version__, "torchrec": getattr(torchrec, "__version__", "?"),
                         "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "?")}}


# ------------------------------------------------------------------------------------ parent (des venv)
def ensure_venv(bench, skip: bool) -> None:
    """``.venv-torchrec`` with :data:`INSTALL_STEPS` (:func:`benchlib.ensure_venv`), probed by importing
    torch, fbgemm_gpu, torchrec and scikit-learn."""
    import benchlib

    benchlib.ensure_venv(bench, TORCHREC_VENV, INSTALL_STEPS, "import torch, fbgemm_gpu, torchrec, sklearn; print("
                         "'PROBE torch', torch.__version__, 'fbgemm_gpu', fbgemm_gpu.__version__)", skip)


def run_child(bench, data: Path, seed: int, args: argparse.Namespace) -> dict:
    """One seed in .venv-torchrec (:func:`train_child`); its result, or raises BenchError / ValueError."""
    import benchlib

    out = bench.run_command([str(TORCHREC_PYTHON), *child_argv(data, seed, args)], label=f"torchrec seed {seed}").stdout
    lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        raise benchlib.BenchError(f"torchrec seed {seed}: no {RESULT_PREFIX.strip()} line in the output")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def table_rows(runs: Sequence[Mapping]) -> list[dict]:
    """A row per seed, then ``mean ± std`` over them (sample std, :func:`benchlib.mean_std`)."""
    import benchlib

    rows = [{"seed": str(r["seed"]), "best_epoch": str(r["best_epoch"]), "auc": f"{r['test_auc']:.4f}",
             "logloss": f"{r['test_logloss']:.4f}", "val": f"{r['validation_auc']:.4f}",
             "samples_per_second": r["samples_per_second"]} for r in runs]
    if runs:
        stats = {k: benchlib.mean_std([r[k] for r in runs])
                 for k in ("test_auc", "test_logloss", "validation_auc", "samples_per_second")}
        rows.append({"seed": f"mean ± std ({len(runs)})", "best_epoch": ",".join(str(r["best_epoch"]) for r in runs),
                     "auc": "{:.4f} ± {:.4f}".format(*stats["test_auc"]),
                     "logloss": "{:.4f} ± {:.4f}".format(*stats["test_logloss"]),
                     "val": "{:.4f}".format(stats["validation_auc"][0]),
                     "samples_per_second": stats["samples_per_second"][0]})
    return rows


COLUMNS = [("seed", "seed", ""), ("best_epoch", "best epoch", ""), ("auc", "test AUC", ""),
           ("logloss", "test logloss", ""), ("val", "validation AUC", ""),
           ("samples_per_second", "samples/s (training)", ",.0f")]


def notes(args: argparse.Namespace, store_note: str, versions: Mapping[str, str]) -> list[str]:
    """What was run, and every way it differs from des's DLRM (its default command)."""
    init = (f"N(0, {args.init_std:g}) as des's --init-scale" if args.init == "des"
            else "EmbeddingBagConfig's default uniform(±sqrt(1/V)) (des: N(0, 1e-4))")
    version = ", ".join(f"{k} {v}" for k, v in versions.items()) or "versions unknown (no seed finished)"
    return [
        f"{store_note}; seeds {args.seeds}. des's DLRM on the same rows: `.venv/bin/python scripts/bench_deepctr.py "
        f"--data {args.data} --models dlrm --systems des`.",
        f"TorchRec's `torchrec.models.dlrm.DLRM` ({version}; CPU, `.venv-torchrec`): k={args.embedding_dim}, bottom "
        f"MLP {args.bottom} then {args.embedding_dim}, top MLP {args.hidden} then 1, BCEWithLogitsLoss; Adam lr "
        f"{args.dense_lr:g} on the MLPs and {args.embedding_lr:g} on the tables, batch {args.batch_size}, the last "
        f"partial batch dropped, up to {args.epochs} epoch(s), the epoch with the best validation AUC; "
        f"{args.threads} torch thread(s): the samples/s are indicative only, not comparable to des's (cores // ranks "
        "threads).",
        "Differences from des's DLRM: (1) the tables: an unsharded EmbeddingBagCollection, one table per field, "
        "whose dense gradients make Adam update every row's moments every step (the same semantics as des's "
        "default adam:lr=0.003,catchup=1); (2) the MLPs keep PyTorch's default init (kaiming-uniform a=√5 weights, "
        "uniform(±1/√fan_in) biases), des's are glorot-uniform with zero biases; embeddings "
        f"{init}; (3) no admission: every id has a row of its own, where des's default (--min-count 2 --unadmitted "
        "shared) shares one trained row per field among ids seen fewer than 2 times; (4) the vocabulary: each "
        "field's keys re-indexed 0..V-1 over all rows of the store (validation and test ids get rows that never "
        "train), des hashes keys into tables that grow; (5) the schedule: up to --epochs epochs, the best "
        "validation AUC's test metrics, where des trains up to 20 epochs with early stopping (patience 2) and "
        "restores the best checkpoint; batches in numpy's default_rng(seed) order and torch.manual_seed(seed) "
        "init, not des's batch order or random streams (a seed pairs with des's by number only).",
        f"Install: torch {TORCH.split('==')[1]} is the local CPU wheel (download.pytorch.org unreachable; pip's "
        "constraints cap torch), fbgemm-gpu-cpu 1.8.0 the FBGEMM build for torch 2.13, torchrec 1.8.0 with --no-deps "
        "(its declared dependency fbgemm-gpu is the CUDA package). Inputs: the store read by des's reader as "
        "bench_deepctr.deepctr_inputs, written as the run folder's data.npz (no pickle).",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:  # .venv-torchrec: no des, no benchlib
        parser = argparse.ArgumentParser(description="bench_torchrec.py's child: one seed")
        parser.add_argument("--child", required=True, metavar="NPZ")
        parser.add_argument("--seed", type=int, required=True)
        network_arguments(parser)
        args = parser.parse_args(argv)
        print(RESULT_PREFIX + json.dumps(train_child(args.child, args.seed, args)), flush=True)
        return 0
    import numpy as np

    import bench_deepctr
    import benchlib
    from des.data import ColumnStore

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a prepared column store with dense features")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--skip-install", action="store_true", help="use .venv-torchrec as it is")
    network_arguments(parser)
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs = "0", 1
    bench = benchlib.Bench(__file__, args)
    store = ColumnStore.open(args.data)
    data = bench.folder / "data.npz"
    try:
        arrays = export_arrays(store)
    except ValueError as exc:
        raise SystemExit(f"{args.data}: {exc}") from None
    np.savez(data, **arrays)
    bench.log(f"  {data}: {arrays['sparse_ids'].shape[1]} fields ({int(arrays['vocab_sizes'].sum()):,} ids), "
              f"{arrays['dense'].shape[1]} dense, train/validation/test "
              + "/".join(f"{arrays[s].size:,}" for s in ("train", "validation", "test")))
    runs = []
    try:
        ensure_venv(bench, args.skip_install)
        for seed in [int(s) for s in args.seeds.split(",")]:
            try:
                runs.append(run_child(bench, data, seed, args))
                bench.log(f"  torchrec seed {seed}: test AUC {runs[-1]['test_auc']:.4f} (epoch "
                          f"{runs[-1]['best_epoch']}), {runs[-1]['samples_per_second']:,.0f} samples/s")
            except (benchlib.BenchError, ValueError) as exc:
                bench.failures.append(f"torchrec seed {seed}: {exc}")
                bench.log(f"FAILED torchrec seed {seed}: {exc}")
    except benchlib.BenchError as exc:
        bench.failures.append(f"TorchRec venv: {exc}")
        bench.log(f"FAILED TorchRec venv: {exc}")
    versions = runs[0]["versions"] if runs else {}
    bench.finish(table_rows(runs), [("TorchRec's DLRM", COLUMNS, table_rows(runs))],
                 notes(args, bench_deepctr.store_note(store), versions), None, extra={"runs": runs})
    return 1 if bench.failures or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
