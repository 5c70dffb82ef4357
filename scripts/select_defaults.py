""".venv/bin/python scripts/select_defaults.py [--quick] [--models lr,fm,wdl,deepfm,dcnv2,dlrm,finalmlp] [--seeds 0,1,2] [--cv K] [--candidates 'a;b']

How des.train's defaults were chosen: for each model, a few candidate settings (below; the first of
each model is the baseline) are trained on the shipped sample's training split with early
stopping on its validation split (up to ``--epochs`` passes, ``--early-stop`` validations without
improvement, per-epoch validation; candidates that name their own ``--early-stop`` use it), and the
candidate with the best mean validation AUC over ``--seeds`` wins. With ``--cv K`` the score is
K-fold cross-validation on the training rows instead (as scikit-learn chooses C): the training
rows are dealt into K folds, each candidate is trained K times on K-1 folds, exactly as des.train's
default command trains (early stopping on the ~1.6k validation rows), and scored by the AUC of the
held-out fold (~9.9k rows for K = 3); the score is the mean over folds and seeds. Only validation
and training rows decide: the test split is neither read nor reported here
(``scripts/bench_deepctr.py`` reports test metrics of the defaults next to DeepCTR and
scikit-learn). ``--candidates`` runs only the candidates whose name contains (with a final ``$``:
ends with) one of the given ';'-separated strings.

Candidates with ``--min-count 2 --unadmitted shared`` (one trained row per field for ids seen once
and unknown ids) are eligible like any other: ``des.export`` serves unknown and unadmitted ids the
field's shared row, as ``des.evaluate`` does.

Expect (a 2-core machine takes minutes per candidate; seeds 0,1,2, ``--epochs 20 --early-stop 2``
as des.train's default command): the chosen candidate of each model is its ``auto`` default in
des.train (the recorded rounds are in ``docs/benchmarks.md``, "Model quality"). The validation
split has only ~1.6k rows, so differences below ~0.002 are noise; with ``--models lr --cv 3
--seeds 0,1`` the held-out folds hold all ~29.6k training rows, a far less noisy selector.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import benchlib

#: every id its own row from its first occurrence (ids seen fewer than N times share one trained row
#: per field: ``{"min_count": str(N), "unadmitted": "shared"}``)
_PER_ID = {"min_count": "1", "unadmitted": "init"}
_INIT = {"0.01": "0.01", "1e-4": "0.0001"}
_OPTIMIZERS = {"adam 1e-3 lazy": "adam:lr=0.001", "adam 1e-3 catchup": "adam:lr=0.001,catchup=1",
               "adam 3e-3 catchup": "adam:lr=0.003,catchup=1", "ftrl 1": "ftrl:alpha=1.0,beta=1.0",
               "ftrl 0.5": "ftrl:alpha=0.5,beta=1.0", "ftrl 1, l2 1": "ftrl:alpha=1.0,beta=1.0,l2=1.0",
               "ftrl 1, l2 3": "ftrl:alpha=1.0,beta=1.0,l2=3.0", "adagrad 0.05": "adagrad:lr=0.05",
               "adagrad 0.1": "adagrad:lr=0.1", "adagrad 0.2": "adagrad:lr=0.2",
               "adagrad 0.5": "adagrad:lr=0.5"}


#: flags that some candidates set (below) and the value of the others of the same model
_EXTRA_DEFAULTS = {"sparse_schedule": "constant", "early_stop": "2", "monitor": "auc", "model_options": ""}


def _candidates(*settings: tuple) -> dict[str, dict[str, str]]:
    """``(optimizer, batch, init or None, shared[, l2[, extra]])`` -> name -> des.train flags
    (``shared``: False, or True / N for ``--min-count 2`` / ``N --unadmitted shared``). Every
    candidate names all the flags that any candidate of the model varies, so a row means the same
    whatever the defaults are; the optimizer is the embeddings' (init given) or the order-1
    weights' (LR, init None); ``l2`` is ``--l2-embedding`` (l2 on the looked-up rows); ``extra``
    more flags (a schedule: ``--sparse-schedule``, ``--early-stop``, ``--monitor``; the others get
    :data:`_EXTRA_DEFAULTS`)."""
    out = {}
    with_l2 = any(len(s) > 4 for s in settings)
    extra_keys = [k for k in _EXTRA_DEFAULTS if any(k in s[5] for s in settings if len(s) > 5)]
    for optimizer, batch, init, shared, *rest in settings:
        l2, extra = rest[0] if rest else None, rest[1] if len(rest) > 1 else {}
        flag = "linear_optimizer" if init is None else "embedding_optimizer"
        count = 2 if shared is True else int(shared)
        name = (f"{optimizer}, batch {batch}" + (f", init {init}" if init else "")
                + (f", min-count {count} shared" if shared else "") + (f", l2 {l2}" if l2 else "")
                + "".join(f", {v}" if k == "sparse_schedule" else f", {k.replace('_', '-')} {v}"
                          for k, v in extra.items()))
        admission = {"min_count": str(count), "unadmitted": "shared"} if shared else _PER_ID
        out[name] = {flag: _OPTIMIZERS[optimizer], "batch_size": str(batch),
                     **({"init_scale": _INIT[init]} if init else {}), **admission,
                     **({"l2_embedding": l2 or "0"} if with_l2 else {}),
                     **{k: extra.get(k, _EXTRA_DEFAULTS[k]) for k in extra_keys}}
    return out


_PLATEAU = {"sparse_schedule": "plateau:factor=0.5,patience=1"}
#: model -> candidate name -> des.train flags (the first of each model is the baseline)
CANDIDATES: dict[str, dict[str, dict[str, str]]] = {
    "deepfm": _candidates(
        ("adam 1e-3 catchup", 256, "1e-4", False), ("adam 3e-3 catchup", 1024, "0.01", False),
        ("adam 3e-3 catchup", 1024, "1e-4", False), ("adam 1e-3 catchup", 512, "0.01", False),
        ("adam 3e-3 catchup", 512, "0.01", False), ("adam 1e-3 catchup", 512, "1e-4", False),
        ("adam 1e-3 catchup", 256, "0.01", False), ("adam 3e-3 catchup", 256, "0.01", False),
        ("adam 1e-3 catchup", 128, "0.01", False), ("adam 1e-3 catchup", 256, "1e-4", True)),
    "fm": _candidates(
        ("adam 1e-3 lazy", 256, "1e-4", False), ("adam 1e-3 lazy", 1024, "0.01", False),
        ("adam 1e-3 lazy", 512, "0.01", False), ("adam 1e-3 lazy", 256, "0.01", False),
        ("adam 1e-3 lazy", 1024, "1e-4", False), ("adam 1e-3 catchup", 256, "1e-4", False),
        ("adam 1e-3 lazy", 256, "1e-4", True), ("adam 1e-3 catchup", 256, "1e-4", True),
        ("adam 1e-3 lazy", 1024, "0.01", True)),
    "lr": _candidates(
        ("adagrad 0.1", 256, None, True, "0.01"), ("adagrad 0.1", 256, None, False), ("ftrl 1", 1024, None, False),
        ("ftrl 1, l2 1", 1024, None, False),
        ("ftrl 1, l2 3", 1024, None, False), ("ftrl 0.5", 256, None, False), ("adagrad 0.05", 256, None, False),
        ("adagrad 0.1", 128, None, False), ("adagrad 0.1", 256, None, False, "0.001"),
        ("adagrad 0.1", 256, None, True), ("adagrad 0.05", 256, None, True), ("adagrad 0.1", 128, None, True),
        ("adagrad 0.1", 256, None, True, "0.001"), ("ftrl 0.5", 256, None, True), ("adagrad 0.1", 256, None, 3),
        ("adagrad 0.1", 256, None, True, "0.03"), ("adagrad 0.2", 256, None, True),
        ("adagrad 0.1", 256, None, True, "0.003"), ("adagrad 0.1", 256, None, True, "0.1"),
        ("adagrad 0.05", 256, None, True, "0.01"), ("adagrad 0.1", 256, None, 3, "0.01"),
        ("adagrad 0.1", 256, None, True, "0.01", _PLATEAU),
        ("adagrad 0.1", 256, None, True, "0.01", {"sparse_schedule": "cosine:end=0"}),
        ("adagrad 0.2", 256, None, True, "0.01"), ("adagrad 0.5", 256, None, True, "0.01"),
        ("adagrad 0.5", 256, None, True, "0.01", _PLATEAU),
        ("adagrad 0.1", 256, None, True, "0.01", {"early_stop": "4"}),
        ("adagrad 0.1", 256, None, True, "0.01", {"early_stop": "0"}),
        ("adagrad 0.1", 256, None, True, "0.01", {"monitor": "logloss"})),
}
CANDIDATES["wdl"] = {name: flags for name, flags in CANDIDATES["deepfm"].items() if "batch 128" not in name}
# DCN-v2 and DLRM: DeepFM's default, then one change at a time (their own options, --model-options;
# DLRM on data with dense features: --data a store prepared with examples/criteo_dense.toml)
_DEEPFM_DEFAULT = ("adam 1e-3 catchup", 256, "1e-4", True)
CANDIDATES["dcnv2"] = _candidates(
    _DEEPFM_DEFAULT, (*_DEEPFM_DEFAULT, None, {"model_options": "cross_layers=2"}),
    (*_DEEPFM_DEFAULT, None, {"model_options": "structure=stacked"}),
    (*_DEEPFM_DEFAULT, None, {"model_options": "cross=mix"}),
    (*_DEEPFM_DEFAULT, None, {"model_options": "linear=false"}),
    ("adam 1e-3 catchup", 256, "0.01", True), ("adam 1e-3 catchup", 512, "1e-4", True))
CANDIDATES["dlrm"] = _candidates(
    _DEEPFM_DEFAULT, ("adam 1e-3 catchup", 256, "0.01", True), ("adam 3e-3 catchup", 256, "1e-4", True),
    ("adam 1e-3 catchup", 512, "1e-4", True), (*_DEEPFM_DEFAULT, None, {"model_options": "bottom=256,64"}))
# FinalMLP: DeepFM's default with its signature's (stream 2 and the gates 800 wide, one head), then
# one change at a time: its own options (FuxiCTR's names) and, as DLRM (no order-1 term), Adam 3e-3
CANDIDATES["finalmlp"] = _candidates(
    _DEEPFM_DEFAULT, (*_DEEPFM_DEFAULT, None, {"model_options": "num_heads=10"}),
    (*_DEEPFM_DEFAULT, None, {"model_options": "mlp2_hidden=400,400,400"}),
    (*_DEEPFM_DEFAULT, None, {"model_options": "fs_hidden=64"}),
    (*_DEEPFM_DEFAULT, None, {"model_options": "use_fs=false"}), ("adam 3e-3 catchup", 256, "1e-4", True))


def cv_folds(data: str, k: int, folder: Path, cache_dir: Path | None = None) -> tuple[Path, list[tuple[Path, Path]]]:
    """K folds of the training rows of raw file ``data`` (split 90/5/5, split seed 0, as des.train
    splits it): each training row goes to fold ``position % k`` of a permutation of the training
    rows (numpy seed 0). Writes raw lines, in file order, into ``folder``: ``validation.txt`` (the
    validation split) and per fold ``fold<i>-train.txt`` (the other folds' rows) and
    ``fold<i>-held-out.txt`` (fold i's rows). Returns the validation file and the fold pairs. The
    test split is not written. (``cache_dir``: where ``data`` is prepared, as des.train's.)"""
    import numpy as np

    from des.data import open_dataset

    with open(data, "rb") as handle:
        raw = handle.read()
    lines = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).splitlines(keepends=True)
    store = open_dataset(data, cache_dir=cache_dir, split=[0.9, 0.05, 0.05], seed=0)
    if store.num_rows != len(lines):  # row i of the store is line i of the file
        raise SystemExit(f"--cv: {data} has {len(lines)} lines but {store.num_rows} rows")
    train = store.split_rows("train")
    fold = np.empty(len(train), dtype=np.int64)
    fold[np.random.default_rng(0).permutation(len(train))] = np.arange(len(train)) % k
    folder.mkdir(parents=True, exist_ok=True)

    def write(name: str, rows: np.ndarray) -> Path:
        (folder / name).write_bytes(b"".join(lines[r] for r in rows))
        return folder / name

    validation = write("validation.txt", store.split_rows("validation"))
    return validation, [(write(f"fold{i}-train.txt", train[fold != i]),
                         write(f"fold{i}-held-out.txt", train[fold == i])) for i in range(k)]


def mark_chosen(rows: list[dict]) -> None:
    """Per model, the row with the best mean validation AUC gets ``chosen = "yes"``."""
    for model in dict.fromkeys(r["model"] for r in rows):
        max((r for r in rows if r["model"] == model), key=lambda r: r["validation_auc"])["chosen"] = "yes"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lr,fm,wdl,deepfm")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=20, help="at most this many passes (des.train's default)")
    parser.add_argument("--early-stop", type=int, default=2, help="validations without improvement (des.train's "
                        "auto; candidates that name --early-stop, as LR's do, run with their own)")
    parser.add_argument("--candidates", default="", help="only the candidates whose name contains one of these "
                        "';'-separated strings (e.g. 'batch 256;batch 128'; one ending in '$' matches the end of "
                        "a name; default: all)")
    parser.add_argument("--cv", type=int, default=0, metavar="K", help="K-fold cross-validation on the training "
                        "rows: each fold's rows score the run trained on the other folds (early stopping on the "
                        "validation split, as des.train's default command); the score is the mean over folds and "
                        "seeds (default 0: score by the validation AUC)")
    parser.add_argument("--data", default=str(benchlib.SAMPLE))
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.epochs = "lr,deepfm", 2
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.cv == 1 or args.cv < 0:
        raise SystemExit("--cv needs at least 2 folds")
    bench = benchlib.Bench(__file__, args)
    # (tag suffix, input flags) of each run of a candidate and seed: the split of --data, or the K folds
    # (scored by the run's "test" metrics: the held-out fold; early stopping on the validation split)
    inputs, score = [("", {"data": args.data})], "validation_auc"
    if args.cv:
        validation, folds = cv_folds(args.data, args.cv, bench.folder / "folds", bench.folder / "cache")
        inputs = [(f"-f{i}", {"train_data": train, "validation_data": validation, "test_data": held_out,
                              "cache_dir": bench.folder / "cache"}) for i, (train, held_out) in enumerate(folds)]
        score = "test_auc"
    rows = []
    for model in args.models.split(","):
        wanted = [w for w in args.candidates.split(";") if w]
        for name, flags in CANDIDATES[model].items():
            if wanted and not any(name.endswith(w[:-1]) if w.endswith("$") else w in name for w in wanted):
                continue
            aucs, epochs = [], []
            for seed, (suffix, data) in itertools.product(seeds, inputs):
                tag = f"{model}-{len(rows)}-s{seed}{suffix}"
                s = bench.train(1, tag, model=model, seed=seed,
                                **{"epochs": args.epochs, "early_stop": args.early_stop, **data, **flags})
                if s is not None:
                    aucs.append(s[score])
                    records = [json.loads(x) for x in (bench.jobs / tag / "metrics.jsonl").read_text().splitlines()]
                    epochs.append(next((r["epoch"] + 1 for r in records if r["step"] == s["best_step"]),
                                       records[-1]["epoch"] + 1))  # --early-stop 0: the last epoch
            mean, std = benchlib.mean_std(aucs)
            rows.append({"model": model, "candidate": name, "flags": " ".join(f"--{k.replace('_', '-')} {v}"
                                                                             for k, v in flags.items()),
                         "validation_auc": mean, "std": std, "best_epochs": ",".join(map(str, epochs))})
    mark_chosen(rows)
    what = f"{args.cv}-fold CV AUC" if args.cv else "validation AUC"
    columns = [("model", "model", ""), ("candidate", "candidate", ""), ("flags", "flags", ""),
               ("validation_auc", f"{what} (mean)", ".4f"), ("std", "std", ".4f"),
               ("best_epochs", "best epoch per seed" + (" and fold" if args.cv else ""), ""), ("chosen", "chosen", "")]
    scored = (f"the AUC of each of {args.cv} folds of the training rows (numpy permutation seed 0) under the run "
              "trained on the other folds (its best checkpoint on the validation split; with --early-stop 0 its "
              "last)" if args.cv else "the validation AUC")
    notes = [f"Shipped sample, split 90/5/5 (split seed 0), seeds {args.seeds}, up to {args.epochs} epochs, "
             f"--early-stop {args.early_stop} (unless the candidate names its own) on the validation AUC (per "
             f"epoch), 1 rank (N ranks train the same). Scored: {scored}. The test split is not used."]
    bench.finish(rows, [(f"Defaults chosen on {what}", columns, rows)], notes, None)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
