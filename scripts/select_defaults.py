""".venv/bin/python scripts/select_defaults.py [--quick] [--models lr,fm,wdl,deepfm] [--seeds 0,1,2] [--candidates 'a;b']

How des.train's defaults were chosen: for each model, a few candidate settings (below; the first of
each model is the previous default) are trained on the shipped sample's training split with early
stopping on its validation split (up to ``--epochs`` passes, ``--early-stop`` validations without
improvement, per-epoch validation), and the candidate with the best mean validation AUC over
``--seeds`` wins. Only validation rows decide: the test split is neither read nor reported here
(``scripts/bench_deepctr.py`` reports test metrics of the defaults next to DeepCTR and
scikit-learn). ``--candidates`` runs only the candidates whose name contains one of the given
';'-separated strings.

Candidates with ``--unadmitted shared`` (one trained row per field for ids seen once and unknown
ids) are measured but not eligible as defaults: ``des.export`` refuses models trained with it.

Expect (2-core machine, seeds 0,1,2, ~20 min for deepfm; the validation split has only ~1.6k rows,
so differences below ~0.002 are noise): DeepFM picks Adam 1e-3 ``catchup=1``, batch 256, embeddings
N(0, 1e-4) (validation AUC ~0.782, vs ~0.769 for the previous default, Adam 3e-3 ``catchup=1``
batch 1024 N(0, 0.01)); smaller batches help most (1024 -> 512 -> 256: ~0.769 -> ~0.774 ->
~0.778; 128: ~0.780); ``--min-count 2 --unadmitted shared`` on top is best (~0.785) but not
eligible. LR (run with ``--models lr --epochs 20``) picks AdaGrad lr 0.1, batch 256 (~0.7795;
every batch-256 candidate is within 0.001 of it, the shared row too, ~0.780, not eligible; FTRL
l2 1 or 3 is worse, ~0.776 / ~0.766), best after ~8 epochs. FM: a tie (0.772 to 0.774), the best
lazy Adam 1e-3, batch 256, N(0, 1e-4).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import benchlib

#: ids seen once share one trained row per field / every id its own row from its first occurrence
_SHARED = {"min_count": "2", "unadmitted": "shared"}
_PER_ID = {"min_count": "1", "unadmitted": "init"}
_INIT = {"0.01": "0.01", "1e-4": "0.0001"}
_OPTIMIZERS = {"adam 1e-3 lazy": "adam:lr=0.001", "adam 1e-3 catchup": "adam:lr=0.001,catchup=1",
               "adam 3e-3 catchup": "adam:lr=0.003,catchup=1", "ftrl 1": "ftrl:alpha=1.0,beta=1.0",
               "ftrl 0.5": "ftrl:alpha=0.5,beta=1.0", "ftrl 1, l2 1": "ftrl:alpha=1.0,beta=1.0,l2=1.0",
               "ftrl 1, l2 3": "ftrl:alpha=1.0,beta=1.0,l2=3.0", "adagrad 0.05": "adagrad:lr=0.05",
               "adagrad 0.1": "adagrad:lr=0.1"}


def _candidates(*settings: tuple) -> dict[str, dict[str, str]]:
    """``(optimizer, batch, init or None, shared)`` -> name -> des.train flags. Every candidate names
    all the flags that any candidate varies, so a row means the same whatever the defaults are; the
    optimizer is the embeddings' (init given) or the order-1 weights' (LR, init None)."""
    out = {}
    for optimizer, batch, init, shared in settings:
        flag = "linear_optimizer" if init is None else "embedding_optimizer"
        name = f"{optimizer}, batch {batch}" + (f", init {init}" if init else "") + (", min-count 2 shared" if shared else "")
        out[name] = {flag: _OPTIMIZERS[optimizer], "batch_size": str(batch),
                     **({"init_scale": _INIT[init]} if init else {}), **(_SHARED if shared else _PER_ID)}
    return out


#: model -> candidate name -> des.train flags (the first of each model is the previous default)
CANDIDATES: dict[str, dict[str, dict[str, str]]] = {
    "deepfm": _candidates(
        ("adam 3e-3 catchup", 1024, "0.01", False), ("adam 3e-3 catchup", 1024, "1e-4", False),
        ("adam 1e-3 catchup", 512, "0.01", False), ("adam 3e-3 catchup", 512, "0.01", False),
        ("adam 1e-3 catchup", 512, "1e-4", False), ("adam 1e-3 catchup", 256, "0.01", False),
        ("adam 3e-3 catchup", 256, "0.01", False), ("adam 1e-3 catchup", 256, "1e-4", False),
        ("adam 1e-3 catchup", 128, "0.01", False), ("adam 1e-3 catchup", 256, "1e-4", True)),
    "fm": _candidates(
        ("adam 1e-3 lazy", 1024, "0.01", False), ("adam 1e-3 lazy", 512, "0.01", False),
        ("adam 1e-3 lazy", 256, "0.01", False), ("adam 1e-3 lazy", 256, "1e-4", False),
        ("adam 1e-3 catchup", 256, "1e-4", False), ("adam 1e-3 lazy", 256, "1e-4", True),
        ("adam 1e-3 catchup", 256, "1e-4", True)),
    "lr": _candidates(
        ("ftrl 1", 1024, None, False), ("ftrl 1, l2 1", 1024, None, False), ("ftrl 1, l2 3", 1024, None, False),
        ("ftrl 0.5", 256, None, False), ("adagrad 0.05", 256, None, False), ("adagrad 0.1", 256, None, False),
        ("adagrad 0.1", 256, None, True), ("ftrl 0.5", 256, None, True)),
}
CANDIDATES["wdl"] = {name: flags for name, flags in CANDIDATES["deepfm"].items() if "batch 128" not in name}


def mark_chosen(rows: list[dict]) -> None:
    """Per model, the row with the best mean validation AUC gets ``chosen = "yes"``; better rows
    with ``--unadmitted shared`` (not exportable yet) are marked not eligible."""
    for model in dict.fromkeys(r["model"] for r in rows):
        for r in sorted((r for r in rows if r["model"] == model), key=lambda r: -r["validation_auc"]):
            r["chosen"] = "not eligible (des.export)" if "--unadmitted shared" in r["flags"] else "yes"
            if r["chosen"] == "yes":
                break


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lr,fm,wdl,deepfm")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=10, help="at most this many passes")
    parser.add_argument("--early-stop", type=int, default=1, help="validations without improvement")
    parser.add_argument("--candidates", default="", help="only the candidates whose name contains one of these "
                        "';'-separated strings (e.g. 'batch 256;batch 128'; default: all)")
    parser.add_argument("--data", default=str(benchlib.SAMPLE))
    benchlib.add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.epochs = "lr,deepfm", 2
    seeds = [int(s) for s in args.seeds.split(",")]
    bench = benchlib.Bench(__file__, args)
    rows = []
    for model in args.models.split(","):
        wanted = [w for w in args.candidates.split(";") if w]
        for name, flags in CANDIDATES[model].items():
            if wanted and not any(w in name for w in wanted):
                continue
            aucs, epochs = [], []
            for seed in seeds:
                tag = f"{model}-{len(rows)}-s{seed}"
                s = bench.train(1, tag, model=model, seed=seed, data=args.data, epochs=args.epochs,
                                early_stop=args.early_stop, **flags)
                if s is not None:
                    aucs.append(s["validation_auc"])
                    records = [json.loads(x) for x in (bench.jobs / tag / "metrics.jsonl").read_text().splitlines()]
                    epochs.append(next(r["epoch"] + 1 for r in records if r["step"] == s["best_step"]))
            mean, std = benchlib.mean_std(aucs)
            rows.append({"model": model, "candidate": name, "flags": " ".join(f"--{k.replace('_', '-')} {v}"
                                                                             for k, v in flags.items()),
                         "validation_auc": mean, "std": std, "best_epochs": ",".join(map(str, epochs))})
    mark_chosen(rows)
    columns = [("model", "model", ""), ("candidate", "candidate", ""), ("flags", "flags", ""),
               ("validation_auc", "validation AUC (mean)", ".4f"), ("std", "std", ".4f"),
               ("best_epochs", "best epoch per seed", ""), ("chosen", "chosen", "")]
    notes = [f"Shipped sample, split 90/5/5 (split seed 0), seeds {args.seeds}, up to {args.epochs} epochs, "
             f"--early-stop {args.early_stop} on the validation AUC (per epoch), 1 rank (N ranks train the same). "
             "Chosen on validation only; the test split is not used. Candidates with --unadmitted shared are "
             "measured but not eligible as defaults while des.export refuses such models."]
    bench.finish(rows, [("Defaults chosen on validation", columns, rows)], notes, None)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
